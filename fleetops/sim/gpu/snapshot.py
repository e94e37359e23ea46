"""The snapshot: the stored values with each condition fault overlaid, in the schema the NVML
collector writes; a lost GPU as NVML shows it; whether a state is steady (the daemon reuses its
samples while it is)."""

from __future__ import annotations

import time
from typing import Any

from fleetops.catalog import throttle
from fleetops.schema import SCHEMA_ID
from fleetops.sim.gpu.base import (
    CRC_STORM_BASE,
    CRC_STORM_PER_MIN,
    GPU_IS_LOST,
    IDLE_FAULT_LOAD_PCT,
    LINK_FAULT_LINK,
    LOST_FAULTS,
    LOST_GPU_KNOWN,
    MIG_SNAPSHOT_KEYS,
    NVML_BUILD_BRANCHES,
    PRIVATE_GPU_KEYS,
    REPLAY_STORM_BASE,
    REPLAY_STORM_PER_MIN,
    SBE_STORM_BASE,
    SBE_STORM_PER_MIN,
    STEADY_PROBE_S,
    stray_process,
)
from fleetops.sim.gpu.fabric import (
    section as fabric_section,
)
from fleetops.sim.gpu.traffic import (
    nvlink_rows,
    uptime_s,
)
from fleetops.sim.gpu.workloads import (
    JOBS_KEY,
)
from fleetops.sim.gpu.workloads import (
    overlay as workload_overlay,
)


def _apply_condition(gpu: dict[str, Any], name: str, elapsed_min: float, links: list[dict[str, Any]]) -> None:
    if name == "ecc-dbe":
        gpu["ecc_uncorrected_volatile"] += 2
        gpu["ecc_uncorrected_aggregate"] += 2
    elif name == "ecc-sbe-storm":
        grown = SBE_STORM_BASE + int(SBE_STORM_PER_MIN * elapsed_min)
        gpu["ecc_corrected_volatile"] += grown
        gpu["ecc_corrected_aggregate"] += grown
    elif name == "row-remap-pending":
        gpu["remapped_rows_pending"] = True
        gpu["remapped_rows_uncorrected"] += 1
    elif name == "row-remap-failure":
        gpu["remapped_rows_failure"] = True
    elif name == "pcie-downgrade":
        gpu["pcie_gen_current"] = 4
        gpu["pcie_width_current"] = 8
    elif name == "pcie-replay-storm":
        gpu["pcie_replay_counter"] += REPLAY_STORM_BASE + int(REPLAY_STORM_PER_MIN * elapsed_min)
    elif name == "nvlink-down" and links:
        links[min(LINK_FAULT_LINK[name], len(links) - 1)]["state"] = "down"
    elif name == "nvlink-crc-storm" and links:
        links[0]["crc_errors"] += CRC_STORM_BASE + int(CRC_STORM_PER_MIN * elapsed_min)
        links[0]["replay_errors"] += 12
    elif name == "thermal-slowdown":
        gpu["temp_gpu_c"] = gpu["temp_slowdown_c"] + 2
        gpu["temp_memory_c"] = 88.0
        gpu["clocks_event_mask"] = (gpu["clocks_event_mask"] & ~0x1) | 0x8 | 0x20 | 0x40
        gpu["clock_sm_mhz"] = 1110
    elif name == "power-brake":
        gpu["clocks_event_mask"] = (gpu["clocks_event_mask"] & ~0x1) | 0x8 | 0x80
        gpu["clock_sm_mhz"] = 810


def snapshot(state: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The node's snapshot as a ``model.Node``-shaped dict (without the collector's timing)."""
    now = time.time() if now is None else now
    node = state["node"]
    faults = state["faults"]
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for fault in faults:
        if fault.get("gpu") is not None:
            by_gpu.setdefault(fault["gpu"], []).append(fault)

    lost = {f["gpu"] for f in faults if f["name"] in LOST_FAULTS and f.get("gpu") is not None}

    reset_at: dict[int, float] = {}  # the GPU's last reset, as the agent's reset journal records it
    for done in state.get("resets", []):
        at = float(done.get("at") or 0.0)
        reset_at[done["gpu"]] = max(at, reset_at.get(done["gpu"], at))
    gpus = []
    for raw in state["gpus"]:
        index = raw["index"]
        if index in lost:
            gpus.append(lost_gpu(raw, reset_at.get(index)))
            continue
        gpu = {k: v for k, v in raw.items() if k not in PRIVATE_GPU_KEYS}
        gpu["last_reset_at"] = reset_at.get(index)
        links = nvlink_rows(state, raw, now)
        workload_overlay(state, raw, gpu, now)  # a job's workload first: a fault overrides it
        if any(f["name"] == "nvlink-idle" for f in by_gpu.get(index, [])):
            gpu["utilization_gpu_pct"] = max(int(gpu.get("utilization_gpu_pct") or 0), IDLE_FAULT_LOAD_PCT)
        for fault in by_gpu.get(index, []):
            _apply_condition(gpu, fault["name"], max(0.0, (now - fault["since"]) / 60.0), links)
            if fault["name"] == "stray-process":
                gpu["memory_used_mib"] = gpu.get("memory_used_mib", 0) + 20480
        procs = [dict(p) for p in state.get("processes", {}).get(str(index), [])]
        if any(f["name"] == "stray-process" for f in by_gpu.get(index, [])):
            procs.append(stray_process())
        gpu["processes"] = procs
        gpu["power_enforced_limit_w"] = gpu["power_limit_w"]
        gpu["clocks_event_reasons"] = throttle.decode(gpu["clocks_event_mask"])
        gpu["nvlinks"] = links
        # configured instances (see mig_reset); a state without any shows an empty list, as before
        # (the snapshot has the fields NVML's collector gives; placements are the state's own)
        gpu["mig_instances"] = ([{k: m.get(k) for k in MIG_SNAPSHOT_KEYS} for m in raw.get("mig_instances") or []]
                                if gpu.get("mig_mode_current") else None)
        unavailable = gpu.setdefault("unavailable", {})
        if not gpu.get("mig_mode_current"):
            unavailable["mig_instances"] = "MIG disabled"
        for key in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
            if gpu.get(key) is None:
                unavailable[key] = "NotSupported"  # Hopper remaps rows instead of retiring pages
        gpus.append(gpu)
    # NVML's order, kept while the driver stays loaded: a GPU that falls off the bus keeps its
    # index (its handle answers GPU_IS_LOST) and no other GPU moves
    gpus.sort(key=lambda g: int(g["index"]))

    bus_ids = [g["bus_id"] for g in gpus]
    n = len(gpus)
    links_matrix: list[list[str | None]] = []
    counts: list[list[int | None]] = []
    topo_unavailable: dict[str, str] = {}
    for i in range(n):
        row_l: list[str | None] = []
        row_c: list[int | None] = []
        for j in range(n):
            if i == j:
                row_l.append("X")
                row_c.append(0)
            elif gpus[i]["nvlinks"] is None or gpus[j]["nvlinks"] is None:
                # a lost GPU answers no topology query, as the NVML collector records it
                row_l.append(None)
                row_c.append(None)
                topo_unavailable[f"{bus_ids[min(i, j)]}|{bus_ids[max(i, j)]}"] = GPU_IS_LOST
            else:
                # NVSwitch systems: the links a GPU has, as topo -m reports them; a link that
                # is down is nvlink.links_down's business, not a topology change
                up = min(len(gpus[i]["nvlinks"]), len(gpus[j]["nvlinks"]))
                row_l.append(f"NV{up}" if up else ("NODE" if gpus[i]["numa_node"] == gpus[j]["numa_node"] else "SYS"))
                row_c.append(up)
        links_matrix.append(row_l)
        counts.append(row_c)
    kernel_log = [entry["line"] for entry in state.get("kernel_log", [])]
    branch = node["driver_branch"] if "driver_branch" in node else driver_branch_of(node.get("driver_version"))
    return {
        "schema": SCHEMA_ID,
        "hostname": state["hostname"],
        "backend": "sim",
        "kernel": node.get("kernel"),
        "os": node.get("os"),
        "uptime_s": uptime_s(state, now),
        "driver_version": node.get("driver_version"),
        "driver_branch": branch,
        "cuda_driver_version": node.get("cuda_driver_version"),
        "nvml_version": node.get("nvml_version"),
        "services": dict(node.get("services", {})),
        "packages": dict(node.get("packages", {})),
        "package_origins": {k: v for k, v in (node.get("package_origins") or {}).items()
                            if k in (node.get("packages") or {})},
        "gpu_count": len(gpus),
        "gpus": gpus,
        "topology": {
            "gpus": bus_ids,
            "links": links_matrix,
            "nvlink_counts": counts,
            "numa": {g["bus_id"]: g["numa_node"] for g in gpus},
            "unavailable": topo_unavailable,
        },
        # a scenario's driver_branch: null is a driver without nvmlSystemGetDriverBranch
        "unavailable": {} if branch is not None else {"driver_branch": "FunctionNotFound"},
        # the HCAs as the node's sysfs tree shows them (the agent reads the tree itself)
        "fabric": fabric_section(state, now),
        "_kernel_log": list(kernel_log),
    }


def lost_gpu(raw: dict[str, Any], last_reset_at: float | None) -> dict[str, Any]:
    """A lost GPU as the snapshot lists it: at its index with its UUID and bus id, every value
    NVML would be asked for unavailable with ``GpuIsLost`` (the reset journal's time is not
    NVML's and stays)."""
    from fleetops import model

    gpu: dict[str, Any] = {k: raw[k] for k in LOST_GPU_KNOWN}
    unavailable: dict[str, str] = {}
    for name in model.Gpu.__dataclass_fields__:
        if name in LOST_GPU_KNOWN or name == "unavailable":
            continue
        gpu[name] = None
        unavailable[name] = GPU_IS_LOST
    gpu["last_reset_at"] = last_reset_at
    if last_reset_at is not None:
        unavailable.pop("last_reset_at")
    gpu["unavailable"] = unavailable
    return gpu


def driver_branch_of(version: str | None) -> str | None:
    """The build branch NVML names for a driver, as the simulator reports it: the one seen on a
    real GPU where known (580.159.04 names r582_49), else ``r<major>_00``. Derived from the loaded
    version at each snapshot, so a driver that a rollout loads brings its branch with it; a
    scenario's ``node: {driver_branch: ...}`` overrides it."""
    if version in NVML_BUILD_BRANCHES:
        return NVML_BUILD_BRANCHES[version]
    head = (version or "").split(".", 1)[0]
    return f"r{head}_00" if head.isdigit() else None


def steady(state: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``snapshot(state)`` stays the same as time passes, its uptime (and the time its
    ports were read) aside: an idle node with no growing error storm and no kernel-log lines. Such a state's samples and snapshots can
    be reused until the state file changes, which is what lets one daemon process serve a
    thousand simulated nodes cheaply. Decided by taking the snapshot an hour apart rather than
    by a list of the time-dependent faults, so a new one cannot be missed."""
    now = time.time() if now is None else now
    if state.get(JOBS_KEY):  # a running workload moves with time (and its cgroup's CPU with it)
        return False
    first, later = snapshot(state, now), snapshot(state, now + STEADY_PROBE_S)
    if first["_kernel_log"]:  # XIDs: their times are derived from the (rounded) uptime
        return False
    for doc in (first, later):
        doc.pop("uptime_s")
        doc["fabric"].pop("read_at")  # when the ports were read, as the uptime: not what they show
    return first == later
