"""The two ways to read and change a node's MIG state behind one interface (``MigOps``): the
simulator's state file (``SimMig``) and NVML (``NvmlMig``, through ``fleetops.gpu.nvml``'s MIG
helpers); ``make_ops`` picks one for the backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetops.agent.mig import MigError
from fleetops.agent.reset.backends import Backend, DryRunGuard
from fleetops.catalog import mig as catalog

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
