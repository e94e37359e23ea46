"""MIG through NVML: the snapshot's instance rows, the daemon's light sample of a GPU in MIG
mode (``mig_sample``), and ``MigControl``, which reads profile tables and creates and destroys
instances for ``fleetops-agent mig apply``."""

from __future__ import annotations

from typing import Any

from fleetops import model
from fleetops.gpu.nvml.core import LOST, GpuReader, Nvml, NvmlUnavailable, as_text, instance_id, load_module


def read_mig(r: GpuReader, N: Any) -> None:
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


def _mig_instances(r: GpuReader, N: Any) -> tuple[list[model.MigInstance] | None, str | None]:
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
        name = as_text(info.name)
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
    call: Any, nv: Nvml, max_devices: int, profile_of: dict[int, str | None]
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
                uuid=as_text(uuid) if uuid is not None else None,
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
        self.nv = Nvml(nv)
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
                profile=index, id=int(info.id), name=catalog.normalize(as_text(info.name)), slices=int(info.sliceCount),
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
            name = as_text(self._must(f"GPU {index}", "nvmlDeviceGetName", h))
            pci = self._must(f"GPU {index}", "nvmlDeviceGetPciInfo", h)
            device = getattr(pci, "pciDeviceId", None)  # 0x233510DE: what a mig-parted device-filter names
            gpu: dict[str, Any] = {
                "index": index, "uuid": as_text(self._must(f"GPU {index}", "nvmlDeviceGetUUID", h)),
                "bus_id": model.normalize_bus_id(as_text(pci.busId)), "name": name,
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
                by_gi[gi]["uuid"] = as_text(self._must(gpu["uuid"], "nvmlDeviceGetUUID", mig))
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
    ``gpu/instances.gpu_table`` reads), for the daemon's light sample of a GPU in MIG mode.

    ``table`` is the GPU's profile table (``MigControl.profiles``, read once per GPU by the
    caller): only its profiles are listed, not every profile index, and names come from it. The
    calls: the mode; per profile, its GPU instances and each one's info; the MIG device count,
    each MIG device's instance ids, UUID and processes; the parent's processes (with each
    process's instance ids): the full snapshot's rows (``_mig_rows``, shared with
    ``_mig_instances``), without its walk over every profile index. A GPU whose mode is off costs the one mode call and
    answers no instance. None when NVML does not answer (the caller keeps what it had)."""
    import ctypes

    nv = Nvml(N)
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
        {"pid": int(p.pid), "gpu_instance_id": instance_id(getattr(p, "gpuInstanceId", None)),
         "compute_instance_id": instance_id(getattr(p, "computeInstanceId", None))}
        for p in (parent if reason is None else [])
    ]
    out["mig_instances"] = rows
    return out
