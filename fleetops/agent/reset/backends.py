"""Where the reset flow reads and changes a node: the backend interface and its two backends.

The flow (``flow.py``) only talks to a ``Backend``; every way the simulator differs from a real
node lives behind the same methods, so the flow has no ``if sim`` branch and the NVML path runs
the same steps in unit tests as on a node.

A backend holds the node's GPU access (``self.gpu``: ``gpu.nvml.access.NvmlAccess`` or
``sim.access.SimAccess``, the classes the daemon samples through), which takes the cold snapshot
(``snapshot``, released afterwards) and looks up, resets and changes GPUs; what is not GPU access
is here: systemd units, signals to processes, the node lock, the reset journal and the daemon's
socket.

The functions that change a real node from here (``send_signal``, ``systemctl``) and the one
that reads it for the flow (``process_alive``) are module-level functions, looked up at call
time: tests replace them (and ``gpu.nvml.access.nvidia_smi_reset``, and ``NvmlAccess.snapshot``)
with fakes that record each call, and so run the NVML backend's whole changing path without a GPU. A
backend built for a dry run refuses every changing method (``DryRunViolation``) before it does
anything, the GPU access's included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

from fleetops import model
from fleetops.agent import lock as node_lock
from fleetops.catalog.actions import KILL_WAIT_S, RESET_JOURNAL, RESET_JOURNAL_ENV, SERVICE_TIMEOUT_S

if TYPE_CHECKING:
    from fleetops.gpu.backend import GpuAccess
    from fleetops.gpu.nvml.access import NvmlAccess

DEFAULT_LOG = RESET_JOURNAL
LOG_ENV = RESET_JOURNAL_ENV
LOCK_ENV = "FLEETOPS_LOCK"


class ResetError(Exception):
    """The reset cannot even be attempted; ``kind`` names why, ``exit_code`` 1 or 2 (usage)."""

    def __init__(self, message: str, kind: str = "reset", exit_code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


class DryRunViolation(RuntimeError):
    """A changing operation was reached in a dry run: a bug, stopped before it did anything."""


# --- the functions that touch a real node (tests replace them) ------------------------------


def send_signal(pid: int, sig: int) -> None:
    os.kill(pid, sig)


def process_alive(pid: int) -> bool:
    return node_lock.pid_alive(pid)


def systemctl(verb: str, unit: str, timeout: float = SERVICE_TIMEOUT_S) -> tuple[int, str]:
    """``systemctl VERB UNIT`` (argument list, no shell); (exit status, output)."""
    try:
        proc = subprocess.run(["systemctl", verb, unit], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "systemctl not found"
    except subprocess.TimeoutExpired:
        return 124, f"systemctl {verb} {unit} timed out after {timeout:.0f}s"
    return proc.returncode, (proc.stderr or proc.stdout).strip()


CGROUP_ROOT = "/sys/fs/cgroup"


def unit_pids(unit: str, root: str = CGROUP_ROOT) -> list[int]:
    """Every process of a running systemd unit, from its cgroup (read, no subprocess: a dry run
    reads it too): ``system.slice/UNIT/cgroup.procs`` under the unified hierarchy, or under
    the legacy ``systemd`` one. [] when the unit runs no process (or the cgroup is elsewhere)."""
    name = unit if "." in unit else unit + ".service"
    for base in (root, os.path.join(root, "systemd")):
        try:
            with open(os.path.join(base, "system.slice", name, "cgroup.procs"), encoding="ascii") as fh:
                return [int(line) for line in fh if line.strip().isdigit()]
        except OSError:
            continue
    return []


# --- ending processes (both backends end real processes the same way) -----------------------


def end_pids(procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
    """SIGTERM each process, wait up to ``grace_s`` for all, SIGKILL the rest; one report each."""
    reports: list[dict[str, Any]] = []
    for proc in procs:
        pid = int(proc["pid"])
        rep: dict[str, Any] = {"pid": pid, "name": proc.get("name"), "signals": [], "ended": False}
        try:
            send_signal(pid, signal.SIGTERM)
            rep["signals"].append("SIGTERM")
        except ProcessLookupError:
            rep["ended"] = True
            rep["detail"] = "already gone"
        except PermissionError:
            rep["detail"] = "no permission to signal it"
        reports.append(rep)
    _wait_gone([r for r in reports if not r["ended"]], grace_s)
    for rep in [r for r in reports if not r["ended"] and r["signals"]]:
        try:
            send_signal(rep["pid"], signal.SIGKILL)
            rep["signals"].append("SIGKILL")
        except ProcessLookupError:
            rep["ended"] = True
    _wait_gone([r for r in reports if not r["ended"]], KILL_WAIT_S)
    for rep in reports:
        if not rep["ended"] and "detail" not in rep:
            rep["detail"] = "still running after SIGKILL (uninterruptible sleep? a hung GPU call)"
    return reports


def _wait_gone(reports: list[dict[str, Any]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for rep in reports:
            if not rep["ended"] and not process_alive(rep["pid"]):
                rep["ended"] = True
        if all(r["ended"] for r in reports) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


# --- the interface ------------------------------------------------------------------------------


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
    through ``self.gpu`` (guarded in a dry run here), the rest in this class and its two kinds."""

    name = "unknown"

    def __init__(self, gpu: GpuAccess, dry_run: bool) -> None:
        super().__init__(dry_run)
        self.gpu = gpu

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
        raise NotImplementedError

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
        return os.environ.get(LOCK_ENV) or node_lock.DEFAULT_PATH

    def default_log(self) -> str:
        return os.environ.get(LOG_ENV) or DEFAULT_LOG

    def device_prefix(self) -> str:
        """Where the node's device files start (``gpu.holders``)."""
        return self.gpu.device_prefix()

    def holders(self) -> tuple[list[Any] | None, str | None]:
        """(every process holding a device file, None) or (None, why they cannot be listed)."""
        return self.gpu.holders()

    def daemon_socket(self) -> str:
        """The resident agent's socket on this node (it is paused for the reset)."""
        from fleetops.agent.serve import client

        return client.action_socket(self.name, None)

    def service_pids(self, units: list[str]) -> dict[int, str]:
        """pid -> unit for the running client units (their processes hold the device files)."""
        return {}

    def release_own(self) -> int:
        """Let go of whatever this process holds of the GPUs (NVML's device files) right before
        the reset; how many NVML initialisations were shut down."""
        return self.gpu.release_own()

    # changing
    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        raise NotImplementedError

    def stop_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def start_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

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


class SimBackend(Backend):
    """The node's simulator state file: processes and services are records in it, the GPUs are
    ``SimAccess``'s.

    A process record marked ``real`` stands for a process of this machine (tests start one) and
    is signalled like on a node; the others are ended by removing their record. The simulated
    reset takes ``node.reset_duration_s`` seconds of the state (default 0), the time a real GPU
    is away during ``nvidia-smi -r``.
    """

    name = "sim"

    def __init__(self, path: str, dry_run: bool) -> None:
        from fleetops.sim.access import SimAccess

        super().__init__(SimAccess(path), dry_run)
        self.path = path

    def _state(self) -> dict[str, Any]:
        from fleetops.sim import gpu as sim

        return sim.read_state(self.path)

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        known = self._state()["node"].get("services", {})
        return {u: known.get(u, "inactive") for u in units}, None

    def default_lock(self) -> str:
        return os.path.abspath(self.path) + ".maintenance.lock"

    def daemon_socket(self) -> str:
        from fleetops.agent.serve import client

        return client.socket_for("sim", os.path.abspath(self.path), None)

    def default_log(self) -> str:
        stem = os.path.splitext(os.path.abspath(self.path))[0]
        return stem + ".reset.jsonl"

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        from fleetops.sim import gpu as sim

        self._changing("end processes")
        state = self._state()
        pos, _ = sim.find_gpu(state, gpu.uuid)
        if pos is None:
            raise sim.SimError(f"{gpu.uuid} is no longer on this node")
        listed = {int(p["pid"]): p for p in sim.gpu_processes(state, pos)}
        real = [p for p in procs if listed.get(int(p["pid"]), {}).get("real")]
        reports = end_pids(real, grace_s) if real else []
        signalled = {r["pid"] for r in reports}
        for proc in procs:
            if int(proc["pid"]) not in signalled:
                # a record only: no process of this machine to signal
                reports.append(
                    {"pid": int(proc["pid"]), "name": proc.get("name"), "signals": ["SIGTERM"], "ended": True, "simulated": True}
                )
        with sim.locked_state(self.path) as st:
            for rep in reports:
                if rep["ended"]:
                    sim.end_process(st, pos, rep["pid"])
        order = [int(p["pid"]) for p in procs]
        return sorted(reports, key=lambda r: order.index(r["pid"]) if r["pid"] in order else len(order))

    def stop_service(self, unit: str) -> tuple[bool, str]:
        return self._service(unit, "inactive", "stop")

    def start_service(self, unit: str) -> tuple[bool, str]:
        return self._service(unit, "active", "start")

    def _service(self, unit: str, status: str, verb: str) -> tuple[bool, str]:
        from fleetops.sim import gpu as sim

        self._changing(f"{verb} {unit}")
        with sim.locked_state(self.path) as st:
            sim.set_service(st, unit, status)
        return True, f"simulated: {unit} recorded {status}"


class NvmlBackend(Backend):
    """A real node: ``NvmlAccess`` for the GPUs, signals and systemctl for processes and units."""

    name = "nvml"

    def __init__(self, dry_run: bool, gpu: NvmlAccess | None = None) -> None:
        from fleetops.gpu.nvml.access import NvmlAccess

        super().__init__(gpu if gpu is not None else NvmlAccess(), dry_run)

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        from fleetops.gpu import hostinfo

        if not units:
            return {}, None
        return hostinfo.service_states(tuple(units))

    def service_pids(self, units: list[str]) -> dict[int, str]:
        return {pid: unit for unit in units for pid in unit_pids(unit)}

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        self._changing("end processes")
        return end_pids(procs, grace_s)

    def stop_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"stop {unit}")
        rc, out = systemctl("stop", unit)
        return rc == 0, out or f"systemctl stop {unit}: exit {rc}"

    def start_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"start {unit}")
        rc, out = systemctl("start", unit)
        return rc == 0, out or f"systemctl start {unit}: exit {rc}"


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
        return SimBackend(path, dry_run)
    return NvmlBackend(dry_run)
