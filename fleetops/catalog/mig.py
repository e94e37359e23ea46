"""MIG GPU-instance profile tables and the placement rule, shared by the simulator, the agent's
``mig apply`` and the baseline's validation of layouts.

A GPU in MIG mode has 8 memory slices (7 compute slices); a GPU instance of a profile occupies
one of the profile's *placements*: a run of memory slices ``[start, start + size)``. Two
instances may not overlap, and a profile has at most ``instances`` of them. NVML answers the
same facts (``nvmlDeviceGetGpuInstanceProfileInfo``, ``nvmlDeviceGetGpuInstancePossiblePlacements``);
these tables let the controller validate a layout without a GPU, and the simulator behave like
one.

The H200 table is the real H200 SXM 141GB's answer (driver 580.159.04), field by field; a unit
test compares it with the capture in the repository. The H100 table follows NVIDIA's MIG user
guide's H100 80GB profile table (slices, engines, instance counts) with the memory
``nvidia-smi mig -lgip`` lists for an H100 80GB (GiB to MiB); its placements follow the same
Hopper memory-slice layout the H200 reports (profile sizes 1, 2, 4, 4, 8 slices).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile as NVML describes it (``nvmlGpuInstanceProfileInfo_t``)."""

    profile: int  # the NVML_GPU_INSTANCE_PROFILE_* index it is asked for by
    id: int  # the profile id NVML reports (what placement and create calls take)
    name: str  # "3g.71gb" (NVML says "MIG 3g.71gb")
    slices: int  # compute slices (NVML's sliceCount)
    instances: int  # how many of this profile fit on one GPU (instanceCount)
    sms: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices
    p2p: bool = False


@dataclass(frozen=True)
class ProfileTable:
    model: str  # the NVML product name
    profiles: tuple[GiProfile, ...]
    # PCI device ids (nvidia-mig-parted's device-filter form); compare=False: NVML's answer
    # builds a table without them
    device_ids: tuple[str, ...] = field(default=(), compare=False)

    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def get(self, name: str) -> GiProfile | None:
        wanted = normalize(name)
        return next((p for p in self.profiles if p.name == wanted), None)

    def by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)


def normalize(name: str) -> str:
    """``"MIG 3g.71gb"`` and ``" 3G.71GB "`` are the same profile as ``"3g.71gb"``."""
    return name.strip().removeprefix("MIG ").strip().lower()


def _p(profile: int, pid: int, name: str, slices: int, instances: int, sms: int, ce: int, dec: int, ofa: int,
       memory_mib: int, starts: Iterable[int], size: int) -> GiProfile:
    return GiProfile(profile=profile, id=pid, name=name, slices=slices, instances=instances, sms=sms,
                     copy_engines=ce, decoders=dec, encoders=0, jpegs=dec, ofas=ofa, memory_mib=memory_mib,
                     placements=tuple((s, size) for s in starts))


H200_SXM = ProfileTable("NVIDIA H200", (
    _p(0, 19, "1g.18gb", 1, 7, 16, 1, 1, 0, 16384, range(7), 1),
    _p(1, 14, "2g.35gb", 2, 3, 32, 2, 2, 0, 33280, (0, 2, 4), 2),
    _p(2, 9, "3g.71gb", 3, 2, 60, 3, 3, 0, 71424, (0, 4), 4),
    _p(3, 5, "4g.71gb", 4, 1, 64, 4, 4, 0, 71424, (0,), 4),
    _p(4, 0, "7g.141gb", 7, 1, 132, 8, 7, 1, 143360, (0,), 8),
    _p(7, 20, "1g.18gb+me", 1, 1, 16, 1, 1, 1, 16384, range(7), 1),
    _p(9, 15, "1g.35gb", 1, 4, 26, 1, 1, 0, 33280, (0, 2, 4, 6), 2),
), device_ids=("0x233510DE",))  # the captured H200's nvidia-smi -q Device Id

H100_SXM = ProfileTable("NVIDIA H100 80GB HBM3", (
    _p(0, 19, "1g.10gb", 1, 7, 16, 1, 1, 0, 9984, range(7), 1),
    _p(1, 14, "2g.20gb", 2, 3, 32, 2, 2, 0, 20096, (0, 2, 4), 2),
    _p(2, 9, "3g.40gb", 3, 2, 60, 3, 3, 0, 40448, (0, 4), 4),
    _p(3, 5, "4g.40gb", 4, 1, 64, 4, 4, 0, 40448, (0,), 4),
    _p(4, 0, "7g.80gb", 7, 1, 132, 8, 7, 1, 81152, (0,), 8),
    _p(7, 20, "1g.10gb+me", 1, 1, 16, 1, 1, 1, 9984, range(7), 1),
    _p(9, 15, "1g.20gb", 1, 4, 26, 1, 1, 0, 20096, (0, 2, 4, 6), 2),
), device_ids=("0x233010DE",))  # H100 SXM5 80GB in the PCI ID database

TABLES: tuple[ProfileTable, ...] = (H200_SXM, H100_SXM)


def device_id_for(model: str | None) -> str | None:
    """The PCI device id of a model fleetops has a table for (to match a device-filter)."""
    table = table_for(model)
    return table.device_ids[0] if table is not None and table.device_ids else None


def table_for(model: str | None) -> ProfileTable | None:
    """The table for an NVML product name; None for a model fleetops has no table for (its
    profiles are then only known from the GPU itself). NVL and 94/96 GB parts differ in memory
    per slice and get none."""
    if not model:
        return None
    upper = model.upper()
    if "NVL" in upper or "94GB" in upper or "96GB" in upper:
        return None
    if "H200" in upper:
        return H200_SXM
    if "H100" in upper:
        return H100_SXM
    return None


class LayoutError(ValueError):
    """A layout that cannot be placed on the GPU; the message says which profile and why."""


def unknown_profile_message(name: str, table: ProfileTable) -> str:
    import difflib  # only on bad input: the agent's collect imports this module

    close = difflib.get_close_matches(normalize(name), table.names(), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown MIG profile {name!r} for {table.model}{hint}; known: {', '.join(table.names())}"


def resolve(table: ProfileTable, layout: Sequence[str]) -> list[GiProfile]:
    out = []
    for name in layout:
        prof = table.get(name)
        if prof is None:
            raise LayoutError(unknown_profile_message(name, table))
        out.append(prof)
    return out


def fits(start: int, size: int, taken: Sequence[tuple[int, int]]) -> bool:
    return all(start + size <= s or s + z <= start for s, z in taken)


def first_free(prof: GiProfile, taken: Sequence[tuple[int, int]]) -> int | None:
    """Where NVML puts an instance created without a placement: the first free one it lists."""
    for start, size in prof.placements:
        if fits(start, size, taken):
            return start
    return None


def place(table: ProfileTable, layout: Sequence[str],
          fixed: Sequence[tuple[str, int]] = ()) -> list[tuple[GiProfile, int]]:
    """Placements for every profile of ``layout`` beside the instances ``fixed`` (profile, start)
    that stay: the layout's order is kept in the answer, but larger profiles are placed first
    (as an operator would), with backtracking, so ``3g + 4g`` fits where creating in that order
    would not. Raises ``LayoutError`` naming the profile that does not fit."""
    profs = resolve(table, layout)
    kept = [(p, s) for p, s in ((table.get(n), s) for n, s in fixed) if p is not None]
    counts: dict[str, int] = {}
    for prof in [p for p, _ in kept] + profs:
        counts[prof.name] = counts.get(prof.name, 0) + 1
        if counts[prof.name] > prof.instances:
            raise LayoutError(f"{prof.name}: at most {prof.instances} on a {table.model}, the layout asks for "
                              f"{counts[prof.name]}")
    compute = sum(p.slices for p in profs) + sum(p.slices for p, _ in kept)
    if compute > COMPUTE_SLICES:
        raise LayoutError(f"the layout needs {compute} compute slices; a {table.model} has {COMPUTE_SLICES}")
    taken = [(s, p.placements[0][1]) for p, s in kept]
    order = sorted(range(len(profs)), key=lambda i: (-profs[i].placements[0][1], i))
    chosen: dict[int, int] = {}

    def search(k: int) -> bool:
        if k == len(order):
            return True
        prof = profs[order[k]]
        for start, size in prof.placements:
            if fits(start, size, taken):
                taken.append((start, size))
                chosen[order[k]] = start
                if search(k + 1):
                    return True
                taken.pop()
                del chosen[order[k]]
        return False

    if not search(0):
        where = "; ".join(f"{p.name} starts at slice {', '.join(str(s) for s, _ in p.placements)}"
                          for p in {p.name: p for p in profs}.values())
        beside = f" beside the kept {', '.join(n for n, _ in fixed)}" if fixed else ""
        raise LayoutError(f"no placement fits {', '.join(layout)} on a {table.model}{beside} ({where})")
    return [(profs[i], chosen[i]) for i in range(len(profs))]
