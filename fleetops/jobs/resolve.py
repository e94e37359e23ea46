"""A job's GPUs, from Slurm's ids to UUIDs: gres id -> gres.conf device file -> its minor
number -> the snapshot's GPU with that ``minor_number``; for a MIG instance, its nvidia-caps
file -> ``mig-minors`` -> (GPU minor, GPU instance) -> the MIG device UUID from the snapshot's
MIG instances. Never by index: a node's NVML index and device minor can differ (Princeton
jobstats' documented trap), and an index-based mapping attributes the job to another GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetops import model
from fleetops.jobs import gres
from fleetops.jobs.record import JobGpu


class ResolveError(Exception):
    """A GPU id that cannot be resolved; the message names the id and why."""


def parse_ids(text: str, what: str) -> list[str]:
    """``0,3`` / ``0-2,5`` (Slurm writes ranges in SLURM_JOB_GPUS on some versions) or UUIDs."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            out += [str(n) for n in range(int(lo), int(hi) + 1)]
        else:
            out.append(part)
    if not out:
        raise ResolveError(f"{what}: no GPU ids in {text!r}")
    return out


def _by_minor(gpus: Sequence[model.Gpu], minor: int, what: str) -> model.Gpu:
    found = [g for g in gpus if g.minor_number == minor]
    if len(found) == 1:
        return found[0]
    unknown = [g for g in gpus if g.minor_number is None]
    if not found and unknown:
        reasons = sorted({g.unavailable.get("minor_number", "not reported") for g in unknown})
        raise ResolveError(f"{what}: device minor {minor}: no GPU reports it, and GPU(s) "
                           f"{', '.join(str(g.index) for g in unknown)} give no minor number ({'; '.join(reasons)})")
    if not found:
        have = ", ".join(f"{g.minor_number} (index {g.index})" for g in gpus)
        raise ResolveError(f"{what}: device minor {minor}: no such GPU on this node (minors: {have or 'none'})")
    raise ResolveError(f"{what}: device minor {minor}: {len(found)} GPUs report it")


def _mig(gpu: model.Gpu, gi: int, ci: int | None, what: str) -> str:
    if not gpu.mig_mode_current:
        raise ResolveError(f"{what}: GPU {gpu.uuid} (minor {gpu.minor_number}) is not in MIG mode")
    found = [m for m in gpu.mig_instances or [] if m.gpu_instance_id == gi
             and (ci is None or m.compute_instance_id == ci) and m.uuid]
    if not found:
        have = ", ".join(f"gi{m.gpu_instance_id}/ci{m.compute_instance_id}" for m in gpu.mig_instances or [])
        raise ResolveError(f"{what}: GPU {gpu.uuid} has no MIG device in GPU instance {gi}"
                           f"{'' if ci is None else f' compute instance {ci}'} (instances: {have or 'none'})")
    uuid = found[0].uuid
    assert uuid is not None
    return uuid


def resolve_gres(
    ids: Sequence[str],
    conf: gres.GresConf,
    gpus: Sequence[model.Gpu],
    mig_minors: Callable[[], dict[int, tuple[int, int, int | None]]],
) -> tuple[list[JobGpu], str]:
    """(the job's devices, how they were resolved, in words) for gres ids ``ids``; ``ResolveError``
    naming the first id that cannot be resolved. ``mig_minors`` is called only for a MIG device."""
    out: list[JobGpu] = []
    how: set[str] = set()
    explicit = bool(conf.devices)
    for text in ids:
        what = f"GPU id {text!r}"
        if not text.isdigit():
            raise ResolveError(f"{what}: not a gres index (expected numbers like 0,3)")
        gres_id = int(text)
        if not explicit:
            if conf.autodetect != "nvml":
                raise ResolveError(f"{what}: {conf.path} declares no Name=gpu File= devices and no AutoDetect=nvml")
            ordered = sorted(gpus, key=lambda g: g.index)
            if gres_id >= len(ordered):
                raise ResolveError(f"{what}: AutoDetect=nvml and this node has {len(ordered)} GPUs")
            gpu = ordered[gres_id]
            if gpu.mig_mode_current:
                raise ResolveError(f"{what}: GPU {gpu.uuid} is in MIG mode and {conf.path} has AutoDetect=nvml "
                                   "without File lines: list the MIG devices (MultipleFiles=) to attribute them")
            out.append(JobGpu(gpu.uuid, None, gpu.index, gpu.minor_number))
            continue
        if gres_id >= len(conf.devices):
            raise ResolveError(f"{what}: {conf.path} declares {len(conf.devices)} GPU device(s) (ids 0.."
                               f"{len(conf.devices) - 1})")
        dev = conf.devices[gres_id]
        caps = [f for f in dev.files if gres.is_cap_file(f)]
        plain = [f for f in dev.files if not gres.is_cap_file(f)]
        where = f"{what} ({conf.path}:{dev.line} {','.join(dev.files)})"
        try:
            if caps:
                table = mig_minors()
                entries = []
                for cap in caps:
                    minor, found_by = gres.device_minor(cap)
                    how.add(found_by)
                    if minor not in table:
                        raise ResolveError(f"{where}: nvidia-caps minor {minor} is no MIG instance in the mig-minors table")
                    entries.append(table[minor])
                gpu_minors = {e[0] for e in entries}
                gis = {e[1] for e in entries}
                if len(gpu_minors) != 1 or len(gis) != 1:
                    raise ResolveError(f"{where}: its nvidia-caps files name more than one GPU instance")
                cis = {e[2] for e in entries if e[2] is not None}
                gpu = _by_minor(gpus, gpu_minors.pop(), where)
                mig_uuid = _mig(gpu, gis.pop(), cis.pop() if len(cis) == 1 else None, where)
                out.append(JobGpu(gpu.uuid, mig_uuid, gpu.index, gpu.minor_number))
                continue
            if len(plain) != 1:
                raise ResolveError(f"{where}: expected one /dev/nvidiaN file, got {len(plain)}")
            minor, found_by = gres.device_minor(plain[0])
            how.add(found_by)
        except ValueError as exc:
            raise ResolveError(f"{where}: {exc}") from None
        gpu = _by_minor(gpus, minor, where)
        out.append(JobGpu(gpu.uuid, None, gpu.index, gpu.minor_number))
    if explicit:
        minors_by = {"stat": "the device files' st_rdev", "name": "the numbers in the device files' names "
                     "(not character devices here)"}
        source = (f"gres ids indexing {conf.path}'s Name=gpu devices in order; device minor from "
                  f"{' and '.join(minors_by[h] for h in sorted(how)) or 'none'}; GPU by its snapshot minor_number")
    else:
        source = (f"{conf.path} has AutoDetect=nvml and no File lines: Slurm orders the GPUs as NVML enumerates "
                  "them (by PCI bus id), so gres id N is NVML's GPU N")
    return _dedupe(out, ids), source


def resolve_uuids(ids: Sequence[str], gpus: Sequence[model.Gpu]) -> list[JobGpu]:
    """UUIDs (``GPU-...``, ``MIG-...``) as CUDA_VISIBLE_DEVICES may name them."""
    out = []
    for text in ids:
        found = None
        for g in gpus:
            if g.uuid == text:
                found = JobGpu(g.uuid, None, g.index, g.minor_number)
            for m in g.mig_instances or []:
                if m.uuid and m.uuid == text:
                    found = JobGpu(g.uuid, m.uuid, g.index, g.minor_number)
        if found is None:
            raise ResolveError(f"GPU id {text!r}: no GPU or MIG device with that UUID on this node")
        out.append(found)
    return _dedupe(out, ids)


def _dedupe(found: list[JobGpu], ids: Sequence[str]) -> list[JobGpu]:
    seen: set[tuple[str, str | None]] = set()
    for g, text in zip(found, ids, strict=True):
        key = (g.uuid, g.mig_uuid)
        if key in seen:
            raise ResolveError(f"GPU id {text!r}: names a device another id of this job already named "
                               f"({g.mig_uuid or g.uuid})")
        seen.add(key)
    return found
