"""Host services: what the reset flow (and ``mig reset``, ``mig apply``'s reset) does to a node
beside its GPUs, one class per kind of node, and where that node keeps its lock, reset journal
and daemon's socket. GPU access is ``gpu.backend.GpuAccess``'s; this is the rest.

- ``SystemdHost``: a real node: systemd units (``systemctl``, their processes from the cgroup),
  processes ended with signals, the lock and journal at their fixed paths (or the environment's).
- ``SimHost``: the simulator's node: its services and processes are records in its state file
  (a record marked ``real`` stands for a process of this machine and is signalled as on a node),
  its lock, journal and daemon socket beside the state file.

The functions that change a real node (``send_signal``, ``systemctl``) and the one that reads it
for the flow (``process_alive``) are module-level functions, looked up at call time: tests
replace them with fakes that record each call. The dry-run guard is the ``Backend``'s
(``backends.py``), which calls a changing method here only outside a dry run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from fleetops import model
from fleetops.agent import lock as node_lock
from fleetops.catalog.actions import KILL_WAIT_S, RESET_JOURNAL, RESET_JOURNAL_ENV, SERVICE_TIMEOUT_S

DEFAULT_LOG = RESET_JOURNAL
LOG_ENV = RESET_JOURNAL_ENV
LOCK_ENV = "FLEETOPS_LOCK"


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


# --- ending processes (both kinds end real processes the same way) --------------------------


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


# --- the interface and its two kinds ----------------------------------------------------------


class HostServices:
    """A node's units and processes, and where it keeps its lock, journal and daemon socket.
    Changing methods are called only outside a dry run (the ``Backend`` guards them)."""

    # reading
    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        """Each unit's state (None where unknown), or why none could be read."""
        raise NotImplementedError

    def service_pids(self, units: list[str]) -> dict[int, str]:
        """pid -> unit for the running client units (their processes hold the device files)."""
        return {}

    def default_lock(self) -> str:
        return os.environ.get(LOCK_ENV) or node_lock.DEFAULT_PATH

    def default_log(self) -> str:
        return os.environ.get(LOG_ENV) or DEFAULT_LOG

    def daemon_socket(self) -> str:
        """The resident agent's socket on this node (it is paused for the reset)."""
        raise NotImplementedError

    def jobs_dir(self) -> str:
        """Where the Slurm prolog writes this node's job records (``fleetops.jobs.record``)."""
        from fleetops.jobs import record

        return record.default_dir()

    # changing
    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        raise NotImplementedError

    def stop_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def start_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError


class SystemdHost(HostServices):
    """A real node: systemd units, signals to real processes."""

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        from fleetops.gpu import hostinfo

        if not units:
            return {}, None
        return hostinfo.service_states(tuple(units))

    def service_pids(self, units: list[str]) -> dict[int, str]:
        return {pid: unit for unit in units for pid in unit_pids(unit)}

    def daemon_socket(self) -> str:
        from fleetops.agent.serve import client

        return client.action_socket("nvml", None)

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        return end_pids(procs, grace_s)

    def stop_service(self, unit: str) -> tuple[bool, str]:
        rc, out = systemctl("stop", unit)
        return rc == 0, out or f"systemctl stop {unit}: exit {rc}"

    def start_service(self, unit: str) -> tuple[bool, str]:
        rc, out = systemctl("start", unit)
        return rc == 0, out or f"systemctl start {unit}: exit {rc}"


class SimHost(HostServices):
    """The node's simulator state file: processes and services are records in it.

    A process record marked ``real`` stands for a process of this machine (tests start one) and
    is signalled like on a node; the others are ended by removing their record.
    """

    def __init__(self, path: str) -> None:
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

    def jobs_dir(self) -> str:
        """The node's run folder's ``jobs/`` (as ``fleetops-agent job`` writes them there)."""
        from fleetops.jobs import record

        return record.default_dir(os.path.dirname(self.daemon_socket()))

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        from fleetops.sim import gpu as sim

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
        return self._service(unit, "inactive")

    def start_service(self, unit: str) -> tuple[bool, str]:
        return self._service(unit, "active")

    def _service(self, unit: str, status: str) -> tuple[bool, str]:
        from fleetops.sim import gpu as sim

        with sim.locked_state(self.path) as st:
            sim.set_service(st, unit, status)
        return True, f"simulated: {unit} recorded {status}"
