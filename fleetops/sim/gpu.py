"""Simulated GPUs: a node described by a scenario, with faults injectable by name.

The node's state lives in one JSON state file so that separate processes (SSH sessions, Ansible
modules, resets) see and change the same node. Every write goes to a temporary file in the
same folder and is renamed over the old one, so a reader never sees half a file; writers are
serialised with ``fcntl.flock`` on a side lock file.

Two kinds of fault:
- *settings* (``power-cap-drift``, ``persistence-off``, ``mig-drift``, ``driver-drift``,
  ``vbios-drift``) change a stored value, as an operator or a bad package would. Clearing one
  restores the value it replaced; the agent's setters (power cap, persistence, MIG) overwrite
  the value and so also retire the fault.
- *conditions* (ECC, remaps, PCIe, NVLink, XIDs, thermal, power brake, a missing GPU, a stray
  process) are overlaid on the stored values each time a snapshot is taken; counters that
  should grow (SBE storm, PCIe replays, NVLink CRC) grow with the time since injection.
  A lost GPU (``xid:79``, ``gpu-missing``) is what NVML makes of one: it keeps its index, UUID
  and bus id, every value reads as unavailable (``GpuIsLost``), no other GPU moves, and every
  workload, setter, MIG call and reset on it is refused.

NVLink traffic: every link's TX/RX data counters (KiB since the driver loaded) grow with the
GPU's load, the stored ``utilization_gpu_pct`` (0 by default: an idle GPU moves nothing over
NVLink). ``set_load`` changes it; the counters are folded into ``nvlink_traffic`` (KiB at a
time) at every change of the rate, so they only ever grow, as NVML's do (a GPU reset zeroes
them). The counters start where a node that has run for months has them (``nvlink_start_kib``,
1e12 to 1e13 KiB, a little more on each higher link; a scenario's ``gpu: {nvlink_start_kib: N}``
sets another, past 2**53 as NVML's unsigned 64-bit counters may be), and they are kept in exact
integers. ``nvlink-idle`` is a job whose traffic misses one link: the GPU runs at least
``IDLE_FAULT_LOAD_PCT`` while link 5 moves nothing; a link that is down (``nvlink-down``)
moves nothing either.

The default scenario is an 8x H200 HGX node modelled on the real H200 captured in
``tests/fixtures/h200``: same driver, VBIOS, InfoROM, limits, thresholds and the counts a healthy
GPU shows (lifetime corrected ECC, two remapped rows), with 18 NVLinks per GPU through NVSwitch
where that passthrough VM reported NVLink as Not Supported.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetops.catalog import mig as _mig_catalog
from fleetops.catalog import throttle
from fleetops.schema import SCHEMA_ID

STATE_ENV = "FLEETOPS_SIM_STATE"
STATE_VERSION = 1

# Real HGX H100/H200 baseboards enumerate their eight GPUs on these buses.
HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

DEFAULT_NODE: dict[str, Any] = {
    "kernel": "6.8.0-49-generic",
    "os": "Ubuntu 24.04.1 LTS",
    "driver_version": "580.159.04",
    "cuda_driver_version": "13.0",
    "nvml_version": "13.580.159.04",
    "services": {"nvidia-fabricmanager": "active", "nvidia-persistenced": "active"},
    "packages": {
        "nvidia-driver-580-server": "580.159.04-0ubuntu1",
        "nvidia-fabricmanager-580": "580.159.04-1",
        "cuda-toolkit-13-0": "13.0.2-1",
    },
    # Who built each driver package (dpkg's Maintainer): the driver's flavour. A scenario's
    # ``node: {packages: ..., package_origins: ...}`` sets another (a consumer nvidia-driver-580).
    "package_origins": {
        "nvidia-driver-580-server": "Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>",
    },
}

DEFAULT_GPU: dict[str, Any] = {
    "name": "NVIDIA H200",
    "board_part_number": "692-2G520-0282-000",
    "vbios_version": "96.00.A5.00.1A",
    "inforom_image": "G520.0282.02.02",
    "inforom_oem": "2.1",
    "gsp_firmware": "580.159.04",
    "persistence_mode": True,
    "compute_mode": "Default",
    "power_draw_w": 77.4,
    "power_limit_w": 700.0,
    "power_default_limit_w": 700.0,
    "power_min_limit_w": 200.0,
    "power_max_limit_w": 700.0,
    "power_enforced_limit_w": 700.0,
    "temp_gpu_c": 36.0,
    "temp_memory_c": 36.0,
    "temp_slowdown_c": 89.0,
    "temp_shutdown_c": 95.0,
    "temp_memory_max_c": 95.0,
    "clock_sm_mhz": 345,
    "clock_sm_max_mhz": 1980,
    "clock_mem_mhz": 3201,
    "clock_mem_max_mhz": 3201,
    "clocks_event_mask": 0x1,
    "utilization_gpu_pct": 0,
    "utilization_mem_pct": 0,
    "memory_used_mib": 0,
    "memory_total_mib": 143771,
    "ecc_mode_current": True,
    "ecc_mode_pending": True,
    "ecc_corrected_volatile": 0,
    "ecc_uncorrected_volatile": 0,
    "ecc_corrected_aggregate": 289,
    "ecc_uncorrected_aggregate": 0,
    "remapped_rows_corrected": 2,
    "remapped_rows_uncorrected": 0,
    "remapped_rows_pending": False,
    "remapped_rows_failure": False,
    "pcie_gen_current": 5,
    "pcie_gen_max": 5,
    "pcie_width_current": 16,
    "pcie_width_max": 16,
    "pcie_replay_counter": 0,
    "nvlink_count": 18,
    "mig_mode_current": False,
    "mig_mode_pending": False,
    "fabric_state": "completed",
    "fabric_status": "success",
    "recovery_action": "none",
}

# Settings: fault -> (field it changes, value it sets). Node-level ones say "node".
SETTING_FAULTS: dict[str, tuple[str, str, Any]] = {
    "power-cap-drift": ("gpu", "power_limit_w", 500.0),
    "persistence-off": ("gpu", "persistence_mode", False),
    "mig-drift": ("gpu", "mig_mode_current", True),
    "vbios-drift": ("gpu", "vbios_version", "96.00.99.00.01"),
    "driver-drift": ("node", "driver_version", "570.133.20"),
}
CONDITION_FAULTS = (
    "ecc-dbe",
    "ecc-sbe-storm",
    "row-remap-pending",
    "row-remap-failure",
    "pcie-downgrade",
    "pcie-replay-storm",
    "nvlink-down",
    "nvlink-crc-storm",
    "nvlink-idle",
    "thermal-slowdown",
    "power-brake",
    "gpu-missing",
    "stray-process",
)
# XIDs the simulator knows how to phrase; any positive code is accepted as xid:<code>.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2e_4a000000",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 3, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row, unable to allocate replacement.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    120: "GSP Error: Task 1 raised error code 0x5 for reason 0x0 at 0x8b2c (0 more errors skipped)",
}
FAULT_NAMES = tuple(SETTING_FAULTS) + CONDITION_FAULTS
NODE_FAULTS = ("driver-drift", "gpu-missing")  # gpu-missing takes --gpu, default the last one
# Events rather than faults: nothing is left to clear. ``reboot``: see ``reboot``.
NODE_EVENTS = ("reboot",)

SBE_STORM_BASE, SBE_STORM_PER_MIN = 120_000, 20_000
REPLAY_STORM_BASE, REPLAY_STORM_PER_MIN = 400, 600
CRC_STORM_BASE, CRC_STORM_PER_MIN = 5_000, 3_000
STRAY_PID = 48213
# NVLink data moved per link and direction at 100 % load: about 80 % of an NVLink 4 link's
# 25 GB/s per direction, what an all-reduce reaches.
NVLINK_KIB_PER_S_FULL = 20_000_000.0
IDLE_FAULT_LOAD_PCT = 50
# A simulated node has run for months (a scenario's ``uptime_s`` says otherwise), and its NVLink
# data counters hold what those months moved: NVLINK_START_KIB_MIN to _MAX KiB per link and
# direction (a real node that had run for weeks showed 8.7e12), link N NVLINK_START_STEP_KIB * N more.
DEFAULT_UPTIME_S = 90 * 86400
NVLINK_START_KIB_MIN, NVLINK_START_KIB_MAX = 1_000_000_000_000, 10_000_000_000_000
NVLINK_START_STEP_KIB = 1_000_003
# The link each link fault takes: fault -> link index (the last link on GPUs with fewer).
LINK_FAULT_LINK = {"nvlink-down": 3, "nvlink-idle": 5}


class SimError(Exception):
    """Bad scenario, state file, fault name or GPU index; the message names which."""


# --- scenario -> state ---------------------------------------------------------------


def _digest(*parts: object) -> str:
    import hashlib  # only when a state is built, not on every collect

    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def _uuid(hostname: str, index: int) -> str:
    h = _digest("uuid", hostname, index)
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
    gpus = []
    for index in range(count):
        gpu = copy.deepcopy(DEFAULT_GPU)
        gpu.update(copy.deepcopy(gpu_overrides))
        bus = HGX_BUSES[index] if index < len(HGX_BUSES) else f"{0xe0 + index:02x}"
        gpu["index"] = index
        gpu["bus_id"] = f"0000:{bus}:00.0"
        gpu["uuid"] = _uuid(hostname, index)
        gpu["serial"] = str(1654024197000 + int(_digest("serial", hostname, index)[:6], 16) % 10**9)
        gpu["numa_node"] = 0 if index < count / 2 else 1
        gpu["cpu_affinity"] = "0-55,112-167" if index < count / 2 else "56-111,168-223"
        if gpu.get("nvlink_start_kib") is None:
            gpu["nvlink_start_kib"] = _months_of_traffic(gpu["uuid"])
        gpus.append(gpu)
    state: dict[str, Any] = {
        "version": STATE_VERSION,
        "hostname": hostname,
        "node": node,
        "gpus": gpus,
        "faults": [],
        "kernel_log": [],
        "processes": {},
    }
    for entry in scenario.get("faults") or []:
        name, gpu_index, peer = _parse_fault_entry(entry)
        inject_into(state, name, gpu_index, peer)
    return state


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
    allowed = {"node", "gpu", "gpu_count", "uptime_s", "faults", "nodes"}
    unknown = set(data) - allowed
    if unknown:
        raise SimError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
    for entry in data.get("faults") or []:
        name, _, _ = _parse_fault_entry(entry)
        check_fault_name(name)
    return data


def check_fault_name(name: str) -> None:
    if name.startswith("xid:"):
        code = name[4:]
        if not code.isdigit() or int(code) <= 0:
            raise SimError(f"unknown fault {name!r}: xid:<code> takes a positive number, e.g. xid:79")
        return
    if name not in FAULT_NAMES and name not in VALIDATION_FAULTS and name not in NODE_EVENTS:
        raise SimError(
            f"unknown fault {name!r}; known: {', '.join(FAULT_NAMES)}, xid:<code>; "
            f"for validate: {', '.join(VALIDATION_FAULTS)}"
        )


# --- state file ----------------------------------------------------------------------


def read_state(path: str) -> dict[str, Any]:
    return parse_state(path, read_state_text(path))


def read_state_text(path: str) -> str:
    """The state file's text, unparsed: a reader that keeps the state it parsed last (the
    daemon's sim backend, every tick) compares the text and parses only a changed file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError as exc:
        raise SimError(f"{path}: simulator state file not found") from exc
    except OSError as exc:
        raise SimError(f"{path}: cannot read simulator state: {exc.strerror}") from exc


def parse_state(path: str, text: str) -> dict[str, Any]:
    """``text`` (read from ``path``) as a state, with the errors ``read_state`` gives."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimError(f"{path}: corrupt simulator state (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise SimError(f"{path}: not a fleetops simulator state (version {STATE_VERSION} expected)")
    for key in ("hostname", "node", "gpus", "faults"):
        if key not in state:
            raise SimError(f"{path}: corrupt simulator state: missing {key!r}")
    if not isinstance(state["gpus"], list) or not isinstance(state["faults"], list):
        raise SimError(f"{path}: corrupt simulator state: 'gpus' and 'faults' must be lists")
    return state


def write_state(path: str, state: dict[str, Any]) -> None:
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".state.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def locked_state(path: str) -> Iterator[dict[str, Any]]:
    """Read, let the caller change, and write back the state under an exclusive lock.

    If the body raises, nothing is written."""
    lock_path = os.path.abspath(path) + ".lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(path)
        yield state
        write_state(path, state)


def init_state(path: str, hostname: str, scenario: dict[str, Any] | None = None) -> dict[str, Any]:
    state = build_state(hostname, scenario)
    write_state(path, state)
    make_devices(path, len(state["gpus"]))
    return state


def make_devices(path: str, count: int) -> None:
    """The simulated node's device files, as the driver makes a node's at load: ``nvidiactl``,
    ``nvidia-uvm`` and ``nvidia0`` .. ``nvidia<count-1>`` (0666, as on a node)."""
    for name in ("ctl", "-uvm", *map(str, range(count))):
        os.close(open_device(path, name))


# --- faults --------------------------------------------------------------------------


def _gpu_index(state: dict[str, Any], name: str, gpu: int | None) -> int | None:
    count = len(state["gpus"])
    if name in ("driver-drift",):
        if gpu is not None:
            raise SimError(f"fault {name!r} is node-wide; it takes no GPU index")
        return None
    if gpu is None:
        return count - 1 if name == "gpu-missing" else 0
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
        _fold_traffic(state, index, now)  # nvlink-idle raises the load from here on
        record["frozen_kib"] = _traffic_kib(state, index, now)  # the link's share stops here
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
    state["faults"].append(record)
    return True



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
        return done


def printk_uptime(node: dict[str, Any], now: float) -> float:
    """The simulated printk clock at wall time ``now``: seconds since boot as the kernel log
    stamps them. A real printk clock is never NTP-corrected and drifts from wall time; the node's
    ``printk_drift_ppm`` (a scenario's ``node: {printk_drift_ppm: 12}``; positive runs ahead)
    makes the simulated one drift alike: 12 ppm is about 30 s after a month of uptime."""
    up = now - float(node.get("boot_time", now))
    return up * (1.0 + float(node.get("printk_drift_ppm", 0.0)) / 1e6)


def device_prefix(state_path: str) -> str:
    """The start of the simulated node's device files (``<state>.dev/nvidia``): its
    ``/dev/nvidia*``. Whoever holds one open holds the simulated GPUs, as on a node
    (``gpu/holders.py`` scans for them): the simulated daemon while it has NVML, a collect while
    it runs, a test's process standing for a workload or another user's tool."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return os.path.join(base + ".dev", "nvidia")


def open_device(state_path: str, name: str = "ctl") -> int:
    """Open the simulated node's ``/dev/nvidia<name>`` (made on first use) and return the
    descriptor: what ``nvmlInit`` does to a node's ``/dev/nvidiactl``. The caller closes it."""
    path = device_prefix(state_path) + name
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        os.fchmod(fd, 0o666)  # as a node's /dev/nvidia*: every user may open it (and so hold the GPU)
        return fd


def in_use_message(bus_id: str, holders: list[Any]) -> str:
    """What ``nvidia-smi -r`` and ``modprobe -r`` answer, in substance, when processes hold the
    device files: the simulated reset and unload refuse with the holders named."""
    named = "; ".join(h.describe() for h in holders)
    return (f"GPU {bus_id}: in use by another client: {len(holders)} process(es) hold the device "
            f"files ({named}); stop every process using the GPU, monitoring ones included, and retry")


def kmsg_path(state_path: str) -> str:
    """The node's simulated ``/dev/kmsg``: beside its state file, ``<state>.kmsg``."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return base + ".kmsg"


def append_kmsg(path: str, line: str, boot_time: float, drift_ppm: float = 0.0) -> int:
    """Append one kernel-log line as a ``/dev/kmsg`` record (``prio,seq,usec,flags;message``,
    seq counting from 0 in the file) so simulated XIDs reach the daemon's kernel-log follower as
    real ones do; returns the record's seq. The stamp is the printk clock's (``printk_uptime``,
    ``drift_ppm`` off wall time). The caller holds the state lock (one writer)."""
    message = line
    if message.startswith("["):
        message = message.split("]", 1)[1].lstrip()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            seq = sum(1 for _ in fh)
    except FileNotFoundError:
        seq = 0
    if boot_time:
        usec = max(0, int(printk_uptime({"boot_time": boot_time, "printk_drift_ppm": drift_ppm}, time.time()) * 1e6))
    else:
        usec = int(time.monotonic() * 1e6)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"3,{seq},{usec},-;{message}\n")
    return seq


def clear(path: str, name: str, gpu: int | None = None) -> int:
    """Clear a fault (every GPU's when ``gpu`` is None, or ``name == "all"``); returns how many."""
    if name != "all":
        check_fault_name(name)
    with locked_state(path) as state:
        return _clear(state, name, gpu)


def _clear(state: dict[str, Any], name: str, gpu: int | None) -> int:
    removed = _clear_validation(state, name, gpu)
    kept = []
    now = time.time()
    for fault in state["faults"]:
        hit = (name == "all" or fault["name"] == name) and (gpu is None or fault.get("gpu") == gpu)
        if not hit:
            kept.append(fault)
            continue
        removed += 1
        if fault["name"] in LINK_FAULT_LINK and fault.get("gpu") is not None and "frozen_kib" in fault:
            _fold_traffic(state, fault["gpu"], now)
            _thaw_link(state, fault, now)
        if fault["name"] in SETTING_FAULTS and "saved" in fault:
            scope, field_name, _ = SETTING_FAULTS[fault["name"]]
            target = state["node"] if scope == "node" else state["gpus"][fault["gpu"]]
            target[field_name] = fault["saved"]
            if "saved_pending" in fault:
                target["mig_mode_pending"] = fault["saved_pending"]
    state["faults"] = kept
    backed = {(_logs_code(f["name"]), f.get("gpu")) for f in kept}
    state["kernel_log"] = [e for e in state.get("kernel_log", []) if (e["code"], e["gpu"]) in backed]
    return removed


def _logs_code(name: str) -> int | None:
    """The XID a fault writes to the kernel log when injected, if any."""
    if name.startswith("xid:"):
        return int(name[4:])
    return {"ecc-dbe": 48, "row-remap-failure": 64}.get(name)


def retire_setting_fault(state: dict[str, Any], field_name: str, gpu: int | None) -> None:
    """The agent set ``field_name`` itself: a setting fault on it no longer applies."""
    state["faults"] = [
        f
        for f in state["faults"]
        if not (f["name"] in SETTING_FAULTS and SETTING_FAULTS[f["name"]][1] == field_name and f.get("gpu") == gpu)
    ]


# --- snapshot ------------------------------------------------------------------------


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


# --- NVLink traffic ----------------------------------------------------------------------


def _position(state: dict[str, Any], gpu: dict[str, Any]) -> int:
    return next(i for i, g in enumerate(state["gpus"]) if g["uuid"] == gpu["uuid"])


def _load_pct(state: dict[str, Any], position: int) -> float:
    """The load that drives the GPU's NVLink traffic: its stored utilisation, raised to
    IDLE_FAULT_LOAD_PCT while nvlink-idle runs a job on it."""
    load = float(state["gpus"][position].get("utilization_gpu_pct") or 0)
    if any(f["name"] == "nvlink-idle" and f.get("gpu") == position for f in state["faults"]):
        load = max(load, float(IDLE_FAULT_LOAD_PCT))
    return min(100.0, max(0.0, load))


def _traffic_kib(state: dict[str, Any], position: int, now: float) -> float:
    """KiB one nominal link has moved per direction since the driver loaded (or the last reset)."""
    gpu = state["gpus"][position]
    base = gpu.get("nvlink_traffic") or {"kib": 0.0, "at": float(state["node"].get("boot_time", now))}
    elapsed = max(0.0, now - float(base["at"]))
    return float(base["kib"]) + NVLINK_KIB_PER_S_FULL * _load_pct(state, position) / 100.0 * elapsed


def _fold_traffic(state: dict[str, Any], position: int, now: float) -> None:
    """Record the counters so far before the rate changes (load, nvlink-idle, a clear)."""
    state["gpus"][position]["nvlink_traffic"] = {"kib": _traffic_kib(state, position, now), "at": now}


def _thaw_link(state: dict[str, Any], fault: dict[str, Any], now: float) -> None:
    """A link fault ends: what the link missed stays missing (its counter resumes, not jumps)."""
    gpu = state["gpus"][fault["gpu"]]
    count = int(gpu.get("nvlink_count", 0))
    if count <= 0:
        return
    link = str(min(LINK_FAULT_LINK[fault["name"]], count - 1))
    missed = gpu.setdefault("nvlink_missed_kib", {})
    missed[link] = float(missed.get(link, 0.0)) + max(0.0, _traffic_kib(state, fault["gpu"], now) - fault["frozen_kib"])


def set_load(state: dict[str, Any], position: int, pct: float, now: float | None = None) -> None:
    """Run the GPU at ``pct`` % load (its utilisation, and the traffic over its NVLinks)."""
    if not 0 <= position < len(state["gpus"]):
        raise SimError(f"GPU position {position} does not exist on {state['hostname']}")
    if not 0 <= pct <= 100:
        raise SimError(f"load must be 0-100 %, not {pct}")
    require_present(state, position, "run a workload")
    now = time.time() if now is None else now
    _fold_traffic(state, position, now)
    state["gpus"][position]["utilization_gpu_pct"] = int(round(pct))


def _months_of_traffic(uuid: str) -> int:
    """The KiB a GPU's first link moved per direction before the simulated state was built:
    NVLINK_START_KIB_MIN to _MAX, fixed by the GPU's UUID."""
    span = NVLINK_START_KIB_MAX - NVLINK_START_KIB_MIN
    return NVLINK_START_KIB_MIN + int(_digest("nvlink-start", uuid)[:12], 16) % span


def link_start_kib(gpu: dict[str, Any], link: int) -> tuple[int, int]:
    """(TX, RX) KiB the link's counters held when the state was built (0 after a reset), exact."""
    tx = int(gpu.get("nvlink_start_kib") or 0)
    if tx:
        tx += NVLINK_START_STEP_KIB * link
    return tx, tx - tx // 50


def _nvlinks(state: dict[str, Any], gpu: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    count = int(gpu.get("nvlink_count", 0))
    if count <= 0:
        return []
    now = time.time() if now is None else now
    position = _position(state, gpu)
    total = _traffic_kib(state, position, now)
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
        links = _nvlinks(state, raw, now)
        if any(f["name"] == "nvlink-idle" for f in by_gpu.get(index, [])):
            gpu["utilization_gpu_pct"] = max(int(gpu.get("utilization_gpu_pct") or 0), IDLE_FAULT_LOAD_PCT)
        for fault in by_gpu.get(index, []):
            _apply_condition(gpu, fault["name"], max(0.0, (now - fault["since"]) / 60.0), links)
            if fault["name"] == "stray-process":
                gpu["memory_used_mib"] = gpu.get("memory_used_mib", 0) + 20480
        procs = [dict(p) for p in state.get("processes", {}).get(str(index), [])]
        if any(f["name"] == "stray-process" for f in by_gpu.get(index, [])):
            procs.append({"pid": STRAY_PID, "name": "python3 train.py", "used_memory_mib": 20480})
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
        "_kernel_log": list(kernel_log),
    }


GPU_IS_LOST = "GpuIsLost"  # = model.GPU_IS_LOST, the reason NVML's collector records
# What NVML still gives for a GPU that fell off the bus: its index (nvmlDeviceGetHandleByIndex
# keeps the handle), and the PCI bus id and UUID the driver attached it with.
LOST_GPU_KNOWN = ("index", "uuid", "bus_id")


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


# The build branch NVML names for drivers seen on real GPUs (nvmlSystemGetDriverBranch on the
# lent H200, tests/fixtures/h200/README.md): not the version's major number.
NVML_BUILD_BRANCHES = {"580.159.04": "r582_49"}


def driver_branch_of(version: str | None) -> str | None:
    """The build branch NVML names for a driver, as the simulator reports it: the one seen on a
    real GPU where known (580.159.04 names r582_49), else ``r<major>_00``. Derived from the loaded
    version at each snapshot, so a driver that a rollout loads brings its branch with it; a
    scenario's ``node: {driver_branch: ...}`` overrides it."""
    if version in NVML_BUILD_BRANCHES:
        return NVML_BUILD_BRANCHES[version]
    head = (version or "").split(".", 1)[0]
    return f"r{head}_00" if head.isdigit() else None


STEADY_PROBE_S = 3600.0


def steady(state: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``snapshot(state)`` stays the same as time passes, its uptime aside: an idle node
    with no growing error storm and no kernel-log lines. Such a state's samples and snapshots can
    be reused until the state file changes, which is what lets one daemon process serve a
    thousand simulated nodes cheaply. Decided by taking the snapshot an hour apart rather than
    by a list of the time-dependent faults, so a new one cannot be missed."""
    now = time.time() if now is None else now
    first, later = snapshot(state, now), snapshot(state, now + STEADY_PROBE_S)
    if first["_kernel_log"]:  # XIDs: their times are derived from the (rounded) uptime
        return False
    first.pop("uptime_s")
    later.pop("uptime_s")
    return first == later


# --- setters used by the agent (power, persistence, MIG) and by reset -----------------


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


# --- reset, processes, services and MIG instances (fleetops.agent.reset / .mig) -------
#
# What a GPU reset does in the simulator, condition by condition. A reset re-initialises the
# GPU: its volatile counters (ECC, NVLink error counters, PCIe replays) start again from zero,
# a pending row remap is applied, the XIDs it had pending are gone and its clocks return to
# their defaults. What comes from outside the GPU, or from hardware that is broken, stays:
# a failed row remap (no spare rows: drain and inspect), a downtrained PCIe link or a link that
# is down for a physical reason, and the thermal slowdown / power brake (the reset restores the
# clocks, but the slowdown returns at once while the cooling or power condition persists, so
# the fault stays and the next snapshot shows it). A GPU that fell off the bus (xid:79) or
# stopped answering without an XID (gpu-missing) is lost: it keeps its index, answers GPU_IS_LOST
# to everything, and a reset cannot reach it: only a reboot brings it back.
# Settings (power cap, persistence, MIG mode, VBIOS, driver) are not the reset's business.

# How long a simulated ``nvidia-smi -r`` keeps the GPU away: the node's ``reset_duration_s``
# (seconds, default 0). A real reset takes seconds to minutes; tests set it to watch a reset in
# progress (a second action refused by the lock, a signal during the reset phase).
RESET_DURATION_FIELD = "reset_duration_s"
# The UUID of the GPU a simulated reset has away right now (set only while a reset with a duration runs).
RESETTING_FIELD = "resetting"


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


RESET_CLEARS = ("ecc-dbe", "ecc-sbe-storm", "row-remap-pending", "nvlink-crc-storm", "pcie-replay-storm")
# nvlink-idle is kept: a link that trains up but carries nothing points at the fabric (routing,
# Fabric Manager, the NVSwitch side), which a GPU reset does not touch; clearing it on reset
# would let a remediation look successful without evidence.
RESET_KEEPS = ("row-remap-failure", "pcie-downgrade", "nvlink-down", "nvlink-idle", "thermal-slowdown", "power-brake")
LOST_FAULTS = ("xid:79", "gpu-missing")
CLOCK_FIELDS = ("clock_sm_mhz", "clock_mem_mhz", "clocks_event_mask")
# Stored per GPU for the simulator's own bookkeeping; never part of a snapshot.
PRIVATE_GPU_KEYS = ("nvlink_count", "nvlink_traffic", "nvlink_missed_kib", "nvlink_start_kib")


def lost_reason(state: dict[str, Any], position: int) -> str | None:
    """The fault that made the GPU at ``position`` lost (it answers nothing), if any."""
    for fault in state["faults"]:
        if fault.get("gpu") == position and fault["name"] in LOST_FAULTS:
            return str(fault["name"])
    return None


def require_present(state: dict[str, Any], position: int, what: str) -> None:
    """Refuse ``what`` on a lost GPU as NVML does: every call on its handle answers
    NVML_ERROR_GPU_IS_LOST, a setter's and a MIG call's as much as a query's."""
    lost = lost_reason(state, position)
    if lost is not None:
        gpu = state["gpus"][position]
        raise SimError(f"GPU {gpu['uuid']} ({gpu['bus_id']}): {what}: GPU is lost ({lost}): NVML answers "
                       "GPU_IS_LOST until the node is rebooted")


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
        procs.append({"pid": STRAY_PID, "name": "python3 train.py", "used_memory_mib": 20480})
    return procs


def add_process(
    state: dict[str, Any], position: int, pid: int, name: str, used_memory_mib: int = 1024, real: bool = False
) -> None:
    """Show ``pid`` as a compute process on the GPU at ``position``. ``real=True`` says it is a
    process of this machine that the agent may signal; the others are only records."""
    entry: dict[str, Any] = {"pid": int(pid), "name": name, "used_memory_mib": int(used_memory_mib)}
    if real:
        entry["real"] = True
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
    every process ended, a lost GPU back on the bus, each GPU reset as ``reset_gpu`` resets it
    (XIDs and what a reset clears are gone; broken hardware, ``RESET_KEEPS``, stays) and an empty
    kernel log. The agent's reset journal keeps its records: a reboot is not a recorded reset."""
    now = time.time() if now is None else now
    state["faults"] = [f for f in state["faults"] if f["name"] not in LOST_FAULTS]
    state["processes"] = {}
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
    backed = {(_logs_code(f["name"]), f.get("gpu")) for f in faults}
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


# --- MIG: the GPU-instance profile tables and placement rules of fleetops.catalog.mig ------
#
# An instance record in the state: ``gpu_instance_id``, ``compute_instance_id`` (None until a
# compute instance is made in it), ``profile`` (name), ``profile_id``, ``placement_start`` and
# ``placement_size`` (memory slices), ``uuid`` (the MIG device's, once it has a compute
# instance) and ``in_use`` (a workload runs on it). Creating in order places each instance at
# the first free placement its profile lists, as NVML does without an explicit placement, and
# fails when none is free (4g + 4g): nothing is half made.

MIG_SNAPSHOT_KEYS = ("gpu_instance_id", "compute_instance_id", "profile", "uuid", "in_use")
# Profile name -> compute slices, for the default (H200) GPU.
MIG_PROFILES = {p.name: p.slices for p in _mig_catalog.H200_SXM.profiles}
# A node whose ``mig_mode_needs_reset`` is true keeps a MIG mode change pending until the GPU is
# reset (a passthrough VM, older parts); otherwise the change is current at once, as on Hopper.
MIG_NEEDS_RESET_FIELD = "mig_mode_needs_reset"


def mig_table(state: dict[str, Any], position: int) -> _mig_catalog.ProfileTable:
    """The profile table of the GPU at ``position`` (by its product name)."""
    gpu = state["gpus"][position]
    table = _mig_catalog.table_for(gpu.get("name"))
    if table is None:
        raise SimError(f"GPU {gpu['uuid']}: the simulator has no MIG profile table for {gpu.get('name')!r}")
    return table


def mig_profile_rows(state: dict[str, Any], position: int) -> list[dict[str, Any]]:
    """The profile table as NVML's profile-info and possible-placement calls answer it."""
    return [
        {"profile": p.profile, "id": p.id, "name": f"MIG {p.name}", "sliceCount": p.slices, "instanceCount": p.instances,
         "multiprocessorCount": p.sms, "copyEngineCount": p.copy_engines, "decoderCount": p.decoders,
         "encoderCount": p.encoders, "jpegCount": p.jpegs, "ofaCount": p.ofas, "memorySizeMB": p.memory_mib,
         "isP2pSupported": int(p.p2p), "placements": [list(x) for x in p.placements]}
        for p in mig_table(state, position).profiles
    ]


def _mig_uuid(gpu_uuid: str, generation: int, slot: int) -> str:
    h = _digest("mig", gpu_uuid, generation, slot)
    return f"MIG-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _mig_gpu(state: dict[str, Any], position: int) -> dict[str, Any]:
    if not 0 <= position < len(state["gpus"]):
        raise SimError(f"GPU position {position} does not exist on {state['hostname']}")
    require_present(state, position, "MIG")
    gpu: dict[str, Any] = state["gpus"][position]
    if not gpu.get("mig_mode_current"):
        raise SimError(f"GPU {gpu['uuid']}: MIG mode is off; set it on first")
    return gpu


def create_gpu_instance(state: dict[str, Any], position: int, profile: str, start: int | None = None) -> dict[str, Any]:
    """Create one GPU instance (no compute instance yet), at ``start`` or at the first free
    placement; SimError, changing nothing, when the profile is unknown, its count is used up or
    the placement is taken."""
    gpu = _mig_gpu(state, position)
    table = mig_table(state, position)
    prof = table.get(profile)
    if prof is None:
        raise SimError(_mig_catalog.unknown_profile_message(profile, table))
    instances = gpu.setdefault("mig_instances", [])
    if sum(1 for m in instances if m.get("profile") == prof.name) >= prof.instances:
        raise SimError(f"GPU {gpu['uuid']}: no {prof.name} left (at most {prof.instances}): insufficient resources")
    taken = [(int(m["placement_start"]), int(m["placement_size"])) for m in instances if "placement_start" in m]
    size = prof.placements[0][1]
    if start is None:
        start = _mig_catalog.first_free(prof, taken)
        if start is None:
            raise SimError(f"GPU {gpu['uuid']}: no free placement for {prof.name}: insufficient resources")
    elif (start, size) not in prof.placements:
        raise SimError(f"GPU {gpu['uuid']}: {prof.name} cannot start at memory slice {start}")
    elif not _mig_catalog.fits(start, size, taken):
        raise SimError(f"GPU {gpu['uuid']}: memory slices {start}-{start + size - 1} are taken: insufficient resources")
    used = {int(m["gpu_instance_id"]) for m in instances}
    gi = next(i for i in range(1, 64) if i not in used)
    record = {"gpu_instance_id": gi, "compute_instance_id": None, "profile": prof.name, "profile_id": prof.id,
              "placement_start": start, "placement_size": size, "uuid": None, "in_use": False}
    instances.append(record)
    instances.sort(key=lambda m: int(m["gpu_instance_id"]))
    return record


def create_compute_instance(state: dict[str, Any], position: int, gpu_instance_id: int) -> dict[str, Any]:
    """The one compute instance spanning the whole GPU instance (``-C``), with its MIG device UUID."""
    gpu = _mig_gpu(state, position)
    for m in gpu.get("mig_instances") or []:
        if int(m["gpu_instance_id"]) == gpu_instance_id:
            if m.get("compute_instance_id") is not None:
                raise SimError(f"GPU {gpu['uuid']}: GI {gpu_instance_id} already has its compute instance")
            generation = int(gpu.get("mig_generation", 0)) + 1
            gpu["mig_generation"] = generation
            m["compute_instance_id"] = 0
            m["uuid"] = _mig_uuid(gpu["uuid"], generation, gpu_instance_id)
            return dict(m)
    raise SimError(f"GPU {gpu['uuid']}: no GPU instance {gpu_instance_id}")


def destroy_gpu_instance(state: dict[str, Any], position: int, gpu_instance_id: int) -> dict[str, Any]:
    """Destroy a GPU instance and its compute instance; refused (NVML's InUse) while in use."""
    gpu = _mig_gpu(state, position)
    instances = gpu.get("mig_instances") or []
    for m in instances:
        if int(m["gpu_instance_id"]) == gpu_instance_id:
            if m.get("in_use"):
                raise SimError(f"GPU {gpu['uuid']}: GI {gpu_instance_id} ({m.get('profile')}) is in use")
            instances.remove(m)
            return dict(m)
    raise SimError(f"GPU {gpu['uuid']}: no GPU instance {gpu_instance_id}")


def set_mig_mode(state: dict[str, Any], position: int, enabled: bool) -> bool:
    """Request MIG mode; True when it is current at once, False when it waits for a GPU reset
    (``mig_mode_needs_reset`` on the node). Turning it off needs no instance left."""
    require_present(state, position, "set MIG mode")
    gpu = state["gpus"][position]
    if not enabled and gpu.get("mig_mode_current") and gpu.get("mig_instances"):
        raise SimError(f"GPU {gpu['uuid']}: destroy its MIG instances before turning MIG mode off")
    gpu["mig_mode_pending"] = enabled
    retire_setting_fault(state, "mig_mode_current", position)
    if state["node"].get(MIG_NEEDS_RESET_FIELD) and bool(gpu.get("mig_mode_current")) != enabled:
        return False
    gpu["mig_mode_current"] = enabled
    if not enabled:
        gpu["mig_instances"] = []
    return True


def set_mig_instances(state: dict[str, Any], position: int, profiles: list[str], in_use: list[int] | None = None) -> list[dict[str, Any]]:
    """Replace the GPU's MIG instances by ``profiles``, created in order (MIG mode must be on);
    ``in_use`` lists the slots (0-based) that have a workload. All or nothing: a profile that
    finds no free placement raises SimError and the old instances stay."""
    gpu = _mig_gpu(state, position)
    before = gpu.get("mig_instances")
    gpu["mig_instances"] = []
    try:
        made = [create_gpu_instance(state, position, p) for p in profiles]
        for m in made:
            create_compute_instance(state, position, int(m["gpu_instance_id"]))
    except SimError:
        gpu["mig_instances"] = before
        raise
    busy = set(in_use or [])
    for slot, m in enumerate(made):
        m["in_use"] = slot in busy
    out: list[dict[str, Any]] = gpu["mig_instances"]
    return out


def mig_reset(state: dict[str, Any], position: int, profiles: list[str] | None = None) -> dict[str, Any]:
    """Destroy the GPU's MIG instances and create them again (the same profiles, or
    ``profiles``); refuses, changing nothing, while any instance is in use."""
    require_present(state, position, "MIG reset")
    gpu = state["gpus"][position]
    before = [dict(m) for m in gpu.get("mig_instances") or []]
    busy = [m for m in before if m.get("in_use")]
    if busy:
        names = ", ".join(f"{m['profile']} GI {m['gpu_instance_id']} ({m['uuid']})" for m in busy)
        raise SimError(f"GPU {gpu['uuid']}: MIG instances in use: {names}")
    wanted = list(profiles) if profiles is not None else [m["profile"] for m in before]
    after = set_mig_instances(state, position, wanted)
    return {"uuid": gpu["uuid"], "destroyed": before, "created": [dict(m) for m in after]}


# --- active validation (fleetops-agent validate --backend sim) ---------------------------
# Degradations seen only by the validation workloads: they change no reported setting.
VALIDATION_FAULTS: dict[str, tuple[str, ...]] = {
    "slow-hbm": ("hbm_copy_gbps", "hbm_triad_gbps"),
    "slow-gemm": ("gemm_bf16_tflops", "gemm_fp8_tflops"),
    "slow-pcie": ("h2d_gbps", "d2h_gbps"),
    "slow-nvlink": ("p2p_gbps", "allreduce_busbw_gbps"),
    "noisy": (),
}


def inject_validation_fault(state: dict[str, Any], name: str, gpu_index: int, peer: int | None = None) -> bool:
    """Mark one GPU degraded for the simulated validation backend (idempotent: False when it
    was already). ``peer`` (only for slow-nvlink) narrows it to the one link between
    ``gpu_index`` and ``peer``."""
    if name not in VALIDATION_FAULTS:
        raise SimError(f"unknown validation fault {name!r}; known: {', '.join(VALIDATION_FAULTS)}")
    for index in (gpu_index,) if peer is None else (gpu_index, peer):
        if not 0 <= index < len(state["gpus"]):
            raise SimError(f"GPU index {index} out of range (0-{len(state['gpus']) - 1})")
    if peer is not None and (name != "slow-nvlink" or peer == gpu_index):
        raise SimError(f"a peer GPU narrows slow-nvlink to one link between two GPUs, not {name} on {gpu_index}-{peer}")
    entries = state.setdefault("validation_faults", [])
    entry: dict[str, Any] = {"fault": name, "gpu": gpu_index}
    if peer is not None:
        entry["peer"] = peer
    if entry in entries:
        return False
    entries.append(entry)
    return True


def _clear_validation(state: dict[str, Any], name: str, gpu: int | None) -> int:
    """Remove validation degradations named ``name`` (or all) on ``gpu`` (either end of a
    narrowed link) or on every GPU; how many."""
    entries = state.get("validation_faults") or []
    kept = [
        e for e in entries
        if not ((name == "all" or e["fault"] == name) and (gpu is None or gpu in (e.get("gpu"), e.get("peer"))))
    ]  # fmt: skip
    if entries:
        state["validation_faults"] = kept
    return len(entries) - len(kept)


def set_validation_noise(state: dict[str, Any], noise: float | None = None, seed: int | None = None) -> None:
    """The noise level and seed of this node's simulated validation runs, for an agent whose
    command line names neither: ``fleetops validate`` passes no simulator options, so a fleet's
    runs reach a noise level and a seed (a reproducible run) only through each node's state.
    ``None`` for both removes the setting (the backend's default noise, fresh draws each run)."""
    if noise is not None and not 0.0 <= noise < 1.0:
        raise SimError(f"validation noise {noise!r}: expected a fraction from 0 to below 1")
    if noise is None and seed is None:
        state.pop("validation_noise", None)
        return
    setting: dict[str, Any] = {}
    if noise is not None:
        setting["noise"] = float(noise)
    if seed is not None:
        setting["seed"] = int(seed)
    state["validation_noise"] = setting


def validation_faults(state: dict[str, Any], gpu_index: int) -> list[str]:
    return [str(e["fault"]) for e in state.get("validation_faults") or [] if e.get("gpu") == gpu_index]
