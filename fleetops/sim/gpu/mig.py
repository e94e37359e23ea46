"""MIG on a simulated GPU: the catalog's profile tables and placement rules, GPU and compute
instances created and destroyed, MIG mode pending until a reset, as NVML does."""

from __future__ import annotations

from typing import Any

from fleetops.catalog import mig as _mig_catalog
from fleetops.sim.gpu.base import (
    MIG_NEEDS_RESET_FIELD,
    SimError,
    digest,
    require_present,
    retire_setting_fault,
)

# Profile name -> compute slices, for the default (H200) GPU.
MIG_PROFILES = {p.name: p.slices for p in _mig_catalog.H200_SXM.profiles}


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
    h = digest("mig", gpu_uuid, generation, slot)
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
