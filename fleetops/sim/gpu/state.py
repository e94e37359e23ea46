"""A simulated node from a scenario: its GPUs' identities (stable digests of host and index), the
scenario file's checks, and a new state file with the scenario's faults injected."""

from __future__ import annotations

import copy
import time
from typing import Any

from fleetops.sim.gpu.base import (
    DEFAULT_GPU,
    DEFAULT_NODE,
    DEFAULT_UPTIME_S,
    HGX_BUSES,
    STATE_VERSION,
    SimError,
    check_fault_name,
    digest,
)
from fleetops.sim.gpu.fabric import (
    build_devices,
    sync_tree,
)
from fleetops.sim.gpu.faults import (
    inject_into,
)
from fleetops.sim.gpu.statefile import (
    make_devices,
    write_state,
)
from fleetops.sim.gpu.traffic import (
    months_of_traffic,
)


def _uuid(hostname: str, index: int) -> str:
    h = digest("uuid", hostname, index)
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def build_state(hostname: str, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh state for one node from a scenario mapping (see ``load_scenario``)."""
    scenario = scenario or {}
    node = copy.deepcopy(DEFAULT_NODE)
    node.update(copy.deepcopy(scenario.get("node") or {}))
    node["hostname"] = hostname
    node["boot_time"] = time.time() - float(scenario.get("uptime_s", DEFAULT_UPTIME_S))
    count = int(scenario.get("gpu_count", 8))
    gpu_overrides = scenario.get("gpu") or {}
    minors = _minor_numbers(scenario.get("gpu_minor_numbers"), count)
    gpus = []
    for index in range(count):
        gpu = copy.deepcopy(DEFAULT_GPU)
        gpu.update(copy.deepcopy(gpu_overrides))
        bus = HGX_BUSES[index] if index < len(HGX_BUSES) else f"{0xe0 + index:02x}"
        gpu["index"] = index
        gpu["bus_id"] = f"0000:{bus}:00.0"
        gpu["uuid"] = _uuid(hostname, index)
        gpu["minor_number"] = minors[index]
        gpu["serial"] = str(1654024197000 + int(digest("serial", hostname, index)[:6], 16) % 10**9)
        gpu["numa_node"] = 0 if index < count / 2 else 1
        gpu["cpu_affinity"] = "0-55,112-167" if index < count / 2 else "56-111,168-223"
        if gpu.get("nvlink_start_kib") is None:
            gpu["nvlink_start_kib"] = months_of_traffic(gpu["uuid"])
        gpus.append(gpu)
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "hostname": hostname,
        "node": node,
        "gpus": gpus,
        "faults": [],
        "kernel_log": [],
        "processes": {},
        "fabric": build_devices(hostname, [g["bus_id"] for g in gpus]),
    }
    for entry in scenario.get("faults") or []:
        name, gpu_index, peer = _parse_fault_entry(entry)
        inject_into(state, name, gpu_index, peer)
    return state


def _minor_numbers(given: Any, count: int) -> list[int]:
    """Each GPU's device minor (``/dev/nvidia<minor>``), by index: the index itself unless the
    scenario's ``gpu_minor_numbers`` lists them (one distinct integer per GPU), as on a node whose
    driver numbered its device files in another order than NVML enumerates (by PCI bus id): the
    trap that attributes a job to the wrong GPU when a gres.conf index is taken for an NVML index."""
    if given is None:
        return list(range(count))
    if (not isinstance(given, list) or len(given) != count or len(set(given)) != count
            or not all(type(m) is int and 0 <= m < 256 for m in given)):
        raise SimError(f"gpu_minor_numbers: expected {count} distinct integers 0..255 (one per GPU, by index), "
                       f"got {given!r}")
    return list(given)


def _parse_fault_entry(entry: Any) -> tuple[str, int | None, int | None]:
    """(fault, GPU, peer GPU) of a scenario's fault entry: ``NAME``, ``NAME@GPU``,
    ``slow-nvlink@GPU-PEER`` (one link), or ``{fault: NAME, gpu: N, peer: M}``."""
    bad = SimError(
        f"faults: entry {entry!r} is neither 'NAME[@GPU]', 'slow-nvlink@GPU-PEER' nor {{fault: NAME, gpu: N, peer: M}}"
    )
    try:
        if isinstance(entry, str):
            name, _, where = entry.partition("@")
            gpu, _, peer = where.partition("-")
            return name, int(gpu) if gpu else None, int(peer) if peer else None
        if isinstance(entry, dict) and "fault" in entry and set(entry) <= {"fault", "gpu", "peer"}:
            index, peer_index = entry.get("gpu"), entry.get("peer")
            return (
                str(entry["fault"]),
                int(index) if index is not None else None,
                int(peer_index) if peer_index is not None else None,
            )
    except (TypeError, ValueError):
        raise bad from None
    raise bad


def load_scenario(path: str) -> dict[str, Any]:
    import yaml  # only the controller reads scenarios; the agent reads JSON state

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise SimError(f"{path}: cannot read scenario: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SimError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SimError(f"{path}: a scenario is a mapping")
    allowed = {"node", "gpu", "gpu_count", "gpu_minor_numbers", "uptime_s", "faults", "nodes"}
    unknown = set(data) - allowed
    if unknown:
        raise SimError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
    for entry in data.get("faults") or []:
        name, _, _ = _parse_fault_entry(entry)
        check_fault_name(name)
    return data


def init_state(path: str, hostname: str, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    state = build_state(hostname, scenario)
    write_state(path, state)
    make_devices(path, len(state["gpus"]), [int(g["minor_number"]) for g in state["gpus"]])
    sync_tree(path, state, time.time())
    return state
