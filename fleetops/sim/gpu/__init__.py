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

The node's HCAs (``fabric``): a sysfs tree beside the state file (``<state>.sys``) with eight
NDR InfiniBand ports and an Ethernet management port, which the agent reads as a node's
``/sys``; the ``ib-*`` faults change it (see ``sim/gpu/fabric.py``).

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

Workloads (``workloads``): a simulated job's GPUs and cgroup as its profile makes them
(``steady``, ``input-bound``, ``straggler``, ``nvlink-unused``, ``cpu-starved``), overlaid on each
snapshot as the condition faults are, deterministic from the job's seed and the time since it
began; ``set_workload`` records one, ``advance_cgroups`` writes each job's ``cpu.stat``. A GPU
without a workload looks as it always did.

The default scenario is an 8x H200 HGX node modelled on the real H200 captured in
``tests/fixtures/h200``: same driver, VBIOS, InfoROM, limits, thresholds and the counts a healthy
GPU shows (lifetime corrected ECC, two remapped rows), with 18 NVLinks per GPU through NVSwitch
where that passthrough VM reported NVLink as Not Supported.

The package (``from fleetops.sim import gpu as sim``; every name below is ``sim.X``): ``base``
(defaults, fault names, shared rules), ``statefile``, ``traffic`` (NVLink counters), ``mig``,
``validation``, ``fabric`` (the HCAs' sysfs tree), ``workloads`` (simulated jobs' telemetry), ``snapshot``, ``ops`` (setters, resets, processes, services, reboot), ``faults``
(inject and clear), ``state`` (a node from a scenario) and ``slurm`` (the node's gres.conf, the
driver's mig-minors table and its jobs' cgroups, in its run folder), each importing only those
before it. A scenario's ``gpu_minor_numbers`` gives each GPU its device minor (default: its index).
"""

from __future__ import annotations

from fleetops.sim.gpu.base import (
    CLOCK_FIELDS,
    CONDITION_FAULTS,
    CRC_STORM_BASE,
    CRC_STORM_PER_MIN,
    DEFAULT_GPU,
    DEFAULT_NODE,
    DEFAULT_UPTIME_S,
    FABRIC_FAULTS,
    FAULT_NAMES,
    GPU_IS_LOST,
    HGX_BUSES,
    IDLE_FAULT_LOAD_PCT,
    LINK_FAULT_LINK,
    LOST_FAULTS,
    LOST_GPU_KNOWN,
    MIG_NEEDS_RESET_FIELD,
    MIG_SNAPSHOT_KEYS,
    NODE_EVENTS,
    NODE_FAULTS,
    NVLINK_KIB_PER_S_FULL,
    NVLINK_START_KIB_MAX,
    NVLINK_START_KIB_MIN,
    NVLINK_START_STEP_KIB,
    NVML_BUILD_BRANCHES,
    PRIVATE_GPU_KEYS,
    REPLAY_STORM_BASE,
    REPLAY_STORM_PER_MIN,
    RESET_CLEARS,
    RESET_DURATION_FIELD,
    RESET_KEEPS,
    RESETTING_FIELD,
    SBE_STORM_BASE,
    SBE_STORM_PER_MIN,
    SETTING_FAULTS,
    STATE_ENV,
    STATE_VERSION,
    STEADY_PROBE_S,
    STRAY_PID,
    STRAY_USER,
    VALIDATION_FAULTS,
    WORKLOAD_KEY,
    WORKLOAD_NVLINK_PCT,
    XID_TEXT,
    SimError,
    check_fault_name,
    digest,
    logs_code,
    lost_reason,
    require_present,
    retire_setting_fault,
)
from fleetops.sim.gpu.fabric import (
    section as fabric_section,
)
from fleetops.sim.gpu.fabric import (
    sync_tree as sync_fabric_tree,
)
from fleetops.sim.gpu.fabric import (
    sys_root as fabric_sys_root,
)
from fleetops.sim.gpu.faults import (
    clear,
    clear_from,
    inject,
    inject_into,
)
from fleetops.sim.gpu.mig import (
    MIG_PROFILES,
    create_compute_instance,
    create_gpu_instance,
    destroy_gpu_instance,
    mig_profile_rows,
    mig_reset,
    mig_table,
    set_mig_instances,
    set_mig_mode,
)
from fleetops.sim.gpu.ops import (
    add_process,
    end_process,
    find_gpu,
    gpu_position,
    gpu_processes,
    reboot,
    reset_duration_s,
    reset_gpu,
    set_reset_duration,
    set_service,
)
from fleetops.sim.gpu.slurm import (
    gres_devices,
    job_cgroup,
    make_job_cgroup,
    remove_job_cgroup,
    write_slurm_files,
)
from fleetops.sim.gpu.snapshot import (
    driver_branch_of,
    lost_gpu,
    snapshot,
    steady,
)
from fleetops.sim.gpu.state import (
    build_state,
    init_state,
    load_scenario,
)
from fleetops.sim.gpu.statefile import (
    append_kmsg,
    device_prefix,
    in_use_message,
    kmsg_path,
    locked_state,
    make_devices,
    open_device,
    parse_state,
    printk_uptime,
    read_state,
    read_state_text,
    run_dir,
    write_state,
)
from fleetops.sim.gpu.traffic import (
    fold_traffic,
    link_start_kib,
    months_of_traffic,
    nvlink_rows,
    set_load,
    thaw_link,
    traffic_kib,
    uptime_s,
)
from fleetops.sim.gpu.validation import (
    clear_validation,
    inject_validation_fault,
    set_validation_noise,
    validation_faults,
)
from fleetops.sim.gpu.workloads import (
    JOBS_KEY,
    PROFILES,
    SAMPLE_KEY,
    advance_cgroup,
    advance_cgroups,
    cgroup_dir,
    cpu_usage_usec,
    job_gpus,
    set_job_workload,
    set_workload,
    straggler_uuid,
)

__all__ = [
    "gres_devices",
    "job_cgroup",
    "make_job_cgroup",
    "remove_job_cgroup",
    "run_dir",
    "write_slurm_files",
    "CLOCK_FIELDS",
    "CONDITION_FAULTS",
    "CRC_STORM_BASE",
    "CRC_STORM_PER_MIN",
    "DEFAULT_GPU",
    "DEFAULT_NODE",
    "DEFAULT_UPTIME_S",
    "FABRIC_FAULTS",
    "FAULT_NAMES",
    "GPU_IS_LOST",
    "HGX_BUSES",
    "IDLE_FAULT_LOAD_PCT",
    "JOBS_KEY",
    "LINK_FAULT_LINK",
    "LOST_FAULTS",
    "LOST_GPU_KNOWN",
    "MIG_NEEDS_RESET_FIELD",
    "MIG_PROFILES",
    "MIG_SNAPSHOT_KEYS",
    "NODE_EVENTS",
    "NODE_FAULTS",
    "NVLINK_KIB_PER_S_FULL",
    "NVLINK_START_KIB_MAX",
    "NVLINK_START_KIB_MIN",
    "NVLINK_START_STEP_KIB",
    "NVML_BUILD_BRANCHES",
    "PRIVATE_GPU_KEYS",
    "PROFILES",
    "REPLAY_STORM_BASE",
    "REPLAY_STORM_PER_MIN",
    "RESETTING_FIELD",
    "RESET_CLEARS",
    "RESET_DURATION_FIELD",
    "RESET_KEEPS",
    "SAMPLE_KEY",
    "SBE_STORM_BASE",
    "SBE_STORM_PER_MIN",
    "SETTING_FAULTS",
    "STATE_ENV",
    "STATE_VERSION",
    "STEADY_PROBE_S",
    "STRAY_PID",
    "STRAY_USER",
    "SimError",
    "VALIDATION_FAULTS",
    "WORKLOAD_KEY",
    "WORKLOAD_NVLINK_PCT",
    "XID_TEXT",
    "add_process",
    "advance_cgroup",
    "advance_cgroups",
    "append_kmsg",
    "build_state",
    "cgroup_dir",
    "check_fault_name",
    "clear",
    "clear_from",
    "clear_validation",
    "cpu_usage_usec",
    "create_compute_instance",
    "create_gpu_instance",
    "destroy_gpu_instance",
    "device_prefix",
    "digest",
    "driver_branch_of",
    "end_process",
    "fabric_section",
    "fabric_sys_root",
    "find_gpu",
    "fold_traffic",
    "gpu_position",
    "gpu_processes",
    "in_use_message",
    "init_state",
    "inject",
    "inject_into",
    "inject_validation_fault",
    "job_gpus",
    "kmsg_path",
    "link_start_kib",
    "load_scenario",
    "locked_state",
    "logs_code",
    "lost_gpu",
    "lost_reason",
    "make_devices",
    "mig_profile_rows",
    "mig_reset",
    "mig_table",
    "months_of_traffic",
    "nvlink_rows",
    "open_device",
    "parse_state",
    "printk_uptime",
    "read_state",
    "read_state_text",
    "reboot",
    "require_present",
    "reset_duration_s",
    "reset_gpu",
    "retire_setting_fault",
    "set_job_workload",
    "set_load",
    "set_mig_instances",
    "set_mig_mode",
    "set_reset_duration",
    "set_service",
    "set_validation_noise",
    "set_workload",
    "snapshot",
    "steady",
    "straggler_uuid",
    "sync_fabric_tree",
    "thaw_link",
    "traffic_kib",
    "uptime_s",
    "validation_faults",
    "write_state",
]
