"""Build one node snapshot from the chosen backend.

The backends fill GPU-related fields; this module adds what is common (host facts, XIDs from the
kernel log attributed to GPUs by bus id, timing) so NVML and the simulator give the same shape.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from fleetops.catalog.actions import RESET_JOURNAL, RESET_JOURNAL_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetops import model
    from fleetops.gpu.nvml.access import NvmlAccess
    from fleetops.sim.access import SimAccess

BACKENDS = ("auto", "nvml", "sim")
SIM_STATE_ENV = "FLEETOPS_SIM_STATE"  # = gpu.sim.STATE_ENV, kept here so the NVML path never imports sim
_JOURNAL_TAIL_BYTES = 1 << 20  # a reset is one line; the newest MiB holds years of them


class CollectError(Exception):
    """Collection cannot produce a snapshot at all (no backend, unreadable state)."""


def choose_backend(requested: str) -> str:
    """``nvml`` or ``sim``, decided by ``backend_choice.choose`` (``auto`` is never the simulator
    on a node with an NVIDIA driver; ``sim`` there needs ``--sim-on-gpu-node``)."""
    from fleetops.gpu import backend_choice

    try:
        return backend_choice.choose(requested)
    except (ValueError, backend_choice.BackendRefused) as exc:
        raise CollectError(str(exc)) from exc


def _xid_events(
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
    journal ``fleetops-agent reset`` appends to: the evidence that ends an XID holding until a
    reset. A journal that is missing or unreadable proves no reset, so it yields nothing; a
    line that is not a complete record is skipped."""
    import json

    path = path or os.environ.get(RESET_JOURNAL_ENV) or RESET_JOURNAL
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _JOURNAL_TAIL_BYTES))
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


def _sim_dict(state_path: str | None, now: float) -> dict[str, Any]:
    from fleetops.sim import gpu as sim

    path = state_path or os.environ.get(sim.STATE_ENV)
    if not path:
        raise CollectError(f"the sim backend needs a state file: set {sim.STATE_ENV} or pass --state")
    try:
        device = sim.open_device(path)  # a collect in flight holds the GPUs, as nvmlInit does
    except OSError as exc:
        raise CollectError(f"{path}: cannot open the simulated node's device files: {exc.strerror or exc}") from exc
    try:
        state = sim.read_state(path)
    except sim.SimError as exc:
        raise CollectError(str(exc)) from exc
    finally:
        os.close(device)
    data: dict[str, Any] = sim.snapshot(state, now=now)
    lines = data.pop("_kernel_log")
    data["collected_at"] = now
    gpus = {g["bus_id"]: (g["uuid"], g["index"]) for g in data["gpus"]}
    data["xids"] = []
    if lines:  # most nodes have no XIDs: then neither the parser nor the model is imported
        from fleetops.model import to_dict

        data["xids"] = [to_dict(e) for e in _xid_events(lines, "sim", gpus, now, data.get("uptime_s"))]
    return data


def collect_dict(backend: str = "auto", state_path: str | None = None) -> dict[str, Any]:
    """The snapshot as the JSON-ready mapping the agent prints. The simulator's path builds the
    mapping directly (the controller validates it on receipt); NVML's goes through ``collect``."""
    start = time.perf_counter()
    if choose_backend(backend) != "sim":
        from fleetops.model import to_dict

        doc: dict[str, Any] = to_dict(collect(backend, state_path))
        return doc
    data = _sim_dict(state_path, time.time())
    data["collect_ms"] = round((time.perf_counter() - start) * 1000.0, 2)
    return data


def nvml_node(
    now: float | None = None,
    *,
    held: bool = False,
    release: bool = False,
    packages: tuple[dict[str, str], dict[str, str], str | None] | None = None,
    kernel_log: bool = True,
) -> model.Node:
    """The node's snapshot through NVML: the one builder of the cold collect and the daemon's
    full snapshot, so a field one of them has, the other has too.

    ``held``: the caller has NVML initialised already (the daemon) and no second ``nvmlInit``
    is counted. ``release``: NVML is shut down before returning (the reset, which must hold no
    device file when it resets). ``packages``: the package list already read (the daemon reads
    it once; the packages change only with a reboot or a rollout that restarts it).
    ``kernel_log``: False where the caller keeps the XIDs itself (the daemon's book follows the
    kernel log); the snapshot's ``xids`` are then empty for the caller to fill.
    Raises ``CollectError`` when NVML cannot start."""
    import socket

    from fleetops import model
    from fleetops.agent import hostinfo
    from fleetops.gpu import nvml
    from fleetops.xid import kernlog as xid

    now = time.time() if now is None else now
    node = model.Node(hostname=socket.gethostname(), backend="nvml", collected_at=now)
    node.kernel = hostinfo.kernel()
    node.os = hostinfo.os_name()
    node.uptime_s = hostinfo.uptime_s()
    try:
        nvml.collect_into(node, initialised=held, shutdown=release)
    except nvml.NvmlUnavailable as exc:
        raise CollectError(str(exc)) from exc
    node.services, reason = hostinfo.service_states()
    if reason:
        node.unavailable["services"] = reason
    node.packages, node.package_origins, reason = packages or hostinfo.nvidia_packages_with_origins()
    node.packages, node.package_origins = dict(node.packages), dict(node.package_origins)
    if reason:
        node.unavailable["packages"] = reason
    if kernel_log:
        lines, reason = xid.read_kernel_log()
        if reason:
            node.unavailable["xids"] = reason
        gpus = {g.bus_id: (g.uuid, g.index) for g in node.gpus}
        node.xids = _xid_events(lines, "kernel", gpus, now, node.uptime_s)
    resets = reset_times()
    for gpu in node.gpus:
        gpu.last_reset_at = resets.get(gpu.uuid)
        if gpu.last_reset_at is not None:
            gpu.unavailable.pop("last_reset_at", None)
        elif gpu.unavailable.get("last_reset_at", "").startswith("not from NVML"):
            gpu.unavailable["last_reset_at"] = "no reset recorded in the agent's reset journal"
    return node


def collect(backend: str = "auto", state_path: str | None = None, *, release: bool = False) -> model.Node:
    """A cold snapshot. ``release``: NVML is shut down before returning (see ``nvml_node``)."""
    from fleetops import model

    start = time.perf_counter()
    chosen = choose_backend(backend)
    now = time.time()
    if chosen == "sim":
        node = model.node_from_dict(_sim_dict(state_path, now))
    else:
        node = nvml_node(now, release=release)
    node.collect_ms = round((time.perf_counter() - start) * 1000.0, 2)
    return node


# --- the GPU access objects, with this module's snapshot builders ----------------------------


def nvml_full(**kwargs: Any) -> model.Node:
    """``nvml_node`` as ``NvmlAccess.full`` calls it: a snapshot that cannot be built is the
    daemon's failed call (RuntimeError), as a failed ``nvmlInit`` there is."""
    try:
        return nvml_node(**kwargs)
    except CollectError as exc:
        raise RuntimeError(str(exc)) from exc


def sim_builder(state_path: str) -> Callable[[], model.Node]:
    """The cold collect of one simulator state file, as ``SimAccess.full`` calls it."""
    return lambda: collect("sim", state_path)


def nvml_access(load: bool = False) -> NvmlAccess:
    """NVML access (``gpu/nvml/access.py``) for every command: the daemon, resets, MIG, setters.
    ``load``: the NVML module now (the daemon: a node without nvidia-ml-py fails its start, not
    its first sample); otherwise at the first sampling call."""
    from fleetops.gpu.nvml.access import NvmlAccess

    access = NvmlAccess(node=nvml_full)
    if load:
        access.N  # noqa: B018 - loads it
    return access


def sim_access(state_path: str) -> SimAccess:
    """Simulator access (``sim/access.py``) to ``state_path`` for every command."""
    from fleetops.sim.access import SimAccess

    return SimAccess(state_path, node=sim_builder(state_path))
