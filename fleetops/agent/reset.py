"""``fleetops-agent reset``: reset one GPU safely, or say exactly why not.

The order never changes:

1. *Identify.* The GPU is named by UUID or PCI bus id, never by index (indices shift when a GPU
   falls off the bus). It must exist, be enumerated, and its UUID and bus id must agree (checked
   by two independent look-ups on NVML; against ``--bus-id`` when the controller passes it).
   An unknown GPU is an error before anything is touched.
2. *Preconditions*, each reported as ok / failed / skipped with its detail and, when failed,
   its remedy: the node's maintenance lock (``agent.lock``), row-remap failure, MIG instances in
   use, NVLink peers that must be reset together (direct GPU-GPU NVLink, no NVSwitch), the
   fabric manager on NVSwitch systems, compute processes, and the GPU clients that hold the
   device (nvidia-persistenced, DCGM, exporters).
3. *Act*, only when every precondition is ok and this is not a dry run: end the processes
   (``--kill-processes``: SIGTERM, SIGKILL after ``--timeout``), stop the clients, reset
   (``nvidia-smi -r -i BUS_ID``; the simulator models it, see ``gpu.sim.reset_gpu``), restart
   the clients (always, also after a failure), release the lock.
4. *Verify*: the GPU is back with the same UUID at the same bus id and a fresh snapshot passes
   the health checks with no critical finding on it.

Every attempt that is not a dry run is appended as one JSON line to the audit log and sent to
syslog. A dry run evaluates every precondition and changes nothing: it takes no lock (it only
looks), writes no log, sends no signal, stops no service and never reaches ``nvidia-smi -r``:
``_act`` is the only caller of the functions that change anything, it is not called in a dry
run, and each backend's changing methods refuse to run when built for a dry run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.agent import lock as node_lock

DEFAULT_CLIENTS = ("nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter")
CLIENTS_ENV = "FLEETOPS_RESET_CLIENTS"
FABRIC_MANAGER = "nvidia-fabricmanager"
DEFAULT_LOG = "/var/log/fleetops/reset.jsonl"
LOG_ENV = "FLEETOPS_RESET_LOG"
LOCK_ENV = "FLEETOPS_LOCK"
DEFAULT_GRACE_S = 10.0
RESET_TIMEOUT_S = 120.0
KILL_WAIT_S = 5.0

REMEDY_REBOOT = "reboot the node"
REMEDY_INSPECT = "drain and inspect (RMA)"
REMEDY_PEERS = "reset the peer set"
# the most drastic remedy wins when several preconditions fail
_REMEDY_ORDER = (REMEDY_REBOOT, REMEDY_INSPECT, REMEDY_PEERS)


class ResetError(Exception):
    """The reset cannot even be attempted; ``kind`` names why, ``exit_code`` 1 or 2 (usage)."""

    def __init__(self, message: str, kind: str = "reset", exit_code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


class DryRunViolation(RuntimeError):
    """A changing operation was reached in a dry run: a bug, stopped before it did anything."""


@dataclass
class Check:
    name: str
    status: str  # "ok" | "failed" | "skipped"
    detail: str
    remedy: str | None = None
    data: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.remedy:
            out["remedy"] = self.remedy
        if self.data:
            out.update(self.data)
        return out


PRECONDITIONS = (
    "gpu_exists",
    "uuid_matches_bus_id",
    "on_bus",
    "maintenance_lock",
    "row_remap",
    "mig_instances",
    "nvlink_peers",
    "fabric_manager",
    "compute_processes",
    "gpu_clients",
)


# --- the few functions that change a real node (tests replace them) ----------------------


def _signal(pid: int, sig: int) -> None:
    os.kill(pid, sig)


def _systemctl(verb: str, unit: str, timeout: float = 60.0) -> tuple[int, str]:
    """``systemctl VERB UNIT`` (argument list, no shell); (exit status, output)."""
    try:
        proc = subprocess.run(["systemctl", verb, unit], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "systemctl not found"
    except subprocess.TimeoutExpired:
        return 124, f"systemctl {verb} {unit} timed out after {timeout:.0f}s"
    return proc.returncode, (proc.stderr or proc.stdout).strip()


def _nvidia_smi_reset(bus_id: str, timeout: float) -> tuple[int, str]:
    """``nvidia-smi -r -i BUS_ID`` (argument list, no shell); (exit status, output)."""
    cmd = ["nvidia-smi", "-r", "-i", bus_id]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 124, f"nvidia-smi -r timed out after {timeout:.0f}s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _syslog(message: str, failed: bool) -> str:
    """Send one line to syslog/journal; says where it went."""
    import syslog

    try:
        syslog.openlog("fleetops-reset", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING if failed else syslog.LOG_NOTICE, message)
        syslog.closelog()
    except OSError as exc:
        return f"failed: {exc}"
    return "sent" if os.path.exists("/dev/log") else "sent (no /dev/log on this host: dropped)"


# --- process ending (shared by both backends) -------------------------------------------------


def end_pids(procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
    """SIGTERM each process, wait up to ``grace_s`` for all, SIGKILL the rest; one report each."""
    reports = []
    for proc in procs:
        pid = int(proc["pid"])
        rep = {"pid": pid, "name": proc.get("name"), "signals": [], "ended": False}
        try:
            _signal(pid, signal.SIGTERM)
            rep["signals"].append("SIGTERM")
        except ProcessLookupError:
            rep["ended"] = True
            rep["detail"] = "already gone"
        except PermissionError:
            rep["detail"] = "no permission to signal it"
        reports.append(rep)
    _wait_gone([r for r in reports if not r["ended"]], grace_s)
    left = [r for r in reports if not r["ended"] and r["signals"]]
    for rep in left:
        try:
            _signal(rep["pid"], signal.SIGKILL)
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
            if not rep["ended"] and not node_lock.pid_alive(rep["pid"]):
                rep["ended"] = True
        if all(r["ended"] for r in reports) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


# --- backends ------------------------------------------------------------------------------


class _Backend:
    name = "unknown"

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run

    def _changing(self, what: str) -> None:
        if self.dry_run:
            raise DryRunViolation(f"dry run: refusing to {what}")

    # reading
    def snapshot(self) -> model.Node:
        raise NotImplementedError

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        raise NotImplementedError

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        return "ok", "UUID and bus id from one snapshot"

    def services(self, units: list[str]) -> tuple[dict[str, str | None], str | None]:
        raise NotImplementedError

    def default_lock(self) -> str:
        return os.environ.get(LOCK_ENV) or node_lock.DEFAULT_PATH

    def default_log(self) -> str:
        return os.environ.get(LOG_ENV) or DEFAULT_LOG

    # changing
    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        raise NotImplementedError

    def stop_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def start_service(self, unit: str) -> tuple[bool, str]:
        raise NotImplementedError

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        raise NotImplementedError


class SimBackend(_Backend):
    """The node's simulator state file: processes, services and the reset are records in it."""

    name = "sim"

    def __init__(self, path: str, dry_run: bool) -> None:
        super().__init__(dry_run)
        self.path = path

    def snapshot(self) -> model.Node:
        from fleetops.agent.collect import collect

        return collect("sim", self.path)

    def _state(self) -> dict[str, Any]:
        from fleetops.gpu import sim

        return sim.read_state(self.path)

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        from fleetops.gpu import sim

        state = self._state()
        pos, why = sim.find_gpu(state, uuid or bus_id or "")
        if pos is None or why is None:
            return None
        raw = state["gpus"][pos]
        text = "Xid 79: the GPU has fallen off the bus" if why == "xid:79" else "the driver does not enumerate it"
        return {"uuid": raw["uuid"], "bus_id": raw["bus_id"], "reason": text}

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        from fleetops.gpu import sim

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

    def default_lock(self) -> str:
        return os.path.abspath(self.path) + ".maintenance.lock"

    def default_log(self) -> str:
        stem = os.path.splitext(os.path.abspath(self.path))[0]
        return stem + ".reset.jsonl"

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        from fleetops.gpu import sim

        self._changing("end processes")
        state = self._state()
        pos, _ = sim.find_gpu(state, gpu.uuid)
        assert pos is not None
        listed = {int(p["pid"]): p for p in sim.gpu_processes(state, pos)}
        real = [p for p in procs if listed.get(int(p["pid"]), {}).get("real")]
        reports = end_pids(real, grace_s) if real else []
        for proc in procs:
            if int(proc["pid"]) not in {r["pid"] for r in reports}:
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
        from fleetops.gpu import sim

        self._changing(f"{verb} {unit}")
        with sim.locked_state(self.path) as st:
            sim.set_service(st, unit, status)
        return True, f"simulated: {unit} recorded {status}"

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        from fleetops.gpu import sim

        self._changing("reset the GPU")
        duration = float(self._state()["node"].get("reset_duration_s", 0.0) or 0.0)
        if duration > 0:
            time.sleep(min(duration, timeout))  # the GPU is away while it resets
        try:
            with sim.locked_state(self.path) as st:
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


class NvmlBackend(_Backend):
    """A real node: NVML for reading, signals, systemctl and ``nvidia-smi -r`` for changing."""

    name = "nvml"

    def snapshot(self) -> model.Node:
        from fleetops.agent.collect import collect

        return collect("nvml", None)

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
        unclaimed = sorted(lost_buses - enumerated)
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

    def end_processes(self, gpu: model.Gpu, procs: list[dict[str, Any]], grace_s: float) -> list[dict[str, Any]]:
        self._changing("end processes")
        return end_pids(procs, grace_s)

    def stop_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"stop {unit}")
        rc, out = _systemctl("stop", unit)
        return rc == 0, out or f"systemctl stop {unit}: exit {rc}"

    def start_service(self, unit: str) -> tuple[bool, str]:
        self._changing(f"start {unit}")
        rc, out = _systemctl("start", unit)
        return rc == 0, out or f"systemctl start {unit}: exit {rc}"

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        self._changing("reset the GPU")
        rc, out = _nvidia_smi_reset(gpu.bus_id, timeout)
        return rc == 0, out or f"exit {rc}", {"command": ["nvidia-smi", "-r", "-i", gpu.bus_id], "exit_status": rc}


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


def make_backend(requested: str, state_path: str | None, dry_run: bool) -> _Backend:
    from fleetops.agent.collect import CollectError, choose_backend

    try:
        chosen = choose_backend(requested)
    except CollectError as exc:
        raise ResetError(str(exc), "usage", 2) from exc
    if chosen == "sim":
        from fleetops.gpu import sim

        path = state_path or os.environ.get(sim.STATE_ENV)
        if not path:
            raise ResetError(f"the sim backend needs a state file: set {sim.STATE_ENV} or pass --state", "usage", 2)
        return SimBackend(path, dry_run)
    return NvmlBackend(dry_run)


# --- selection --------------------------------------------------------------------------------


def parse_selector(selector: str) -> tuple[str | None, str | None]:
    """(uuid, bus_id) from ``--gpu``; an index or anything else is a usage error."""
    text = (selector or "").strip()
    if not text:
        raise ResetError("--gpu is empty: give the GPU's UUID or PCI bus id", "usage", 2)
    if text.isdigit():
        raise ResetError(
            f"--gpu {text}: the agent takes a UUID or a PCI bus id, never an index (indices change when a GPU "
            "falls off the bus); `fleetops reset NODE INDEX` resolves an index to its UUID first",
            "usage",
            2,
        )
    if text.upper().startswith("MIG-"):
        raise ResetError(f"--gpu {text}: a MIG device, not a GPU; use `fleetops-agent mig reset`", "usage", 2)
    if text.upper().startswith("GPU-"):
        return text, None
    try:
        return None, model.normalize_bus_id(text)
    except ValueError:
        raise ResetError(f"--gpu {text!r}: neither a GPU UUID (GPU-...) nor a PCI bus id (0000:18:00.0)", "usage", 2) from None


def _present(node: model.Node) -> str:
    return ", ".join(f"{g.index}={g.uuid}@{g.bus_id}" for g in node.gpus) or "none"


# --- preconditions (pure functions of the snapshot) ---------------------------------------------


def check_identity(
    node: model.Node, uuid: str | None, bus_id: str | None, expected_bus: str | None, lost: dict[str, Any] | None
) -> tuple[model.Gpu | None, list[Check]]:
    """gpu_exists, uuid_matches_bus_id (first pass: the snapshot) and on_bus."""
    gpu = node.gpu_by_uuid(uuid) if uuid else node.gpu_by_bus_id(bus_id or "")
    named = uuid or bus_id
    if gpu is None:
        if lost:
            where = f"{lost.get('uuid') or named} ({lost.get('bus_id') or 'bus id unknown'})"
            return None, [
                Check("gpu_exists", "failed", f"{where} is known but not enumerated by the driver"),
                Check("uuid_matches_bus_id", "skipped", "the GPU is not enumerated"),
                Check(
                    "on_bus",
                    "failed",
                    f"{where}: {lost['reason']}; a GPU reset cannot reach it",
                    f"{REMEDY_REBOOT}: drain it and reboot; if the GPU is still missing after the reboot, open a hardware case",
                ),
            ]
        kind = "UUID" if uuid else "bus id"
        return None, [
            Check("gpu_exists", "failed", f"no GPU with {kind} {named} on {node.hostname} (present: {_present(node)})")
        ]
    checks = [Check("gpu_exists", "ok", f"GPU {gpu.index} {gpu.uuid} at {gpu.bus_id} ({gpu.name or 'unnamed'})")]
    if expected_bus and expected_bus != gpu.bus_id:
        checks.append(
            Check(
                "uuid_matches_bus_id",
                "failed",
                f"{gpu.uuid} is at {gpu.bus_id}, not at {expected_bus} as the caller expected: the GPUs were renumbered or moved",
                "collect the node again and name the GPU by its current UUID",
            )
        )
    else:
        checks.append(Check("uuid_matches_bus_id", "ok", f"{gpu.uuid} is at {gpu.bus_id}"))
    reasons = []
    if gpu.unavailable and "GpuIsLost" in gpu.unavailable.values():
        reasons.append("NVML answers GpuIsLost")
    x79 = [x for x in node.xids if x.code == 79 and x.bus_id == gpu.bus_id]
    if x79:
        reasons.append(f"Xid 79 (fallen off the bus) logged {len(x79)}x since boot")
    if gpu.recovery_action == "node_reboot":
        reasons.append("NVML's recovery action is 'node reboot required'")
    if reasons:
        checks.append(
            Check("on_bus", "failed", "; ".join(reasons) + ": a GPU reset cannot recover it", REMEDY_REBOOT)
        )
    else:
        checks.append(Check("on_bus", "ok", "enumerated and answering"))
    return gpu, checks


def check_row_remap(gpu: model.Gpu) -> Check:
    if gpu.remapped_rows_failure:
        return Check(
            "row_remap",
            "failed",
            "row remapping failed: no spare rows left for a failing memory row; a reset cannot repair it",
            f"{REMEDY_INSPECT}: drain the node and have the GPU inspected / replaced",
        )
    if gpu.remapped_rows_failure is None:
        why = gpu.unavailable.get("remapped_rows_failure", "not reported")
        return Check("row_remap", "skipped", f"row-remap state unreadable ({why})")
    if gpu.remapped_rows_pending:
        return Check("row_remap", "ok", "a row remap is pending: the reset applies it")
    return Check("row_remap", "ok", "no row-remap failure")


def check_mig(gpu: model.Gpu) -> Check:
    if gpu.mig_mode_current is None:
        return Check("mig_instances", "skipped", f"MIG mode unreadable ({gpu.unavailable.get('mig_mode_current', 'unknown')})")
    if not gpu.mig_mode_current:
        return Check("mig_instances", "ok", "MIG disabled")
    instances = gpu.mig_instances
    if instances is None:
        return Check(
            "mig_instances",
            "failed",
            f"MIG enabled but its instances cannot be listed ({gpu.unavailable.get('mig_instances', 'unknown')})",
            "list the instances (nvidia-smi mig -lgi) and make sure none is in use, then retry",
        )
    busy = [m for m in instances if m.in_use]
    if busy:
        names = ", ".join(f"GI {m.gpu_instance_id} CI {m.compute_instance_id} {m.profile} {m.uuid}" for m in busy)
        return Check(
            "mig_instances",
            "failed",
            f"MIG instances in use: {names}",
            "stop the workloads on those MIG instances (drain the GPU), then retry",
            {"in_use": [model.to_dict(m) for m in busy]},
        )
    return Check("mig_instances", "ok", f"MIG enabled, {len(instances)} instance(s), none in use")


def is_nvswitch_system(gpu: model.Gpu) -> bool | None:
    if gpu.nvlinks:
        return any(link.remote_type == "switch" for link in gpu.nvlinks)
    if gpu.nvlinks == []:
        return False
    if gpu.fabric_state in ("completed", "in_progress", "not_started"):
        return True  # the GPU takes part in an NVSwitch fabric
    return None


def check_nvlink_peers(node: model.Node, gpu: model.Gpu) -> Check:
    if gpu.nvlinks is None:
        why = gpu.unavailable.get("nvlinks", "not reported")
        return Check("nvlink_peers", "skipped", f"NVLink not readable ({why}): no peer set known")
    peers = sorted({link.remote_bus_id for link in gpu.nvlinks if link.remote_type == "gpu" and link.remote_bus_id})
    if peers:
        named = []
        for bus in peers:
            peer = node.gpu_by_bus_id(bus)
            named.append(f"{peer.uuid} ({bus})" if peer else bus)
        peer_set = [f"{gpu.uuid} ({gpu.bus_id})", *named]
        return Check(
            "nvlink_peers",
            "failed",
            f"direct GPU-to-GPU NVLink (no NVSwitch) to {', '.join(named)}: these GPUs can only be reset together",
            f"{REMEDY_PEERS}: {', '.join(peer_set)} (drain all of them, then reset them together, or reboot the node)",
            {"peer_set": [gpu.bus_id, *peers]},
        )
    if not gpu.nvlinks:
        return Check("nvlink_peers", "ok", "no NVLink on this GPU")
    return Check("nvlink_peers", "ok", "no direct GPU-to-GPU NVLink peers (links go to NVSwitches)")


def check_fabric_manager(node: model.Node, gpu: model.Gpu) -> Check:
    nvswitch = is_nvswitch_system(gpu)
    if nvswitch is False:
        return Check("fabric_manager", "skipped", "not an NVSwitch system")
    if nvswitch is None:
        return Check(
            "fabric_manager",
            "skipped",
            f"cannot tell whether this is an NVSwitch system (NVLink: {gpu.unavailable.get('nvlinks', 'unknown')}; "
            f"fabric state: {gpu.fabric_state or gpu.unavailable.get('fabric_state', 'unknown')})",
        )
    state = node.services.get(FABRIC_MANAGER)
    if state == "active":
        return Check("fabric_manager", "ok", f"NVSwitch system; {FABRIC_MANAGER} is active")
    if state is None and gpu.fabric_state == "completed" and gpu.fabric_status in (None, "success"):
        return Check("fabric_manager", "ok", f"NVSwitch system; fabric registration completed ({FABRIC_MANAGER} state unknown)")
    if state is None:
        return Check(
            "fabric_manager",
            "failed",
            f"NVSwitch system, but the state of {FABRIC_MANAGER} is unknown "
            f"({node.unavailable.get('services', 'not reported')})",
            f"make sure {FABRIC_MANAGER} runs (systemctl status {FABRIC_MANAGER}), then retry",
        )
    return Check(
        "fabric_manager",
        "failed",
        f"NVSwitch system, but {FABRIC_MANAGER} is {state}: the GPU would come back without its NVLink fabric",
        f"start it (systemctl start {FABRIC_MANAGER}), wait for the fabric state 'completed', then retry",
    )


def check_processes(gpu: model.Gpu, kill: bool, grace_s: float) -> Check:
    procs = gpu.processes
    if procs is None:
        why = gpu.unavailable.get("processes", "not reported")
        return Check(
            "compute_processes",
            "failed",
            f"cannot list the GPU's compute processes ({why})",
            "make sure no job uses the GPU (drain it), run as root, then retry",
        )
    listed = [{"pid": p.pid, "name": p.name, "used_memory_mib": p.used_memory_mib} for p in procs]
    if not procs:
        return Check("compute_processes", "ok", "no compute processes", data={"processes": []})
    names = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in procs)
    if kill:
        return Check(
            "compute_processes",
            "ok",
            f"{len(procs)} compute process(es) will be ended (SIGTERM, SIGKILL after {grace_s:g}s): {names}",
            data={"processes": listed},
        )
    return Check(
        "compute_processes",
        "failed",
        f"{len(procs)} compute process(es) on the GPU: {names}",
        "drain the GPU's jobs first, or rerun with --kill-processes to end them",
        {"processes": listed},
    )


def check_clients(
    states: dict[str, str | None], reason: str | None, units: list[str], left_stopped: list[str] | None = None
) -> Check:
    restart = [u for u in left_stopped or [] if states.get(u) != "active"]
    note = f"; {', '.join(restart)} left stopped by a crashed run: started again after the reset" if restart else ""
    if not units:
        return Check("gpu_clients", "ok", "no GPU clients configured" + note, data={"stop": [], "restart": restart})
    if reason:
        return Check(
            "gpu_clients",
            "skipped",
            f"cannot read the clients' state ({reason}): nothing will be stopped; a client holding the "
            "device makes the reset fail",
            data={"stop": []},
        )
    active = [u for u in units if states.get(u) == "active"]
    idle = [f"{u} ({states.get(u) or 'unknown'})" for u in units if states.get(u) != "active" and u not in restart]
    detail = (f"will stop and restart: {', '.join(active)}" if active else "none running") + (
        f"; not running: {', '.join(idle)}" if idle else ""
    )
    return Check("gpu_clients", "ok", detail + note, data={"stop": active, "restart": restart})


def _lock_check(status: node_lock.Status) -> Check:
    if status.state == "held":
        return Check(
            "maintenance_lock",
            "failed",
            f"another maintenance action holds this node: {node_lock.describe(status.record)}",
            "wait for it to finish (or its deadline to pass), then retry",
            {"holder": status.record},
        )
    if status.state == "stale":
        return Check("maintenance_lock", "ok", status.detail(), data={"stale": status.record})
    return Check("maintenance_lock", "ok", status.detail())


def _pick_remedy(checks: list[Check]) -> str | None:
    remedies = [c.remedy for c in checks if c.status == "failed" and c.remedy]
    if not remedies:
        return None
    for prefix in _REMEDY_ORDER:
        for remedy in remedies:
            if remedy.startswith(prefix):
                return remedy
    return remedies[0]


# --- the whole flow ------------------------------------------------------------------------------


@dataclass
class Options:
    selector: str
    expected_bus: str | None = None
    dry_run: bool = False
    kill_processes: bool = False
    grace_s: float = DEFAULT_GRACE_S
    reset_timeout_s: float = RESET_TIMEOUT_S
    clients: list[str] | None = None
    log_path: str | None = None
    lock_path: str | None = None
    use_syslog: bool = True
    deadline_s: float = node_lock.DEFAULT_DEADLINE_S


def parse_clients(text: str | None) -> list[str]:
    if text is None:
        text = os.environ.get(CLIENTS_ENV)
    if text is None:
        return list(DEFAULT_CLIENTS)
    return [u.strip() for u in text.split(",") if u.strip()]


def run(opts: Options, backend: _Backend) -> tuple[dict[str, Any], int]:
    """Evaluate, and unless a dry run or refused, reset and verify. (document, exit code)."""
    started = time.time()
    uuid, bus_id = parse_selector(opts.selector)
    expected_bus = None
    if opts.expected_bus:
        try:
            expected_bus = model.normalize_bus_id(opts.expected_bus)
        except ValueError:
            raise ResetError(f"--bus-id {opts.expected_bus!r} is not a PCI bus id", "usage", 2) from None
    clients = list(opts.clients) if opts.clients is not None else list(DEFAULT_CLIENTS)
    lock_path = opts.lock_path or backend.default_lock()
    log_path = opts.log_path or backend.default_log()

    node = backend.snapshot()
    lost = None
    found = node.gpu_by_uuid(uuid) if uuid else node.gpu_by_bus_id(bus_id or "")
    if found is None:
        lost = backend.lost_gpu(node, uuid, bus_id)
    gpu, checks = check_identity(node, uuid, bus_id, expected_bus, lost)
    if gpu is not None and checks[1].status == "ok":
        status, detail = backend.cross_check(gpu)
        if status != "ok":
            checks[1] = Check("uuid_matches_bus_id", status, detail, "collect the node again and name the GPU by its current UUID")
        else:
            checks[1].detail = f"{gpu.uuid} is at {gpu.bus_id}: {detail}"

    doc: dict[str, Any] = {
        "gpu": {
            "selector": opts.selector,
            "uuid": gpu.uuid if gpu else (lost or {}).get("uuid") or uuid,
            "bus_id": gpu.bus_id if gpu else (lost or {}).get("bus_id") or bus_id,
            "index": gpu.index if gpu else None,
            "name": gpu.name if gpu else None,
        },
        "node": node.hostname,
        "backend": backend.name,
        "dry_run": opts.dry_run,
        "kill_processes": opts.kill_processes,
        "preconditions": [],
        "refused": False,
        "remedy": None,
        "actions": [],
        "verified": False,
        "verification": None,
        "result": None,
        "message": "",
        "lock": lock_path,
    }
    held: node_lock.Lock | None = None
    code = 1
    try:
        if gpu is None or any(c.status == "failed" for c in checks):
            done = {c.name for c in checks}
            why = (
                "not evaluated: the GPU is not enumerated" if lost else "not evaluated: the GPU was not found"
            ) if gpu is None else "not evaluated: the GPU cannot be reset (see above)"
            checks += [Check(name, "skipped", why) for name in PRECONDITIONS if name not in done]
            doc["result"] = "error" if gpu is None and lost is None else "refused"
        else:
            # the lock: a dry run only looks; a real run takes it and then looks again at the GPU
            stale_record: dict[str, Any] | None = None
            if opts.dry_run:
                peeked = node_lock.peek(lock_path)
                checks.append(_lock_check(peeked))
                stale_record = peeked.record if peeked.state == "stale" else None
            else:
                try:
                    held = node_lock.acquire(lock_path, "gpu reset", gpu.uuid, opts.deadline_s + opts.grace_s)
                except node_lock.LockHeld as exc:
                    checks.append(_lock_check(node_lock.Status("held", exc.holder, path=lock_path)))
                except node_lock.LockError as exc:
                    checks.append(Check("maintenance_lock", "failed", str(exc), "fix the lock folder's permissions"))
                else:
                    if held.recovered:
                        rec = stale_record = held.recovered
                        checks.append(
                            Check(
                                "maintenance_lock",
                                "ok",
                                f"taken over a stale lock ({node_lock.describe(rec)}): {rec.get('stale_because')}",
                                data={"recovered": rec},
                            )
                        )
                    else:
                        checks.append(Check("maintenance_lock", "ok", f"taken ({lock_path})"))
                    node = backend.snapshot()  # under the lock: nobody else changes the node now
                    again = node.gpu_by_uuid(gpu.uuid)
                    if again is None or again.bus_id != gpu.bus_id:
                        checks.append(
                            Check("gpu_exists", "failed", f"{gpu.uuid} changed or vanished while taking the lock", REMEDY_REBOOT)
                        )
                    else:
                        gpu = again
            # services a crashed run stopped and never started again: start them after this reset
            left_stopped = [str(u) for u in (stale_record or {}).get("stopped") or []]
            states, reason = backend.services(sorted(set(clients) | set(left_stopped)))
            checks += [
                check_row_remap(gpu),
                check_mig(gpu),
                check_nvlink_peers(node, gpu),
                check_fabric_manager(node, gpu),
                check_processes(gpu, opts.kill_processes, opts.grace_s),
                check_clients(states, reason, clients, left_stopped),
            ]
            failed = [c for c in checks if c.status == "failed"]
            if failed:
                doc["result"] = "refused"
            elif opts.dry_run:
                doc["result"] = "would-reset"
                code = 0
            else:
                code = _act(opts, backend, gpu, checks, doc, held)
        doc["preconditions"] = [c.to_dict() for c in checks]
        if doc["result"] in ("refused", "error"):
            doc["refused"] = True
            doc["remedy"] = _pick_remedy(checks)
        doc["message"] = _message(doc, checks)
    finally:
        if held is not None:
            held.release()
    doc["elapsed_s"] = round(time.time() - started, 3)
    if not opts.dry_run:
        doc["log"] = _log(doc, log_path, opts.use_syslog, started)
    return doc, code


def _act(
    opts: Options,
    backend: _Backend,
    gpu: model.Gpu,
    checks: list[Check],
    doc: dict[str, Any],
    held: node_lock.Lock | None,
) -> int:
    """End processes, stop clients, reset, restart clients, verify. Never called in a dry run."""
    if opts.dry_run or backend.dry_run:
        raise DryRunViolation("dry run: _act must not be reached")
    actions: list[dict[str, Any]] = doc["actions"]
    procs = next((c.data or {}).get("processes", []) for c in checks if c.name == "compute_processes")
    if procs:
        reports = backend.end_processes(gpu, procs, opts.grace_s)
        ok = all(r["ended"] for r in reports)
        actions.append({"action": "end_processes", "ok": ok, "processes": reports})
        if not ok:
            doc["result"] = "failed"
            doc["remedy"] = "end the processes by hand (or drain and reboot the node), then retry"
            return 1
        if backend.name == "nvml":
            left = backend.snapshot().gpu_by_uuid(gpu.uuid)
            if left is not None and left.processes:
                actions[-1]["ok"] = False
                actions[-1]["still_listed"] = [p.pid for p in left.processes]
                doc["result"] = "failed"
                doc["remedy"] = "processes are still listed on the GPU: drain it and retry"
                return 1
    client_data = next((c.data or {}) for c in checks if c.name == "gpu_clients")
    to_stop = list(client_data.get("stop", []))
    # left stopped by a crashed run: started again at the end, like the ones this run stops
    stopped: list[str] = [u for u in client_data.get("restart", []) if u not in to_stop]
    reset_ok = False
    try:
        for unit in to_stop:
            ok, detail = backend.stop_service(unit)
            actions.append({"action": "stop_service", "unit": unit, "ok": ok, "detail": detail})
            if not ok:
                doc["result"] = "failed"
                doc["remedy"] = f"{unit} did not stop: stop it by hand and retry"
                return 1
            stopped.append(unit)
            if held is not None:
                held.update(stopped=list(stopped))
        t0 = time.time()
        ok, detail, extra = backend.reset(gpu, opts.reset_timeout_s)
        actions.append(
            {"action": "reset", "bus_id": gpu.bus_id, "ok": ok, "detail": detail, "elapsed_s": round(time.time() - t0, 3), **extra}
        )
        reset_ok = ok
    finally:
        for unit in reversed(stopped):
            ok, detail = backend.start_service(unit)
            actions.append({"action": "start_service", "unit": unit, "ok": ok, "detail": detail})
    if not reset_ok:
        doc["result"] = "failed"
        doc["remedy"] = f"the reset failed; {REMEDY_REBOOT}"
        return 1
    verification = _verify(opts, backend, gpu, t0)
    doc["verification"] = verification
    doc["verified"] = verification["ok"]
    restarted = all(a["ok"] for a in actions if a["action"] == "start_service")
    if verification["ok"] and restarted:
        doc["result"] = "reset"
        return 0
    doc["result"] = "failed"
    if not restarted:
        doc["remedy"] = "a GPU client did not start again: start it by hand (systemctl start UNIT)"
    else:
        doc["remedy"] = verification.get("remedy") or f"the GPU is not healthy after the reset; {REMEDY_INSPECT}"
    return 1


def _verify(opts: Options, backend: _Backend, gpu: model.Gpu, reset_at: float) -> dict[str, Any]:
    """The GPU is back with the same UUID at the same bus id, and has no critical finding."""
    deadline = time.monotonic() + opts.reset_timeout_s
    node = backend.snapshot()
    back = node.gpu_by_uuid(gpu.uuid)
    while back is None and time.monotonic() < deadline:
        time.sleep(1.0)
        node = backend.snapshot()
        back = node.gpu_by_uuid(gpu.uuid)
    out: dict[str, Any] = {"ok": False, "same_uuid": back is not None, "same_bus_id": bool(back and back.bus_id == gpu.bus_id)}
    if back is None:
        at_bus = node.gpu_by_bus_id(gpu.bus_id)
        out["detail"] = f"{gpu.uuid} did not come back" + (f"; {gpu.bus_id} now shows {at_bus.uuid}" if at_bus else "")
        out["remedy"] = REMEDY_REBOOT
        return out
    if back.bus_id != gpu.bus_id:
        out["detail"] = f"{gpu.uuid} came back at {back.bus_id}, not {gpu.bus_id}"
        out["remedy"] = REMEDY_REBOOT
        return out
    # the kernel log keeps the XIDs that led to the reset; only what came after it counts now
    node.xids = [x for x in node.xids if x.timestamp is None or x.timestamp >= reset_at or backend.name == "sim"]
    try:
        from fleetops import checks as health
    except ImportError as exc:  # pragma: no cover - the checks ship with the agent
        out["detail"] = f"health checks unavailable: {exc}"
        return out
    findings = [f for f in health.run_node_checks(node, None, None) if (f.gpu or {}).get("uuid") == gpu.uuid]
    crit = [f for f in findings if f.severity == "crit"]
    out["findings"] = [
        {"check": f.check, "severity": f.severity, "message": f.message, "action": f.action}
        for f in findings
        if f.severity in ("warn", "crit", "unknown")
    ]
    if crit:
        out["detail"] = "critical after the reset: " + "; ".join(f"{f.check}: {f.message}" for f in crit)
        out["remedy"] = crit[0].action or f"{REMEDY_INSPECT}"
        return out
    out["ok"] = True
    out["detail"] = f"{gpu.uuid} is back at {gpu.bus_id} with no critical finding" + (
        f" ({len(out['findings'])} warning(s) left)" if out["findings"] else ""
    )
    return out


def _message(doc: dict[str, Any], checks: list[Check]) -> str:
    gpu = doc["gpu"]
    name = f"{gpu.get('uuid') or gpu.get('selector')} ({gpu.get('bus_id') or '?'})"
    result = doc["result"]
    failed = [c for c in checks if c.status == "failed"]
    if result == "error":
        return failed[0].detail if failed else f"no such GPU: {name}"
    if result == "refused":
        why = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        return f"refused to reset {name}: {why}"
    if result == "would-reset":
        return f"dry run: every precondition holds; {name} would be reset"
    if result == "reset":
        return f"reset {name} and verified it"
    return f"reset of {name} failed" + (f": {doc['verification']['detail']}" if doc.get("verification") else "")


def _log(doc: dict[str, Any], path: str, use_syslog: bool, started: float) -> dict[str, Any]:
    """Append the attempt to the audit log (JSON line) and syslog; never fails the reset."""
    entry = {
        "time": started,
        "host": socket.gethostname(),
        "node": doc.get("node"),
        "user": os.environ.get("SUDO_USER") or os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid()),
        "pid": os.getpid(),
        "gpu": doc.get("gpu"),
        "backend": doc.get("backend"),
        "dry_run": doc.get("dry_run"),
        "kill_processes": doc.get("kill_processes"),
        "result": doc.get("result"),
        "refused": doc.get("refused"),
        "remedy": doc.get("remedy"),
        "verified": doc.get("verified"),
        "preconditions": [{k: c.get(k) for k in ("name", "status", "detail")} for c in doc.get("preconditions", [])],
        "actions": doc.get("actions"),
        "elapsed_s": doc.get("elapsed_s"),
    }
    out: dict[str, Any] = {"file": path}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, separators=(",", ":"), default=str) + "\n")
    except OSError as exc:
        out["error"] = f"{path}: {exc.strerror}"
    if use_syslog:
        gpu = doc.get("gpu") or {}
        line = (
            f"gpu reset {doc.get('result')}: {gpu.get('uuid')} ({gpu.get('bus_id')}) on {doc.get('node')}"
            + (f"; remedy: {doc['remedy']}" if doc.get("remedy") else "")
        )
        out["syslog"] = _syslog(line, doc.get("result") != "reset")
    else:
        out["syslog"] = "off"
    return out


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    """Entry from ``fleetops-agent reset`` (argparse namespace)."""
    opts = Options(
        selector=args.gpu,
        expected_bus=args.bus_id,
        dry_run=bool(args.dry_run),
        kill_processes=bool(args.kill_processes),
        grace_s=float(args.timeout),
        reset_timeout_s=float(args.reset_timeout),
        clients=parse_clients(args.clients),
        log_path=args.log,
        lock_path=args.lock_file,
        use_syslog=not args.no_syslog,
    )
    if opts.grace_s < 0 or opts.reset_timeout_s <= 0:
        raise ResetError("--timeout and --reset-timeout must be positive", "usage", 2)
    parse_selector(opts.selector)  # usage errors before any backend is touched
    backend = make_backend(args.backend, args.state, opts.dry_run)
    return run(opts, backend)
