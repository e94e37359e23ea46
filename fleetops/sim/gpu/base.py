"""The simulated node's vocabulary: the default H200 node and GPU, the fault names and what each
changes, the constants every part shares, ``SimError``, and the small rules the others apply
(a lost GPU refuses work, which fault logs which XID, a setter retiring its fault)."""

from __future__ import annotations

from typing import Any

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


# The node's HCAs (sim/gpu/fabric.py): each takes the HCA beside ``--gpu N`` (mlx5_N).
FABRIC_FAULTS = (
    "ib-port-down",
    "ib-degraded",
    "ib-flap",
    "ib-symbol-errors",
    "ib-link-downed",
    "ib-fw-drift",
    "ib-missing-hca",
)


FAULT_NAMES = tuple(SETTING_FAULTS) + CONDITION_FAULTS + FABRIC_FAULTS


NODE_FAULTS = ("driver-drift", "gpu-missing")  # gpu-missing takes --gpu, default the last one


# Events rather than faults: nothing is left to clear. ``reboot``: see ``reboot``.
NODE_EVENTS = ("reboot",)


SBE_STORM_BASE, SBE_STORM_PER_MIN = 120_000, 20_000


REPLAY_STORM_BASE, REPLAY_STORM_PER_MIN = 400, 600


CRC_STORM_BASE, CRC_STORM_PER_MIN = 5_000, 3_000


STRAY_PID = 48213
STRAY_USER = "svc-train"  # the stray process's owner: a training job's service account


def stray_process() -> dict[str, Any]:
    """The ``stray-process`` fault's compute process, as the snapshot lists it."""
    return {"pid": STRAY_PID, "name": "python3 train.py", "used_memory_mib": 20480, "user": STRAY_USER}


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


def digest(*parts: object) -> str:
    import hashlib  # only when a state is built, not on every collect

    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


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


def logs_code(name: str) -> int | None:
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


GPU_IS_LOST = "GpuIsLost"  # = model.GPU_IS_LOST, the reason NVML's collector records


# What NVML still gives for a GPU that fell off the bus: its index (nvmlDeviceGetHandleByIndex
# keeps the handle), and the PCI bus id and UUID the driver attached it with.
LOST_GPU_KNOWN = ("index", "uuid", "bus_id")


# The build branch NVML names for drivers seen on real GPUs (nvmlSystemGetDriverBranch on the
# lent H200, tests/fixtures/h200/README.md): not the version's major number.
NVML_BUILD_BRANCHES = {"580.159.04": "r582_49"}


STEADY_PROBE_S = 3600.0


# How long a simulated ``nvidia-smi -r`` keeps the GPU away: the node's ``reset_duration_s``
# (seconds, default 0). A real reset takes seconds to minutes; tests set it to watch a reset in
# progress (a second action refused by the lock, a signal during the reset phase).
RESET_DURATION_FIELD = "reset_duration_s"


# The UUID of the GPU a simulated reset has away right now (set only while a reset with a duration runs).
RESETTING_FIELD = "resetting"


RESET_CLEARS = ("ecc-dbe", "ecc-sbe-storm", "row-remap-pending", "nvlink-crc-storm", "pcie-replay-storm")


# nvlink-idle is kept: a link that trains up but carries nothing points at the fabric (routing,
# Fabric Manager, the NVSwitch side), which a GPU reset does not touch; clearing it on reset
# would let a remediation look successful without evidence.
RESET_KEEPS = ("row-remap-failure", "pcie-downgrade", "nvlink-down", "nvlink-idle", "thermal-slowdown", "power-brake")


LOST_FAULTS = ("xid:79", "gpu-missing")


CLOCK_FIELDS = ("clock_sm_mhz", "clock_mem_mhz", "clocks_event_mask")


# Stored per GPU for the simulator's own bookkeeping; never part of a snapshot.
PRIVATE_GPU_KEYS = ("nvlink_count", "nvlink_traffic", "nvlink_missed_kib", "nvlink_start_kib", "workload")


# A simulated job's workload on a GPU (``sim/gpu/workloads.py``): the GPU's record of it.
WORKLOAD_KEY = "workload"


# The NVLink load (percentage of NVLINK_KIB_PER_S_FULL per link and direction) each workload
# profile drives while it runs, in place of the GPU's stored utilisation: constant per profile, so
# the counters stay a closed form of time (``traffic.traffic_kib``). nvlink-unused moves nothing.
WORKLOAD_NVLINK_PCT = {"steady": 55.0, "input-bound": 8.0, "straggler": 45.0, "nvlink-unused": 0.0, "cpu-starved": 25.0}


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


MIG_SNAPSHOT_KEYS = ("gpu_instance_id", "compute_instance_id", "profile", "uuid", "in_use")


# A node whose ``mig_mode_needs_reset`` is true keeps a MIG mode change pending until the GPU is
# reset (a passthrough VM, older parts); otherwise the change is current at once, as on Hopper.
MIG_NEEDS_RESET_FIELD = "mig_mode_needs_reset"


# --- active validation (fleetops-agent validate --backend sim) ---------------------------
# Degradations seen only by the validation workloads: they change no reported setting.
VALIDATION_FAULTS: dict[str, tuple[str, ...]] = {
    "slow-hbm": ("hbm_copy_gbps", "hbm_triad_gbps"),
    "slow-gemm": ("gemm_bf16_tflops", "gemm_fp8_tflops"),
    "slow-pcie": ("h2d_gbps", "d2h_gbps"),
    "slow-nvlink": ("p2p_gbps", "allreduce_busbw_gbps"),
    "noisy": (),
}
