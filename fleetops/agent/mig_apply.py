"""``fleetops-agent mig apply``: the plan, the change under the lock, and the read-back.

The contract (flags, statuses, report fields, exit codes) is described in ``fleetops.agent.mig``.
This module has the two ways to read and change a node's MIG state, behind one small interface
(``MigOps``): the simulator's state file (``SimMig``) and NVML (``NvmlMig``, through
``fleetops.gpu.nvml``'s MIG helpers). The planner is a pure function of what they read.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleetops.agent import lock as node_lock
from fleetops.agent.mig import REPORT_KIND, MigError
from fleetops.agent.reset.backends import Backend, DryRunGuard
from fleetops.catalog import mig as catalog
from fleetops.catalog.actions import mig_budget_s, reset_budget_s

OFF = "off"


class MigChangeError(Exception):
    """The node refused one MIG change (NVML's answer, the simulator's rule); the message says which."""


@dataclass
class Inst:
    gpu_instance_id: int
    profile: str | None
    start: int | None
    size: int | None
    compute_instance_id: int | None = None
    uuid: str | None = None
    in_use: bool = False
    pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu_instance_id": self.gpu_instance_id, "compute_instance_id": self.compute_instance_id,
            "profile": self.profile,
            "placement": {"start": self.start, "size": self.size} if self.start is not None else None,
            "uuid": self.uuid, "in_use": self.in_use}
        if self.pids:
            out["pids"] = list(self.pids)
        return out


@dataclass
class GpuMig:
    uuid: str
    bus_id: str
    index: int
    name: str | None
    mode_current: bool | None
    mode_pending: bool | None
    instances: list[Inst] | None  # None: cannot be listed (``why``)
    table: catalog.ProfileTable | None
    why: str | None = None
    loose_pids: list[int] = field(default_factory=list)  # processes on the GPU tied to no instance
    device_id: str | None = None
    # a MIG mode change waits for a GPU reset on this node: True / False, None where it can only
    # be told once the mode is set (NVML: the mode stays pending, or is current at once)
    reset_needed: bool | None = None


class MigOps(DryRunGuard):
    """Reading and changing one node's MIG state; changing methods refuse in a dry run.

    ``reset_backend`` is the reset flow's backend for the same node (``make_ops`` sets the one
    ``make_backend`` picks), through which a MIG mode that waits for a GPU reset is applied."""

    name = "unknown"
    backend: Backend | None = None

    def reset_backend(self) -> Backend:
        if self.backend is None:
            self.backend = self._make_reset_backend()
        return self.backend

    def _make_reset_backend(self) -> Backend:
        raise NotImplementedError

    def hostname(self) -> str:
        raise NotImplementedError

    def read(self) -> list[GpuMig]:
        raise NotImplementedError

    def set_mode(self, uuid: str, enabled: bool) -> bool:
        """True when the mode is current now, False when it waits for a GPU reset."""
        raise NotImplementedError

    def destroy(self, uuid: str, inst: Inst) -> None:
        raise NotImplementedError

    def create(self, uuid: str, profile: catalog.GiProfile, start: int) -> int:
        """A GPU instance at ``start`` and its one compute instance; its GPU instance id."""
        raise NotImplementedError


class SimMig(MigOps):
    name = "sim"

    def __init__(self, path: str, dry_run: bool) -> None:
        super().__init__(dry_run)
        self.path = path

    def _make_reset_backend(self) -> Backend:
        from fleetops.agent.reset.backends import SimBackend

        return SimBackend(self.path, self.dry_run)

    def hostname(self) -> str:
        from fleetops.sim import gpu as sim

        return str(sim.read_state(self.path)["hostname"])

    def read(self) -> list[GpuMig]:
        from fleetops.sim import gpu as sim

        state = sim.read_state(self.path)
        needs_reset = bool(state["node"].get(sim.MIG_NEEDS_RESET_FIELD))
        out = []
        for g in sim.snapshot(state)["gpus"]:
            pos = next(i for i, raw in enumerate(state["gpus"]) if raw["uuid"] == g["uuid"])
            raw = state["gpus"][pos]
            try:
                table: catalog.ProfileTable | None = sim.mig_table(state, pos)
            except sim.SimError:
                table = None
            current = bool(raw.get("mig_mode_current"))
            instances = None
            if current:
                instances = [
                    Inst(gpu_instance_id=int(m["gpu_instance_id"]), profile=m.get("profile"),
                         start=m.get("placement_start"), size=m.get("placement_size"),
                         compute_instance_id=m.get("compute_instance_id"), uuid=m.get("uuid"),
                         in_use=bool(m.get("in_use") or m.get("pids")), pids=[int(p) for p in m.get("pids") or []])
                    for m in raw.get("mig_instances") or []  # the state's records: with their placements
                ]
            out.append(GpuMig(uuid=g["uuid"], bus_id=g["bus_id"], index=int(g["index"]), name=g.get("name"),
                              mode_current=current, mode_pending=bool(raw.get("mig_mode_pending", current)),
                              instances=instances, table=table,
                              loose_pids=[int(p["pid"]) for p in g.get("processes") or []],
                              device_id=catalog.device_id_for(g.get("name")), reset_needed=needs_reset))
        return out

    def _change(self, uuid: str, what: str, fn: Any) -> Any:
        from fleetops.sim import gpu as sim

        self._changing(what)
        try:
            with sim.locked_state(self.path) as st:
                pos, _ = sim.find_gpu(st, uuid)
                if pos is None:
                    raise sim.SimError(f"{uuid} is no longer on this node")
                return fn(st, pos)
        except sim.SimError as exc:
            raise MigChangeError(str(exc)) from exc

    def set_mode(self, uuid: str, enabled: bool) -> bool:
        from fleetops.sim import gpu as sim

        return bool(self._change(uuid, "set MIG mode", lambda st, pos: sim.set_mig_mode(st, pos, enabled)))

    def destroy(self, uuid: str, inst: Inst) -> None:
        from fleetops.sim import gpu as sim

        self._change(uuid, "destroy a MIG instance",
                     lambda st, pos: sim.destroy_gpu_instance(st, pos, inst.gpu_instance_id))

    def create(self, uuid: str, profile: catalog.GiProfile, start: int) -> int:
        from fleetops.sim import gpu as sim

        def make(st: dict[str, Any], pos: int) -> int:
            gi = sim.create_gpu_instance(st, pos, profile.name, start)
            sim.create_compute_instance(st, pos, int(gi["gpu_instance_id"]))
            return int(gi["gpu_instance_id"])

        return int(self._change(uuid, "create a MIG instance", make))


class NvmlMig(MigOps):
    """A real node, through ``fleetops.gpu.nvml``'s MIG helpers (pynvml, or the module tests name)."""

    name = "nvml"

    def __init__(self, dry_run: bool, nv: Any = None) -> None:
        super().__init__(dry_run)
        from fleetops.gpu import nvml

        self.ctl = nvml.MigControl(nv)

    def _make_reset_backend(self) -> Backend:
        from fleetops.agent.reset.backends import NvmlBackend

        return NvmlBackend(self.dry_run)

    def hostname(self) -> str:
        import socket

        return socket.gethostname()

    def read(self) -> list[GpuMig]:
        from fleetops.gpu import nvml

        try:
            raw = self.ctl.read()
        except (nvml.MigControlError, nvml.NvmlUnavailable) as exc:
            raise MigError(f"cannot read the node's MIG state through NVML: {exc}", "collect") from exc
        out = []
        for g in raw:
            instances = None
            if g["instances"] is not None:
                instances = [Inst(gpu_instance_id=m["gpu_instance_id"], profile=m["profile"], start=m["start"],
                                  size=m["size"], compute_instance_id=m["compute_instance_id"], uuid=m["uuid"],
                                  in_use=bool(m["pids"]), pids=list(m["pids"]))
                             for m in g["instances"]]
            out.append(GpuMig(uuid=g["uuid"], bus_id=g["bus_id"], index=g["index"], name=g["name"],
                              mode_current=g["mode_current"], mode_pending=g["mode_pending"], instances=instances,
                              table=g["table"], why=g["why"], loose_pids=list(g["loose_pids"]),
                              device_id=g.get("device_id")))
        return out

    def set_mode(self, uuid: str, enabled: bool) -> bool:
        self._changing("set MIG mode")
        return bool(self._call(self.ctl.set_mode, uuid, enabled))

    def destroy(self, uuid: str, inst: Inst) -> None:
        self._changing("destroy a MIG instance")
        self._call(self.ctl.destroy, uuid, inst.gpu_instance_id)

    def create(self, uuid: str, profile: catalog.GiProfile, start: int) -> int:
        self._changing("create a MIG instance")
        return int(self._call(self.ctl.create, uuid, profile.id, start, profile.placements[0][1], profile.slices))

    def _call(self, fn: Any, *args: Any) -> Any:
        from fleetops.gpu import nvml

        try:
            return fn(*args)
        except nvml.MigControlError as exc:
            raise MigChangeError(str(exc)) from exc


def make_ops(requested: str, state_path: str | None, dry_run: bool) -> tuple[MigOps, str]:
    """The ops and the default lock path of the backend the agent picks (as reset does)."""
    from fleetops.agent.reset.backends import ResetError, make_backend

    try:
        back = make_backend(requested, state_path, dry_run)
    except ResetError as exc:
        raise MigError(str(exc), exc.kind, exc.exit_code) from exc
    path = getattr(back, "path", None)
    ops: MigOps = SimMig(str(path), dry_run) if back.name == "sim" and path else NvmlMig(dry_run)
    ops.backend = back
    return ops, back.default_lock()


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


def _pending_detail(uuid: str, enabled: bool) -> str:
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
        entry.update(status="mode-pending", result="mode-pending", detail=_pending_detail(gpu.uuid, want.mode),
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


# --- the run -----------------------------------------------------------------------------------


def _comparable(entry: dict[str, Any]) -> Any:
    return (entry["status"], entry["destroy"], entry["create"])


def run(source: Source, selector: str, dry_run: bool, backend: str, state_path: str | None,
        lock_path: str | None, ops: MigOps | None = None, reset: bool = True) -> tuple[dict[str, Any], int]:
    started = time.time()
    default_lock = None
    if ops is None:
        ops, default_lock = make_ops(backend, state_path, dry_run)
    host = ops.hostname()
    entries = plan(ops, source, selector, host, reset)
    doc: dict[str, Any] = {"kind": REPORT_KIND, "action": "mig apply", "node": host, "backend": ops.name,
                           "dry_run": dry_run, "reset": reset, "source": source.describe(), "gpus": entries,
                           "changed": False, "refused": False, "result": None, "message": ""}
    refused = [e for e in entries if e["status"] == "refused"]
    waiting = [e for e in entries if e["status"] == "mode-pending"]
    todo = [e for e in entries if e["status"] not in ("unchanged", "mode-pending")]
    if refused:
        doc.update(refused=True, result="refused", message="refused, nothing changed: "
                   + "; ".join(f"{e['uuid']}: {e['detail']}" for e in refused))
        return doc, 1
    if not todo and waiting:
        doc.update(result="mode-pending", message=_pending_message(waiting))
        return doc, 1
    if not todo:
        doc.update(result="unchanged", message=f"MIG layout already as wanted on {len(entries)} GPU(s)")
        return doc, 0
    if dry_run:
        blocked = _dry_run_resets(ops, todo, lock_path or default_lock) if reset else []
        if blocked:
            doc.update(result="mode-pending", message="dry run: the GPU reset a MIG mode change needs would be refused, "
                       "leaving the mode pending: " + "; ".join(f"{e['uuid']}: {e['reset_report']['message']}"
                                                               for e in blocked))
            return doc, 1
        doc.update(result="would-change", message=f"dry run: would change MIG on {len(todo)} GPU(s): "
                   + "; ".join(f"{e['uuid']}: {e['detail']}" for e in todo))
        return doc, 0
    path = lock_path or default_lock or node_lock.DEFAULT_PATH
    steps = sum(len(e["destroy"]) + len(e["create"]) + 1 for e in todo)
    resets = sum(1 for e in todo if reset and e["reset"] is not False)
    try:
        held = node_lock.acquire(path, "mig apply", ",".join(e["uuid"] for e in todo),
                                 mig_budget_s(steps) + resets * reset_budget_s())
    except node_lock.LockHeld as exc:
        doc.update(refused=True, result="refused", message=str(exc), holder=exc.holder)
        return doc, 1
    from fleetops.agent.reset.flow import Interrupted, SignalGuard

    guard = SignalGuard()
    try:
        with guard:
            try:
                # the plan again, from a read under the lock: act only on what the operator was shown
                again = {e["uuid"]: e for e in plan(ops, source, selector, host, reset)}
                moved = [e for e in todo
                         if _comparable(again.get(e["uuid"], {"status": "gone", "destroy": [], "create": []}))
                         != _comparable(e)]
                if moved:
                    for e in moved:
                        fresh = again.get(e["uuid"])
                        e.update(status="refused", detail="the GPU changed between the plan and the lock: "
                                 + (fresh["detail"] if fresh else "it is gone"), remedy="look again and retry")
                    doc.update(refused=True, result="refused", message="refused, nothing changed: "
                               + "; ".join(f"{e['uuid']}: {e['detail']}" for e in moved))
                    return doc, 1
                failed, pending = _execute(ops, todo, held, steps, guard, reset)
                held.heartbeat("read back", mig_budget_s(0))
                _verify(ops, todo, source)
            except Interrupted as exc:
                # a change is never cut in half (each runs deferred); what was made is read back
                with guard.shielded():
                    _verify(ops, todo, source)
                    doc["elapsed_s"] = round(time.time() - started, 3)
                    doc["changed"] = any(e["changed"] for e in entries)
                    name = signal_name(exc.signum)
                    doc.update(result="interrupted", interrupted_by=name,
                               message=f"interrupted by {name}: look again (mig apply --dry-run) before a rerun")
                return doc, 128 + exc.signum
            finally:
                with guard.shielded():
                    held.release()
    finally:
        held.release()
    doc["elapsed_s"] = round(time.time() - started, 3)
    doc["changed"] = any(e["changed"] for e in entries)
    bad = [e for e in todo if e.get("result") == "failed"]
    if bad or failed:
        doc.update(result="failed", message="MIG apply failed on " + "; ".join(f"{e['uuid']}: {e['detail']}" for e in bad))
        return doc, 1
    if pending or waiting:
        doc.update(result="mode-pending", message=_pending_message(pending + waiting))
        return doc, 1
    doc.update(result="applied", message=f"applied the MIG layout on {len(todo)} GPU(s)")
    return doc, 0


def _pending_message(entries: list[dict[str, Any]]) -> str:
    text = "MIG mode pending until a GPU reset on " + ", ".join(e["uuid"] for e in entries)
    refused = [e for e in entries if e.get("reset_report")]
    if refused:
        return text + "; the safe reset flow refused: " + "; ".join(
            f"{e['uuid']}: {e['reset_report']['message']} (remedy: {e.get('remedy')})" for e in refused)
    return text + "; reset them (fleetops-agent reset --gpu UUID), then rerun mig apply"


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def _execute(ops: MigOps, todo: list[dict[str, Any]], held: Any, steps: int,
             guard: Any, reset: bool = True) -> tuple[bool, list[dict[str, Any]]]:
    failed = False
    pending: list[dict[str, Any]] = []
    left = steps
    # the GPU resets still ahead (a mode that may wait for one), in the lock's deadline too
    resets = sum(1 for e in todo if reset and e["reset"] is not False)

    def budget() -> float:
        return mig_budget_s(left) + resets * reset_budget_s()

    current = {g.uuid: g for g in ops.read()}
    for e in todo:
        gpu = current[e["uuid"]]
        by_id = {m.gpu_instance_id: m for m in gpu.instances or []}
        want = e["want"]
        try:
            for gi in e["destroy"]:
                held.heartbeat(f"destroy GI {gi} on {e['uuid']}", budget())
                with guard.deferred():
                    ops.destroy(e["uuid"], by_id[gi])
                    e["changed"] = True
                left -= 1
            if gpu.mode_current != want["mode"]:
                now = False
                if e["mode"].get("send", True):
                    held.heartbeat(f"MIG mode on {e['uuid']}", budget())
                    with guard.deferred():
                        now = ops.set_mode(e["uuid"], bool(want["mode"]))
                        e["changed"] = True
                left -= 1
                if reset and e["reset"] is not False:
                    resets -= 1  # used now or not needed: out of the deadline either way
                if not now and reset:
                    now = _reset_for_mode(ops, e, held, guard, bool(want["mode"]))
                    if e.get("result") == "failed":
                        failed = True
                        continue
                if not now:
                    if e.get("status") != "mode-pending":
                        e.update(result="mode-pending", status="mode-pending",
                                 detail=_pending_detail(e["uuid"], bool(want["mode"])),
                                 remedy=f"fleetops-agent reset --gpu {e['uuid']}")
                    pending.append(e)
                    continue
                held.heartbeat(f"MIG mode on {e['uuid']} applied", budget())
            table = gpu.table
            for item in e["create"]:
                assert table is not None
                prof = table.get(item["profile"])
                assert prof is not None
                held.heartbeat(f"create {prof.name} on {e['uuid']}", budget())
                with guard.deferred():
                    ops.create(e["uuid"], prof, int(item["placement_start"]))
                    e["changed"] = True
                left -= 1
            e["result"] = "done"
        except MigChangeError as exc:
            e.update(result="failed", detail=f"{e['detail']}: stopped: {exc}")
            failed = True
    return failed, pending


def _reset_options(uuid: str, bus_id: str, held: Any, dry_run: bool, lock_path: str | None = None) -> Any:
    """The reset flow's options for the GPU reset a MIG mode waits for: the reset command's
    defaults (clients from $FLEETOPS_RESET_CLIENTS, the backend's journal and lock) and never
    ``--kill-processes``: a GPU with compute processes is refused by the flow's precondition,
    with its remedy (drain the jobs), and left mode-pending."""
    from fleetops.agent.reset.flow import Options, parse_clients

    return Options(selector=uuid, expected_bus=bus_id, dry_run=dry_run, clients=parse_clients(None),
                   lock_path=lock_path, held_lock=held)


def _reset_summary(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: doc.get(k) for k in ("result", "message", "remedy", "verified")}
    out["preconditions"] = [{k: c.get(k) for k in ("name", "status", "detail", "remedy") if c.get(k) is not None}
                            for c in doc.get("preconditions") or []]
    if doc.get("actions"):
        out["actions"] = [{k: a.get(k) for k in ("action", "unit", "ok", "detail") if k in a} for a in doc["actions"]]
    if doc.get("log"):
        out["log"] = doc["log"]
    return out


def _flow(call: Any, *args: Any) -> dict[str, Any]:
    """The reset flow's report; one that cannot even start (no NVML, an unreadable state) is a
    report with result ``error`` naming why, so the GPU is left mode-pending rather than mig
    apply stopping with the rest of its plan unreported."""
    try:
        rdoc, _code = call(*args)
    except Exception as exc:  # noqa: BLE001
        return {"result": "error", "message": f"the reset flow could not start: {exc}",
                "remedy": "look at the node (fleetops-agent reset --gpu GPU --dry-run)"}
    return dict(rdoc)


def _reset_for_mode(ops: MigOps, e: dict[str, Any], held: Any, guard: Any, enabled: bool) -> bool:
    """Run the safe reset flow for a GPU whose MIG mode is pending, under the lock mig apply
    holds; True when the mode is current after it. A refusal leaves the GPU ``mode-pending``
    with the flow's reason and remedy; a failed reset fails the GPU; a signal during the reset
    ends the flow as it ends the reset command, then interrupts mig apply."""
    from fleetops.agent.reset import flow

    opts = _reset_options(e["uuid"], e["bus_id"], held, False)
    rdoc = _flow(flow.run, opts, ops.reset_backend(), guard)
    e["reset_report"] = _reset_summary(rdoc)
    result = rdoc.get("result")
    if result == "interrupted":
        import signal

        raise flow.Interrupted(int(signal.Signals[str(rdoc["interrupted_by"])]))
    word = "enabled" if enabled else "disabled"
    if result == "reset":
        again = next((g for g in ops.read() if g.uuid == e["uuid"]), None)
        if again is not None and again.mode_current == enabled:
            e["changed"] = True
            e["detail"] += f"; the GPU was reset (safe reset flow) and MIG mode is {word}"
            return True
        e.update(result="failed", detail=f"{e['detail']}: stopped: the GPU was reset but MIG mode is still not {word}",
                 remedy="look at the GPU (nvidia-smi -q), then reboot the node if the mode stays pending")
        return False
    if result == "failed":
        e["changed"] = True
        e.update(result="failed", detail=f"{e['detail']}: stopped: the GPU reset failed: {rdoc.get('message')}",
                 remedy=rdoc.get("remedy") or "look at the GPU (fleetops-agent reset --dry-run)")
        return False
    e.update(result="mode-pending", status="mode-pending",
             detail=f"MIG mode {word} is pending until the GPU is reset, and the safe reset flow refused: "
             f"{rdoc.get('message')}",
             remedy=rdoc.get("remedy") or f"fleetops-agent reset --gpu {e['uuid']}")
    return False


def _dry_run_resets(ops: MigOps, todo: list[dict[str, Any]], lock_path: str | None) -> list[dict[str, Any]]:
    """A dry run of the reset flow for each GPU whose mode change may wait for a reset: its
    preconditions evaluated, nothing changed. The entries whose needed reset would be refused."""
    from fleetops.agent.reset import flow

    blocked = []
    for e in todo:
        if e["status"] != "mode-change" or e["reset"] is False:
            continue
        opts = _reset_options(e["uuid"], e["bus_id"], None, True, lock_path)
        rdoc = _flow(flow.run, opts, ops.reset_backend())
        e["reset_report"] = _reset_summary(rdoc)
        if rdoc.get("result") == "would-reset":
            continue
        how = "could not be evaluated" if rdoc.get("result") == "error" else "would be refused"
        maybe = " (if NVML keeps the mode pending)" if e["reset"] is None else ""
        e["detail"] += f"; the GPU reset{maybe} {how}: {rdoc.get('message')}"
        e["remedy"] = rdoc.get("remedy")
        if e["reset"] is True:
            blocked.append(e)
    return blocked


def _verify(ops: MigOps, todo: list[dict[str, Any]], source: Source) -> None:
    after = {g.uuid: g for g in ops.read()}
    for e in todo:
        gpu = after.get(e["uuid"])
        if gpu is None:
            e.update(result="failed", detail=f"{e['detail']}; the GPU is gone after the change")
            continue
        e["after"] = [m.to_dict() for m in gpu.instances or []]
        if e.get("result") != "done":
            continue
        check = plan_gpu(gpu, source.want(gpu))
        if check["status"] != "unchanged":
            e.update(result="failed", detail=f"{e['detail']}; read back: {check['detail']}")
            continue
        placed = {(m.profile, m.start) for m in gpu.instances or []}
        missing = [c for c in e["create"] if (c["profile"], c["placement_start"]) not in placed]
        if missing:
            e.update(result="failed", detail=f"{e['detail']}; read back without "
                     + ", ".join(f"{c['profile']} at slice {c['placement_start']}" for c in missing))


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    if args.profiles:
        raise MigError("--profiles belongs to mig reset; mig apply takes --layout or --config/--select", "usage", 2)
    if bool(args.layout) == bool(args.config):
        raise MigError("mig apply needs exactly one of --layout PROFILES or --config FILE --select NAME", "usage", 2)
    if args.config and not args.select:
        raise MigError("--config needs --select NAME (the config in the file)", "usage", 2)
    if args.select and not args.config:
        raise MigError("--select needs --config FILE", "usage", 2)
    source = Source(layout=parse_layout(args.layout)) if args.layout else Source(config=args.config, select=args.select)
    return run(source, args.gpu, bool(args.dry_run), args.backend, args.state, args.lock_file,
               reset=not getattr(args, "no_reset", False))
