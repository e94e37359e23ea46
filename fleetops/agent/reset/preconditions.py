"""The reset's preconditions: pure functions of a snapshot, each giving one ``Check``.

Each says ok / failed / skipped with its detail and, when failed, its remedy; the flow reports
all of them in ``PRECONDITIONS`` order and acts only when none failed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.agent import lock as node_lock

FABRIC_MANAGER = "nvidia-fabricmanager"

REMEDY_REBOOT = "reboot the node"
REMEDY_INSPECT = "drain and inspect (RMA)"
REMEDY_PEERS = "reset the peer set"
# the most drastic remedy wins when several preconditions fail
REMEDY_ORDER = (REMEDY_REBOOT, REMEDY_INSPECT, REMEDY_PEERS)


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
    "slurm_jobs",
    "gpu_clients",
    "device_holders",
)
# Holders of the device files a reset leaves be: on an NVSwitch system the reset needs the
# Fabric Manager running (``fabric_manager`` above), and it holds the driver's control device.
TOLERATED_HOLDERS = ("nv-fabricmanager",)


def tolerated(holder: Any) -> bool:
    """A holder the reset leaves running (its program is one of ``TOLERATED_HOLDERS``)."""
    return os.path.basename(holder.command.split(" ", 1)[0]) in TOLERATED_HOLDERS



def present(node: model.Node) -> str:
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
            Check("gpu_exists", "failed", f"no GPU with {kind} {named} on {node.hostname} (present: {present(node)})")
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


def check_processes(
    gpu: model.Gpu, kill: bool, grace_s: float, expect_pids: list[int] | None = None
) -> Check:
    """Busy is refused unless the operator asked to end the processes AND confirmed exactly which
    (``expect_pids``, the list they were shown). The reset never ends a process nobody saw: a job
    that started on the GPU after the confirmation makes the lists differ, and that is refused."""
    procs = gpu.processes
    expected = sorted(set(expect_pids)) if expect_pids is not None else None
    extra: dict[str, Any] = {"expected_pids": expected} if expected is not None else {}
    if procs is None:
        why = gpu.unavailable.get("processes", "not reported")
        return Check(
            "compute_processes",
            "failed",
            f"cannot list the GPU's compute processes ({why})",
            "make sure no job uses the GPU (drain it), run as root, then retry",
            extra or None,
        )
    listed = [{"pid": p.pid, "name": p.name, "used_memory_mib": p.used_memory_mib} for p in procs]
    data = {"processes": listed, **extra}
    if expected is not None:
        running = {p.pid for p in procs}
        unexpected = sorted(running - set(expected))
        missing = sorted(set(expected) - running)
        if unexpected or missing:
            parts = []
            if unexpected:
                named = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in procs if p.pid in unexpected)
                parts.append(f"not confirmed: {named}")
            if missing:
                parts.append(f"confirmed but no longer on the GPU: {', '.join(f'pid {p}' for p in missing)}")
            return Check(
                "compute_processes",
                "failed",
                "the GPU's compute processes differ from the confirmed list "
                f"({', '.join(str(p) for p in expected) or 'none'}): " + "; ".join(parts),
                "look at the GPU's processes again and confirm the list you see (--expect-pids), then retry",
                {**data, "unexpected_pids": unexpected, "missing_pids": missing},
            )
    if not procs:
        return Check("compute_processes", "ok", "no compute processes", data=data)
    names = ", ".join(f"pid {p.pid} ({p.name or '?'})" for p in procs)
    if kill:
        return Check(
            "compute_processes",
            "ok",
            f"{len(procs)} confirmed compute process(es) will be ended (SIGTERM, SIGKILL after {grace_s:g}s): {names}",
            data=data,
        )
    pids = ",".join(str(p.pid) for p in procs)
    return Check(
        "compute_processes",
        "failed",
        f"{len(procs)} compute process(es) on the GPU: {names}",
        f"drain the GPU's jobs first, or rerun with --kill-processes --expect-pids {pids} to end exactly these",
        data,
    )


def check_jobs(gpu: model.Gpu, records: list[Any] | None, errors: list[str], where: str, kill: bool,
               expect: list[str] | None = None) -> Check:
    """``slurm_jobs``: the jobs the node's job records (``fleetops.jobs.record``, written by the
    prolog) put on this GPU, whole or one of its MIG instances. A running job refuses the reset
    even with no process on the GPU (between two steps of the job: resetting would kill the next
    one) unless the operator passed ``--kill-processes``; a record that does not read, or a folder
    that cannot be listed, refuses the same way, since it may be this GPU's job. ``expect`` (the
    operator's ``--expect-jobs``): the jobs they confirmed may lose the GPU; a running job not among
    them (started since they looked) refuses the reset even with ``--kill-processes``."""
    if records is None:
        why = "; ".join(errors) or "unknown"
        if kill:
            return Check("slurm_jobs", "ok", f"cannot read the job records ({why}); --kill-processes given",
                         data={"jobs": [], "jobs_dir": where})
        return Check("slurm_jobs", "failed", f"cannot read the job records in {where} ({why}): a job may hold the GPU",
                     "make sure no job uses the GPU (drain it), or rerun with --kill-processes", {"jobs_dir": where})
    from fleetops.jobs.record import running_on

    on = [r for r in records if any(g.uuid == gpu.uuid for g in r.gpus)]
    running = running_on(on, gpu.uuid)
    # a record still open whose cgroup slurmd has removed: the job may have ended without its epilog
    # (slurmd killed it, or it failed). Only a hint: without PrologFlags=Contain a job has no cgroup
    # between two steps, so the reset still refuses; the operator asks Slurm and closes the record.
    gone = {r.job_id for r in running if r.cgroup and not os.path.isdir(r.cgroup)}
    listed = [{"job_id": r.job_id, "user": r.user, "uid": r.uid, "started_at": r.started_at,
               "mig": sorted(g.mig_uuid for g in r.gpus if g.uuid == gpu.uuid and g.mig_uuid),
               **({"cgroup_gone": r.cgroup} if r.job_id in gone else {})} for r in running]
    data: dict[str, Any] = {"jobs": listed, "jobs_dir": where}
    names = ", ".join(f"job {r.job_id} ({r.owner}"
                      + (f"; its cgroup {r.cgroup} is gone: ended without its epilog?" if r.job_id in gone else "")
                      + ")" for r in running)
    if errors:
        data["record_errors"] = list(errors)
        if not kill:
            return Check("slurm_jobs", "failed",
                         f"job records that do not read (they may be this GPU's jobs): {'; '.join(errors)}"
                         + (f"; running on the GPU: {names}" if running else ""),
                         "fix or remove the broken records (fleetops-agent job list), or drain the GPU and rerun "
                         "with --kill-processes", data)
    if not running:
        ended = len(on)
        return Check("slurm_jobs", "ok", "no running job on the GPU" + (f" ({ended} ended)" if ended else ""), data=data)
    stray = [r for r in running if expect is not None and r.job_id not in expect]
    if kill and stray:
        confirm = ",".join(sorted({*(expect or []), *(r.job_id for r in stray)}, key=int))
        return Check("slurm_jobs", "failed",
                     "job(s) nobody confirmed hold the GPU: " + ", ".join(f"job {r.job_id} ({r.owner})" for r in stray)
                     + f" (confirmed: {', '.join(expect or []) or 'none'})",
                     f"look again (fleetops-agent reset --gpu GPU --dry-run); if they may lose the GPU, rerun with "
                     f"--expect-jobs {confirm}", data)
    if kill:
        return Check("slurm_jobs", "ok", f"{len(running)} running job(s) on the GPU lose it (--kill-processes): {names}",
                     data=data)
    return Check(
        "slurm_jobs",
        "failed",
        f"{len(running)} running job(s) on the GPU: {names}" + (
            "" if gpu.processes else " (no process on the GPU now: between job steps, the next step would fail)"),
        "drain the GPU's jobs first (let them end, or scancel them), or rerun with --kill-processes to reset under them"
        + "".join(f"; if `scontrol show job {j}` says job {j} has ended, close its record with "
                  f"`fleetops-agent job end --job-id {j}`" for j in sorted(gone, key=int)),
        data,
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


def lock_check(status: node_lock.Status) -> Check:
    if status.state == "held":
        return Check(
            "maintenance_lock",
            "failed",
            node_lock.held_message(status.record or {}),
            "wait for it to finish, then retry (a live holder is never taken over; a dead one's lock is)",
            {"holder": status.record},
        )
    if status.state == "stale":
        return Check("maintenance_lock", "ok", status.detail(), data={"stale": status.record})
    return Check("maintenance_lock", "ok", status.detail())


def pick_remedy(checks: list[Check]) -> str | None:
    remedies = [c.remedy for c in checks if c.status == "failed" and c.remedy]
    if not remedies:
        return None
    for prefix in REMEDY_ORDER:
        for remedy in remedies:
            if remedy.startswith(prefix):
                return remedy
    return remedies[0]


def check_holders(
    holders: list[Any] | None,
    reason: str | None,
    *,
    own_pid: int,
    daemon_pid: int | None,
    client_pids: dict[int, str],
    end_pids: list[int],
) -> Check:
    """Every process holding a device file of the driver (``/proc/*/fd``), each either one the
    flow takes off the GPU (the daemon, paused through its socket; a client unit it stops; a
    confirmed process it ends; this process, which shuts NVML down first) or tolerated (the
    Fabric Manager); any other holder refuses the reset, named by pid, user and command, since
    ``nvidia-smi -r`` would fail on it half-way through the flow."""
    if holders is None:
        return Check("device_holders", "failed", f"cannot list the processes holding the GPU's device files ({reason})",
                     "run the reset as root (it reads every process's /proc/PID/fd)")
    plan: list[dict[str, Any]] = []
    others = []
    for h in holders:
        entry = h.to_dict()
        if h.pid == own_pid:
            entry["then"] = "this reset: NVML shut down before the reset"
        elif daemon_pid is not None and h.pid == daemon_pid:
            entry["then"] = "fleetops-agent serve: paused through its socket, NVML taken back after the reset"
        elif h.pid in client_pids:
            entry["then"] = f"stopped with {client_pids[h.pid]}, started again after the reset"
        elif h.pid in end_pids:
            entry["then"] = "ended (confirmed compute process)"
        elif tolerated(h):
            entry["then"] = "left running: the reset needs it"
        else:
            others.append(h)
            entry["then"] = None
        plan.append(entry)
    data: dict[str, Any] = {"holders": plan, "pause_daemon": daemon_pid is not None and any(
        h.pid == daemon_pid for h in holders)}
    if others:
        return Check(
            "device_holders",
            "failed",
            f"{len(others)} process(es) that this reset does not stop hold the GPU's device files: "
            + "; ".join(h.describe() for h in others),
            "stop them (a monitoring tool, a job outside the scheduler, another user's session), or name "
            "their systemd unit as a GPU client the reset stops and starts again (on the node: "
            "fleetops-agent reset --clients UNIT,..., or FLEETOPS_RESET_CLIENTS in the agent's environment), "
            "then retry",
            data,
        )
    if not holders:
        return Check("device_holders", "ok", "no process holds the GPU's device files", data=data)
    return Check("device_holders", "ok", "; ".join(f"pid {e['pid']} ({e['command']}): {e['then']}" for e in plan), data=data)
