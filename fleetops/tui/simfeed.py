"""Simulated snapshots fed straight to the TUI, with no SSH: for tests, the benchmark, and
trying the screens. Snapshots come from the same simulator and checks as a live fleet, at a
fixed clock so what is drawn does not depend on when it runs."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from fleetops import model
from fleetops.sim import gpu as sim
from fleetops.tui import data

T0 = 1_800_000_000.0  # a fixed "now" (2027-01-15) for deterministic screens


def sim_state(
    name: str, faults: Iterable[str] = (), since: float = T0 - 120, scenario: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A node's simulator state with ``faults`` ("ecc-dbe@3", "xid:79@5", ...) injected at ``since``."""
    state = sim.build_state(name, scenario or {})
    state["node"]["boot_time"] = T0 - 3 * 86400
    for entry in faults:
        fault, _, gpu = entry.partition("@")
        sim.inject_into(state, fault, int(gpu) if gpu else None)
        state["faults"][-1]["since"] = since
    # the simulator stamps kernel log lines with the real clock: move them to ``since``
    boot = state["node"]["boot_time"]
    for line in state["kernel_log"]:
        line["line"] = re.sub(r"^\[\s*-?[\d.]+\]", f"[{since - boot:12.6f}]", line["line"])
    return state


def snapshot(state: dict[str, Any], now: float = T0) -> model.Node:
    """What ``fleetops-agent collect`` would print for this state at ``now``, parsed. (The
    agent reads the clock itself; this is its simulator path at a clock of our choosing.)"""
    from fleetops.xid import kernlog as xid

    doc = sim.snapshot(state, now=now)
    lines = doc.pop("_kernel_log")
    doc["collected_at"] = now
    node = model.node_from_dict(doc)
    by_bus = {g.bus_id: g for g in node.gpus}
    boot = now - (node.uptime_s or 0.0)
    for event in xid.parse_lines(lines, source="sim"):
        gpu = by_bus.get(event.bus_id or "")
        if gpu is not None:
            event.gpu_uuid, event.gpu_index = gpu.uuid, gpu.index
        if event.timestamp is None and event.uptime_s is not None:
            event.timestamp = round(boot + event.uptime_s, 3)
        node.xids.append(event)
    return node


def findings(
    node: model.Node, baseline: Any = None, previous: model.Node | None = None
) -> list[model.Finding]:
    from fleetops import checks

    return list(checks.run_node_checks(node, baseline, previous))


def entry(
    name: str,
    faults: Iterable[str] = (),
    now: float = T0,
    previous: data.NodeEntry | None = None,
    state: dict[str, Any] | None = None,
) -> data.NodeEntry:
    """A node entry as the refresher would build it, from the simulator and the real checks."""
    st = state if state is not None else sim_state(name, faults)
    node = snapshot(st, now)
    return data.summarize(name, node, findings(node), now, previous)


def fleet(names_faults: dict[str, Iterable[str]], now: float = T0) -> list[data.NodeEntry]:
    return [entry(name, faults, now) for name, faults in names_faults.items()]


def clone_node(node: model.Node, hostname: str) -> model.Node:
    """A copy of a snapshot under another name (cheap way to a 1000-node fleet)."""
    out = copy.deepcopy(node)
    out.hostname = hostname
    return out


def gpu_history(
    name: str, uuid: str, now: float = T0, seconds: float = 3600.0, interval_s: float = 20.0
) -> dict[str, list[tuple[float, float | None]]]:
    """A GPU's last hour as the daemon's ``history`` would give it, made up but fixed: a
    warm-up, a plateau under load and a cool-down, different per GPU, so charts and their
    labels can be drawn without a daemon and without depending on when they run."""
    import math
    import zlib

    seed = zlib.crc32(f"{name}/{uuid}".encode()) % 1000 / 1000.0
    n = int(seconds / interval_s)
    out: dict[str, list[tuple[float, float | None]]] = {
        "temp_gpu_c": [], "temp_memory_c": [], "power_draw_w": [], "clock_sm_mhz": [],
        "utilization_gpu_pct": [], "clocks_event_mask": [],
    }  # fmt: skip
    for i in range(n):
        t = now - seconds + (i + 1) * interval_s
        x = i / max(1, n - 1)
        load = max(0.0, math.sin(math.pi * x * (1.0 + seed)))
        out["temp_gpu_c"].append((t, round(36 + 40 * load + 2 * math.sin(i * 0.7 + seed * 6), 1)))
        out["temp_memory_c"].append((t, round(38 + 35 * load, 1)))
        out["power_draw_w"].append((t, round(77 + 560 * load, 1)))
        out["clock_sm_mhz"].append((t, None if i % 17 == 5 else float(round(1980 - 300 * load * load))))
        out["utilization_gpu_pct"].append((t, float(round(100 * load))))
        out["clocks_event_mask"].append((t, 1.0 if load < 0.05 else 0.0))  # gpu_idle when unloaded
    return out
