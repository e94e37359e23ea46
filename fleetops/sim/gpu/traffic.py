"""NVLink traffic: counters that grow with the GPU's load, folded at every change of the rate so
they only ever grow, from where a node that has run for months has them, in exact integers."""

from __future__ import annotations

import time
from typing import Any

from fleetops.sim.gpu.base import (
    IDLE_FAULT_LOAD_PCT,
    LINK_FAULT_LINK,
    NVLINK_KIB_PER_S_FULL,
    NVLINK_START_KIB_MAX,
    NVLINK_START_KIB_MIN,
    NVLINK_START_STEP_KIB,
    WORKLOAD_KEY,
    WORKLOAD_NVLINK_PCT,
    SimError,
    digest,
    require_present,
)


def _position(state: dict[str, Any], gpu: dict[str, Any]) -> int:
    return next(i for i, g in enumerate(state["gpus"]) if g["uuid"] == gpu["uuid"])


def _load_pct(state: dict[str, Any], position: int) -> float:
    """The load that drives the GPU's NVLink traffic: its workload's (``workloads``) while one
    runs, else its stored utilisation, raised to IDLE_FAULT_LOAD_PCT while nvlink-idle runs a job
    on it."""
    work = state["gpus"][position].get(WORKLOAD_KEY)
    if work:
        return WORKLOAD_NVLINK_PCT[work["profile"]]
    load = float(state["gpus"][position].get("utilization_gpu_pct") or 0)
    if any(f["name"] == "nvlink-idle" and f.get("gpu") == position for f in state["faults"]):
        load = max(load, float(IDLE_FAULT_LOAD_PCT))
    return min(100.0, max(0.0, load))


def traffic_kib(state: dict[str, Any], position: int, now: float) -> float:
    """KiB one nominal link has moved per direction since the driver loaded (or the last reset)."""
    gpu = state["gpus"][position]
    base = gpu.get("nvlink_traffic") or {"kib": 0.0, "at": float(state["node"].get("boot_time", now))}
    elapsed = max(0.0, now - float(base["at"]))
    return float(base["kib"]) + NVLINK_KIB_PER_S_FULL * _load_pct(state, position) / 100.0 * elapsed


def fold_traffic(state: dict[str, Any], position: int, now: float) -> None:
    """Record the counters so far before the rate changes (load, nvlink-idle, a clear)."""
    state["gpus"][position]["nvlink_traffic"] = {"kib": traffic_kib(state, position, now), "at": now}


def thaw_link(state: dict[str, Any], fault: dict[str, Any], now: float) -> None:
    """A link fault ends: what the link missed stays missing (its counter resumes, not jumps)."""
    gpu = state["gpus"][fault["gpu"]]
    count = int(gpu.get("nvlink_count", 0))
    if count <= 0:
        return
    link = str(min(LINK_FAULT_LINK[fault["name"]], count - 1))
    missed = gpu.setdefault("nvlink_missed_kib", {})
    missed[link] = float(missed.get(link, 0.0)) + max(0.0, traffic_kib(state, fault["gpu"], now) - fault["frozen_kib"])


def set_load(state: dict[str, Any], position: int, pct: float, now: float | None = None) -> None:
    """Run the GPU at ``pct`` % load (its utilisation, and the traffic over its NVLinks)."""
    if not 0 <= position < len(state["gpus"]):
        raise SimError(f"GPU position {position} does not exist on {state['hostname']}")
    if not 0 <= pct <= 100:
        raise SimError(f"load must be 0-100 %, not {pct}")
    require_present(state, position, "run a workload")
    now = time.time() if now is None else now
    fold_traffic(state, position, now)
    state["gpus"][position]["utilization_gpu_pct"] = int(round(pct))


def months_of_traffic(uuid: str) -> int:
    """The KiB a GPU's first link moved per direction before the simulated state was built:
    NVLINK_START_KIB_MIN to _MAX, fixed by the GPU's UUID."""
    span = NVLINK_START_KIB_MAX - NVLINK_START_KIB_MIN
    return NVLINK_START_KIB_MIN + int(digest("nvlink-start", uuid)[:12], 16) % span


def link_start_kib(gpu: dict[str, Any], link: int) -> tuple[int, int]:
    """(TX, RX) KiB the link's counters held when the state was built (0 after a reset), exact."""
    tx = int(gpu.get("nvlink_start_kib") or 0)
    if tx:
        tx += NVLINK_START_STEP_KIB * link
    return tx, tx - tx // 50


def nvlink_rows(state: dict[str, Any], gpu: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    count = int(gpu.get("nvlink_count", 0))
    if count <= 0:
        return []
    now = time.time() if now is None else now
    position = _position(state, gpu)
    total = traffic_kib(state, position, now)
    frozen = {
        min(LINK_FAULT_LINK[f["name"]], count - 1): float(f["frozen_kib"])
        for f in state["faults"]
        if f["name"] in LINK_FAULT_LINK and f.get("gpu") == position and "frozen_kib" in f
    }
    missed = gpu.get("nvlink_missed_kib") or {}
    links = []
    for link in range(count):
        moved = frozen.get(link, total) - float(missed.get(str(link), 0.0))
        share = 1.0 - 0.01 * (link % 4)  # links do not carry exactly the same share
        start_tx, start_rx = link_start_kib(gpu, link)
        links.append(
            {
                "link": link,
                "state": "down" if gpu.get("mig_mode_current") else "up",
                "remote_bus_id": f"0000:{0x05 + link // 3:02x}:00.{link % 3}",
                "remote_type": "switch",
                "crc_errors": 0,
                "replay_errors": 0,
                "recovery_errors": 0,
                "tx_kib": start_tx + int(max(0.0, moved) * share),
                "rx_kib": start_rx + int(max(0.0, moved) * share * 0.98),
            }
        )
    return links


def uptime_s(state: dict[str, Any], now: float) -> float:
    return round(now - float(state["node"].get("boot_time", now)), 1)
