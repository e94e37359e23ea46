"""What is wanted (``Want``, ``parse_layout``, ``Source``) and the plan: a pure function of
what ``MigOps`` read, per GPU (``plan_gpu``) and for the selected GPUs (``plan``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from fleetops.agent.mig import MigError
from fleetops.agent.mig_apply.ops import OFF, GpuMig, Inst, MigOps
from fleetops.catalog import mig as catalog

# --- what is wanted ------------------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    mode: bool
    layout: tuple[str, ...]


def parse_layout(text: str) -> Want:
    items = [p.strip() for p in text.split(",") if p.strip()]
    if items == [OFF]:
        return Want(False, ())
    if not items:
        raise MigError("--layout: give the profiles (3g.71gb,3g.71gb), or 'off' to turn MIG mode off", "usage", 2)
    if OFF in items:
        raise MigError("--layout: 'off' stands alone (it turns MIG mode off)", "usage", 2)
    return Want(True, tuple(catalog.normalize(p) for p in items))


class Source:
    """Where the wanted state comes from: one layout for all GPUs, or a mig-parted config."""

    def __init__(self, layout: Want | None = None, config: str | None = None, select: str | None = None) -> None:
        self.layout = layout
        self.config_path = config
        self.select = select
        self.entries: Any = None
        if config is not None:
            from fleetops.catalog import migparted

            try:
                self.entries = migparted.load(config).select(select or "")
            except migparted.MigPartedError as exc:
                raise MigError(str(exc), "usage", 2) from None

    def describe(self) -> dict[str, Any]:
        if self.layout is not None:
            return {"layout": list(self.layout.layout) if self.layout.mode else OFF}
        return {"config": self.config_path, "select": self.select}

    def want(self, gpu: GpuMig) -> Want | None:
        if self.layout is not None:
            return self.layout
        from fleetops.catalog import migparted

        got = migparted.want_for(self.entries, gpu.index, gpu.device_id)
        if got is None:
            return None
        return Want(got[0], tuple(catalog.normalize(p) for p in got[1]))


# --- the plan (pure) -----------------------------------------------------------------------------


def _complete(m: Inst) -> bool:
    return m.compute_instance_id is not None and m.start is not None and m.profile is not None


def _keep_and_place(table: catalog.ProfileTable, current: list[Inst], layout: tuple[str, ...]
                    ) -> tuple[list[Inst], list[tuple[catalog.GiProfile, int]]] | str:
    """The instances to keep and the placements of the rest: of the subsets of current
    instances the layout still has, the one that keeps the most busy instances, then the most
    instances, with which the rest of the layout can be placed. A string: no placement at all."""
    import itertools

    candidates = [m for m in current if _complete(m) and m.profile in layout]
    wanted = Counter(layout)
    subsets = []
    for n in range(len(candidates), -1, -1):
        for combo in itertools.combinations(candidates, n):
            if all(c <= wanted[p] for p, c in Counter(str(m.profile) for m in combo).items()):
                subsets.append(list(combo))
    subsets.sort(key=lambda ms: (-sum(m.in_use for m in ms), -len(ms)))
    problem = ""
    for keep in subsets:
        rest = Counter(layout) - Counter(str(m.profile) for m in keep)
        names = []
        for name in layout:
            if rest[name] > 0:
                rest[name] -= 1
                names.append(name)
        try:
            return keep, catalog.place(table, names, [(str(m.profile), int(m.start or 0)) for m in keep])
        except catalog.LayoutError as exc:
            problem = problem if keep else str(exc)
    return problem


def pending_detail(uuid: str, enabled: bool) -> str:
    return (f"MIG mode {'enabled' if enabled else 'disabled'} is pending until the GPU is reset: fleetops-agent "
            f"reset --gpu {uuid}, then rerun mig apply")


def plan_gpu(gpu: GpuMig, want: Want | None, reset: bool = True) -> dict[str, Any]:
    """The plan of one GPU (pure). ``reset``: a MIG mode that waits for a GPU reset is applied
    through the safe reset flow (False: ``--no-reset``, left pending for the operator)."""
    entry: dict[str, Any] = {
        "uuid": gpu.uuid, "bus_id": gpu.bus_id, "index": gpu.index, "name": gpu.name, "changed": False,
        "want": {"mode": want.mode, "layout": list(want.layout)} if want else None,
        "mode": {"current": gpu.mode_current, "pending": gpu.mode_pending},
        "before": [m.to_dict() for m in gpu.instances or []], "after": None, "destroy": [], "create": [],
        "reset": False}

    def refuse(detail: str, remedy: str, **extra: Any) -> dict[str, Any]:
        entry.update(status="refused", detail=detail, remedy=remedy, **extra)
        return entry

    if want is None:
        entry.update(status="unchanged", detail="the selected config has no entry for this GPU: left alone",
                     after=entry["before"])
        return entry
    if gpu.mode_current is None:
        return refuse(f"MIG mode unreadable ({gpu.why or 'unknown'})", "check the driver (nvidia-smi -q) and retry")
    current = gpu.instances or []
    if gpu.mode_current and gpu.instances is None:
        return refuse(f"cannot list the MIG instances ({gpu.why or 'unknown'})",
                      "list them with nvidia-smi mig -lgi and retry")
    # asked for already (here or by nvidia-smi -mig): only the GPU reset that applies it is missing
    asked = gpu.mode_current != want.mode and gpu.mode_pending == want.mode
    if asked and not reset and not (gpu.mode_current and current):
        entry.update(status="mode-pending", result="mode-pending", detail=pending_detail(gpu.uuid, want.mode),
                     remedy=f"fleetops-agent reset --gpu {gpu.uuid}")
        return entry
    if not want.mode:
        if not gpu.mode_current:
            entry.update(status="unchanged", detail="MIG mode is off, as wanted", after=[])
            return entry
        destroy = current
        plan: list[tuple[catalog.GiProfile, int]] = []
    else:
        if gpu.table is None:
            return refuse(f"no MIG profile table for {gpu.name or 'this GPU'} (NVML lists no GPU instance profile)",
                          "check that the GPU supports MIG")
        for name in want.layout:
            if gpu.table.get(name) is None:
                raise MigError(f"GPU {gpu.uuid}: {catalog.unknown_profile_message(name, gpu.table)}", "usage", 2)
        have = Counter(m.profile for m in current if _complete(m))
        if gpu.mode_current and have == Counter(want.layout) and all(_complete(m) for m in current):
            entry.update(status="unchanged", detail=f"instances already {', '.join(want.layout)}", after=entry["before"])
            return entry
        found = _keep_and_place(gpu.table, current, want.layout)
        if isinstance(found, str):
            return refuse(found, "choose a layout whose instances fit the GPU's placements "
                          "(larger profiles take fixed slices: a 4g takes slices 0-3)")
        keep, plan = found
        kept_ids = {m.gpu_instance_id for m in keep}
        destroy = [m for m in current if m.gpu_instance_id not in kept_ids]
    busy = [m for m in destroy if m.in_use]
    if busy:
        names = ", ".join(f"GI {m.gpu_instance_id} {m.profile} {m.uuid}" + (f" (pid {', '.join(map(str, m.pids))})"
                                                                              if m.pids else "") for m in busy)
        return refuse(f"workloads run on MIG instances it would destroy: {names}",
                      "stop the workloads on those instances (drain the GPU), then retry",
                      in_use=[m.to_dict() for m in busy])
    # a mode change that goes through the reset flow leaves the GPU's processes to the flow's own
    # precondition (compute_processes, judged under the lock, with its remedy): not a second copy here
    via_reset = reset and gpu.mode_current != want.mode and (asked or bool(gpu.reset_needed))
    if gpu.loose_pids and (destroy or (gpu.mode_current != want.mode and not via_reset)):
        pids = ", ".join(map(str, gpu.loose_pids))
        return refuse(f"compute processes on the GPU (pid {pids}) that no MIG instance accounts for",
                      "drain the GPU's jobs first, then retry", processes=list(gpu.loose_pids))
    entry["destroy"] = [m.gpu_instance_id for m in destroy]
    entry["create"] = [{"profile": p.name, "placement_start": s} for p, s in plan]
    kept = [m.to_dict() for m in current if m not in destroy]
    entry["after"] = sorted(kept + [{"gpu_instance_id": None, "compute_instance_id": None, "profile": p.name,
                                     "placement": {"start": s, "size": p.placements[0][1]}, "uuid": None,
                                     "in_use": False} for p, s in plan],
                            key=lambda m: m["placement"]["start"] if m["placement"] else -1)
    if gpu.mode_current != want.mode:
        word = "enable" if want.mode else "disable"
        made = f", then create {', '.join(p.name for p, _ in plan)}" if plan else ""
        gone = f"destroy {len(destroy)} instance(s), then " if destroy else ""
        # the mode is asked for once: one already pending is not sent again
        entry["mode"]["send"] = gpu.mode_pending != want.mode
        entry["reset"] = True if asked or gpu.reset_needed else gpu.reset_needed
        if entry["reset"] is None:
            how = (" (and, if it stays pending, reset the GPU through the safe reset flow)" if reset
                   else " (if it stays pending until a GPU reset: left pending, --no-reset)")
        elif not entry["reset"]:
            how = ""
        elif not reset:
            how = " (pending until a GPU reset: left pending, --no-reset)"
        elif asked:
            how = " (already asked for: pending), reset the GPU through the safe reset flow to apply it"
        else:
            how = ", reset the GPU through the safe reset flow (the new mode waits for it)"
        entry.update(status="mode-change", detail=f"{gone}{word} MIG mode{how}{made}")
    elif destroy:
        entry.update(status="recreate", detail=f"destroy GI {', '.join(str(m.gpu_instance_id) for m in destroy)} "
                     f"({', '.join(str(m.profile) for m in destroy)}), create {', '.join(p.name for p, _ in plan)}")
    else:
        entry.update(status="create", detail=f"create {', '.join(p.name for p, _ in plan)}")
    return entry


def _select(gpus: list[GpuMig], selector: str, host: str) -> list[GpuMig]:
    text = (selector or "all").strip()
    if text == "all":
        return gpus
    from fleetops import model
    from fleetops.common import selectors

    chosen = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            sel = selectors.parse_identity(part)
        except selectors.SelectorError as exc:
            raise MigError(exc.message, "usage", 2) from None
        if sel.uuid:
            hit = next((g for g in gpus if g.uuid == sel.uuid), None)
        else:
            hit = next((g for g in gpus if model.normalize_bus_id(g.bus_id) == sel.bus_id), None)
        if hit is None:
            present = ", ".join(f"{g.index}={g.uuid}@{g.bus_id}" for g in gpus) or "none"
            raise MigError(f"--gpu {part}: no such GPU on {host} (present: {present})", "no-such-gpu")
        if hit not in chosen:
            chosen.append(hit)
    return chosen


def plan(ops: MigOps, source: Source, selector: str, host: str, reset: bool = True) -> list[dict[str, Any]]:
    gpus = _select(ops.read(), selector, host)
    return [plan_gpu(g, source.want(g), reset) for g in gpus]
