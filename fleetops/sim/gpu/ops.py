"""What the agent does to a simulated node, refused where real hardware refuses: setters, GPU
resets (timed, clearing what a reset clears), processes, services, a reboot."""

from __future__ import annotations

import time
from typing import Any

from fleetops.sim.gpu.base import (
    CLOCK_FIELDS,
    DEFAULT_GPU,
    LINK_FAULT_LINK,
    LOST_FAULTS,
    RESET_CLEARS,
    RESET_DURATION_FIELD,
    SBE_STORM_BASE,
    SBE_STORM_PER_MIN,
    SETTING_FAULTS,
    STRAY_PID,
    WORKLOAD_KEY,
    SimError,
    logs_code,
    lost_reason,
    stray_process,
)
from fleetops.sim.gpu.workloads import (
    JOBS_KEY,
)


def gpu_position(state: dict[str, Any], uuid_or_bus: str) -> int | None:
    """Position in ``state["gpus"]`` of the GPU with this UUID or bus id, if it answers (not lost)."""
    pos, lost = find_gpu(state, uuid_or_bus)
    return pos if lost is None else None


def _same_bus(a: str, b: str) -> bool:
    try:
        from fleetops.model import normalize_bus_id

        return normalize_bus_id(a) == normalize_bus_id(b)
    except ValueError:
        return False


def reset_duration_s(state: dict[str, Any]) -> float:
    """The simulated reset's duration in seconds (``node.reset_duration_s``; 0 when unset)."""
    try:
        return max(0.0, float(state["node"].get(RESET_DURATION_FIELD) or 0.0))
    except (TypeError, ValueError):
        return 0.0


def set_reset_duration(state: dict[str, Any], seconds: float) -> None:
    """Make the simulated reset take ``seconds`` (see ``reset_duration_s``)."""
    if seconds < 0:
        raise SimError(f"reset duration must be >= 0 s, not {seconds}")
    state["node"][RESET_DURATION_FIELD] = float(seconds)


def find_gpu(state: dict[str, Any], key: str) -> tuple[int | None, str | None]:
    """(position in ``state["gpus"]``, why the driver does not enumerate it) of the GPU whose
    UUID or bus id is ``key``; ``(None, None)`` when no GPU of this node ever had it. Unlike
    ``gpu_position`` this also finds a GPU that fell off the bus."""
    key = key.strip()
    for pos, gpu in enumerate(state["gpus"]):
        if gpu["uuid"] == key or (not key.upper().startswith("GPU-") and _same_bus(gpu["bus_id"], key)):
            return pos, lost_reason(state, pos)
    return None, None


def gpu_processes(state: dict[str, Any], position: int) -> list[dict[str, Any]]:
    """Compute processes on the GPU at ``position``, as the snapshot lists them (with the
    ``real`` flag of processes a test registered with ``add_process``)."""
    procs = [dict(p) for p in state.get("processes", {}).get(str(position), [])]
    if any(f["name"] == "stray-process" and f.get("gpu") == position for f in state["faults"]):
        procs.append(stray_process())
    return procs


def add_process(
    state: dict[str, Any],
    position: int,
    pid: int,
    name: str,
    used_memory_mib: int = 1024,
    real: bool = False,
    user: str | None = None,
) -> None:
    """Show ``pid`` as a compute process on the GPU at ``position``, run by ``user``. ``real=True``
    says it is a process of this machine that the agent may signal (its user, unless given, is
    read from /proc as the NVML collector reads it); the others are only records."""
    entry: dict[str, Any] = {"pid": int(pid), "name": name, "used_memory_mib": int(used_memory_mib)}
    if real:
        entry["real"] = True
        if user is None:
            from fleetops.gpu import holders

            user = holders.process_user(int(pid))
    if user is not None:
        entry["user"] = user
    state.setdefault("processes", {}).setdefault(str(position), []).append(entry)


def end_process(state: dict[str, Any], position: int, pid: int) -> bool:
    """The process ``pid`` on the GPU at ``position`` has ended: drop it (ending the stray
    process retires the ``stray-process`` fault). False when it was not there."""
    found = False
    table = state.setdefault("processes", {})
    entries = table.get(str(position), [])
    kept = [p for p in entries if int(p.get("pid", -1)) != int(pid)]
    if len(kept) != len(entries):
        found = True
        if kept:
            table[str(position)] = kept
        else:
            table.pop(str(position), None)
    if int(pid) == STRAY_PID:
        before = len(state["faults"])
        state["faults"] = [
            f for f in state["faults"] if not (f["name"] == "stray-process" and f.get("gpu") == position)
        ]
        found = found or len(state["faults"]) != before
    return found


def set_service(state: dict[str, Any], unit: str, status: str) -> str | None:
    """Record ``unit`` as ``status`` ("active"/"inactive") on the node; returns what it was."""
    services = state["node"].setdefault("services", {})
    before = services.get(unit)
    services[unit] = status
    return None if before is None else str(before)


def reboot(state: dict[str, Any], now: float | None = None) -> None:
    """Reboot the node (``fleetops sim inject NODE reboot``): a new boot time (so a new uptime),
    every process ended (and every simulated job's workload), a lost GPU back on the bus, each GPU reset as ``reset_gpu`` resets it
    (XIDs and what a reset clears are gone; broken hardware, ``RESET_KEEPS``, stays) and an empty
    kernel log. The agent's reset journal keeps its records: a reboot is not a recorded reset."""
    now = time.time() if now is None else now
    state["faults"] = [f for f in state["faults"] if f["name"] not in LOST_FAULTS]
    state["processes"] = {}
    for gpu in state["gpus"]:  # every job ended with its processes: no workload runs any more
        gpu.pop(WORKLOAD_KEY, None)
    state.pop(JOBS_KEY, None)
    journal = list(state.get("resets", []))
    for position in range(len(state["gpus"])):
        reset_gpu(state, position, now)
    state["resets"] = journal
    state["kernel_log"] = []
    state["node"]["boot_time"] = now


def reset_gpu(state: dict[str, Any], position: int, now: float | None = None) -> dict[str, Any]:
    """Reset the GPU at ``position`` as ``nvidia-smi -r`` would (see the table above).

    Raises SimError, changing nothing, when the GPU is not enumerated or still has compute
    processes (the driver refuses a reset of a GPU in use). Returns what the reset did."""
    now = time.time() if now is None else now
    if not 0 <= position < len(state["gpus"]):
        raise SimError(f"GPU position {position} does not exist on {state['hostname']}")
    gpu = state["gpus"][position]
    lost = lost_reason(state, position)
    if lost:
        raise SimError(
            f"GPU {gpu['uuid']} ({gpu['bus_id']}) is lost ({lost}): NVML answers GPU_IS_LOST and a reset cannot "
            "reach it; reboot the node"
        )
    procs = gpu_processes(state, position)
    if procs:
        pids = ", ".join(str(p["pid"]) for p in procs)
        raise SimError(f"GPU {gpu['uuid']} ({gpu['bus_id']}) is in use by pid {pids}: the driver refuses the reset")
    cleared: list[str] = []
    kept: list[str] = []
    applied: list[str] = []
    faults = []
    for fault in state["faults"]:
        name = fault["name"]
        if fault.get("gpu") != position or name in SETTING_FAULTS:
            faults.append(fault)
            if fault.get("gpu") == position:
                kept.append(name)
            continue
        if name in RESET_CLEARS or name.startswith("xid:"):
            elapsed_min = max(0.0, (now - float(fault.get("since", now))) / 60.0)
            # the aggregate (lifetime) counters keep what the volatile ones counted
            if name == "ecc-dbe":
                gpu["ecc_uncorrected_aggregate"] = int(gpu.get("ecc_uncorrected_aggregate") or 0) + 2
            elif name == "ecc-sbe-storm":
                grown = SBE_STORM_BASE + int(SBE_STORM_PER_MIN * elapsed_min)
                gpu["ecc_corrected_aggregate"] = int(gpu.get("ecc_corrected_aggregate") or 0) + grown
            elif name == "row-remap-pending":
                gpu["remapped_rows_uncorrected"] = int(gpu.get("remapped_rows_uncorrected") or 0) + 1
                applied.append("pending row remap applied")
            cleared.append(name)
            continue
        faults.append(fault)
        kept.append(name)
    state["faults"] = faults
    # NVLink data counters start again from zero; a kept link fault's link stays at zero
    gpu["nvlink_traffic"] = {"kib": 0.0, "at": now}
    gpu["nvlink_start_kib"] = 0
    gpu.pop("nvlink_missed_kib", None)
    for fault in faults:
        if fault.get("gpu") == position and fault["name"] in LINK_FAULT_LINK:
            fault["frozen_kib"] = 0.0
    gpu["ecc_corrected_volatile"] = 0
    gpu["ecc_uncorrected_volatile"] = 0
    gpu["pcie_replay_counter"] = 0
    gpu["remapped_rows_pending"] = False
    if "mig_mode_pending" in gpu and gpu.get("mig_mode_pending") != gpu.get("mig_mode_current"):
        gpu["mig_mode_current"] = gpu["mig_mode_pending"]  # a pending MIG mode takes effect at the reset
        gpu["mig_instances"] = []
        applied.append(f"MIG mode {'enabled' if gpu['mig_mode_current'] else 'disabled'}")
    for name in CLOCK_FIELDS:
        gpu[name] = DEFAULT_GPU[name]
    backed = {(logs_code(f["name"]), f.get("gpu")) for f in faults}
    log = state.get("kernel_log", [])
    xids_cleared = [e["code"] for e in log if e.get("gpu") == position and (e["code"], e["gpu"]) not in backed]
    state["kernel_log"] = [e for e in log if e.get("gpu") != position or (e["code"], e["gpu"]) in backed]
    record = {
        "uuid": gpu["uuid"],
        "bus_id": gpu["bus_id"],
        "at": now,
        "cleared": cleared,
        "kept": kept,
        "applied": applied,
        "xids_cleared": xids_cleared,
    }
    state.setdefault("resets", []).append({"gpu": position, **record})
    return record
