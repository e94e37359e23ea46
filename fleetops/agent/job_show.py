"""``fleetops-agent job show JOBID``: everything this node knows of one job, in one JSON document,
for the controller's ``fleetops job`` (which judges it with ``fleetops.jobs.diagnose``).

The record (``fleetops.jobs.record``), and from the resident daemon: each of the job's GPUs'
samples over the job's life (the daemon's ring: ``gpu/backend.py`` ``GPU_FIELDS`` and
``nvlink<N>_tx_kib`` / ``_rx_kib`` for each link the GPU's snapshot lists), capped at the daemon's
window; its static facts from the daemon's snapshot (power limit, maximum SM clock, the PCIe link
as trained, index, minor, bus id); the XIDs on the job's GPUs during the job (those the daemon
tagged with the job, and untagged ones on its GPUs within its time); and the job cgroup's CPU time
(``cpu_usage_usec``) with its CPUs. One short socket request per field (``history_cli.history``).

Without a daemon the document still carries the record and the facts of a cold collect, with no
samples, and says why in ``notes``: the controller then judges nothing and says so.
"""

from __future__ import annotations

import os
import time
from typing import Any

from fleetops.agent.serve import client, history_cli

KIND = "fleetops.job-show/v1"
ABSENT_KIND = "fleetops.job-absent/v1"
SNAPSHOT_MAX_AGE_S = 60.0
XID_GRACE_S = 5.0  # diagnose's xid_end_grace_s: an XID stamped just after the job's end is its


def _facts(gpu: Any) -> dict[str, Any]:
    return {"power_limit_w": gpu.power_limit_w, "clock_sm_max_mhz": gpu.clock_sm_max_mhz,
            "pcie_gen": gpu.pcie_gen_current, "pcie_width": gpu.pcie_width_current}


def _snapshot(args: Any, sock: str, notes: list[str]) -> Any:
    """The daemon's snapshot (facts, XIDs with their jobs), else a cold collect (facts only)."""
    from fleetops import model
    from fleetops.agent.collect import collect

    served = client.fetch_snapshot(sock, SNAPSHOT_MAX_AGE_S)
    if served is not None:
        return model.node_from_json(served)
    notes.append(f"no fleetops-agent daemon answers on {sock}: no samples, XIDs or CPU time; facts from a cold collect")
    try:
        return collect(args.backend, args.state)
    except Exception as exc:  # noqa: BLE001 - the record still answers; the reason goes with it
        notes.append(f"cold collect failed: {exc}")
        return None


def _series(sock: str, uuid: str, fields: list[str], seconds: float, notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in fields:
        try:
            out.update(history_cli.history(sock, uuid, [name], seconds))
        except history_cli.HistoryError as exc:
            if exc.kind == "no-daemon":
                notes.append(f"GPU {uuid}: {exc}")
                return out
            if not name.startswith("nvlink"):  # a link the ring has no column for says nothing
                notes.append(f"GPU {uuid} {name}: {exc}")
    return out


def show(args: Any, directory: str, job_id: str) -> dict[str, Any]:
    from fleetops.gpu.backend import GPU_FIELDS
    from fleetops.jobs import record

    path = record.path_for(directory, job_id)
    if not os.path.exists(path):
        return {"kind": ABSENT_KIND, "job_id": job_id, "dir": directory}
    rec = record.read(path)
    now = time.time()
    sock = client.socket_for(args.backend, args.state, getattr(args, "socket", None))
    notes: list[str] = []
    node = _snapshot(args, sock, notes)
    daemon = node is not None and node.daemon is not None
    end = rec.ended_at if rec.ended_at is not None else now
    # the job's life, capped at the daemon's window (a few seconds more: the first sample may
    # predate the record by less than one interval)
    seconds = min(history_cli.DEFAULT_SECONDS, max(1.0, now - rec.started_at + 5.0))
    if now - rec.started_at > history_cli.DEFAULT_SECONDS:
        notes.append(f"the job began {now - rec.started_at:.0f} s ago: samples cover the daemon's last "
                     f"{history_cli.DEFAULT_SECONDS:.0f} s only")
    by_uuid = {g.uuid: g for g in (node.gpus if node is not None else [])}
    uuids = {g.uuid for g in rec.gpus}
    gpus = []
    for g in rec.gpus:
        snap = by_uuid.get(g.uuid)
        links = [link.link for link in (snap.nvlinks or [])] if snap is not None else []
        fields = [*GPU_FIELDS, *(f"nvlink{n}_{d}_kib" for n in links for d in ("tx", "rx"))]
        series = _series(sock, g.uuid, fields, seconds, notes) if node is not None and daemon else {}
        gpus.append({"uuid": g.uuid, "mig_uuid": g.mig_uuid, "index": snap.index if snap is not None else g.index,
                     "minor": g.minor, "bus_id": snap.bus_id if snap is not None else None,
                     "facts": _facts(snap) if snap is not None else {}, "series": series})
        if snap is None and node is not None:
            notes.append(f"GPU {g.uuid} of the record is not in the node's snapshot")
    xids = []
    for x in (node.xids if node is not None else []):
        mine = job_id in (x.jobs or []) or (
            x.jobs is None and x.gpu_uuid in uuids and x.timestamp is not None
            and rec.started_at <= x.timestamp <= end + XID_GRACE_S)
        if mine:
            xids.append({"code": x.code, "gpu_uuid": x.gpu_uuid, "gpu_index": x.gpu_index, "timestamp": x.timestamp,
                         "message": x.message})
    cpu: list[Any] = []
    if daemon:
        try:
            cpu = history_cli.history(sock, f"job:{job_id}", ["cpu_usage_usec"], seconds)["cpu_usage_usec"]
        except history_cli.HistoryError as exc:
            notes.append(f"CPU of the job: {exc}")
    return {"kind": KIND, "node": node.hostname if node is not None else os.uname().nodename, "now": now,
            "daemon": daemon, "interval_s": (node.daemon or {}).get("interval_s") if daemon else None,
            "job": rec.to_dict(), "gpus": gpus, "xids": xids,
            "cpu": {"cpus": rec.cpus, "cgroup": rec.cgroup, "usage_usec": cpu}, "notes": notes}
