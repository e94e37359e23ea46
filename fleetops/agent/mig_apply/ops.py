"""``mig apply``'s reads and changes of a node's MIG state (``MigOps``), through the GPU access
the reset flow's backend holds (``gpu.backend.GpuAccess``'s ``mig_*`` methods: the simulator's
state file or NVML's ``MigControl``); ``make_ops`` builds one on the backend the agent picks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetops.agent.mig import MigError
from fleetops.agent.reset.backends import Backend, DryRunGuard
from fleetops.catalog import mig as catalog
from fleetops.gpu.backend import NodeChangeError
from fleetops.gpu.node import SnapshotError

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
    """Reading and changing one node's MIG state through ``backend.gpu``; changing methods refuse
    in a dry run (the backend's own ``dry_run``).

    ``backend`` is the reset flow's backend for the same node, through which a MIG mode that
    waits for a GPU reset is applied."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend.dry_run)
        self.backend = backend
        self.gpu = backend.gpu
        self.name = backend.name

    def reset_backend(self) -> Backend:
        return self.backend

    def hostname(self) -> str:
        return self.gpu.hostname()

    def read(self) -> list[GpuMig]:
        try:
            raw = self.gpu.mig_read()
        except SnapshotError as exc:
            raise MigError(str(exc), "collect") from exc
        out = []
        for g in raw:
            instances = None
            if g["instances"] is not None:
                instances = [Inst(gpu_instance_id=int(m["gpu_instance_id"]), profile=m["profile"], start=m["start"],
                                  size=m["size"], compute_instance_id=m["compute_instance_id"], uuid=m["uuid"],
                                  in_use=bool(m["in_use"]), pids=list(m["pids"]))
                             for m in g["instances"]]
            out.append(GpuMig(uuid=g["uuid"], bus_id=g["bus_id"], index=int(g["index"]), name=g["name"],
                              mode_current=g["mode_current"], mode_pending=g["mode_pending"], instances=instances,
                              table=g["table"], why=g["why"], loose_pids=list(g["loose_pids"]),
                              device_id=g.get("device_id"), reset_needed=g.get("reset_needed")))
        return out

    def set_mode(self, uuid: str, enabled: bool) -> bool:
        """True when the mode is current now, False when it waits for a GPU reset."""
        self._changing("set MIG mode")
        return bool(self._call(self.gpu.mig_set_mode, uuid, enabled))

    def destroy(self, uuid: str, inst: Inst) -> None:
        self._changing("destroy a MIG instance")
        self._call(self.gpu.mig_destroy, uuid, inst.gpu_instance_id)

    def create(self, uuid: str, profile: catalog.GiProfile, start: int) -> int:
        """A GPU instance at ``start`` and its one compute instance; its GPU instance id."""
        self._changing("create a MIG instance")
        return int(self._call(self.gpu.mig_create, uuid, profile, start))

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except NodeChangeError as exc:
            raise MigChangeError(str(exc)) from exc


def make_ops(requested: str, state_path: str | None, dry_run: bool) -> tuple[MigOps, str]:
    """The ops and the default lock path of the backend the agent picks (as reset does)."""
    from fleetops.agent.reset.backends import ResetError, make_backend

    try:
        back = make_backend(requested, state_path, dry_run)
    except ResetError as exc:
        raise MigError(str(exc), exc.kind, exc.exit_code) from exc
    return MigOps(back), back.default_lock()
