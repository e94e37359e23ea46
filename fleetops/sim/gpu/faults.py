"""Injecting and clearing faults by name, into the state (``inject_into``, ``clear_from``) or the
state file (``inject``, ``clear``), with the kernel-log line an XID fault writes."""

from __future__ import annotations

import time
from typing import Any

from fleetops.sim.gpu.base import (
    FABRIC_FAULTS,
    LINK_FAULT_LINK,
    NODE_EVENTS,
    SETTING_FAULTS,
    VALIDATION_FAULTS,
    XID_TEXT,
    SimError,
    check_fault_name,
    logs_code,
)
from fleetops.sim.gpu.fabric import (
    link_line,
    sync_tree,
)
from fleetops.sim.gpu.ops import (
    reboot,
)
from fleetops.sim.gpu.statefile import (
    append_kmsg,
    kmsg_path,
    locked_state,
    printk_uptime,
)
from fleetops.sim.gpu.traffic import (
    fold_traffic,
    thaw_link,
    traffic_kib,
)
from fleetops.sim.gpu.validation import (
    clear_validation,
    inject_validation_fault,
)


def _gpu_index(state: dict[str, Any], name: str, gpu: int | None) -> int | None:
    count = len(state["gpus"])
    if name in ("driver-drift",):
        if gpu is not None:
            raise SimError(f"fault {name!r} is node-wide; it takes no GPU index")
        return None
    if gpu is None:
        return count - 1 if name == "gpu-missing" else 0
    hcas = len(state.get("fabric") or [])
    if name in FABRIC_FAULTS and count <= gpu < hcas:
        return gpu  # the HCA past the GPUs' (mlx5_N): the Ethernet management port
    if not 0 <= gpu < count:
        raise SimError(f"GPU index {gpu} does not exist on {state['hostname']} (it has GPUs 0-{count - 1})")
    return gpu


def inject_into(state: dict[str, Any], name: str, gpu: int | None, peer: int | None = None) -> bool:
    """Inject ``name`` into a state held in memory (a scenario being built, a test's node); False
    if it was already there. An XID fault injected again logs its XID once more (each XID is an
    event, and the policy escalates on repeats). A validation degradation (``VALIDATION_FAULTS``)
    changes only what the simulated ``validate`` measures; ``peer`` narrows slow-nvlink to one
    link. ``inject`` does the same on a state file."""
    check_fault_name(name)
    if name in NODE_EVENTS:
        if gpu is not None or peer is not None:
            raise SimError(f"{name!r} is node-wide; it takes no GPU index")
        reboot(state)
        return True
    if name in VALIDATION_FAULTS:
        return inject_validation_fault(state, name, 0 if gpu is None else gpu, peer)
    if peer is not None:
        raise SimError(f"a peer GPU narrows slow-nvlink to one link; {name} takes none")
    index = _gpu_index(state, name, gpu)
    for fault in state["faults"]:
        if fault["name"] == name and fault.get("gpu") == index:
            if name.startswith("xid:"):  # the fault is there already, but the GPU logs it again
                _log_xid(state, index, int(name[4:]))
            return False
    now = time.time()
    record: dict[str, Any] = {"name": name, "gpu": index, "since": now}
    if name in LINK_FAULT_LINK and index is not None:
        fold_traffic(state, index, now)  # nvlink-idle raises the load from here on
        record["frozen_kib"] = traffic_kib(state, index, now)  # the link's share stops here
    if name in SETTING_FAULTS:
        scope, field_name, value = SETTING_FAULTS[name]
        target = state["node"] if scope == "node" else state["gpus"][index]
        record["saved"] = target.get(field_name)
        target[field_name] = value
        if field_name == "mig_mode_current":  # an applied mode change: pending agrees with current
            record["saved_pending"] = target.get("mig_mode_pending")
            target["mig_mode_pending"] = value
    if name.startswith("xid:") or name in ("ecc-dbe", "row-remap-failure"):
        code = int(name[4:]) if name.startswith("xid:") else (48 if name == "ecc-dbe" else 64)
        _log_xid(state, index, code)
    if name in LINK_LOGGED and index is not None:
        _log_link(state, name, index, up=False)
        if name == "ib-link-downed":  # the link fell and trained again
            _log_link(state, name, index, up=True)
    state["faults"].append(record)
    return True


# The ib-* faults whose port falls: the mlx5 driver logs the carrier going down (and up).
LINK_LOGGED = ("ib-port-down", "ib-flap", "ib-link-downed")


def _log_link(state: dict[str, Any], name: str, index: int, up: bool) -> str | None:
    devices = state.get("fabric") or []
    if index >= len(devices):
        return None
    stamp = printk_uptime(state["node"], time.time())
    line = f"[{stamp:12.6f}] {link_line(devices[index], up)}"
    state.setdefault("kernel_log", []).append({"gpu": index, "code": None, "fault": name, "line": line})
    return line


def _log_xid(state: dict[str, Any], index: int | None, code: int) -> None:
    gpu = state["gpus"][index or 0]
    bus = gpu["bus_id"]  # 0000:18:00.0 -> PCI:0000:18:00 as the driver prints it
    pci = "PCI:" + bus.rsplit(".", 1)[0]
    text = XID_TEXT.get(code, "Unspecified error")
    stamp = printk_uptime(state["node"], time.time())
    if code in (13, 31, 43, 45, 94):
        line = f"[{stamp:12.6f}] NVRM: Xid ({pci}): {code}, pid=31337, name=python3, {text}"
    else:
        line = f"[{stamp:12.6f}] NVRM: Xid ({pci}): {code}, pid='<unknown>', name=<unknown>, {text}"
    state.setdefault("kernel_log", []).append({"gpu": index, "code": code, "line": line})


def inject(path: str, name: str, gpu: int | None = None, peer: int | None = None) -> bool:
    """Inject ``name`` on the node whose state is at ``path``; False if it was already there.
    An XID it logs is also appended to the node's kmsg-format file (``kmsg_path``)."""
    check_fault_name(name)
    with locked_state(path) as state:
        before = len(state.get("kernel_log", []))
        done = inject_into(state, name, gpu, peer)
        if name == "reboot":  # a new boot's /dev/kmsg starts empty (the daemon's follower starts over)
            with open(kmsg_path(path), "w", encoding="utf-8"):
                before = 0
        for entry in state.get("kernel_log", [])[before:]:
            append_kmsg(kmsg_path(path), entry["line"], float(state["node"].get("boot_time", 0.0)),
                        float(state["node"].get("printk_drift_ppm", 0.0)))
        if name in FABRIC_FAULTS or name == "reboot":
            sync_tree(path, state, time.time())
        return done


def clear(path: str, name: str, gpu: int | None = None) -> int:
    """Clear a fault (every GPU's when ``gpu`` is None, or ``name == "all"``); returns how many."""
    if name != "all":
        check_fault_name(name)
    with locked_state(path) as state:
        before = [dict(f) for f in state["faults"]]
        removed = clear_from(state, name, gpu)
        kept = {(f["name"], f.get("gpu")) for f in state["faults"]}
        gone = [f for f in before if (f["name"], f.get("gpu")) not in kept]
        if any(f["name"] in FABRIC_FAULTS for f in gone):
            sync_tree(path, state, time.time())
        for fault in gone:  # the port is back: the driver logs its carrier up (to /dev/kmsg only)
            if fault["name"] in ("ib-port-down", "ib-flap"):
                line = _log_link(state, fault["name"], fault["gpu"], up=True)
                state["kernel_log"].pop()
                if line is not None:
                    append_kmsg(kmsg_path(path), line, float(state["node"].get("boot_time", 0.0)),
                                float(state["node"].get("printk_drift_ppm", 0.0)))
        return removed


def clear_from(state: dict[str, Any], name: str, gpu: int | None) -> int:
    removed = clear_validation(state, name, gpu)
    kept = []
    now = time.time()
    for fault in state["faults"]:
        hit = (name == "all" or fault["name"] == name) and (gpu is None or fault.get("gpu") == gpu)
        if not hit:
            kept.append(fault)
            continue
        removed += 1
        if fault["name"] in LINK_FAULT_LINK and fault.get("gpu") is not None and "frozen_kib" in fault:
            fold_traffic(state, fault["gpu"], now)
            thaw_link(state, fault, now)
        if fault["name"] in SETTING_FAULTS and "saved" in fault:
            scope, field_name, _ = SETTING_FAULTS[fault["name"]]
            target = state["node"] if scope == "node" else state["gpus"][fault["gpu"]]
            target[field_name] = fault["saved"]
            if "saved_pending" in fault:
                target["mig_mode_pending"] = fault["saved_pending"]
    state["faults"] = kept
    backed = {(logs_code(f["name"]), f.get("gpu")) for f in kept}
    standing = {(f["name"], f.get("gpu")) for f in kept}
    state["kernel_log"] = [e for e in state.get("kernel_log", [])
                           if ((e["fault"], e["gpu"]) in standing if "fault" in e else (e["code"], e["gpu"]) in backed)]
    return removed
