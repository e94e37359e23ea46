"""Where the reset flow reads and changes a node: one ``Backend``, the node's GPU access and its
host services together.

The flow (``flow.py``) only talks to a ``Backend``; every way the simulator differs from a real
node lives behind the same methods, so the flow has no ``if sim`` branch and the NVML path runs
the same steps in unit tests as on a node.

A backend is composed of two parts, one of each kind: the node's GPU access (``self.gpu``:
``gpu.nvml.access.NvmlAccess`` or ``sim.access.SimAccess``, the classes the daemon samples
through), which takes the cold snapshot (``snapshot``, released afterwards) and looks up, resets
and changes GPUs; and its host services (``self.host``: ``host.SystemdHost`` or
``host.SimHost``): systemd units or the simulator's records of them, ending processes, and where
the node keeps its lock, reset journal and daemon socket. ``nvml_backend`` and ``sim_backend``
put each kind together; ``make_backend`` picks the kind as every agent command does.

A backend built for a dry run refuses every changing method (``DryRunViolation``) before it does
anything, the GPU access's and the host's included. Tests replace the functions that change a
real node (``host.send_signal``, ``host.systemctl``, ``gpu.nvml.access.nvidia_smi_reset``) and
``NvmlAccess.snapshot`` with fakes that record each call, and so run the NVML kind's whole
changing path without a GPU.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fleetops import model
from fleetops.agent.reset.host import HostServices, SimHost, SystemdHost

if TYPE_CHECKING:
    from fleetops.gpu.backend import GpuAccess
    from fleetops.gpu.nvml.access import NvmlAccess


class ResetError(Exception):
    """The reset cannot even be attempted; ``kind`` names why, ``exit_code`` 1 or 2 (usage)."""

    def __init__(self, message: str, kind: str = "reset", exit_code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


class DryRunViolation(RuntimeError):
    """A changing operation was reached in a dry run: a bug, stopped before it did anything."""


# --- the backend -----------------------------------------------------------------------------


class DryRunGuard:
    """Reading methods work in a dry run; changing methods call ``_changing`` first and so
    refuse in one (the reset backends and ``mig apply``'s node access)."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run

    def _changing(self, what: str) -> None:
        if self.dry_run:
            raise DryRunViolation(f"dry run: refusing to {what}")


class Backend(DryRunGuard):
    """What the reset flow (and ``mig reset``, the setters) may do to a node: the GPU operations
    through ``self.gpu``, the units, processes and the node's places through ``self.host``; every
    changing one guarded in a dry run here. ``name``: the GPU access kind ("nvml" or "sim")."""

    def __init__(self, gpu: GpuAccess, host: HostServices, dry_run: bool) -> None:
        super().__init__(dry_run)
        self.gpu = gpu
        self.host = host
        self.name = gpu.name

    # reading
    def snapshot(self) -> model.Node:
        """A fresh snapshot of this node (the one ``fleetops-agent collect`` prints), nothing of
        the GPUs held after it: the reset process must hold no device file when it resets, or it
        is itself the client that makes ``nvidia-smi -r`` fail."""
        return self.gpu.snapshot(release=True)

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        """The GPU the selector names when it is known but not enumerated (fallen off the bus)."""
        return self.gpu.lost_gpu(node, uuid, bus_id)

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        """A second, independent look-up that the UUID and the bus id name the same GPU."""
        return self.gpu.cross_check(gpu)

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        return self.host.services(units)

    def listed_pids(self, gpu: model.Gpu) -> list[int] | None:
        """The compute processes a fresh look lists on ``gpu`` (None: it is gone)."""
        again = self.snapshot().gpu_by_uuid(gpu.uuid)
        if again is None:
            return None
        return [p.pid for p in again.processes or []]

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        """The XIDs that count after a reset at ``reset_at``."""
        return self.gpu.xids_since_reset(node, reset_at)

    def default_lock(self) -> str:
        return self.host.default_lock()

    def default_log(self) -> str:
        return self.host.default_log()

    def device_prefix(self) -> str:
        """Where the node's device files start (``gpu.holders``)."""
        return self.gpu.device_prefix()

    def holders(self) -> tuple[list[Any] | None, str | None]:
        """(every process holding a device file, None) or (None, why they cannot be listed)."""
        return self.gpu.holders()

    def daemon_socket(self) -> str:
        """The resident agent's socket on this node (it is paused for the reset)."""
        return self.host.daemon_socket()

    def service_pids(self, units: list[str]) -> dict[int, str]:
        """pid -> unit for the running client units (their processes hold the device files)."""
        return self.host.service_pids(units)

    def job_records(self) -> tuple[list[Any] | None, list[str], str]:
        """(the node's job records, or None when the folder cannot be listed; the errors of those
        that do not read; the folder): which Slurm jobs hold which GPUs, as the prolog wrote it."""
        from fleetops.jobs import record

        where = self.host.jobs_dir()
        try:
            records, errors = record.read_all(where)
        except record.JobRecordError as exc:
            return None, [str(exc)], where
        return records, errors, where

    def release_own(self) -> int:
        """Let go of whatever this process holds of the GPUs (NVML's device files) right before
        the reset; how many NVML initialisations were shut down."""
        return self.gpu.release_own()

    # changing
    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        self._changing("end processes")
        return self.host.end_processes(gpu, procs, grace_s)

    def stop_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"stop {unit}")
        return self.host.stop_service(unit)

    def start_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"start {unit}")
        return self.host.start_service(unit)

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        self._changing("reset the GPU")
        return self.gpu.reset(gpu, timeout)

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        """Destroy the GPU's MIG instances and create ``profiles`` (``mig reset``)."""
        self._changing("recreate MIG instances")
        return self.gpu.recreate_mig(uuid, profiles)

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        """Set power cap, persistence or MIG mode on the GPUs ``uuids`` (``fleetops-agent set``)."""
        self._changing(f"set {setting}")
        self.gpu.apply_setting(setting, field_name, value, uuids)


def nvml_backend(dry_run: bool, gpu: NvmlAccess | None = None) -> Backend:
    """A real node: ``NvmlAccess`` for the GPUs (``gpu``: one already built, tests pass one over
    a fake NVML), systemd and signals for units and processes."""
    from fleetops.gpu.nvml.access import NvmlAccess

    return Backend(gpu if gpu is not None else NvmlAccess(), SystemdHost(), dry_run)


def sim_backend(path: str, dry_run: bool) -> Backend:
    """The simulated node of the state file ``path``: ``SimAccess`` for the GPUs (its reset
    takes ``node.reset_duration_s`` seconds of the state, default 0, the time a real GPU is away
    during ``nvidia-smi -r``), the state file's records for services and processes."""
    from fleetops.sim.access import SimAccess

    return Backend(SimAccess(path), SimHost(path), dry_run)


def make_backend(requested: str, state_path: str | None, dry_run: bool) -> Backend:
    from fleetops.agent.collect import CollectError, choose_backend

    try:
        chosen = choose_backend(requested)
    except CollectError as exc:
        raise ResetError(str(exc), "usage", 2) from exc
    if chosen == "sim":
        from fleetops.sim import gpu as sim

        path = state_path or os.environ.get(sim.STATE_ENV)
        if not path:
            raise ResetError(f"the sim backend needs a state file: set {sim.STATE_ENV} or pass --state", "usage", 2)
        return sim_backend(path, dry_run)
    return nvml_backend(dry_run)
