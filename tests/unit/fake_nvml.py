"""A fake ``pynvml`` for the daemon tests (``$FLEETOPS_AGENT_NVML_MODULE=fake_nvml``): two GPUs,
driven by a JSON control file (``$FAKE_NVML_CONTROL``): ``mode`` ok | unloaded | hang, ``temp``,
and optionally ``nvlinks`` (links per GPU, default none), ``link_kib`` (``"GPU/LINK"`` ->
``[tx, rx]`` KiB counters) and ``driver_branch`` (see ``nvmlSystemGetDriverBranch``). Every NVML
function counts its calls in ``CALLS`` (``calls()``, ``reset_calls()``), so a test can say how
many NVML calls a daemon tick costs. XID events (``xid``, ``fall_off_bus``) and lost GPUs: see
the events section at the end."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

CALLS: dict[str, int] = {}

# Field ids the daemon's light read asks for, with NVML's own numbers (distinct ones matter:
# a field-values call answers per id); any other NVML_* constant is 0.
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
NVML_FI_DEV_NVLINK_ERROR_DL_CRC = 163
NOT_SUPPORTED = 3


def calls() -> dict[str, int]:
    return dict(CALLS)


def reset_calls() -> None:
    """Count calls from zero again; NVML stays as initialised as it was."""
    CALLS.clear()


def fresh() -> None:
    """A fresh fake for the next test in this process: no calls counted, NVML not initialised
    and its device file closed (a test must not inherit the last one's nvmlInit)."""
    global _INITS, _DEVICE
    CALLS.clear()
    _INITS = 0
    if _DEVICE is not None:
        os.close(_DEVICE)
        _DEVICE = None


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def _control() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_CONTROL"], encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _gate(name: str, initialising: bool = False) -> dict[str, Any]:
    _count(name)
    if not initialising and _INITS == 0:
        raise NVMLError_Uninitialized(1)  # NVML answers nothing before nvmlInit or after its last shutdown
    c = _control()
    while c["mode"] == "hang":
        time.sleep(0.05)
        c = _control()
    if c["mode"] == "unloaded":
        raise NVMLError_DriverNotLoaded(9) if initialising else NVMLError_Uninitialized(1)
    return c


def __getattr__(name: str) -> int:
    if name.startswith("NVML_"):
        return 0
    raise AttributeError(name)


# NVML holds the driver's device files from nvmlInit to the last nvmlShutdown (it counts its
# inits), as a real process holds /dev/nvidiactl: the fake opens ``<FAKE_NVML_DEV>ctl``
# (default: ``dev/nvidia`` beside the control file), so a holder scan (fleetops.gpu.holders) sees
# this process, a fake reset or unload refuses while it is open, and a call after the last
# shutdown fails Uninitialized.
_INITS = 0
_DEVICE: int | None = None


def device_prefix(control_path: str | None = None) -> str:
    explicit = os.environ.get("FAKE_NVML_DEV")
    if explicit:
        return explicit
    control = control_path or os.environ["FAKE_NVML_CONTROL"]
    return os.path.join(os.path.dirname(os.path.abspath(control)), "dev", "nvidia")


def _open_device() -> int:
    path = device_prefix() + "ctl"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)


def holders(control_path: str | None = None) -> list[Any]:
    """The processes holding the fake's device files (of the control file's fake node)."""
    from fleetops.gpu import holders as scan

    return scan.scan(device_prefix(control_path))


class InUse(Exception):
    """A fake reset or driver unload refused: processes hold the device files."""


def unload(control_path: str) -> None:
    """``modprobe -r nvidia`` for the fake: refused, naming the holders, while any process holds
    the device files (as the kernel refuses to unload a module in use); otherwise every NVML
    call of every process fails until ``load``."""
    held = holders(control_path)
    if held:
        raise InUse("modprobe: FATAL: Module nvidia is in use: " + "; ".join(h.describe() for h in held))
    _set_mode(control_path, "unloaded")


def load(control_path: str) -> None:
    """``modprobe nvidia`` for the fake: NVML answers again."""
    _set_mode(control_path, "ok")


def _set_mode(control_path: str, mode: str) -> None:
    with open(control_path, encoding="utf-8") as fh:
        c = json.load(fh)
    c["mode"] = mode
    with open(control_path, "w", encoding="utf-8") as fh:
        json.dump(c, fh)


def nvmlInit() -> None:
    global _INITS, _DEVICE
    _gate("nvmlInit", initialising=True)
    if _DEVICE is None:
        _DEVICE = _open_device()
    _INITS += 1


def nvmlSystemGetDriverVersion() -> str:
    _gate("nvmlSystemGetDriverVersion")
    return "580.0"


class NVMLError_FunctionNotFound(NVMLError):
    pass


def nvmlSystemGetDriverBranch() -> Any:
    """``driver_branch`` in the control file: the branch's name, or null for a driver without the
    call (FunctionNotFound); default r580_00."""
    c = _gate("nvmlSystemGetDriverBranch")
    branch = c.get("driver_branch", "r580_00")
    if branch is None:
        raise NVMLError_FunctionNotFound(13)
    return SimpleNamespace(version=0x1000054, branch=branch.encode())


def nvmlDeviceGetCount() -> int:
    _gate("nvmlDeviceGetCount")
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gate("nvmlDeviceGetHandleByIndex")
    return index


def nvmlDeviceGetUUID(h: int) -> str:
    _gate("nvmlDeviceGetUUID")
    return f"GPU-fake-{h}"


def nvmlDeviceGetPciInfo(h: int) -> Any:
    _gate("nvmlDeviceGetPciInfo")
    return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0", pciDeviceId=0x233510DE)  # an H200


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    return int(_gate("nvmlDeviceGetTemperature")["temp"])


def nvmlDeviceGetTemperatureV(h: int, sensor: int) -> int:
    return int(_gate("nvmlDeviceGetTemperatureV")["temp"])


def nvmlDeviceGetPowerUsage(h: int) -> int:
    _gate("nvmlDeviceGetPowerUsage")
    return 100000


def nvmlDeviceGetClockInfo(h: int, clock: int) -> int:
    _gate("nvmlDeviceGetClockInfo")
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:
    _gate("nvmlDeviceGetCurrentClocksEventReasons")
    return 0


def nvmlDeviceGetUtilizationRates(h: int) -> Any:
    _gate("nvmlDeviceGetUtilizationRates")
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetPcieThroughput(h: int, counter: int) -> int:
    _gate("nvmlDeviceGetPcieThroughput")
    return 0


def _field(fid: int, scope: int, ret: int, value: int = 0) -> Any:
    return SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=3,
                           value=SimpleNamespace(ullVal=value))


def nvmlDeviceGetFieldValues(h: int, ids: list[Any]) -> list[Any]:
    c = _gate("nvmlDeviceGetFieldValues")
    links = int(c.get("nvlinks", 0))
    kib = c.get("link_kib", {})
    out = []
    for key in ids:
        fid, scope = key if isinstance(key, tuple) else (key, 0)
        if fid == NVML_FI_DEV_NVLINK_LINK_COUNT:
            out.append(_field(fid, scope, 0 if links else NOT_SUPPORTED, links))
        elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            pair = kib.get(f"{h}/{scope}", [0, 0])
            value = pair[0] if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else pair[1]
            out.append(_field(fid, scope, 0 if scope < links else NOT_SUPPORTED, int(value)))
        elif fid in (NVML_FI_DEV_NVLINK_ERROR_DL_CRC, NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                     NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY):
            out.append(_field(fid, scope, 0 if scope < links else NOT_SUPPORTED, 0))
        elif fid in (NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL, NVML_FI_DEV_PCIE_REPLAY_COUNTER):
            out.append(_field(fid, scope, 0, 0))
        elif fid == NVML_FI_DEV_MEMORY_TEMP:
            out.append(_field(fid, scope, 0, int(c["temp"])))
        else:
            out.append(_field(fid, scope, NOT_SUPPORTED))
    return out


# --- MIG ------------------------------------------------------------------------------------
# The GPU-instance profiles are the real H200's (tests/fixtures/h200/mig_profiles.json); each
# GPU's MIG state lives in the control file under ``mig`` ({"GPU": {"mode": [current, pending],
# "instances": [{"gi", "profile_id", "start", "size", "ci", "pids"}]}}) so a subprocess sees it;
# ``mig_needs_reset`` keeps a mode change pending. Handles: a GPU is its index; a GPU instance
# is GPU*1000 + 100 + GI id, a compute instance + 500, a MIG device + 800.

import ctypes  # noqa: E402

NVML_GPU_INSTANCE_PROFILE_COUNT = 18
NVML_DEVICE_MIG_ENABLE = 1
c_nvmlGpuInstance_t = ctypes.c_int64
c_nvmlComputeInstance_t = ctypes.c_int64


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_InUse(NVMLError):
    pass


class NVMLError_InsufficientResources(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


_CAPTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "h200", "mig_profiles.json")
_GI, _CI, _DEV = 100, 500, 800


def _profiles() -> list[dict[str, Any]]:
    with open(_CAPTURE, encoding="utf-8") as fh:
        rows: list[dict[str, Any]] = json.load(fh)["gpus"][0]["profiles"]
    return [r for r in rows if "error" not in r]


def _write(c: dict[str, Any]) -> None:
    path = os.environ["FAKE_NVML_CONTROL"]
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(c, fh)
    os.replace(path + ".tmp", path)


def _gpu_mig(c: dict[str, Any], gpu: int) -> dict[str, Any]:
    mig: dict[str, Any] = c.setdefault("mig", {}).setdefault(str(gpu), {"mode": [0, 0], "instances": []})
    return mig


def _split(handle: int) -> tuple[int, int, int]:
    """(GPU, kind, GI id) of a MIG handle."""
    gpu, rest = divmod(int(handle), 1000)
    kind = _DEV if rest >= _DEV else _CI if rest >= _CI else _GI
    return gpu, kind, rest - kind


def _inst(c: dict[str, Any], gpu: int, gi: int) -> dict[str, Any]:
    for m in _gpu_mig(c, gpu)["instances"]:
        if m["gi"] == gi:
            return dict(m)
    raise NVMLError_NotFound(6)


def _require_mig(c: dict[str, Any], gpu: int) -> dict[str, Any]:
    mig = _gpu_mig(c, gpu)
    if not mig["mode"][0]:
        raise NVMLError_InvalidArgument(2)  # NVML answers so on a GPU not in MIG mode
    return mig


def nvmlDeviceGetName(h: int) -> str:
    _gate("nvmlDeviceGetName")
    return "NVIDIA H200"


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    _gate("nvmlDeviceGetHandleByUUID")
    if not uuid.startswith("GPU-fake-"):
        raise NVMLError_NotFound(6)
    return int(uuid.rsplit("-", 1)[1])


def nvmlShutdown() -> None:
    global _INITS, _DEVICE
    _count("nvmlShutdown")
    if _INITS == 0:
        raise NVMLError_Uninitialized(1)
    _INITS -= 1
    if _INITS == 0 and _DEVICE is not None:
        os.close(_DEVICE)
        _DEVICE = None


def nvmlDeviceGetHandleByPciBusId(bus_id: str) -> int:
    """The GPU at ``bus_id`` (``nvmlDeviceGetPciInfo``'s form): the reset flow's second look-up."""
    _gate("nvmlDeviceGetHandleByPciBusId")
    index = int(str(bus_id).split(":")[1], 16) - 0x18
    if not 0 <= index < 2:
        raise NVMLError_NotFound(6)
    return index


def reset_gpu(bus_id: str) -> None:
    """What ``nvidia-smi -r -i BUS_ID`` does to the fake: a pending MIG mode becomes current (its
    instances gone). Tests install it in place of the reset backend's ``nvidia_smi_reset``.
    Refused (``InUse``) while any process holds the device files, this one included: the
    driver resets no GPU that a client, a monitoring one too, has open."""
    held = holders()
    if held:
        raise InUse(f"GPU {bus_id}: In use by another client: " + "; ".join(h.describe() for h in held))
    c = _control()
    index = int(bus_id.split(":")[1], 16) - 0x18
    mig = _gpu_mig(c, index)
    if mig["mode"][0] != mig["mode"][1]:
        mig["mode"][0] = mig["mode"][1]
        mig["instances"] = []
    _write(c)


def nvmlDeviceGetMigMode(h: int) -> list[int]:
    c = _gate("nvmlDeviceGetMigMode")
    return list(_gpu_mig(c, int(h))["mode"])


def nvmlDeviceSetMigMode(h: int, mode: int) -> int:
    c = _gate("nvmlDeviceSetMigMode")
    mig = _gpu_mig(c, int(h))
    if not mode and mig["instances"]:
        raise NVMLError_InUse(19)
    mig["mode"][1] = int(mode)
    if not c.get("mig_needs_reset"):
        mig["mode"][0] = int(mode)
    _write(c)
    return 0


def nvmlDeviceGetGpuInstanceProfileInfo(h: int, profile: int, version: int = 2) -> Any:
    _gate("nvmlDeviceGetGpuInstanceProfileInfo")
    for row in _profiles():
        if row["profile"] == profile:
            return SimpleNamespace(**{k: v for k, v in row.items() if k not in ("profile", "placements")})
    raise NVMLError_NotSupported(3)


def nvmlDeviceGetGpuInstancePossiblePlacements(h: int, profile_id: int, buf: Any, count_ref: Any) -> None:
    _gate("nvmlDeviceGetGpuInstancePossiblePlacements")
    row = next((r for r in _profiles() if r["id"] == profile_id), None)
    if row is None:
        raise NVMLError_InvalidArgument(2)
    for i, (start, size) in enumerate(row["placements"]):
        buf[i].start, buf[i].size = start, size
    count_ref._obj.value = len(row["placements"])


def nvmlDeviceGetGpuInstances(h: int, profile_id: int, buf: Any, count_ref: Any) -> None:
    c = _gate("nvmlDeviceGetGpuInstances")
    mig = _require_mig(c, int(h))
    found = [m for m in mig["instances"] if m["profile_id"] == profile_id]
    for i, m in enumerate(found):
        buf[i] = int(h) * 1000 + _GI + m["gi"]
    count_ref._obj.value = len(found)


def nvmlGpuInstanceGetInfo(gi_handle: int) -> Any:
    c = _gate("nvmlGpuInstanceGetInfo")
    gpu, _, gi = _split(gi_handle)
    m = _inst(c, gpu, gi)
    return SimpleNamespace(id=gi, profileId=m["profile_id"], device=gpu,
                           placement=SimpleNamespace(start=m["start"], size=m["size"]))


def nvmlDeviceGetGpuInstanceById(h: int, gi: int) -> int:
    c = _gate("nvmlDeviceGetGpuInstanceById")
    _inst(c, int(h), gi)
    return int(h) * 1000 + _GI + gi


def nvmlDeviceCreateGpuInstanceWithPlacement(h: int, profile_id: int, placement_ref: Any) -> int:
    c = _gate("nvmlDeviceCreateGpuInstanceWithPlacement")
    mig = _require_mig(c, int(h))
    placement = placement_ref._obj
    row = next((r for r in _profiles() if r["id"] == profile_id), None)
    if row is None or [placement.start, placement.size] not in row["placements"]:
        raise NVMLError_InvalidArgument(2)
    if sum(1 for m in mig["instances"] if m["profile_id"] == profile_id) >= row["instanceCount"]:
        raise NVMLError_InsufficientResources(23)
    start, size = placement.start, placement.size
    if any(not (start + size <= m["start"] or m["start"] + m["size"] <= start) for m in mig["instances"]):
        raise NVMLError_InsufficientResources(23)
    used = {m["gi"] for m in mig["instances"]}
    gi = next(i for i in range(1, 64) if i not in used)
    mig["instances"].append({"gi": gi, "profile_id": profile_id, "start": start, "size": size, "ci": None, "pids": []})
    _write(c)
    return int(h) * 1000 + _GI + gi


def nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle: int, profile: int, eng_profile: int, version: int = 2) -> Any:
    c = _gate("nvmlGpuInstanceGetComputeInstanceProfileInfo")
    gpu, _, gi = _split(gi_handle)
    m = _inst(c, gpu, gi)
    slices = next(r["sliceCount"] for r in _profiles() if r["id"] == m["profile_id"])
    full = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}[slices]
    if profile != full:  # the fake knows only the compute instance spanning the GPU instance
        raise NVMLError_NotSupported(3)
    return SimpleNamespace(id=profile, sliceCount=slices, instanceCount=1)


def nvmlGpuInstanceCreateComputeInstance(gi_handle: int, profile_id: int) -> int:
    c = _gate("nvmlGpuInstanceCreateComputeInstance")
    gpu, _, gi = _split(gi_handle)
    for m in _gpu_mig(c, gpu)["instances"]:
        if m["gi"] == gi:
            if m["ci"] is not None:
                raise NVMLError_InsufficientResources(23)
            m["ci"] = 0
            _write(c)
            return gpu * 1000 + _CI + gi
    raise NVMLError_NotFound(6)


def nvmlGpuInstanceGetComputeInstances(gi_handle: int, profile_id: int, buf: Any, count_ref: Any) -> None:
    c = _gate("nvmlGpuInstanceGetComputeInstances")
    gpu, _, gi = _split(gi_handle)
    m = _inst(c, gpu, gi)
    count = 1 if m["ci"] is not None else 0
    if count:
        buf[0] = gpu * 1000 + _CI + gi
    count_ref._obj.value = count


def nvmlComputeInstanceDestroy(ci_handle: int) -> None:
    c = _gate("nvmlComputeInstanceDestroy")
    gpu, _, gi = _split(ci_handle)
    for m in _gpu_mig(c, gpu)["instances"]:
        if m["gi"] == gi:
            if m["pids"]:
                raise NVMLError_InUse(19)
            m["ci"] = None
            _write(c)
            return
    raise NVMLError_NotFound(6)


def nvmlGpuInstanceDestroy(gi_handle: int) -> None:
    c = _gate("nvmlGpuInstanceDestroy")
    gpu, _, gi = _split(gi_handle)
    mig = _gpu_mig(c, gpu)
    for m in mig["instances"]:
        if m["gi"] == gi:
            if m["ci"] is not None:
                raise NVMLError_InUse(19)
            mig["instances"].remove(m)
            _write(c)
            return
    raise NVMLError_NotFound(6)


def nvmlDeviceGetMaxMigDeviceCount(h: int) -> int:
    _gate("nvmlDeviceGetMaxMigDeviceCount")
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(h: int, index: int) -> int:
    c = _gate("nvmlDeviceGetMigDeviceHandleByIndex")
    devices = [m for m in _gpu_mig(c, int(h))["instances"] if m["ci"] is not None]
    if index >= len(devices):
        raise NVMLError_NotFound(6)
    return int(h) * 1000 + _DEV + devices[index]["gi"]


def nvmlDeviceGetGpuInstanceId(mig_handle: int) -> int:
    _gate("nvmlDeviceGetGpuInstanceId")
    return _split(mig_handle)[2]


def nvmlDeviceGetComputeInstanceId(mig_handle: int) -> int:
    c = _gate("nvmlDeviceGetComputeInstanceId")
    gpu, _, gi = _split(mig_handle)
    return int(_inst(c, gpu, gi)["ci"])


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[Any]:
    c = _gate("nvmlDeviceGetComputeRunningProcesses")
    if int(h) < 1000:  # the parent GPU lists the processes of all its instances, each with its instance ids
        return [SimpleNamespace(pid=p, usedGpuMemory=0, gpuInstanceId=m["gi"], computeInstanceId=m["ci"])
                for m in _gpu_mig(c, int(h))["instances"] for p in m["pids"]]
    gpu, _, gi = _split(h)
    return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in _inst(c, gpu, gi)["pids"]]


def mig_uuid(gpu: int, gi: int) -> str:
    return f"MIG-fake-{gpu}-{gi}"


_plain_uuid = nvmlDeviceGetUUID


def nvmlDeviceGetUUID(h: int) -> str:  # type: ignore[no-redef]  # MIG devices have their own
    if int(h) >= 1000:
        _count("nvmlDeviceGetUUID")
        gpu, _, gi = _split(h)
        return mig_uuid(gpu, gi)
    return _plain_uuid(h)


# --- XID events and lost GPUs ----------------------------------------------------------------
# NVML's event API as strict as NVML: nothing before nvmlInit (Uninitialized), a set or device
# it does not know is InvalidArgument, an event type other than XIDs is NotSupported, a wait
# that sees no event within its timeout raises Timeout, and the sets end with the last
# nvmlShutdown. The XIDs are the control file's ``xids`` list ([{"gpu", "code"}], in the order
# they happened; ``xid`` appends one), so every process that holds a set sees them: a set
# delivers, once and in order, each XID appended after its GPU was registered on it.
# ``lost`` lists the GPUs that fell off the bus: their handles stay (NVML keeps them), and every
# query on one answers GpuIsLost; its XID 79 is still delivered. ``register_error`` ({"GPU":
# "Unknown"}) makes registering that GPU fail with that NVML error while it is there.

nvmlEventTypeXidCriticalError = 8
NVML_ERROR_TIMEOUT = 10
NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_Unknown(NVMLError):
    pass


_ERRORS = {"Unknown": (NVMLError_Unknown, 999), "NotSupported": (NVMLError_NotSupported, 3),
           "GpuIsLost": (NVMLError_GpuIsLost, 15), "InvalidArgument": (NVMLError_InvalidArgument, 2)}
_SETS: dict[int, dict[str, Any]] = {}  # set handle -> {"cursor": next XID to look at, "gpus": {GPU: from}}
_SET_IDS = [0x5E7000]


def xid(control_path: str, gpu: int, code: int) -> None:
    """An XID on ``gpu``, as the driver raises it: delivered to every set it is registered on."""
    _edit(control_path, lambda c: c.setdefault("xids", []).append({"gpu": int(gpu), "code": int(code)}))


def fall_off_bus(control_path: str, gpu: int) -> None:
    """``gpu`` falls off the bus: its XID 79 is raised, then every query on it answers GpuIsLost."""
    def lose(c: dict[str, Any]) -> None:
        c.setdefault("xids", []).append({"gpu": int(gpu), "code": 79})
        c["lost"] = sorted({*c.get("lost", []), int(gpu)})
    _edit(control_path, lose)


def _edit(control_path: str, change: Any) -> None:
    with open(control_path, encoding="utf-8") as fh:
        c = json.load(fh)
    change(c)
    with open(control_path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(c, fh)
    os.replace(control_path + ".tmp", control_path)


def _gpu_of(h: Any) -> int:
    """The GPU a device handle is (a MIG device's handle: its parent's); InvalidArgument for
    anything that is not a handle of this fake."""
    if isinstance(h, bool) or not isinstance(h, int) or h < 0:
        raise NVMLError_InvalidArgument(2)
    gpu = h // 1000 if h >= 1000 else h
    if gpu >= 2:
        raise NVMLError_InvalidArgument(2)
    return gpu


def nvmlEventSetCreate() -> int:
    c = _gate("nvmlEventSetCreate")
    _SET_IDS[0] += 1
    _SETS[_SET_IDS[0]] = {"cursor": len(c.get("xids", [])), "gpus": {}}
    return _SET_IDS[0]


def _event_set(es: Any) -> dict[str, Any]:
    found = _SETS.get(es) if isinstance(es, int) else None
    if found is None:
        raise NVMLError_InvalidArgument(2)  # freed, never made, or gone with the last shutdown
    return found


def nvmlDeviceRegisterEvents(h: Any, types: int, es: Any) -> None:
    c = _gate("nvmlDeviceRegisterEvents")
    event_set = _event_set(es)
    gpu = _gpu_of(h)
    if gpu in c.get("lost", []):
        raise NVMLError_GpuIsLost(15)
    if int(types) & ~nvmlEventTypeXidCriticalError or not int(types):
        raise NVMLError_NotSupported(3)  # this fake raises XID events only
    failure = (c.get("register_error") or {}).get(str(gpu))
    if failure:
        cls, value = _ERRORS[failure]
        raise cls(value)
    event_set["gpus"].setdefault(gpu, len(c.get("xids", [])))


def nvmlEventSetWait_v2(es: Any, timeout_ms: int) -> Any:
    """The next XID for a GPU registered on ``es``, waiting up to ``timeout_ms``; Timeout when none
    comes. The set's GPUs' XIDs are delivered whether or not the GPU is lost."""
    end = time.monotonic() + max(0, int(timeout_ms)) / 1000.0
    while True:
        c = _gate("nvmlEventSetWait")
        event_set = _event_set(es)
        xids = c.get("xids", [])
        while event_set["cursor"] < len(xids):
            at = event_set["cursor"]
            event_set["cursor"] += 1
            ev = xids[at]
            since = event_set["gpus"].get(int(ev["gpu"]))
            if since is not None and at >= since:
                return SimpleNamespace(device=int(ev["gpu"]), eventType=nvmlEventTypeXidCriticalError,
                                       eventData=int(ev["code"]), gpuInstanceId=NVML_VALUE_NOT_AVAILABLE_uint,
                                       computeInstanceId=NVML_VALUE_NOT_AVAILABLE_uint)
        if time.monotonic() >= end:
            raise NVMLError_Timeout(NVML_ERROR_TIMEOUT)
        time.sleep(0.02)


nvmlEventSetWait = nvmlEventSetWait_v2


def nvmlEventSetFree(es: Any) -> None:
    _gate("nvmlEventSetFree")
    _event_set(es)
    del _SETS[es]


def _sets_end_with_nvml(fn: Any) -> Any:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            if _INITS == 0:
                _SETS.clear()
    call.__name__ = fn.__name__
    return call


nvmlShutdown = _sets_end_with_nvml(nvmlShutdown)  # type: ignore[no-redef]
fresh = _sets_end_with_nvml(fresh)  # type: ignore[no-redef]

# A lost GPU answers GpuIsLost to every query on its handle (a MIG device's: its parent's); the
# look-ups that give handles and the event API (above) are not queries on a handle.
_NOT_ON_A_HANDLE = {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
                    "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceRegisterEvents"}


def _fails_when_lost(name: str, fn: Any) -> Any:
    def call(h: Any, *args: Any) -> Any:
        if _INITS and isinstance(h, int) and not isinstance(h, bool) and 0 <= h:
            gpu = h // 1000 if h >= 1000 else h
            c = _control()
            if c["mode"] == "ok" and gpu in c.get("lost", []):  # a driver unloaded or hung answers so first
                _count(name)
                raise NVMLError_GpuIsLost(15)
        return fn(h, *args)
    call.__name__ = name
    return call


for _name, _fn in list(globals().items()):
    if _name.startswith("nvmlDevice") and callable(_fn) and _name not in _NOT_ON_A_HANDLE:
        globals()[_name] = _fails_when_lost(_name, _fn)
