"""Build one node snapshot from the chosen backend.

The backends fill GPU-related fields; this module adds what is common (host facts, XIDs from the
kernel log attributed to GPUs by bus id, timing) so NVML and the simulator give the same shape.
"""

from __future__ import annotations

import os
import socket
import time

from fleetops import model
from fleetops.agent import hostinfo

BACKENDS = ("auto", "nvml", "sim")


class CollectError(Exception):
    """Collection cannot produce a snapshot at all (no backend, unreadable state)."""


def choose_backend(requested: str) -> str:
    if requested not in BACKENDS:
        raise CollectError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested != "auto":
        return requested
    from fleetops.gpu import sim

    if os.environ.get(sim.STATE_ENV):
        return "sim"
    return "nvml"


def _attach_xids(node: model.Node, lines: list[str], source: str) -> None:
    from fleetops.gpu import xid

    by_bus = {g.bus_id: g for g in node.gpus}
    events = xid.parse_lines(lines, source=source)
    boot = node.collected_at - node.uptime_s if node.uptime_s is not None else None
    for event in events:
        gpu = by_bus.get(event.bus_id or "")
        if gpu is not None:
            event.gpu_uuid, event.gpu_index = gpu.uuid, gpu.index
        if event.timestamp is None and event.uptime_s is not None and boot is not None:
            event.timestamp = round(boot + event.uptime_s, 3)
    node.xids = events


def collect(backend: str = "auto", state_path: str | None = None) -> model.Node:
    start = time.perf_counter()
    chosen = choose_backend(backend)
    now = time.time()
    if chosen == "sim":
        from fleetops.gpu import sim

        path = state_path or os.environ.get(sim.STATE_ENV)
        if not path:
            raise CollectError(f"the sim backend needs a state file: set {sim.STATE_ENV} or pass --state")
        try:
            state = sim.read_state(path)
        except sim.SimError as exc:
            raise CollectError(str(exc)) from exc
        data = sim.snapshot(state, now=now)
        log_lines = data.pop("_kernel_log")
        data["collected_at"] = now
        node = model.node_from_dict(data)
        _attach_xids(node, log_lines, "sim")
    else:
        from fleetops.gpu import nvml, xid

        node = model.Node(hostname=socket.gethostname(), backend="nvml", collected_at=now)
        node.kernel = hostinfo.kernel()
        node.os = hostinfo.os_name()
        node.uptime_s = hostinfo.uptime_s()
        nvml.collect_into(node)
        node.services, reason = hostinfo.service_states()
        if reason:
            node.unavailable["services"] = reason
        node.packages, reason = hostinfo.nvidia_packages()
        if reason:
            node.unavailable["packages"] = reason
        lines, reason = xid.read_kernel_log()
        if reason:
            node.unavailable["xids"] = reason
        _attach_xids(node, lines, "kernel")
    node.collect_ms = round((time.perf_counter() - start) * 1000.0, 2)
    return node
