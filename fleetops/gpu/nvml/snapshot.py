"""The NVML backend: fill a ``model.Node`` from the driver through nvidia-ml-py (``pynvml``).

``collect_into(node)`` is the only entry point. It fills the node's driver/CUDA/NVML versions
and driver branch (``nvmlSystemGetDriverBranch``, where the driver and binding have it),
``gpu_count``, one ``model.Gpu`` per enumerated GPU and ``node.topology``.

Rules this module keeps:

- Every NVML call goes through ``Nvml.call``, which never raises: it answers ``(value, None)``
  or ``(None, reason)`` where ``reason`` is the NVML error name without its prefix
  (``"NotSupported"``, ``"NoPermission"``, ``"GpuIsLost"``, ``"Unknown"`` ...). A value that
  cannot be read stays ``None`` and its field name goes into the owning object's
  ``unavailable`` map with that reason (see ``fleetops.model``).
- ``GpuIsLost`` on a GPU marks it lost: its remaining calls are not made and every field not
  yet read gets the reason ``"GpuIsLost"``. Other GPUs are collected as usual.
- A failing ``nvmlInit`` (no driver, no library) raises ``NvmlUnavailable`` naming the reason
  (``gpu.nvml.node.build`` turns it into ``gpu.node.SnapshotError``, the agent's ``CollectError``).
- Scalar counters are read with ONE ``nvmlDeviceGetFieldValues`` call per GPU (memory
  temperature, ECC totals, remapped rows, PCIe replays, NVLink link count and error totals,
  recovery action); each returned field's own ``nvmlReturn`` is checked. Where a field fails
  for a reason other than NotSupported/GpuIsLost, the classic getter is tried instead.
- NVLink: when link 0 answers NotSupported the GPU's ``nvlinks`` is ``None`` with that reason
  and no other link is asked. Links are walked up to the link count the field call reported
  (18 on H100/H200), else up to ``NVML_NVLINK_MAX_LINKS`` stopping at the first link that does
  not exist. Per-link error counters are read only when the GPU-wide total is non-zero or
  unknown: a zero total means every link's counter is zero. Per-link TX/RX data counters
  (KiB) and the per-link error counters come from one more field-values call per GPU with
  ``scopeId`` = link id (the fields the daemon samples); the error-counter getter is used only
  for a counter whose field does not answer.
- Kept out on purpose, each slower than what it would give (figures: bench/RESULTS.md):
  ``nvmlDeviceGetInforomConfigurationChecksum``, ``nvmlDeviceGetCpuAffinity`` while sysfs
  answers (sysfs ``local_cpulist`` is the same list, for a file read), and ``nvmlShutdown``
  (the process exit releases NVML, and a long-running caller keeps NVML initialised for its
  next snapshot, nvmlInit being reference-counted).
- NUMA node: ``nvmlDeviceGetNumaNodeId``; where NVML does not support it (x86 hosts,
  passthrough VMs) the PCI device's ``numa_node`` from sysfs, when that is not -1.
- Memory used/total: ``nvmlDeviceGetMemoryInfo`` v2, which keeps driver-reserved memory out
  of "used" as nvidia-smi does (v1 counts that memory as used, on an idle GPU too).
- ``pynvml`` is imported inside functions only: importing this module costs nothing.

Set ``FLEETOPS_NVML_TRACE=1`` to get each NVML call's time on stderr (profiling aid).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from fleetops import model
from fleetops.catalog import throttle
from fleetops.gpu import holders
from fleetops.gpu.nvml.core import LOST, GpuReader, Nvml, NvmlUnavailable, as_text, field_value, instance_id
from fleetops.gpu.nvml.mig import read_mig
from fleetops.gpu.nvml.topology import node_topology, read_affinity, read_fabric, read_nvlinks

PROC = "/proc"  # tests point this elsewhere

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}

# Gpu field (or private key) -> NVML field-id constant name, read in one FieldValues call.
FIELD_IDS: tuple[tuple[str, str], ...] = (
    ("temp_memory_c", "NVML_FI_DEV_MEMORY_TEMP"),
    ("ecc_corrected_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_uncorrected_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("ecc_corrected_aggregate", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    ("ecc_uncorrected_aggregate", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    ("remapped_rows_corrected", "NVML_FI_DEV_REMAPPED_COR"),
    ("remapped_rows_uncorrected", "NVML_FI_DEV_REMAPPED_UNC"),
    ("remapped_rows_pending", "NVML_FI_DEV_REMAPPED_PENDING"),
    ("remapped_rows_failure", "NVML_FI_DEV_REMAPPED_FAILURE"),
    ("pcie_replay_counter", "NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    ("_nvlink_count", "NVML_FI_DEV_NVLINK_LINK_COUNT"),
    ("_nvlink_crc_total", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("_nvlink_replay_total", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("_nvlink_recovery_total", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
)
_MIB = 1024 * 1024
_IDENTITY = ("index", "uuid", "bus_id", "unavailable")
# Filled by the agent's collector from the node, not from NVML: the reason says where it comes from.
_NOT_FROM_NVML = {"last_reset_at": "not from NVML: the agent's reset journal"}


def collect_into(node: model.Node, *, initialised: bool = False, shutdown: bool = False) -> None:
    """Fill ``node`` from NVML. Raises ``NvmlUnavailable`` only when NVML cannot start at all.

    ``initialised``: the caller holds NVML initialised (the daemon), so no ``nvmlInit`` is made
    here: every ``nvmlInit`` is counted and holds the device files until its own
    ``nvmlShutdown``, and a daemon that initialised once per snapshot could never let go of
    them. ``shutdown``: ``nvmlShutdown`` before returning, for a caller that must hold no device
    file afterwards (the reset). A cold collect does neither: the process's exit releases NVML,
    and the shutdown costs time (bench/RESULTS.md)."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"NVML backend: nvidia-ml-py is not installed ({exc})") from exc
    nv = Nvml(pynvml, trace=bool(os.environ.get("FLEETOPS_NVML_TRACE")))
    if not initialised:
        _, reason = nv.call("nvmlInit")
        if reason is not None:
            raise NvmlUnavailable(f"NVML initialisation failed: {reason}")
    try:
        _collect(nv, node)
    finally:
        if shutdown and not initialised:
            nv.call("nvmlShutdown")
        if nv.trace is not None:
            _print_trace(nv.trace)


def _print_trace(trace: list[tuple[float, str]]) -> None:
    totals: dict[str, list[float]] = {}
    for ms, name in trace:
        totals.setdefault(name, []).append(ms)
    rows = sorted(totals.items(), key=lambda kv: -sum(kv[1]))
    sys.stderr.write(f"nvml trace: {len(trace)} calls, {sum(ms for ms, _ in trace):.2f} ms\n")
    for name, times in rows:
        sys.stderr.write(f"  {sum(times):8.3f} ms  {len(times):4d}x  {name}\n")


def _collect(nv: Nvml, node: model.Node) -> None:
    value, reason = nv.call("nvmlSystemGetDriverVersion")
    _set_node(node, "driver_version", as_text(value) if reason is None else None, reason)
    # Newer drivers and bindings only: elsewhere the call is missing (FunctionNotFound, or not
    # in this nvidia-ml-py), which is recorded like any unreadable value and fails nothing.
    value, reason = nv.call("nvmlSystemGetDriverBranch")
    branch = _branch_text(value) if reason is None else None
    if reason is None and branch is None:
        reason = "empty answer"
    _set_node(node, "driver_branch", branch, reason)
    value, reason = nv.call("nvmlSystemGetNVMLVersion")
    _set_node(node, "nvml_version", as_text(value) if reason is None else None, reason)
    value, reason = nv.call("nvmlSystemGetCudaDriverVersion_v2")
    if reason is not None:  # older drivers have only the first version
        value, reason = nv.call("nvmlSystemGetCudaDriverVersion")
    _set_node(node, "cuda_driver_version", cuda_version(value) if reason is None else None, reason)

    count, reason = nv.call("nvmlDeviceGetCount")
    if reason is not None:
        _set_node(node, "gpu_count", None, reason)
        node.gpus = []
        node.topology = None
        node.unavailable["topology"] = reason
        return
    node.gpu_count = count
    readers: list[GpuReader] = []
    for index in range(count):
        reader = _open_gpu(nv, node, index)
        if reader is not None:
            readers.append(reader)
    _read_all(readers)
    node.gpus = [r.gpu for r in readers]
    for reader in readers:
        node.errors.extend(reader.errors)
    node.topology = node_topology(nv, readers)


def _set_node(node: model.Node, name: str, value: Any, reason: str | None) -> None:
    setattr(node, name, value)
    if reason is not None:
        node.unavailable[name] = reason


def _branch_text(info: Any) -> str | None:
    """nvmlSystemGetDriverBranch answers a structure whose ``branch`` holds the text."""
    text = as_text(getattr(info, "branch", info))
    return text or None


def cuda_version(value: int) -> str:
    """NVML's 13000 -> "13.0", 12080 -> "12.8"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _open_gpu(nv: Nvml, node: model.Node, index: int) -> GpuReader | None:
    """Handle, bus id and UUID. Without a handle or a bus id a GPU cannot be named, so it goes to
    node.errors (``gpu_count`` still counts it, and the others keep their indices). A GPU whose
    UUID answers GpuIsLost is named by its bus id and kept at its index, lost."""
    handle, reason = nv.call("nvmlDeviceGetHandleByIndex", index)
    if reason is not None:
        node.errors.append(f"GPU index {index}: nvmlDeviceGetHandleByIndex: {reason}")
        return None
    pci, reason = nv.call("nvmlDeviceGetPciInfo_v3", handle)
    bus_id = None
    if reason is None:
        try:
            bus_id = model.normalize_bus_id(as_text(pci.busId))
        except (ValueError, AttributeError) as exc:
            reason = f"bad bus id: {exc}"
    if bus_id is None:
        node.errors.append(f"GPU index {index}: PCI bus id unreadable: {reason}")
        return None
    uuid, reason = nv.call("nvmlDeviceGetUUID", handle)
    if reason == LOST:
        # fallen off the bus: it keeps its index and its bus id names it; its UUID stays empty,
        # with the reason, and no more calls are made on it
        gpu = model.Gpu(index=index, uuid="", bus_id=bus_id, unavailable={"uuid": LOST})
        reader = GpuReader(nv, gpu, handle)
        reader.lost = True
        return reader
    if reason is not None:
        node.errors.append(f"GPU index {index} ({bus_id}): UUID unreadable: {reason}")
        return None
    gpu = model.Gpu(index=index, uuid=as_text(uuid), bus_id=bus_id)
    return GpuReader(nv, gpu, handle)


# --- one GPU -------------------------------------------------------------------------------


def _read_counters(r: GpuReader) -> None:
    N = r.nv.N
    fields = _read_fields(r)
    _read_ecc_memory(r, N, fields)
    _read_pcie_replay(r, fields)
    read_nvlinks(r, N, fields)


def _read_modes(r: GpuReader) -> None:
    _read_pcie(r)
    read_mig(r, r.nv.N)
    _read_processes(r)


def _read_placement(r: GpuReader) -> None:
    read_fabric(r, r.nv.N)
    read_affinity(r, r.nv.N)


SECTIONS: tuple[Callable[[GpuReader], None], ...] = (
    lambda r: _read_identity(r),
    lambda r: _read_power_thermal(r, r.nv.N),
    lambda r: _read_clocks_util(r, r.nv.N),
    lambda r: _read_counters(r),
    lambda r: _read_modes(r),
    lambda r: _read_placement(r),
)


def _read_all(readers: list[GpuReader]) -> None:
    """Read every GPU, one call after another.

    Reading in threads was tried and dropped: the driver serialises the calls, so each one
    waited for the others and the whole collection got slower (bench/RESULTS.md)."""
    for r in readers:
        r.read("name", "nvmlDeviceGetName", conv=as_text)
        if not r.lost:
            for section in SECTIONS:
                _guarded(section, r)
        _finish_gpu(r)


def _guarded(section: Callable[[GpuReader], None], r: GpuReader) -> None:
    try:
        section(r)
    except Exception as exc:  # noqa: BLE001
        r.errors.append(f"GPU {r.gpu.index} ({r.gpu.bus_id}): {type(exc).__name__}: {exc}")


def _finish_gpu(r: GpuReader) -> None:
    gpu = r.gpu
    # Every field not read and not explained gets a reason, so None never goes unexplained;
    # reasons are listed in field order whatever order the threads finished in.
    order = list(model.Gpu.__dataclass_fields__)
    for name in order:
        if name in _IDENTITY or getattr(gpu, name) is not None or name in gpu.unavailable:
            continue
        gpu.unavailable[name] = LOST if r.lost else _NOT_FROM_NVML.get(name, "not collected")
    rank = {name: i for i, name in enumerate(order)}
    gpu.unavailable = dict(sorted(gpu.unavailable.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def _read_identity(r: GpuReader) -> None:
    N = r.nv.N
    r.read("serial", "nvmlDeviceGetSerial", conv=as_text)
    r.read("minor_number", "nvmlDeviceGetMinorNumber", conv=int)
    r.read("board_part_number", "nvmlDeviceGetBoardPartNumber", conv=as_text)
    r.read("vbios_version", "nvmlDeviceGetVbiosVersion", conv=as_text)
    r.read("inforom_image", "nvmlDeviceGetInforomImageVersion", conv=as_text)
    r.read("inforom_oem", "nvmlDeviceGetInforomVersion", N.NVML_INFOROM_OEM, conv=as_text)
    r.read("gsp_firmware", "nvmlDeviceGetGspFirmwareVersion", conv=as_text)
    r.read("persistence_mode", "nvmlDeviceGetPersistenceMode", conv=bool)
    r.read("compute_mode", "nvmlDeviceGetComputeMode", conv=lambda v: COMPUTE_MODES.get(v, f"unknown_{v}"))


def _watts(milliwatts: Any) -> float:
    watts: float = round(milliwatts / 1000.0, 3)
    return watts


def _read_power_thermal(r: GpuReader, N: Any) -> None:
    r.read("power_draw_w", "nvmlDeviceGetPowerUsage", conv=_watts)
    r.read("power_limit_w", "nvmlDeviceGetPowerManagementLimit", conv=_watts)
    r.read("power_default_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit", conv=_watts)
    value, reason = r.call("nvmlDeviceGetPowerManagementLimitConstraints")
    if reason is None:
        r.gpu.power_min_limit_w, r.gpu.power_max_limit_w = _watts(value[0]), _watts(value[1])
    else:
        r.miss("power_min_limit_w", reason)
        r.miss("power_max_limit_w", reason)
    r.read("power_enforced_limit_w", "nvmlDeviceGetEnforcedPowerLimit", conv=_watts)

    gpu_sensor = N.NVML_TEMPERATURE_GPU
    value, reason = r.call("nvmlDeviceGetTemperatureV", gpu_sensor)
    if reason is not None and reason != LOST:  # older driver or binding: the classic getter
        value, reason = r.call("nvmlDeviceGetTemperature", gpu_sensor)
    if reason is None:
        r.gpu.temp_gpu_c = float(value)
    else:
        r.miss("temp_gpu_c", reason)
    r.read(
        "temp_slowdown_c",
        "nvmlDeviceGetTemperatureThreshold",
        N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        conv=float,
    )
    r.read(
        "temp_shutdown_c",
        "nvmlDeviceGetTemperatureThreshold",
        N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
        conv=float,
    )
    r.read(
        "temp_memory_max_c",
        "nvmlDeviceGetTemperatureThreshold",
        N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX,
        conv=float,
    )


def _read_clocks_util(r: GpuReader, N: Any) -> None:
    r.read("clock_sm_mhz", "nvmlDeviceGetClockInfo", N.NVML_CLOCK_SM, conv=int)
    r.read("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_SM, conv=int)
    r.read("clock_mem_mhz", "nvmlDeviceGetClockInfo", N.NVML_CLOCK_MEM, conv=int)
    r.read("clock_mem_max_mhz", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_MEM, conv=int)
    getter = "nvmlDeviceGetCurrentClocksEventReasons"
    if not hasattr(N, getter):
        getter = "nvmlDeviceGetCurrentClocksThrottleReasons"
    mask = r.read("clocks_event_mask", getter, conv=int)
    if mask is not None:
        r.gpu.clocks_event_reasons = throttle.decode(mask)
    else:
        r.miss("clocks_event_reasons", r.gpu.unavailable["clocks_event_mask"])
    value, reason = r.call("nvmlDeviceGetUtilizationRates")
    if reason is None:
        r.gpu.utilization_gpu_pct, r.gpu.utilization_mem_pct = int(value.gpu), int(value.memory)
    else:
        r.miss("utilization_gpu_pct", reason)
        r.miss("utilization_mem_pct", reason)


def _read_fields(r: GpuReader) -> dict[str, tuple[Any, str | None]]:
    """One nvmlDeviceGetFieldValues call; answers key -> (value, reason) for every FIELD_IDS key."""
    nv = r.nv
    wanted: list[tuple[str, int]] = []
    out: dict[str, tuple[Any, str | None]] = {}
    for key, const in FIELD_IDS:
        fid = nv.const(const)
        if fid is None:
            out[key] = (None, f"{const} not in this nvidia-ml-py")
        else:
            wanted.append((key, fid))
    if not wanted:
        return out
    values, reason = r.call("nvmlDeviceGetFieldValues", [fid for _, fid in wanted])
    if reason is not None:
        for key, _ in wanted:
            out[key] = (None, reason)
        return out
    for (key, _), fv in zip(wanted, values, strict=False):
        ret = fv.nvmlReturn
        if ret == 0:
            out[key] = (field_value(fv), None)
        else:
            out[key] = (None, nv.reason_code(ret))
            if ret == nv.const("NVML_ERROR_GPU_IS_LOST", 15):
                r.lost = True
    return out


def _apply_field(
    r: GpuReader, fields: dict[str, tuple[Any, str | None]], key: str, conv: Callable[[Any], Any]
) -> bool:
    value, reason = fields[key]
    if reason is None:
        setattr(r.gpu, key, conv(value))
        return True
    r.miss(key, reason)
    return False


def _retry(reason: str | None) -> bool:
    """A field failed: is the classic getter worth a try?"""
    return reason not in (None, "NotSupported", LOST)


def _read_ecc_memory(r: GpuReader, N: Any, fields: dict[str, tuple[Any, str | None]]) -> None:
    gpu = r.gpu
    _apply_field(r, fields, "temp_memory_c", float)

    # v2 counts driver-reserved memory apart from "used", as nvidia-smi shows it (v1 counts
    # it as used, on an idle GPU too); v1 where the driver or binding lacks v2.
    version = getattr(N, "nvmlMemory_v2", None)
    value, reason = r.call("nvmlDeviceGetMemoryInfo", version) if version else (None, "no v2")
    if reason is not None and reason != LOST:
        value, reason = r.call("nvmlDeviceGetMemoryInfo")
    if reason is None and value is not None:
        gpu.memory_used_mib, gpu.memory_total_mib = int(value.used) // _MIB, int(value.total) // _MIB
    else:
        r.miss("memory_used_mib", reason or "Unknown")
        r.miss("memory_total_mib", reason or "Unknown")

    value, reason = r.call("nvmlDeviceGetEccMode")
    if reason is None:
        gpu.ecc_mode_current, gpu.ecc_mode_pending = bool(value[0]), bool(value[1])
    else:
        r.miss("ecc_mode_current", reason)
        r.miss("ecc_mode_pending", reason)

    ecc = (
        ("ecc_corrected_volatile", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
        ("ecc_uncorrected_volatile", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        ("ecc_corrected_aggregate", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
        ("ecc_uncorrected_aggregate", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
    )
    for key, err_type, counter in ecc:
        if not _apply_field(r, fields, key, int) and _retry(fields[key][1]):
            r.gpu.unavailable.pop(key, None)
            r.read(key, "nvmlDeviceGetTotalEccErrors", getattr(N, err_type), getattr(N, counter), conv=int)

    remap = (
        "remapped_rows_corrected",
        "remapped_rows_uncorrected",
        "remapped_rows_pending",
        "remapped_rows_failure",
    )
    convs = (int, int, bool, bool)
    ok = [_apply_field(r, fields, key, conv) for key, conv in zip(remap, convs, strict=True)]
    if not all(ok) and any(_retry(fields[key][1]) for key in remap):
        value, reason = r.call("nvmlDeviceGetRemappedRows")
        if reason is None:
            for key, conv, v in zip(remap, convs, value, strict=False):
                setattr(gpu, key, conv(v))
                gpu.unavailable.pop(key, None)
        else:
            for key in remap:
                r.miss(key, reason)

    # Page retirement: Hopper answers NotSupported (it remaps rows instead); ask the cheap
    # pending status first and skip the two page lists when it is not supported.
    value, reason = r.call("nvmlDeviceGetRetiredPagesPendingStatus")
    if reason is not None:
        for key in ("retired_pages_pending", "retired_pages_sbe", "retired_pages_dbe"):
            r.miss(key, reason)
    else:
        gpu.retired_pages_pending = bool(value)
        r.read(
            "retired_pages_sbe",
            "nvmlDeviceGetRetiredPages",
            N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            conv=len,
        )
        r.read(
            "retired_pages_dbe",
            "nvmlDeviceGetRetiredPages",
            N.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            conv=len,
        )

    value, reason = fields["recovery_action"]
    if reason is None:
        gpu.recovery_action = RECOVERY_ACTIONS.get(int(value), f"unknown_{int(value)}")
    else:
        r.miss("recovery_action", reason)


def _read_pcie(r: GpuReader) -> None:
    r.read("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", conv=int)
    r.read("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", conv=int)
    r.read("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth", conv=int)
    r.read("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", conv=int)


def _read_pcie_replay(r: GpuReader, fields: dict[str, tuple[Any, str | None]]) -> None:
    if not _apply_field(r, fields, "pcie_replay_counter", int) and _retry(fields["pcie_replay_counter"][1]):
        r.gpu.unavailable.pop("pcie_replay_counter", None)
        r.read("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter", conv=int)


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"{PROC}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _read_processes(r: GpuReader) -> None:
    value, reason = r.call("nvmlDeviceGetComputeRunningProcesses")
    if reason is not None:
        r.miss("processes", reason)
        return
    procs = []
    for p in value:
        used = getattr(p, "usedGpuMemory", None)
        procs.append(
            model.GpuProcess(
                pid=int(p.pid),
                name=_proc_name(int(p.pid)),
                used_memory_mib=int(used) // _MIB if used is not None else None,
                gpu_instance_id=instance_id(getattr(p, "gpuInstanceId", None)),
                compute_instance_id=instance_id(getattr(p, "computeInstanceId", None)),
                user=holders.process_user(int(p.pid), PROC),
            )
        )
    r.gpu.processes = procs
