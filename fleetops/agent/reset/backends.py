"""Where the reset flow reads and changes a node: the backend interface and its two backends.

The flow (``flow.py``) only talks to a ``Backend``; every way the simulator differs from a real
node lives here, behind the same methods, so the flow has no ``if sim`` branch and the NVML path
runs the same steps in unit tests as on a node.

The few functions that change a real node (``send_signal``, ``systemctl``, ``nvidia_smi_reset``)
and the two that read it for the flow (``nvml_snapshot``, ``process_alive``) are module-level
functions, looked up at call time: tests replace them with fakes that record each call, and so
run the NVML backend's whole changing path without a GPU. A backend built for a dry run refuses
every changing method (``DryRunViolation``) before it does anything.
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


class ResetError(Exception):
    """The reset cannot even be attempted; ``kind`` names why, ``exit_code`` 1 or 2 (usage)."""

    def __init__(self, message: str, kind: str = "reset", exit_code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


class NodeChangeError(Exception):
    """The node refused a change (NVML said no); the message names the setting and the reason."""


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


def nvidia_smi_reset(bus_id: str, timeout: float) -> tuple[int, str]:
    """``nvidia-smi -r -i BUS_ID`` (argument list, no shell); (exit status, output)."""
    cmd = ["nvidia-smi", "-r", "-i", bus_id]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 124, f"nvidia-smi -r timed out after {timeout:.0f}s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def nvml_snapshot() -> model.Node:
    """A fresh snapshot of this node through NVML (the same one ``fleetops-agent collect``
    prints), NVML shut down after it: the reset process must hold no device file when it
    resets, or it is itself the client that makes ``nvidia-smi -r`` fail."""
    from fleetops.agent.collect import collect

    return collect("nvml", None, release=True)


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
    """What the reset flow (and ``mig reset``) may do to a node."""

    name = "unknown"

    # reading
    def snapshot(self) -> model.Node:
        raise NotImplementedError

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        """The GPU the selector names when it is known but not enumerated (fallen off the bus)."""
        raise NotImplementedError

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        """A second, independent look-up that the UUID and the bus id name the same GPU."""
        return "ok", "UUID and bus id from one snapshot"

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        raise NotImplementedError

    def listed_pids(self, gpu: model.Gpu) -> list[int] | None:
        """The compute processes a fresh look lists on ``gpu`` (None: it is gone)."""
        again = self.snapshot().gpu_by_uuid(gpu.uuid)
        if again is None:
            return None
        return [p.pid for p in again.processes or []]

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        """The XIDs that count after a reset at ``reset_at``: a kernel log keeps the ones that led to it."""
        return [x for x in node.xids if x.timestamp is None or x.timestamp >= reset_at]

    def default_lock(self) -> str:
        return os.environ.get(LOCK_ENV) or node_lock.DEFAULT_PATH

    def default_log(self) -> str:
        return os.environ.get(LOG_ENV) or DEFAULT_LOG

    def device_prefix(self) -> str:
        """Where the node's device files start (``gpu.holders``)."""
        from fleetops.gpu import holders

        return holders.DEVICE_PREFIX

    def holders(self) -> tuple[list[Any] | None, str | None]:
        """(every process holding a device file, None) or (None, why they cannot be listed)."""
        from fleetops.gpu import holders

        if not holders.readable():
            return None, "not root: other processes' descriptors are not readable"
        return holders.scan(self.device_prefix()), None

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
        return 0

    # changing
    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        raise NotImplementedError

    def stop_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def start_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        raise NotImplementedError

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        """Destroy the GPU's MIG instances and create ``profiles`` (``mig reset``)."""
        raise NotImplementedError

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        """Set power cap, persistence or MIG mode on the GPUs ``uuids`` (``fleetops-agent set``)."""
        raise NotImplementedError


class SimBackend(Backend):
    """The node's simulator state file: processes, services and the reset are records in it.

    A process record marked ``real`` stands for a process of this machine (tests start one) and
    is signalled like on a node; the others are ended by removing their record. The simulated
    reset takes ``node.reset_duration_s`` seconds of the state (default 0), the time a real GPU
    is away during ``nvidia-smi -r``.
    """

    name = "sim"

    def __init__(self, path: str, dry_run: bool) -> None:
        super().__init__(dry_run)
        self.path = path

    def snapshot(self) -> model.Node:
        from fleetops.agent.collect import collect

        return collect("sim", self.path)

    def _state(self) -> dict[str, Any]:
        from fleetops.sim import gpu as sim

        return sim.read_state(self.path)

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        from fleetops.sim import gpu as sim

        state = self._state()
        pos, why = sim.find_gpu(state, uuid or bus_id or "")
        if pos is None or why is None:
            return None
        raw = state["gpus"][pos]
        text = "Xid 79: the GPU has fallen off the bus" if why == "xid:79" else "the driver does not enumerate it"
        return {"uuid": raw["uuid"], "bus_id": raw["bus_id"], "reason": text}

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        from fleetops.sim import gpu as sim

        state = self._state()
        by_uuid, _ = sim.find_gpu(state, gpu.uuid)
        by_bus, _ = sim.find_gpu(state, gpu.bus_id)
        if by_uuid is None or by_uuid != by_bus:
            other = state["gpus"][by_bus]["uuid"] if by_bus is not None else "nothing"
            return "failed", f"bus id {gpu.bus_id} holds {other}, not {gpu.uuid}"
        return "ok", "looked up by UUID and by bus id: the same GPU"

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        known = self._state()["node"].get("services", {})
        return {u: known.get(u, "inactive") for u in units}, None

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        # the simulated reset removes the XIDs it cleared from the simulated kernel log and keeps
        # those of the faults it cannot clear: every XID left counts
        return list(node.xids)

    def default_lock(self) -> str:
        return os.path.abspath(self.path) + ".maintenance.lock"

    def device_prefix(self) -> str:
        from fleetops.sim import gpu as sim

        return sim.device_prefix(os.path.abspath(self.path))

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

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        from fleetops.sim import gpu as sim

        self._changing("reset the GPU")
        held, why = self.holders()
        if held:  # the driver refuses a GPU any client holds, a monitoring one too
            return False, f"simulated nvidia-smi -r -i {gpu.bus_id}: {sim.in_use_message(gpu.bus_id, held)}", {
                "holders": [h.to_dict() for h in held]}
        if held is None:
            return False, f"simulated nvidia-smi -r -i {gpu.bus_id}: cannot tell who holds the GPU ({why})", {}
        duration = sim.reset_duration_s(self._state())
        if duration > 0:
            # the GPU is away while it resets; the state says which one, as long as it is away
            with sim.locked_state(self.path) as st:
                st["node"][sim.RESETTING_FIELD] = gpu.uuid
            time.sleep(min(duration, timeout))
        try:
            with sim.locked_state(self.path) as st:
                st["node"].pop(sim.RESETTING_FIELD, None)
                pos, _ = sim.find_gpu(st, gpu.uuid)
                if pos is None:
                    raise sim.SimError(f"{gpu.uuid} is no longer on this node")
                done = sim.reset_gpu(st, pos)
        except sim.SimError as exc:
            return False, f"simulated reset failed: {exc}", {}
        cleared = ", ".join(done["cleared"]) or "nothing (no volatile fault pending)"
        kept = f"; still present: {', '.join(done['kept'])}" if done["kept"] else ""
        return True, f"simulated nvidia-smi -r -i {gpu.bus_id}: cleared {cleared}{kept}", {
            "cleared": done["cleared"],
            "kept": done["kept"],
            "xids_cleared": done["xids_cleared"],
        }

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        from fleetops.sim import gpu as sim

        self._changing("recreate MIG instances")
        try:
            with sim.locked_state(self.path) as st:
                pos, _ = sim.find_gpu(st, uuid)
                if pos is None:
                    raise sim.SimError(f"{uuid} is no longer on this node")
                sim.mig_reset(st, pos, profiles)
        except sim.SimError as exc:
            return False, str(exc)
        return True, "simulated: destroyed and recreated"

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        from fleetops.sim import gpu as sim

        self._changing(f"set {setting}")
        with sim.locked_state(self.path) as state:
            for uuid in uuids:
                pos = next(i for i, g in enumerate(state["gpus"]) if g["uuid"] == uuid)
                try:
                    sim.require_present(state, pos, f"set {setting}")
                except sim.SimError as exc:  # nothing is written: the state lock's body raised
                    raise NodeChangeError(str(exc)) from exc
                state["gpus"][pos][field_name] = value
                if field_name == "mig_mode_current":
                    state["gpus"][pos]["mig_mode_pending"] = value
                sim.retire_setting_fault(state, field_name, pos)


class NvmlBackend(Backend):
    """A real node: NVML for reading, signals, systemctl and ``nvidia-smi -r`` for changing."""

    name = "nvml"

    def snapshot(self) -> model.Node:
        return nvml_snapshot()

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        lost_buses = {x.bus_id for x in node.xids if x.code == 79 and x.bus_id and x.gpu_uuid is None}
        enumerated = {g.bus_id for g in node.gpus}
        if bus_id:
            on_pci = _pci_vendor(bus_id) == "0x10de"
            if bus_id in lost_buses:
                return {"uuid": uuid, "bus_id": bus_id, "reason": "Xid 79: the GPU has fallen off the bus"}
            if on_pci and bus_id not in enumerated:
                return {"uuid": uuid, "bus_id": bus_id, "reason": "on the PCI bus but not enumerated by the driver"}
            return None
        unclaimed = sorted(b for b in lost_buses - enumerated if b)
        if unclaimed:
            return {
                "uuid": uuid,
                "bus_id": None,
                "reason": f"not enumerated; Xid 79 (fallen off the bus) was logged for {', '.join(unclaimed)}",
            }
        return None

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        try:
            import pynvml as nv
        except ImportError:
            return "ok", "UUID and bus id from one snapshot (pynvml not importable for a second look-up)"
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return "failed", f"NVML does not start for the second look-up: {exc}"
        try:
            by_uuid = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            bus_of_uuid = _text(nv.nvmlDeviceGetPciInfo(by_uuid).busId)
            by_bus = nv.nvmlDeviceGetHandleByPciBusId(_nvml_bus(gpu.bus_id))
            uuid_of_bus = _text(nv.nvmlDeviceGetUUID(by_bus))
        except nv.NVMLError as exc:
            return "failed", f"NVML look-up of {gpu.uuid} / {gpu.bus_id} failed: {exc}"
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
        if model.normalize_bus_id(bus_of_uuid) != gpu.bus_id or uuid_of_bus != gpu.uuid:
            return "failed", (
                f"NVML by UUID {gpu.uuid} -> bus {bus_of_uuid}; by bus {gpu.bus_id} -> UUID {uuid_of_bus}: they disagree"
            )
        return "ok", f"NVML by UUID -> {model.normalize_bus_id(bus_of_uuid)}, by bus id -> {uuid_of_bus}: the same GPU"

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        from fleetops.agent import hostinfo

        if not units:
            return {}, None
        return hostinfo.service_states(tuple(units))

    def service_pids(self, units: list[str]) -> dict[int, str]:
        return {pid: unit for unit in units for pid in unit_pids(unit)}

    def release_own(self) -> int:
        from fleetops.gpu import nvml

        return nvml.release_process()

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

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        self._changing("reset the GPU")
        rc, out = nvidia_smi_reset(gpu.bus_id, timeout)
        return rc == 0, out or f"exit {rc}", {"command": ["nvidia-smi", "-r", "-i", gpu.bus_id], "exit_status": rc}

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        self._changing("recreate MIG instances")
        steps = [["-i", uuid, "-dci"], ["-i", uuid, "-dgi"], ["-i", uuid, "-cgi", ",".join(profiles), "-C"]]
        said = []
        for step in steps:
            rc, out = nvidia_smi_mig(step)
            said.append(f"nvidia-smi mig {' '.join(step)}: exit {rc}")
            # destroying when there is nothing to destroy is not an error worth stopping for
            if rc != 0 and step[-1] not in ("-dci", "-dgi"):
                return False, "; ".join(said) + (f": {out}" if out else "")
        return True, "; ".join(said)

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        import pynvml as nv

        self._changing(f"set {setting}")
        nv.nvmlInit()
        try:
            for uuid in uuids:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                if setting == "power":
                    nv.nvmlDeviceSetPowerManagementLimit(handle, int(value * 1000))
                elif setting == "persistence":
                    nv.nvmlDeviceSetPersistenceMode(handle, 1 if value else 0)
                elif setting == "mig":
                    nv.nvmlDeviceSetMigMode(handle, 1 if value else 0)
        except nv.NVMLError as exc:
            raise NodeChangeError(f"{setting}: NVML refused the change: {exc}") from exc
        finally:
            nv.nvmlShutdown()


def nvidia_smi_mig(args: list[str], timeout: float | None = None) -> tuple[int, str]:
    """``nvidia-smi mig ARGS`` (argument list, no shell); (exit status, output)."""
    from fleetops.catalog.actions import MIG_COMMAND_TIMEOUT_S

    limit = MIG_COMMAND_TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.run(["nvidia-smi", "mig", *args], capture_output=True, text=True, timeout=limit, check=False)
    except FileNotFoundError:
        return 127, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 124, "nvidia-smi mig timed out"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_bus(bus_id: str) -> str:
    return "0000" + bus_id if len(bus_id) == 12 else bus_id  # NVML's 8-digit domain form


def _pci_vendor(bus_id: str) -> str | None:
    try:
        with open(f"/sys/bus/pci/devices/{bus_id}/vendor", encoding="ascii") as fh:
            return fh.read().strip().lower()
    except OSError:
        return None


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
