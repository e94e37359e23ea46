"""What a node snapshot adds around its GPUs, whichever access kind builds it (``snapshot``):
the kernel log's XIDs attributed to GPUs by bus id (``xid_events``), and each GPU's last
successful reset from the reset journal (``reset_times``).

The journal is written by ``fleetops-agent reset`` (``agent/reset/journal.py``); it is read here
because ``last_reset_at`` is a field of the snapshot, the evidence that ends an XID holding
until a reset, and the GPU layer builds the snapshot without importing the agent. Its path is
the catalog's (``catalog.actions.RESET_JOURNAL``), shared by writer and reader.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fleetops.catalog.actions import RESET_JOURNAL, RESET_JOURNAL_ENV

if TYPE_CHECKING:
    from fleetops import model

JOURNAL_TAIL_BYTES = 1 << 20  # a reset is one line; the newest MiB holds years of them


class SnapshotError(Exception):
    """No snapshot can be built at all (NVML does not start, the simulator's state is unreadable);
    the agent's ``collect.CollectError`` is this class. Here, not in ``backend``: the agent's
    fast collect path imports it and nothing else of this layer."""


def xid_events(
    lines: list[str], source: str, gpus: dict[str, tuple[str, int]], collected_at: float, uptime_s: float | None
) -> list[model.XidEvent]:
    """Parse kernel-log lines and attribute each XID to its GPU by bus id (``gpus``: bus id ->
    (uuid, index)); a GPU that fell off the bus is no longer enumerated and stays unattributed."""
    from fleetops.xid import kernlog as xid

    events = xid.parse_lines(lines, source=source)
    boot = collected_at - uptime_s if uptime_s is not None else None
    for event in events:
        hit = gpus.get(event.bus_id or "")
        if hit is not None:
            event.gpu_uuid, event.gpu_index = hit
        if event.timestamp is None and event.uptime_s is not None and boot is not None:
            event.timestamp = round(boot + event.uptime_s, 3)
    return events


def reset_times(path: str | None = None) -> dict[str, float]:
    """GPU UUID -> when its last successful reset (``result`` "reset") ended, from the reset
    journal ``fleetops-agent reset`` appends to. A journal that is missing or unreadable proves
    no reset, so it yields nothing; a line that is not a complete record is skipped."""
    import json

    path = path or os.environ.get(RESET_JOURNAL_ENV) or RESET_JOURNAL
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - JOURNAL_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the first line of a tail, or a torn write
        if not isinstance(rec, dict) or rec.get("result") != "reset" or rec.get("dry_run"):
            continue
        gpu = rec.get("gpu")
        uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
        started, elapsed = rec.get("time"), rec.get("elapsed_s") or 0.0
        if not isinstance(uuid, str) or not isinstance(started, (int, float)) or not isinstance(elapsed, (int, float)):
            continue
        ended = float(started) + float(elapsed)  # "time" is when the attempt began
        out[uuid] = max(ended, out.get(uuid, ended))
    return out
