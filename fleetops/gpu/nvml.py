"""The NVML backend: fill a ``model.Node`` from the driver through nvidia-ml-py (``pynvml``).

``collect_into(node)`` is the only entry point. It fills the node's driver/CUDA/NVML versions
and driver branch (``nvmlSystemGetDriverBranch``, where the driver and binding have it),
``gpu_count``, one ``model.Gpu`` per enumerated GPU and ``node.topology``.

Rules this module keeps:

- Every NVML call goes through ``_Nvml.call``, which never raises: it answers ``(value, None)``
  or ``(None, reason)`` where ``reason`` is the NVML error name without its prefix
  (``"NotSupported"``, ``"NoPermission"``, ``"GpuIsLost"``, ``"Unknown"`` ...). A value that
  cannot be read stays ``None`` and its field name goes into the owning object's
  ``unavailable`` map with that reason (see ``fleetops.model``).
- ``GpuIsLost`` on a GPU marks it lost: its remaining calls are not made and every field not
  yet read gets the reason ``"GpuIsLost"``. Other GPUs are collected as usual.
- A failing ``nvmlInit`` (no driver, no library) raises ``NvmlUnavailable`` naming the reason
  (the agent's collect turns it into its ``CollectError``; this layer imports nothing of the agent).
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

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetops import model
from fleetops.catalog import throttle

SYSFS_PCI = "/sys/bus/pci/devices"  # tests point this elsewhere
PROC = "/proc"

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
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
REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}
# nvmlDeviceGetTopologyCommonAncestor level -> nvidia-smi topo -m vocabulary
TOPO_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

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
# NvLink field -> (field-values total key, nvmlNvLinkErrorCounter constant name)
LINK_COUNTERS = (
    ("crc_errors", "_nvlink_crc_total", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("replay_errors", "_nvlink_replay_total", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "_nvlink_recovery_total", "NVML_NVLINK_ERROR_DL_RECOVERY"),
)
# NvLink field -> NVML field id read per link (scopeId = link id); KiB since the driver loaded.
LINK_TRAFFIC = (
    ("tx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    ("rx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
)
# The same per-link error counters as field ids, in the same call: where they answer, the
# snapshot and the daemon's ring (which samples these fields every tick) count alike; where
# they do not, LINK_COUNTERS' getter is used.
LINK_ERROR_FIELDS = (
    ("crc_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"),
    ("replay_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY"),
)
_MIB = 1024 * 1024
_IDENTITY = ("index", "uuid", "bus_id", "unavailable")
# Filled by the agent's collector from the node, not from NVML: the reason says where it comes from.
_NOT_FROM_NVML = {"last_reset_at": "not from NVML: the agent's reset journal"}
LOST = "GpuIsLost"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\x00").strip()
    return str(value).strip()


NVML_MODULE_ENV = "FLEETOPS_AGENT_NVML_MODULE"  # test hook: a module used in place of pynvml


def load_module() -> Any:
    """``pynvml``, or the module ``$FLEETOPS_AGENT_NVML_MODULE`` names (a test's fake NVML), which
    is then also ``sys.modules['pynvml']`` so every reader in this layer and the daemon's sees it."""
    name = os.environ.get(NVML_MODULE_ENV)
    if name:
        module = importlib.import_module(name)
        sys.modules["pynvml"] = module
        return module
    import pynvml

    return pynvml


def reason_of(exc: BaseException) -> str:
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return name[len("NVMLError_") :]
    value = getattr(exc, "value", None)
    if name == "NVMLError" and value is not None:
        return f"NVMLError{value}"
    return f"{name}: {exc}" if str(exc) else name


class _Nvml:
    """The one door to NVML: ``call`` answers (value, None) or (None, reason), never raises."""

    def __init__(self, module: Any, trace: bool = False) -> None:
        self.N = module
        self.trace: list[tuple[float, str]] | None = [] if trace else None

    def call(self, name: str, *args: Any) -> tuple[Any, str | None]:
        fn = getattr(self.N, name, None)
        if fn is None:
            return None, f"{name} not in this nvidia-ml-py"
        start = time.perf_counter() if self.trace is not None else 0.0
        try:
            value, reason = fn(*args), None
        except self.N.NVMLError as exc:
            value, reason = None, reason_of(exc)
        except Exception as exc:  # noqa: BLE001
            value, reason = None, reason_of(exc)
        if self.trace is not None:
            self.trace.append(((time.perf_counter() - start) * 1000.0, name))
        return value, reason

    def reason_code(self, code: int) -> str:
        # NVMLError(code) builds the code's own subclass (NVMLError_NotSupported, ...)
        try:
            name = type(self.N.NVMLError(code)).__name__
        except Exception:  # a binding without that behaviour: the plain code  # noqa: BLE001
            name = ""
        if name.startswith("NVMLError_"):
            return name[len("NVMLError_") :]
        return f"NVMLError{code}"

    def const(self, name: str, default: Any = None) -> Any:
        return getattr(self.N, name, default)


class _GpuReader:
    """Reads one GPU; after GpuIsLost it makes no more calls."""

    def __init__(self, nv: _Nvml, gpu: model.Gpu, handle: Any) -> None:
        self.nv = nv
        self.gpu = gpu
        self.handle = handle
        self.lost = False
        self.errors: list[str] = []  # collector bugs, copied to node.errors

    def call(self, name: str, *args: Any) -> tuple[Any, str | None]:
        if self.lost:
            return None, LOST
        value, reason = self.nv.call(name, self.handle, *args)
        if reason == LOST:
            self.lost = True
        return value, reason

    def read(self, field_name: str, name: str, *args: Any, conv: Callable[[Any], Any] | None = None) -> Any:
        value, reason = self.call(name, *args)
        if reason is not None:
            self.gpu.unavailable[field_name] = reason
            return None
        if conv is not None:
            value = conv(value)
        setattr(self.gpu, field_name, value)
        return value

    def miss(self, field_name: str, reason: str) -> None:
        setattr(self.gpu, field_name, None)
        self.gpu.unavailable[field_name] = reason


# --- entry point ---------------------------------------------------------------------------


class NvmlUnavailable(Exception):
    """NVML cannot start at all (no nvidia-ml-py, no driver, no library); the message says why."""


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
    nv = _Nvml(pynvml, trace=bool(os.environ.get("FLEETOPS_NVML_TRACE")))
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


def _collect(nv: _Nvml, node: model.Node) -> None:
    value, reason = nv.call("nvmlSystemGetDriverVersion")
    _set_node(node, "driver_version", _text(value) if reason is None else None, reason)
    # Newer drivers and bindings only: elsewhere the call is missing (FunctionNotFound, or not
    # in this nvidia-ml-py), which is recorded like any unreadable value and fails nothing.
    value, reason = nv.call("nvmlSystemGetDriverBranch")
    branch = _branch_text(value) if reason is None else None
    if reason is None and branch is None:
        reason = "empty answer"
    _set_node(node, "driver_branch", branch, reason)
    value, reason = nv.call("nvmlSystemGetNVMLVersion")
    _set_node(node, "nvml_version", _text(value) if reason is None else None, reason)
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
    readers: list[_GpuReader] = []
    for index in range(count):
        reader = _open_gpu(nv, node, index)
        if reader is not None:
            readers.append(reader)
    _read_all(readers)
    node.gpus = [r.gpu for r in readers]
    for reader in readers:
        node.errors.extend(reader.errors)
    node.topology = _topology(nv, readers)


def _set_node(node: model.Node, name: str, value: Any, reason: str | None) -> None:
    setattr(node, name, value)
    if reason is not None:
        node.unavailable[name] = reason


def _branch_text(info: Any) -> str | None:
    """nvmlSystemGetDriverBranch answers a structure whose ``branch`` holds the text."""
    text = _text(getattr(info, "branch", info))
    return text or None


def cuda_version(value: int) -> str:
    """NVML's 13000 -> "13.0", 12080 -> "12.8"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _open_gpu(nv: _Nvml, node: model.Node, index: int) -> _GpuReader | None:
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
            bus_id = model.normalize_bus_id(_text(pci.busId))
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
        reader = _GpuReader(nv, gpu, handle)
        reader.lost = True
        return reader
    if reason is not None:
        node.errors.append(f"GPU index {index} ({bus_id}): UUID unreadable: {reason}")
        return None
    gpu = model.Gpu(index=index, uuid=_text(uuid), bus_id=bus_id)
    return _GpuReader(nv, gpu, handle)


# --- one GPU -------------------------------------------------------------------------------


def _read_counters(r: _GpuReader) -> None:
    N = r.nv.N
    fields = _read_fields(r)
    _read_ecc_memory(r, N, fields)
    _read_pcie_replay(r, fields)
    _read_nvlinks(r, N, fields)


def _read_modes(r: _GpuReader) -> None:
    _read_pcie(r)
    _read_mig(r, r.nv.N)
    _read_processes(r)


def _read_placement(r: _GpuReader) -> None:
    _read_fabric(r, r.nv.N)
    _read_affinity(r, r.nv.N)


SECTIONS: tuple[Callable[[_GpuReader], None], ...] = (
    lambda r: _read_identity(r),
    lambda r: _read_power_thermal(r, r.nv.N),
    lambda r: _read_clocks_util(r, r.nv.N),
    lambda r: _read_counters(r),
    lambda r: _read_modes(r),
    lambda r: _read_placement(r),
)


def _read_all(readers: list[_GpuReader]) -> None:
    """Read every GPU, one call after another.

    Reading in threads was tried and dropped: the driver serialises the calls, so each one
    waited for the others and the whole collection got slower (bench/RESULTS.md)."""
    for r in readers:
        r.read("name", "nvmlDeviceGetName", conv=_text)
        if not r.lost:
            for section in SECTIONS:
                _guarded(section, r)
        _finish_gpu(r)


def _guarded(section: Callable[[_GpuReader], None], r: _GpuReader) -> None:
    try:
        section(r)
    except Exception as exc:  # noqa: BLE001
        r.errors.append(f"GPU {r.gpu.index} ({r.gpu.bus_id}): {type(exc).__name__}: {exc}")


def _finish_gpu(r: _GpuReader) -> None:
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


def _read_identity(r: _GpuReader) -> None:
    N = r.nv.N
    r.read("serial", "nvmlDeviceGetSerial", conv=_text)
    r.read("board_part_number", "nvmlDeviceGetBoardPartNumber", conv=_text)
    r.read("vbios_version", "nvmlDeviceGetVbiosVersion", conv=_text)
    r.read("inforom_image", "nvmlDeviceGetInforomImageVersion", conv=_text)
    r.read("inforom_oem", "nvmlDeviceGetInforomVersion", N.NVML_INFOROM_OEM, conv=_text)
    r.read("gsp_firmware", "nvmlDeviceGetGspFirmwareVersion", conv=_text)
    r.read("persistence_mode", "nvmlDeviceGetPersistenceMode", conv=bool)
    r.read("compute_mode", "nvmlDeviceGetComputeMode", conv=lambda v: COMPUTE_MODES.get(v, f"unknown_{v}"))


def _watts(milliwatts: Any) -> float:
    watts: float = round(milliwatts / 1000.0, 3)
    return watts


def _read_power_thermal(r: _GpuReader, N: Any) -> None:
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


def _read_clocks_util(r: _GpuReader, N: Any) -> None:
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


def field_value(fv: Any) -> Any:
    vt = fv.valueType
    v = fv.value
    if vt == 0:
        return v.dVal
    if vt == 1:
        return v.uiVal
    if vt == 2:
        return v.ulVal
    if vt == 3:
        return v.ullVal
    if vt == 4:
        return v.sllVal
    if vt == 5:
        return v.siVal
    if vt == 6:
        return v.usVal
    return v.ullVal


def _read_fields(r: _GpuReader) -> dict[str, tuple[Any, str | None]]:
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
    r: _GpuReader, fields: dict[str, tuple[Any, str | None]], key: str, conv: Callable[[Any], Any]
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


def _read_ecc_memory(r: _GpuReader, N: Any, fields: dict[str, tuple[Any, str | None]]) -> None:
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


def _read_pcie(r: _GpuReader) -> None:
    r.read("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", conv=int)
    r.read("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", conv=int)
    r.read("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth", conv=int)
    r.read("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", conv=int)


def _read_pcie_replay(r: _GpuReader, fields: dict[str, tuple[Any, str | None]]) -> None:
    if not _apply_field(r, fields, "pcie_replay_counter", int) and _retry(fields["pcie_replay_counter"][1]):
        r.gpu.unavailable.pop("pcie_replay_counter", None)
        r.read("pcie_replay_counter", "nvmlDeviceGetPcieReplayCounter", conv=int)


def _read_mig(r: _GpuReader, N: Any) -> None:
    gpu = r.gpu
    value, reason = r.call("nvmlDeviceGetMigMode")
    if reason is not None:
        r.miss("mig_mode_current", reason)
        r.miss("mig_mode_pending", reason)
        r.miss("mig_instances", reason)
        return
    gpu.mig_mode_current, gpu.mig_mode_pending = bool(value[0]), bool(value[1])
    if not gpu.mig_mode_current:
        r.miss("mig_instances", "MIG disabled")
        return
    instances, reason = _mig_instances(r, N)
    if reason is not None:
        r.miss("mig_instances", reason)
    else:
        gpu.mig_instances = instances


def _mig_instances(r: _GpuReader, N: Any) -> tuple[list[model.MigInstance] | None, str | None]:
    """GPU instances (with their profile names) and the compute instances inside them."""
    import ctypes

    profile_names: dict[int, str] = {}
    gpu_instances: dict[int, int] = {}  # GPU instance id -> profile id
    for profile in range(int(getattr(N, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        info, reason = r.call("nvmlDeviceGetGpuInstanceProfileInfo", profile)
        if reason == LOST:
            return None, LOST
        if reason is not None:
            continue  # this profile does not exist on this GPU
        name = _text(info.name)
        profile_names[int(info.id)] = name.removeprefix("MIG ")
        if not info.instanceCount:
            continue
        handles = (N.c_nvmlGpuInstance_t * int(info.instanceCount))()
        count = ctypes.c_uint(0)
        _, reason = r.call("nvmlDeviceGetGpuInstances", info.id, handles, ctypes.byref(count))
        if reason is not None:
            continue
        for i in range(count.value):
            gi_info, reason = r.nv.call("nvmlGpuInstanceGetInfo", handles[i])
            if reason is None:
                gpu_instances[int(gi_info.id)] = int(gi_info.profileId)

    max_devices, reason = r.call("nvmlDeviceGetMaxMigDeviceCount")
    if reason is not None:
        return None, reason
    names = {gi: profile_names.get(pid) for gi, pid in gpu_instances.items()}
    return _mig_rows(r.call, r.nv, int(max_devices), names), None


def _mig_rows(
    call: Any, nv: _Nvml, max_devices: int, profile_of: dict[int, str | None]
) -> list[model.MigInstance]:
    """The MIG devices of a GPU (``call``: NVML on the parent's handle) as instances, each with
    its GPU instance's profile from ``profile_of`` (GPU instance id -> name), then the GPU
    instances with no compute instance yet; sorted by GPU then compute instance id. The full
    snapshot and the daemon's light sample read them alike."""
    out: list[model.MigInstance] = []
    seen_gi: set[int] = set()
    for index in range(max_devices):
        mig, reason = call("nvmlDeviceGetMigDeviceHandleByIndex", index)
        if reason is not None:
            continue  # NotFound: no MIG device at this index
        gi, _ = nv.call("nvmlDeviceGetGpuInstanceId", mig)
        ci, _ = nv.call("nvmlDeviceGetComputeInstanceId", mig)
        uuid, _ = nv.call("nvmlDeviceGetUUID", mig)
        procs, _ = nv.call("nvmlDeviceGetComputeRunningProcesses", mig)
        out.append(
            model.MigInstance(
                gpu_instance_id=int(gi) if gi is not None else -1,
                compute_instance_id=int(ci) if ci is not None else None,
                profile=profile_of.get(int(gi)) if gi is not None else None,
                uuid=_text(uuid) if uuid is not None else None,
                in_use=bool(procs),
            )
        )
        if gi is not None:
            seen_gi.add(int(gi))
    for gi, name in sorted(profile_of.items()):
        if gi not in seen_gi:  # a GPU instance with no compute instance yet
            out.append(model.MigInstance(gpu_instance_id=gi, profile=name))
    out.sort(
        key=lambda m: (m.gpu_instance_id, m.compute_instance_id if m.compute_instance_id is not None else -1)
    )
    return out


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"{PROC}/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _read_processes(r: _GpuReader) -> None:
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
                gpu_instance_id=_instance_id(getattr(p, "gpuInstanceId", None)),
                compute_instance_id=_instance_id(getattr(p, "computeInstanceId", None)),
            )
        )
    r.gpu.processes = procs


def _instance_id(value: Any) -> int | None:
    """A process's MIG instance id; NVML fills 0xFFFFFFFF where the GPU is not in MIG mode."""
    if value is None or int(value) == 0xFFFFFFFF:
        return None
    return int(value)


def _read_nvlinks(r: _GpuReader, N: Any, fields: dict[str, tuple[Any, str | None]]) -> None:
    gpu = r.gpu
    count, count_reason = fields["_nvlink_count"]
    if count_reason is None and int(count) == 0:
        gpu.nvlinks = []  # the driver says this GPU has no NVLink
        return
    known = count_reason is None
    limit = int(count) if known else int(getattr(N, "NVML_NVLINK_MAX_LINKS", 18))
    links: list[model.NvLink] = []
    for index in range(limit):
        state, reason = r.call("nvmlDeviceGetNvLinkState", index)
        if reason is not None:
            if index == 0:
                r.miss("nvlinks", reason)  # NotSupported on link 0: none of the others is asked
                return
            if reason == LOST:
                break
            if not known and reason in ("NotSupported", "InvalidArgument"):
                break  # past the last link this GPU has
            links.append(model.NvLink(link=index, unavailable={"state": reason}))
            continue
        link = model.NvLink(link=index, state="up" if state else "down")
        if state:
            pci, reason = r.call("nvmlDeviceGetNvLinkRemotePciInfo", index)
            if reason is None:
                try:
                    link.remote_bus_id = model.normalize_bus_id(_text(pci.busId))
                except (ValueError, AttributeError) as exc:
                    link.unavailable["remote_bus_id"] = f"bad bus id: {exc}"
            else:
                link.unavailable["remote_bus_id"] = reason
            kind, reason = r.call("nvmlDeviceGetNvLinkRemoteDeviceType", index)
            if reason is None:
                link.remote_type = REMOTE_TYPES.get(int(kind))
                if link.remote_type is None:
                    link.unavailable["remote_type"] = f"unknown device type {int(kind)}"
            else:
                link.unavailable["remote_type"] = reason
        else:
            link.unavailable["remote_bus_id"] = link.unavailable["remote_type"] = "link down"
        links.append(link)
    if r.lost:
        r.miss("nvlinks", LOST)
        return
    _read_link_fields(r, links)
    if r.lost:
        r.miss("nvlinks", LOST)
        return
    for attr, total_key, const in LINK_COUNTERS:
        pending = [link for link in links if link.state is not None and getattr(link, attr) is None]
        total, reason = fields[total_key]
        if reason is None and int(total) == 0:
            for link in pending:
                setattr(link, attr, 0)  # a zero total: every link's counter is zero
            continue
        counter = getattr(N, const)
        for link in pending:
            value, reason = r.call("nvmlDeviceGetNvLinkErrorCounter", link.link, counter)
            if reason is None:
                setattr(link, attr, int(value))
            else:
                link.unavailable[attr] = reason
    for link in links:
        if link.state is None:
            for attr in [a for a, _, _ in LINK_COUNTERS] + [a for a, _ in LINK_TRAFFIC]:
                link.unavailable.setdefault(attr, link.unavailable["state"])
            link.unavailable.setdefault("remote_bus_id", link.unavailable["state"])
            link.unavailable.setdefault("remote_type", link.unavailable["state"])
    gpu.nvlinks = links


def _read_link_fields(r: _GpuReader, links: list[model.NvLink]) -> None:
    """TX/RX data counters and the error counters of every readable link in ONE field-values
    call (scopeId = link): 18 links cost one driver round trip, not 90. An error counter whose
    field does not answer stays None without a reason, for LINK_COUNTERS' getter to read."""
    readable = [link for link in links if link.state is not None]
    if not readable:
        return
    ids: list[tuple[int, int]] = []
    attr_of: dict[int, str] = {}
    for attr, const in LINK_TRAFFIC + LINK_ERROR_FIELDS:
        fid = r.nv.const(const)
        if fid is None:
            if (attr, const) in LINK_TRAFFIC:
                for link in readable:
                    link.unavailable[attr] = f"{const} not in this nvidia-ml-py"
            continue
        attr_of[fid] = attr
        ids.extend((fid, link.link) for link in readable)
    if not ids:
        return
    traffic = {attr for attr, _ in LINK_TRAFFIC}
    by_link = {link.link: link for link in readable}
    values, reason = r.call("nvmlDeviceGetFieldValues", ids)
    if reason is not None:
        for fid, link_no in ids:
            if attr_of[fid] in traffic:
                by_link[link_no].unavailable[attr_of[fid]] = reason
        return
    lost_code = r.nv.const("NVML_ERROR_GPU_IS_LOST", 15)
    for (fid, link_no), fv in zip(ids, values, strict=False):
        link, attr = by_link[link_no], attr_of[fid]
        if fv.nvmlReturn == 0:
            setattr(link, attr, int(field_value(fv)))
            continue
        if attr in traffic:
            link.unavailable[attr] = r.nv.reason_code(fv.nvmlReturn)
        if fv.nvmlReturn == lost_code:
            r.lost = True


def _read_fabric(r: _GpuReader, N: Any) -> None:
    struct_cls = getattr(N, "c_nvmlGpuFabricInfoV_t", None)
    getter = "nvmlDeviceGetGpuFabricInfoV"
    if struct_cls is None:
        struct_cls, getter = getattr(N, "c_nvmlGpuFabricInfo_t", None), "nvmlDeviceGetGpuFabricInfo"
    if struct_cls is None:
        r.miss("fabric_state", "no fabric info in this nvidia-ml-py")
        r.miss("fabric_status", "no fabric info in this nvidia-ml-py")
        return
    import ctypes

    info = struct_cls()
    _, reason = r.call(getter, ctypes.byref(info))
    if reason is not None:
        r.miss("fabric_state", reason)
        r.miss("fabric_status", reason)
        return
    state = int(info.state)
    r.gpu.fabric_state = FABRIC_STATES.get(state, f"unknown_{state}")
    if state == 0:
        # A GPU with no fabric (the H200 passthrough VM answers so, with status success):
        # there is no registration whose status could be reported; nvidia-smi shows N/A.
        r.miss("fabric_status", "NotSupported")
        return
    status = int(info.status)
    r.gpu.fabric_status = "success" if status == 0 else r.nv.reason_code(status)


def _read_sysfs(bus_id: str, name: str) -> str | None:
    try:
        with open(f"{SYSFS_PCI}/{bus_id}/{name}", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def cpu_list(words: Any, word_bits: int = 64) -> str:
    """A CPU bit mask (NVML's array of unsigned longs) as a list string: "0-15,32-47"."""
    cpus = [w * word_bits + b for w, word in enumerate(words) for b in range(word_bits) if int(word) >> b & 1]
    parts = []
    start: int | None = None
    prev = -2
    for cpu in cpus:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def _read_affinity(r: _GpuReader, N: Any) -> None:
    gpu = r.gpu
    # CPU affinity: sysfs local_cpulist is the list NVML derives its mask from, for a file read
    # instead of nvmlDeviceGetCpuAffinity's slow first call (bench/RESULTS.md).
    cpus = _read_sysfs(gpu.bus_id, "local_cpulist")
    if cpus:
        gpu.cpu_affinity = cpus
    else:
        words = max(1, ((os.cpu_count() or 64) + 63) // 64)
        value, reason = r.call("nvmlDeviceGetCpuAffinity", words)
        if reason is None:
            gpu.cpu_affinity = cpu_list(list(value)) or None
            if gpu.cpu_affinity is None:
                gpu.unavailable["cpu_affinity"] = "empty CPU mask"
        else:
            r.miss("cpu_affinity", reason)
    # NUMA node: NVML's answer (GPU memory's node on coherent platforms); where NVML does not
    # support it, the PCI device's node from sysfs; -1 there means none known.
    value, reason = r.call("nvmlDeviceGetNumaNodeId")
    if reason is None and int(value) >= 0:
        gpu.numa_node = int(value)
        return
    if reason != LOST:
        text = _read_sysfs(gpu.bus_id, "numa_node")
        if text is not None and text.lstrip("-").isdigit() and int(text) >= 0:
            gpu.numa_node = int(text)
            return
    r.miss("numa_node", reason or "no NUMA node")


# --- topology ------------------------------------------------------------------------------


def _nvlink_pair_count(a: model.Gpu, b: model.Gpu) -> int | None:
    """NVLinks joining two GPUs: direct links to the peer, else through NVSwitch the smaller
    of the two GPUs' up links to switches. None when either GPU's links are unknown."""
    if a.nvlinks is None or b.nvlinks is None:
        return None
    direct = sum(1 for link in a.nvlinks if link.state == "up" and link.remote_bus_id == b.bus_id)
    if not direct:
        direct = sum(1 for link in b.nvlinks if link.state == "up" and link.remote_bus_id == a.bus_id)
    if direct:
        return direct
    sa = sum(1 for link in a.nvlinks if link.state == "up" and link.remote_type == "switch")
    sb = sum(1 for link in b.nvlinks if link.state == "up" and link.remote_type == "switch")
    return min(sa, sb)


def _topology(nv: _Nvml, readers: list[_GpuReader]) -> model.Topology:
    topo = model.Topology(gpus=[r.gpu.bus_id for r in readers])
    n = len(readers)
    links: list[list[str | None]] = [[None] * n for _ in range(n)]
    counts: list[list[int | None]] = [[None] * n for _ in range(n)]
    for i in range(n):
        links[i][i], counts[i][i] = "X", 0
        for j in range(i + 1, n):
            a, b = readers[i], readers[j]
            count = _nvlink_pair_count(a.gpu, b.gpu)
            counts[i][j] = counts[j][i] = count
            if count:
                links[i][j] = links[j][i] = f"NV{count}"
                continue
            reason: str | None
            level: Any
            if a.lost or b.lost:
                level, reason = None, LOST
            else:
                level, reason = nv.call("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
            if reason is None:
                links[i][j] = links[j][i] = TOPO_LEVELS.get(int(level), f"LEVEL{int(level)}")
            else:
                topo.unavailable[f"{a.gpu.bus_id}|{b.gpu.bus_id}"] = reason
    topo.links = links
    topo.nvlink_counts = counts
    topo.numa = {r.gpu.bus_id: r.gpu.numa_node for r in readers}
    return topo


# --- MIG: reading a GPU's profile table and instances, creating and destroying them --------
#
# ``fleetops-agent mig apply`` uses these; the collector above reads instances for the snapshot.
# The changing calls are the only NVML calls in this module that change a GPU. Profiles are
# asked by their NVML_GPU_INSTANCE_PROFILE_* index; placements, GPU instances and the create
# call take the profile *id* the answer carries. A compute instance spanning the whole GPU
# instance is the compute-instance profile of the same slice count (shared engines).

# GPU-instance slice count -> NVML_COMPUTE_INSTANCE_PROFILE_* index of the full compute instance
CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
MIG_PLACEMENTS_MAX = 32


# Moves each time ``release_process`` shuts NVML down in this process: a holder of NVML state
# (``MigControl``) initialises again before its next call instead of using a dead handle.
RELEASES = [0]


def release_process(nv: Any = None) -> int:
    """Shut NVML down in this process as often as it was initialised (``nvmlInit`` is counted,
    and NVML keeps ``/dev/nvidiactl`` and every opened ``/dev/nvidiaN`` until the count is
    zero), so the process holds no device file: the reset flow's last step before
    ``nvidia-smi -r``, which fails while any process, this one included, holds the GPU.
    Returns how many shutdowns were made (0: NVML was not initialised or not importable)."""
    if nv is None:
        try:
            import pynvml
        except ImportError:
            return 0
        nv = pynvml
    done = 0
    for _ in range(256):
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - Uninitialized (the count is at zero) or no library loaded
            break
        done += 1
    RELEASES[0] += 1
    return done


class MigControlError(Exception):
    """NVML refused a MIG call; the message names the GPU, the call and NVML's reason."""


class MigControl:
    """MIG reads and changes through NVML (``nv``: pynvml, or the module a test names)."""

    def __init__(self, nv: Any = None) -> None:
        if nv is None:
            nv = load_module()
        self.nv = _Nvml(nv)
        self.N = nv
        self._started: int | None = None  # the RELEASES generation NVML was initialised in

    def _start(self) -> None:
        if self._started != RELEASES[0]:  # never started, or shut down since by release_process
            _, reason = self.nv.call("nvmlInit")
            if reason is not None:
                raise NvmlUnavailable(f"nvmlInit failed: {reason}")
            self._started = RELEASES[0]

    def _must(self, what: str, name: str, *args: Any) -> Any:
        value, reason = self.nv.call(name, *args)
        if reason is not None:
            raise MigControlError(f"{what}: {name}: {reason}")
        return value

    def _handle(self, uuid: str) -> Any:
        self._start()
        return self._must(uuid, "nvmlDeviceGetHandleByUUID", uuid)

    def profiles(self, handle: Any, name: str) -> tuple[Any, str | None]:
        """The GPU's profile table as a ``catalog.mig.ProfileTable`` (None: MIG not supported)."""
        import ctypes

        from fleetops.catalog import mig as catalog

        found = []
        last = None
        for index in range(int(self.nv.const("NVML_GPU_INSTANCE_PROFILE_COUNT", 0) or 0)):
            info, reason = self.nv.call("nvmlDeviceGetGpuInstanceProfileInfo", handle, index)
            if reason is not None:
                last = reason
                continue
            buf = (self.N.c_nvmlGpuInstancePlacement_t * MIG_PLACEMENTS_MAX)()
            count = ctypes.c_uint(MIG_PLACEMENTS_MAX)
            _, reason = self.nv.call("nvmlDeviceGetGpuInstancePossiblePlacements", handle, int(info.id), buf,
                                     ctypes.byref(count))
            if reason is not None:
                last = reason
                continue
            found.append(catalog.GiProfile(
                profile=index, id=int(info.id), name=catalog.normalize(_text(info.name)), slices=int(info.sliceCount),
                instances=int(info.instanceCount), sms=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount), decoders=int(info.decoderCount),
                encoders=int(info.encoderCount), jpegs=int(info.jpegCount), ofas=int(info.ofaCount),
                memory_mib=int(info.memorySizeMB), p2p=bool(info.isP2pSupported),
                placements=tuple((int(buf[i].start), int(buf[i].size)) for i in range(count.value))))
        if not found:
            return None, last or "no GPU instance profile"
        return catalog.ProfileTable(name, tuple(found)), None

    def _gpu_instances(self, handle: Any, table: Any) -> list[dict[str, Any]]:
        import ctypes

        out = []
        for prof in table.profiles:
            handles = (self.N.c_nvmlGpuInstance_t * max(1, prof.instances))()
            count = ctypes.c_uint(0)
            _, reason = self.nv.call("nvmlDeviceGetGpuInstances", handle, prof.id, handles, ctypes.byref(count))
            if reason is not None:
                raise MigControlError(f"nvmlDeviceGetGpuInstances({prof.name}): {reason}")
            for i in range(count.value):
                info = self._must(prof.name, "nvmlGpuInstanceGetInfo", handles[i])
                out.append({"gpu_instance_id": int(info.id), "profile": prof.name, "start": int(info.placement.start),
                            "size": int(info.placement.size), "compute_instance_id": None, "uuid": None, "pids": []})
        return out

    def read(self) -> list[dict[str, Any]]:
        """Every GPU: identity, MIG mode, profile table, instances (with their processes)."""
        self._start()
        out = []
        for index in range(int(self._must("node", "nvmlDeviceGetCount"))):
            h = self._must(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
            name = _text(self._must(f"GPU {index}", "nvmlDeviceGetName", h))
            pci = self._must(f"GPU {index}", "nvmlDeviceGetPciInfo", h)
            device = getattr(pci, "pciDeviceId", None)  # 0x233510DE: what a mig-parted device-filter names
            gpu: dict[str, Any] = {
                "index": index, "uuid": _text(self._must(f"GPU {index}", "nvmlDeviceGetUUID", h)),
                "bus_id": model.normalize_bus_id(_text(pci.busId)), "name": name,
                "device_id": f"0x{int(device):08X}" if device is not None else None,
                "mode_current": None, "mode_pending": None, "instances": None, "table": None,
                "why": None, "loose_pids": []}
            out.append(gpu)
            mode, reason = self.nv.call("nvmlDeviceGetMigMode", h)
            if reason is not None:
                gpu["why"] = reason
                continue
            gpu["mode_current"], gpu["mode_pending"] = bool(mode[0]), bool(mode[1])
            gpu["table"], why = self.profiles(h, name)
            if not gpu["mode_current"]:
                continue
            if gpu["table"] is None:
                gpu["why"] = why
                continue
            try:
                instances = self._gpu_instances(h, gpu["table"])
            except MigControlError as exc:
                gpu["why"] = str(exc)
                continue
            by_gi = {m["gpu_instance_id"]: m for m in instances}
            tied: set[int] = set()
            for slot in range(int(self._must(gpu["uuid"], "nvmlDeviceGetMaxMigDeviceCount", h))):
                mig, reason = self.nv.call("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
                if reason is not None:
                    continue  # NotFound: no MIG device in this slot
                gi = int(self._must(gpu["uuid"], "nvmlDeviceGetGpuInstanceId", mig))
                if gi not in by_gi:
                    continue
                by_gi[gi]["compute_instance_id"] = int(self._must(gpu["uuid"], "nvmlDeviceGetComputeInstanceId", mig))
                by_gi[gi]["uuid"] = _text(self._must(gpu["uuid"], "nvmlDeviceGetUUID", mig))
                procs = self._must(gpu["uuid"], "nvmlDeviceGetComputeRunningProcesses", mig) or []
                by_gi[gi]["pids"] = sorted(int(p.pid) for p in procs)
                tied.update(by_gi[gi]["pids"])
            parent = self._must(gpu["uuid"], "nvmlDeviceGetComputeRunningProcesses", h) or []
            gpu["loose_pids"] = sorted({int(p.pid) for p in parent} - tied)
            gpu["instances"] = sorted(instances, key=lambda m: m["gpu_instance_id"])
        return out

    def set_mode(self, uuid: str, enabled: bool) -> bool:
        """Request MIG mode; True when current at once, False when it waits for a GPU reset."""
        h = self._handle(uuid)
        self._must(uuid, "nvmlDeviceSetMigMode", h, 1 if enabled else 0)
        mode = self._must(uuid, "nvmlDeviceGetMigMode", h)
        return bool(mode[0]) == enabled

    def destroy(self, uuid: str, gpu_instance_id: int) -> None:
        """Destroy the GPU instance's compute instances, then the GPU instance."""
        import ctypes

        h = self._handle(uuid)
        what = f"{uuid} GI {gpu_instance_id}"
        gi = self._must(what, "nvmlDeviceGetGpuInstanceById", h, gpu_instance_id)
        for index in sorted(set(CI_PROFILE_FOR_SLICES.values())):
            info, reason = self.nv.call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, index, 0)
            if reason is not None:
                continue
            cis = (self.N.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            count = ctypes.c_uint(0)
            _, reason = self.nv.call("nvmlGpuInstanceGetComputeInstances", gi, int(info.id), cis, ctypes.byref(count))
            if reason is not None:
                continue
            for i in range(count.value):
                self._must(what, "nvmlComputeInstanceDestroy", cis[i])
        self._must(what, "nvmlGpuInstanceDestroy", gi)

    def create(self, uuid: str, profile_id: int, start: int, size: int, slices: int) -> int:
        """A GPU instance of ``profile_id`` at ``start`` and its full compute instance; its id.
        A compute instance that fails leaves no empty GPU instance behind."""
        h = self._handle(uuid)
        what = f"{uuid} profile {profile_id} at slice {start}"
        placement = self.N.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = size
        import ctypes

        gi = self._must(what, "nvmlDeviceCreateGpuInstanceWithPlacement", h, profile_id, ctypes.byref(placement))
        try:
            info = self._must(what, "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi,
                              CI_PROFILE_FOR_SLICES.get(slices, 0), 0)
            self._must(what, "nvmlGpuInstanceCreateComputeInstance", gi, int(info.id))
        except MigControlError:
            self.nv.call("nvmlGpuInstanceDestroy", gi)
            raise
        return int(self._must(what, "nvmlGpuInstanceGetInfo", gi).id)


# --- the daemon's light MIG sample ----------------------------------------------------------------


def mig_sample(N: Any, handle: Any, table: Any) -> dict[str, Any] | None:
    """One GPU's MIG mode, instances and compute processes in the snapshot's form (the keys
    ``serve/instances.gpu_table`` reads), for the daemon's light sample of a GPU in MIG mode.

    ``table`` is the GPU's profile table (``MigControl.profiles``, read once per GPU by the
    caller): only its profiles are listed, not every profile index, and names come from it. The
    calls: the mode; per profile, its GPU instances and each one's info; the MIG device count,
    each MIG device's instance ids, UUID and processes; the parent's processes (with each
    process's instance ids): the full snapshot's rows (``_mig_rows``, shared with
    ``_mig_instances``), without its walk over every profile index. A GPU whose mode is off costs the one mode call and
    answers no instance. None when NVML does not answer (the caller keeps what it had)."""
    import ctypes

    nv = _Nvml(N)
    mode, reason = nv.call("nvmlDeviceGetMigMode", handle)
    if reason is not None:
        return None
    out: dict[str, Any] = {"mig_mode_current": bool(mode[0]), "mig_mode_pending": bool(mode[1]),
                           "mig_instances": [], "processes": []}
    if not mode[0]:
        return out
    profile_of: dict[int, str | None] = {}  # GPU instance id -> its profile's name
    for prof in table.profiles:
        handles = (N.c_nvmlGpuInstance_t * max(1, prof.instances))()
        count = ctypes.c_uint(0)
        _, reason = nv.call("nvmlDeviceGetGpuInstances", handle, prof.id, handles, ctypes.byref(count))
        if reason is not None:
            return None
        for i in range(count.value):
            info, reason = nv.call("nvmlGpuInstanceGetInfo", handles[i])
            if reason is None:
                profile_of[int(info.id)] = prof.name
    max_devices, reason = nv.call("nvmlDeviceGetMaxMigDeviceCount", handle) if profile_of else (0, None)
    rows = [
        model.to_dict(m)
        for m in _mig_rows(lambda name, *a: nv.call(name, handle, *a), nv, int(max_devices or 0), profile_of)
    ]
    parent, reason = nv.call("nvmlDeviceGetComputeRunningProcesses", handle)
    out["processes"] = [
        {"pid": int(p.pid), "gpu_instance_id": _instance_id(getattr(p, "gpuInstanceId", None)),
         "compute_instance_id": _instance_id(getattr(p, "computeInstanceId", None))}
        for p in (parent if reason is None else [])
    ]
    out["mig_instances"] = rows
    return out
