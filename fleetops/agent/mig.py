"""``fleetops-agent mig``: MIG instances as declared state.

``mig apply`` makes each selected GPU's MIG mode and GPU instances what a layout says: one
layout for every GPU (``--layout 3g.71gb,3g.71gb``; ``--layout off`` turns MIG mode off) or a
named config of an nvidia-mig-parted file (``--config FILE --select NAME``). It plans per GPU,
``unchanged`` | ``create`` | ``recreate`` | ``mode-change`` | ``mode-pending`` | ``refused``,
checks the placement against the GPU's own profile table (NVML's profile-info and possible-placement answers, or the
simulator's table), keeps the instances the layout still has where a placement beside them
exists, and refuses, changing nothing on any GPU, when a GPU cannot be placed, cannot be read,
or has a workload on an instance it would destroy (or processes it cannot tie to an instance;
where the mode change goes through a GPU reset, the reset flow's own process precondition
judges them, leaving the GPU ``mode-pending`` with its remedy).
The plan is made again under the node's maintenance lock, from a fresh read: what changed
between the look and the lock is refused, never acted on. A MIG mode that stays pending after
the change needs a GPU reset: mig apply runs the safe reset flow (``fleetops.agent.reset.flow``:
identify, preconditions, act, verify) for that GPU under the lock it holds, journalled as
``fleetops-agent reset`` journals it, and then creates the instances, so one run takes a GPU
from MIG off to the layout. A mode already pending (asked for earlier) is not asked for again:
only the reset runs. The plan says it per GPU (``reset``: true where the mode change waits for a
reset, null where that shows only once the mode is set, as on NVML); a dry run evaluates the
reset's preconditions (``reset_report``) and, where a needed reset would be refused (a busy GPU,
NVLink peers that must be reset together, the fabric manager down), reports ``mode-pending``
with the reason and exit 1, changing nothing. A reset the preconditions refuse leaves the GPU
``mode-pending`` with the flow's reason and remedy, no instance created, exit 1; a reset that
fails fails the GPU. ``--no-reset`` leaves a pending mode to the operator: the GPU is reported
``mode-pending`` with the reset command (``fleetops-agent reset --gpu UUID``), and a rerun after
the reset creates the instances. Changes go through NVML (GPU instance with its placement, then its compute
instance) or the simulator's state; the result is read back and compared with the plan. A rerun
reports ``unchanged`` and changes nothing (exit 0).

Report (``kind: fleetops.mig/v1``, ``action: mig apply``): ``changed``, ``result``
(``unchanged`` | ``applied`` | ``would-change`` | ``refused`` | ``failed`` | ``mode-pending`` |
``interrupted``),
``message``, ``source`` (the layout or the config and name), and ``gpus``: per GPU ``uuid``,
``bus_id``, ``index``, ``name``, ``status``, ``detail``, ``changed``, ``want`` (``mode``,
``layout``), ``mode`` (``current``, ``pending`` before), ``before`` and ``after`` (instances:
``gpu_instance_id``, ``compute_instance_id``, ``profile``, ``placement`` {``start``,
``size``}, ``uuid``, ``in_use``; in a dry run ``after`` is the plan), ``destroy`` (GPU
instance ids), ``create`` (profile and placement start), ``reset`` (see above; the report's own
``reset`` is false with ``--no-reset``), ``reset_report`` where the reset flow ran or was
evaluated (its ``result``, ``message``, ``remedy``, ``preconditions``, ``actions``, ``log``), and
on a refusal ``remedy`` and ``in_use``. Exit 0 when applied or unchanged (and in a dry run that could apply), 1 when
refused, failed or left pending a reset (``mode-pending``: nothing else to do until the GPU is
reset), 2 for bad input (an unknown profile, a config file that does not parse). SIGTERM, SIGHUP
or SIGINT during the change lets the one change in hand finish (a GPU instance is never left
without its compute instance), releases the lock, reads back what is there and exits 128 + the
signal number (``result: interrupted``); a rerun completes the layout. A signal during the
GPU reset is handled by the reset flow as in ``fleetops-agent reset`` (``nvidia-smi -r`` is not
cut off, the clients it stopped are started again, the attempt is journalled ``interrupted``),
then mig apply stops the same way.

``mig reset`` destroys and recreates a GPU's MIG instances, when none is in use.

The layout recreated is the GPU's current one (its instances' profiles, in order) or the one
given with ``--profiles``. All-or-nothing: if any selected GPU has an instance in use (or its
instances cannot be listed), nothing is changed on any GPU and the busy instances are named.
The change holds the node's maintenance lock (``agent.lock``), like a GPU reset. A dry run
reports the plan and changes nothing.

The change itself is the reset backend's ``recreate_mig``: on the simulator the instances live in
the state file (``gpu.sim.mig_reset``); on a real node the agent runs ``nvidia-smi mig -i UUID
-dci``, ``-dgi`` and ``-cgi PROFILES -C`` (argument lists, no shell). Then it reads the instances
back. The lock's deadline is the action's own worst case (``catalog.actions.mig_budget_s``),
moved at each GPU.
"""

from __future__ import annotations

import time
from typing import Any

from fleetops import model
from fleetops.agent import lock as node_lock
from fleetops.catalog.actions import mig_budget_s

REPORT_KIND = "fleetops.mig/v1"


class MigError(Exception):
    def __init__(self, message: str, kind: str = "mig", exit_code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


def _select(node: model.Node, selector: str) -> tuple[list[model.Gpu], bool]:
    """(GPUs, explicitly named). ``all`` means the GPUs with MIG enabled."""
    text = (selector or "all").strip()
    if text == "all":
        return [g for g in node.gpus if g.mig_mode_current], False
    from fleetops.common import selectors

    try:
        sel = selectors.parse_identity(text)
    except selectors.SelectorError as exc:
        raise MigError(exc.message, "usage", 2) from None
    gpu = selectors.find(node, sel)
    if gpu is None:
        raise MigError(f"--gpu {text}: no such GPU on {node.hostname} (present: {selectors.present(node)})", "no-such-gpu")
    return [gpu], True


def _inst(m: model.MigInstance) -> dict[str, Any]:
    return {"gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id, "profile": m.profile,
            "uuid": m.uuid, "in_use": m.in_use}


def plan(node: model.Node, selector: str, profiles: list[str] | None) -> list[dict[str, Any]]:
    """One entry per selected GPU: status ``ready`` | ``refused`` | ``skipped`` with detail."""
    gpus, explicit = _select(node, selector)
    out = []
    for gpu in gpus:
        entry: dict[str, Any] = {"uuid": gpu.uuid, "bus_id": gpu.bus_id, "index": gpu.index, "before": [], "after": None}
        if not gpu.mig_mode_current:
            entry.update(status="refused" if explicit else "skipped", detail="MIG mode is off on this GPU",
                         remedy="enable MIG first (fleetops apply mig)")
        elif gpu.mig_instances is None:
            entry.update(status="refused", detail=f"cannot list MIG instances ({gpu.unavailable.get('mig_instances', 'unknown')})",
                         remedy="list them with nvidia-smi mig -lgi and retry")
        else:
            entry["before"] = [_inst(m) for m in gpu.mig_instances]
            busy = [m for m in gpu.mig_instances if m.in_use]
            layout = list(profiles) if profiles is not None else [m.profile or "?" for m in gpu.mig_instances]
            if busy:
                names = ", ".join(f"GI {m.gpu_instance_id} {m.profile} {m.uuid}" for m in busy)
                entry.update(status="refused", detail=f"MIG instances in use: {names}",
                             remedy="stop the workloads on those instances (drain the GPU), then retry", in_use=[_inst(m) for m in busy])
            elif not layout:
                entry.update(status="refused", detail="no instances configured and no --profiles given: nothing to recreate",
                             remedy="give the layout with --profiles")
            else:
                entry.update(status="ready", profiles=layout,
                             detail=f"destroy {len(gpu.mig_instances)} instance(s), create {', '.join(layout)}")
        out.append(entry)
    return out


def _refuse_jobs(entries: list[dict[str, Any]], records: list[Any] | None, errors: list[str], where: str) -> None:
    """Refuse each ready GPU a running Slurm job holds by the node's job records (the prolog's):
    recreating the instances takes them from under the job, also between its steps, when no
    instance is in use. A record folder or a record that cannot be read refuses every ready GPU."""
    from fleetops.jobs.record import running_on

    for e in [e for e in entries if e.get("status") == "ready"]:
        if records is None or errors:
            e.update(status="refused", detail=f"cannot read every job record in {where}: {'; '.join(errors)}",
                     remedy="fix or remove the broken records (fleetops-agent job list), then retry")
            continue
        running = running_on(records, e["uuid"])
        if running:
            names = ", ".join(f"job {r.job_id} ({r.owner})" for r in running)
            e.update(status="refused", detail=f"running Slurm job(s) on the GPU: {names}", jobs=[r.job_id for r in running],
                     remedy="drain the GPU's jobs (let them end, or scancel them), then retry")


def run(selector: str, profiles: list[str] | None, dry_run: bool, backend: str, state_path: str | None,
        lock_path: str | None) -> tuple[dict[str, Any], int]:
    from fleetops.agent.reset.backends import ResetError, make_backend

    started = time.time()
    try:
        back = make_backend(backend, state_path, dry_run)
    except ResetError as exc:
        raise MigError(str(exc), exc.kind, exc.exit_code) from exc
    node = back.snapshot()
    entries = plan(node, selector, profiles)
    _refuse_jobs(entries, *back.job_records())
    doc: dict[str, Any] = {"kind": REPORT_KIND, "action": "mig reset", "node": node.hostname, "backend": back.name, "dry_run": dry_run,
                           "gpus": entries, "refused": False, "result": None, "message": ""}
    refused = [e for e in entries if e["status"] == "refused"]
    ready = [e for e in entries if e["status"] == "ready"]
    if refused:
        doc.update(refused=True, result="refused",
                   message="refused: " + "; ".join(f"{e['uuid']}: {e['detail']}" for e in refused))
        return doc, 1
    if not ready:
        doc.update(result="nothing-to-do", message="no GPU with MIG enabled: nothing to recreate")
        return doc, 0
    if dry_run:
        for e in ready:
            e["status"] = "would-recreate"
        doc.update(result="would-recreate", message=f"dry run: would recreate MIG instances on {len(ready)} GPU(s)")
        return doc, 0
    path = lock_path or back.default_lock()
    try:
        held = node_lock.acquire(path, "mig reset", ",".join(e["uuid"] for e in ready), mig_budget_s(len(ready)))
    except node_lock.LockHeld as exc:
        doc.update(refused=True, result="refused", message=str(exc), holder=exc.holder)
        return doc, 1
    try:
        failed = False
        for n, e in enumerate(ready):
            held.heartbeat(f"recreate {e['uuid']}", mig_budget_s(len(ready) - n))
            ok, detail = back.recreate_mig(e["uuid"], e["profiles"])
            e["status"] = "recreated" if ok else "failed"
            e["detail"] = detail
            failed = failed or not ok
        held.heartbeat("read back", mig_budget_s(0))
        after = back.snapshot()
        for e in ready:
            gpu = after.gpu_by_uuid(e["uuid"])
            e["after"] = [_inst(m) for m in (gpu.mig_instances or [])] if gpu else None
            got = [m["profile"] for m in e["after"] or []]
            if e["status"] == "recreated" and sorted(got) != sorted(e["profiles"]):
                e["status"] = "failed"
                e["detail"] += f"; read back {got}, expected {e['profiles']}"
                failed = True
    finally:
        held.release()
    doc["elapsed_s"] = round(time.time() - started, 3)
    if failed:
        doc.update(result="failed", message="MIG reset failed on " + ", ".join(e["uuid"] for e in ready if e["status"] == "failed"))
        return doc, 1
    doc.update(result="recreated", message=f"recreated MIG instances on {len(ready)} GPU(s)")
    return doc, 0


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    """``mig reset`` (``mig apply`` is ``mig_apply.main_args``: it builds on this module)."""
    if args.layout or args.config or args.select or getattr(args, "no_reset", False):
        raise MigError("--layout, --config, --select and --no-reset belong to mig apply; mig reset takes --profiles",
                       "usage", 2)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()] if args.profiles else None
    return run(args.gpu, profiles, bool(args.dry_run), args.backend, args.state, args.lock_file)
