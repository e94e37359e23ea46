"""``fleetops remediate``: remediation plans over SSH, and the GPU resets they call for (through
the same ``fleetops.ops.reset`` functions as ``fleetops reset``, ``reset_cli.py``).

``fleetops remediate -i INVENTORY`` plans from each host's newest result across the audits in the
history store, taken only when younger than ``--max-audit-age`` (a fresh audit when no host was
ever audited, or with ``--fresh``): which GPUs to reset, which nodes to drain, reboot or send for
inspection, which need a command (apply power, rollout driver, ...), which cannot be planned
(hung, unreachable) and which have no recent result (named, never taken for healthy).
``--dry-run`` asks each node's agent whether each planned reset could run (``reset --dry-run``);
``--yes`` carries out the GPU resets, one node at a time and one GPU at a time, and is refused
while any host in scope has no recent result. Reboots, drains, inspections and commands are
printed as instructions, never done.

With ``--kill-processes`` a reset may end only processes somebody confirmed: ``--expect-pids
NODE:GPU=PID[,PID]`` or, on a terminal, a question per GPU after a fresh look at its processes;
without either the run is refused before anything is sent. Before a reset that ends processes
the node is drained in Slurm under remediate's own ownership (kind ``reset``, one run id per
invocation) and resumed once its resets are verified; another owner's drain is never lifted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetops import model
from fleetops.catalog.durations import GRAMMAR, DurationError, parse_duration
from fleetops.common import selectors
from fleetops.common.errors import EXIT_OK, EXIT_WARN, FleetopsError, Refused, UsageError
from fleetops.fleet import escalation
from fleetops.ops import frontend, results
from fleetops.ops import remediate as fitness_mod
from fleetops.ops import reset as ops_reset
from fleetops.ops.frontend import guarded
from fleetops.remedy import plan as plan_mod


def _usage(message: str) -> UsageError:
    return UsageError(message)


# --- fleetops remediate ------------------------------------------------------------------

# Owners of a drain that mean someone is working on the node now: remediate leaves it alone.
# Any other owner's drain (a fault drain: the health program, an operator, someone outside
# fleetops) keeps jobs off the node, so the reset may go ahead; remediate never lifts it.
_WORKING_KINDS = ("rollout", "mig", "firmware", "power", "reset")


def _escalations(args: argparse.Namespace, findings: list[model.Finding]) -> escalation.Escalations:
    """What the history in ``--db`` says of ``findings``, under the escalation flags' policy."""
    from fleetops.fleet.store import database as store_db

    return store_db.escalations(getattr(args, "db", None), findings, escalation.policy_from_args(args))


def _results(
    args: argparse.Namespace, hosts: list[Any], inv: str, max_age: float
) -> tuple[list[model.Finding], fitness_mod.Coverage, bool, dict[str, model.Node]]:
    """Each host's newest recorded result, merged across audits, sorted by age against the limit,
    the findings of those within it, and the snapshots of those that answered (their job records
    name the jobs each action hits). A fresh audit (recorded) with ``--fresh`` or when no host was
    ever audited."""
    from fleetops.fleet.store.database import Store

    names = [h.name for h in hosts]
    fresh = False
    with Store(args.db) as store:
        latest = {} if args.fresh else store.latest_results(names)
        if not latest:
            from fleetops.checks import verdict
            from fleetops.fleet import audit
            from fleetops.ops.baseline import resolve_baselines

            baselines = resolve_baselines(hosts, args.baseline, inv)
            previous = store.previous_snapshots(names)
            result = audit.run(
                hosts,
                baselines,
                previous,
                forks=args.forks,
                connect_timeout=args.connect_timeout,
                command_timeout=60.0,
                known_hosts=args.known_hosts,
                accept_new_hostkeys=args.accept_new_hostkeys,
                inventory=os.path.abspath(inv) if os.path.exists(inv) else inv,
            )
            store.record(result, verdict.exit_code(result.findings, "warn"))
            fresh = True
            latest = store.latest_results(names)
        cov = fitness_mod.coverage(latest, names, max_age, args.max_audit_age)
        findings = [f for name in names if name in cov.recent for f in store.findings(cov.recent[name].audit_id, name)]
        # a node's newest snapshot is its recent result's when that one reached it
        snaps = store.previous_snapshots([n for n, r in cov.recent.items() if r.reachable])
    return findings, cov, fresh, snaps


def parse_expect_pids(values: list[str] | None) -> dict[str, list[tuple[selectors.Selector, tuple[int, ...]]]]:
    """``--expect-pids NODE:GPU=PID[,PID...]`` (repeatable; ``NODE:GPU=`` confirms no process)
    -> node -> [(GPU selector, PIDs)]. The GPU is a UUID, a bus id or an index, as everywhere."""
    out: dict[str, list[tuple[selectors.Selector, tuple[int, ...]]]] = {}
    for value in values or []:
        node, colon, rest = str(value).partition(":")
        gpu, equals, listed = rest.rpartition("=")
        if not colon or not equals or not node.strip() or not gpu.strip():
            raise _usage(f"--expect-pids {value!r}: give NODE:GPU=PID[,PID...] (GPU: UUID, bus id or index)")
        try:
            sel = selectors.parse(gpu.strip())
        except selectors.SelectorError as exc:
            raise _usage(f"--expect-pids {value!r}: {exc.message}") from None
        pids = []
        for item in listed.split(","):
            if not item.strip():
                continue
            if not item.strip().isdigit():
                raise _usage(f"--expect-pids {value!r}: {item.strip()!r} is not a process id")
            pids.append(int(item))
        out.setdefault(node.strip(), []).append((sel, tuple(sorted(set(pids)))))
    return out


def _process_text(p: model.GpuProcess) -> str:
    user = getattr(p, "user", None)
    mem = f", {p.used_memory_mib} MiB" if p.used_memory_mib is not None else ""
    return f"pid {p.pid} ({p.name or '?'}" + (f", user {user}" if user else "") + mem + ")"


def _gpu_text(node: str, gpu: dict[str, Any]) -> str:
    return f"{node} GPU {gpu.get('index')} {gpu.get('uuid')} ({gpu.get('bus_id')})"


def _confirm_processes(
    args: argparse.Namespace, plan: plan_mod.Plan, by_name: dict[str, Any]
) -> tuple[dict[tuple[str, str], tuple[int, ...]], list[str]]:
    """The processes the operator confirmed may be ended, per planned reset: (node, UUID) ->
    PIDs. A fresh look at each node lists what runs on each planned GPU; a GPU that runs
    processes needs them confirmed by ``--expect-pids`` or, on a terminal, by a question. With
    neither, the run is refused before anything is sent. Returns the confirmations and notes."""
    wanted = parse_expect_pids(args.expect_pids)
    for node in wanted:
        if node not in by_name:
            raise _usage(f"--expect-pids names {node!r}, which is not in the inventory (and --limit)")
    confirmed: dict[tuple[str, str], tuple[int, ...]] = {}
    notes: list[str] = []
    unconfirmed: list[tuple[str, dict[str, Any], tuple[model.GpuProcess, ...]]] = []
    planned_nodes = [n for n in plan.nodes if n.resets and n.node in by_name]
    for n in planned_nodes:
        host = by_name[n.node]
        try:
            snap = ops_reset.snapshot(host, frontend.runner(args, host), args.collect_timeout)
        except FleetopsError as exc:
            notes.append(f"{n.node}: no fresh look at its GPUs ({exc.message}): its resets end no process")
            continue
        given: dict[str, tuple[int, ...]] = {}
        for sel, pids in wanted.get(n.node, []):
            given[str(selectors.resolve(sel, snap, n.node, allow_absent=False).uuid)] = pids
        planned = {str((i.gpu or {}).get("uuid")) for i in n.resets}
        for uuid in sorted(set(given) - planned):
            notes.append(f"--expect-pids for {n.node} {uuid}: no reset is planned for that GPU; ignored")
        for item in n.resets:
            uuid = str((item.gpu or {}).get("uuid"))
            if uuid in given:
                confirmed[(n.node, uuid)] = given[uuid]
                continue
            seen = snap.gpu_by_uuid(uuid)
            procs = tuple(seen.processes or ()) if seen is not None else ()
            if procs:
                unconfirmed.append((n.node, item.gpu or {}, procs))
    for node in wanted:
        if not any(n.node == node for n in planned_nodes):
            notes.append(f"--expect-pids for {node}: no reset is planned on that node; ignored")
    if not unconfirmed:
        return confirmed, notes
    if not sys.stdin.isatty():
        if args.expect_pids:
            return confirmed, notes  # those GPUs' resets are refused: their processes were not confirmed
        listed = "; ".join(
            f"{_gpu_text(node, gpu)}: " + ", ".join(_process_text(p) for p in procs) for node, gpu, procs in unconfirmed
        )
        flags = " ".join(
            f"--expect-pids {node}:{gpu.get('uuid')}={','.join(str(p.pid) for p in procs)}"
            for node, gpu, procs in unconfirmed
        )
        raise Refused(
            "refusing --kill-processes: nobody confirmed the processes it would end, and there is no terminal to "
            f"ask on: {listed}. Check them, then pass {flags} (or run on a terminal to be asked). "
            "Nothing was reset or drained."
        )
    for node, ref, procs in unconfirmed:
        sys.stderr.write(f"{_gpu_text(node, ref)} runs {len(procs)} process(es):\n")
        for p in procs:
            sys.stderr.write(f"  {_process_text(p)}\n")
        answer = frontend.confirm(f"End exactly these and reset the GPU on {node}?")
        if answer:
            confirmed[(node, str(ref.get("uuid")))] = tuple(sorted(p.pid for p in procs))
        else:
            notes.append(f"{_gpu_text(node, ref)}: its processes were not confirmed: its reset is not done")
    return confirmed, notes


def _reset_one(
    args: argparse.Namespace,
    host: Any,
    item: plan_mod.Item,
    dry_run: bool,
    confirmed: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """One planned reset through ops: a fresh look at the GPU, then the agent's reset, sent once.
    With ``--kill-processes`` the agent may end only processes the operator confirmed
    (``confirmed``); one that runs on the GPU unconfirmed refuses the reset here, before
    anything is sent. A dry run without confirmations evaluates the processes it sees."""
    planned = item.gpu or {}
    out: dict[str, Any] = {"node": host.name, "gpu": planned, "dry_run": dry_run}
    runner = frontend.runner(args, host)
    try:
        view = ops_reset.preview(host, str(planned.get("uuid")), runner, args.collect_timeout)
    except FleetopsError as exc:
        out.update(result="error", outcome=results.FAILED, message=exc.message, remedy=None, check=None)
        return out
    gpu = view.gpu
    if planned.get("bus_id") and gpu.bus_id and gpu.bus_id != planned["bus_id"]:
        out.update(result="refused", outcome=results.REFUSED, remedy=None, check=None,
                   message=f"{gpu.uuid} is at {gpu.bus_id} now, not at {planned['bus_id']} as the audit saw it: "
                           "audit again")
        return out
    out["processes"] = [{"pid": p.pid, "name": p.name} for p in view.processes or ()]
    # the GPU's Slurm jobs now (the daemon's records; None without): on the node a running one
    # refuses the reset (slurm_jobs) unless confirmed processes go with --kill-processes (after the
    # drain); a job between steps, with no process to confirm, refuses it
    out["jobs"] = None if view.jobs is None else [{"job_id": j.job_id, "user": j.user} for j in view.jobs]
    kill: list[int] = []
    if args.kill_processes:
        if confirmed is None and dry_run:
            kill = list(view.pids)
        else:
            allowed = set(confirmed or ())
            stray = [p for p in view.processes or () if p.pid not in allowed]
            if stray:
                out.update(result="refused", outcome=results.REFUSED, remedy=None, check=None,
                           message="processes nobody confirmed run on the GPU: "
                                   + ", ".join(_process_text(p) for p in stray)
                                   + f"; nothing sent. Confirm them (--expect-pids {host.name}:{gpu.uuid}="
                                   + ",".join(str(p) for p in sorted({*allowed, *(p.pid for p in stray)}))
                                   + ") if they may be ended")
                return out
            kill = sorted(allowed & set(view.pids))
        out["processes"] = [p for p in out["processes"] if p["pid"] in kill] if kill else []
    res = ops_reset.run(host, gpu, runner, dry_run=dry_run, kill_pids=kill, timeout_s=frontend.action_timeout(args),
                        planned_backend=view.backend, inventory=args.inventory,
                        expect_jobs=None if view.jobs is None else [j.job_id for j in view.jobs])
    doc = res.detail.get("report")
    out.update(outcome=res.outcome, check=res.check)
    if res.detail.get("backend_mismatch"):  # the agent's report is not about the planned GPU
        out.update(result="refused" if res.outcome == results.REFUSED else "unknown", message=res.message,
                   remedy=None, backend_mismatch=res.detail["backend_mismatch"])
    elif doc is None:
        out.update(result="unknown" if res.outcome == results.UNKNOWN else "error", message=res.message, remedy=None)
    else:
        out.update(result=doc.get("result"), message=doc.get("message"), remedy=doc.get("remedy"),
                   verified=doc.get("verified"), agent=doc)
    return out


def _line(r: dict[str, Any]) -> str:
    g = r["gpu"]
    text = f"  {r['node']} GPU {g.get('index')} {g.get('uuid')} ({g.get('bus_id')}): {r['result']}"
    if r.get("processes") and r["result"] in ("reset", "would-reset"):
        text += " (ended: " if r["result"] == "reset" else " (would end: "
        text += ", ".join(f"pid {p['pid']} {p.get('name') or '?'}" for p in r["processes"]) + ")"
    if r.get("jobs") and r["result"] in ("reset", "would-reset"):
        text += " (under jobs " + ", ".join(str(j["job_id"]) for j in r["jobs"]) + ")"
    if r["result"] not in ("reset", "would-reset"):
        text += f": {r.get('message')}"
        if r.get("remedy"):
            text += f"\n      remedy: {r['remedy']}"
        if r.get("check"):
            text += f"\n      check: {r['check']}"
    return text


def _slurm(args: argparse.Namespace, inv: str) -> Any:
    """Drain and resume for this inventory (every host of it: a Slurm host may be outside --limit)."""
    from fleetops.fleet import inventory
    from fleetops.ops.slurm import SlurmControl

    return SlurmControl(
        inventory.load(inv, None),
        connect_timeout=args.connect_timeout,
        known_hosts=args.known_hosts,
        accept_new_hostkeys=args.accept_new_hostkeys,
    )


def _purpose(items: list[plan_mod.Item]) -> str:
    """The drain's purpose: the GPUs to reset and the checks that call for it (sinfo -R's width)."""
    gpus = ", ".join(f"GPU {(i.gpu or {}).get('index')} {(i.gpu or {}).get('uuid')}" for i in items)
    checks = sorted({r["check"] for i in items for r in i.reasons if r.get("plan") == "reset_gpu"})
    return f"reset {gpus}" + (f" ({', '.join(checks)})" if checks else "")


def _drain_log(db: str | None, run_id: str) -> Any:
    """Records each drain and resume of this run in the history (``fleetops history --kind
    drains``); a dry run's are not recorded, and a store that cannot be written only warns."""
    from fleetops.ops import drain_log

    def log(res: results.ActionResult, purpose: str | None = None) -> None:
        drain_log.record(db, res, kind="reset", run=run_id, purpose=purpose, source="remediate")

    return log


def _drain_first(
    slurm: Any, host: Any, items: list[plan_mod.Item], run_id: str, dry_run: bool, log: Any = None
) -> dict[str, Any]:
    """Drain the node under remediate's ownership (kind reset, this run) before resets that end
    processes. ``go``: whether those resets may run; ``ours``: whether this run's drain is to be
    lifted after them (never another owner's). ``log`` records the drain (``_drain_log``)."""
    from fleetops.ops.slurm import slurm_managed

    out: dict[str, Any] = {"node": host.name, "action": "drain", "go": False, "ours": False}
    why = slurm.precheck(host)
    if why is not None and slurm_managed(host):
        out.update(outcome=results.REFUSED, message=f"{host.name}: cannot drain it first: {why}")
        return out
    purpose = _purpose(items)
    res = slurm.drain(host, purpose, kind="reset", run=run_id, dry_run=dry_run)
    if log is not None:
        log(res, purpose)
    detail = res.detail or {}
    owner = detail.get("owner") or {}
    out.update(outcome=res.outcome, message=res.message, detail=detail)
    if res.outcome in (results.DONE, results.DRY_RUN):
        out.update(go=True, ours=detail.get("decision") != "held")
    elif detail.get("slurm_managed") is False:
        out.update(go=True, message=f"{res.message}: the reset goes ahead without a drain")
    elif detail.get("decision") == "held" and owner.get("kind") not in _WORKING_KINDS:
        out.update(go=True, message=f"{res.message}: the node takes no jobs, the reset goes ahead; "
                                    "that drain is not remediate's to lift")
    return out


def _resume_after(
    slurm: Any, host: Any, node_results: list[dict[str, Any]], run_id: str, log: Any = None
) -> dict[str, Any]:
    """Lift this run's drain once every reset it was made for is verified (or was refused,
    nothing touched); leave it after one that failed, went unanswered or was not verified."""
    done = [r for r in node_results if r.get("drained_for")]
    if all((r.get("result") == "reset" and r.get("verified")) or r.get("outcome") == results.REFUSED for r in done):
        res = slurm.resume(host, kind="reset", run=run_id)
        if log is not None:
            log(res)
        return {"node": host.name, "action": "resume", "outcome": res.outcome, "message": res.message}
    return {"node": host.name, "action": "resume", "outcome": results.REFUSED,
            "message": f"{host.name}: left drained (reset/{run_id}): a reset it was drained for is not verified; "
                       f"once the GPU is fixed an operator lifts it: fleetops resume {host.name} --force"}


def _remediate_node(
    args: argparse.Namespace,
    n: plan_mod.NodePlan,
    host: Any,
    run_id: str,
    confirmed: dict[tuple[str, str], tuple[int, ...]],
    slurm: Any,
    dry_run: bool,
    emit: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One node's planned resets, in turn: the drain first when one ends processes, then each
    reset (stopping after one that did not succeed), then the resume of this run's drain."""
    executed: list[dict[str, Any]] = []
    slurm_steps: list[dict[str, Any]] = []
    picks = {str((i.gpu or {}).get("uuid")): confirmed.get((n.node, str((i.gpu or {}).get("uuid")))) for i in n.resets}
    if dry_run:
        # each reset evaluated first (it only looks); the drain they would need is shown before them
        looked = [_reset_one(args, host, i, True, picks[str((i.gpu or {}).get("uuid"))]) for i in n.resets]
        ending = [i for i, r in zip(n.resets, looked, strict=True) if r.get("processes")] if args.kill_processes else []
        drain = _drain_first(slurm, host, ending, run_id, True) if ending else None
        if drain is not None:
            slurm_steps.append(drain)
            emit(f"  Slurm: {drain['message']}")
        for item, r in zip(n.resets, looked, strict=True):
            if drain is not None and item in ending and not drain["go"]:
                r.update(result="refused", outcome=results.REFUSED,
                         message=f"it would end processes, and the node could not be drained first: {drain['message']}")
            executed.append(r)
            emit(_line(r))
        return executed, slurm_steps
    ending = [i for i in n.resets if picks[str((i.gpu or {}).get("uuid"))]] if args.kill_processes else []
    log = _drain_log(args.db, run_id)
    drain = None
    if ending:
        drain = _drain_first(slurm, host, ending, run_id, False, log)
        slurm_steps.append(drain)
        emit(f"  Slurm: {drain['message']}")
    good = results.DONE
    for item in n.resets:
        uuid = str((item.gpu or {}).get("uuid"))
        if drain is not None and item in ending and not drain["go"]:
            r = {"node": n.node, "gpu": item.gpu or {}, "dry_run": False, "result": "refused",
                 "outcome": results.REFUSED, "remedy": None, "check": None,
                 "message": f"it would end processes, and the node could not be drained first: {drain['message']}"}
        else:
            r = _reset_one(args, host, item, False, picks[uuid] if args.kill_processes else None)
            r["drained_for"] = bool(drain and drain["ours"] and item in ending)
        executed.append(r)
        emit(_line(r))
        if r["outcome"] != good:
            emit(f"  {n.node}: stopping this node's resets after a {r['result']} reset")
            break
    if drain is not None and drain["ours"]:
        step = _resume_after(slurm, host, executed, run_id, log)
        slurm_steps.append(step)
        emit(f"  Slurm: {step['message']}")
    return executed, slurm_steps


def cmd_remediate(args: argparse.Namespace) -> int:
    from fleetops.catalog import slurm as slurm_rule
    from fleetops.fleet import inventory

    try:
        max_age = parse_duration(args.max_audit_age, flag="--max-audit-age")
    except DurationError as exc:
        raise _usage(str(exc)) from exc
    parse_expect_pids(args.expect_pids)  # a malformed one is refused before anything else
    if args.expect_pids and not args.kill_processes:
        raise _usage("--expect-pids names the processes --kill-processes may end: give both")
    inv = args.inventory = frontend.inventory_path(args.inventory)
    hosts = inventory.load(inv, args.limit)
    by_name = {h.name: h for h in hosts}
    findings, cov, fresh, snaps = _results(args, hosts, inv, max_age)
    plan = plan_mod.build(
        findings,
        [h.name for h in hosts],
        inventory=inv,
        audited=list(cov.recent),
        unaudited=cov.unplanned,
        window=args.max_audit_age,
        escalations=_escalations(args, findings),
        snapshots=snaps,
    )
    run_id = slurm_rule.new_run_id()
    newest = max(cov.audit_ids) if cov.audit_ids else None
    source: dict[str, Any] = {"audit_id": newest, "fresh": fresh, **cov.to_dict()}
    doc: dict[str, Any] = {"run": run_id, "source": source, "plan": plan.to_dict(), "executed": [], "slurm": [],
                           "warnings": cov.problems()}
    text_out = args.format == "text"

    def emit(line: str) -> None:
        if text_out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    if text_out:
        ages = [r.age_s for r in cov.recent.values()]
        audits = ", ".join(f"#{a}" for a in cov.audit_ids) or "none"
        kind = "a fresh audit" if fresh else "the latest results"
        span = ""
        if ages:
            span = f", {fitness_mod.format_age(min(ages))}" + (
                f" to {fitness_mod.format_age(max(ages))}" if max(ages) - min(ages) >= 1 else "") + " old"
        emit(f"Plan from {kind} of {len(cov.recent)} node(s) (audit {audits}{span}); run {run_id}")
        for problem in cov.problems():
            emit(f"WARNING: {problem}")
        emit("")
        sys.stdout.write(plan_mod.render(plan))
    resets = plan.resets
    if args.yes:
        try:
            fitness_mod.require_fit(cov)
        except FleetopsError:
            if not text_out:
                sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            raise
    code = EXIT_OK if cov.ok else EXIT_WARN
    if resets and (args.dry_run or args.yes):
        confirmed: dict[tuple[str, str], tuple[int, ...]] = {}
        if args.kill_processes and args.yes:
            try:
                confirmed, notes = _confirm_processes(args, plan, by_name)
            except FleetopsError:
                if not text_out:
                    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
                raise
            for note in notes:
                emit(f"NOTE: {note}")
            doc["confirmed"] = [{"node": k[0], "gpu": k[1], "pids": list(v)} for k, v in sorted(confirmed.items())]
        elif args.kill_processes:
            confirmed = _dry_confirmations(args, plan, by_name)
        slurm = _slurm(args, inv) if args.kill_processes else None
        verb = "Checking (dry run)" if args.dry_run else "Carrying out"
        emit(f"\n{verb} {len(resets)} GPU reset(s), one node at a time (run {run_id}):")
        executed: list[dict[str, Any]] = []
        steps: list[dict[str, Any]] = []
        todo = [n for n in plan.nodes if n.resets and n.node in by_name]
        if args.dry_run:
            # read-only: the nodes may be asked in parallel, each node's GPUs in turn; lines per node
            def node_dry(n: plan_mod.NodePlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
                lines: list[str] = []
                done, slurm_done = _remediate_node(args, n, by_name[n.node], run_id, confirmed, slurm, True,
                                                   lines.append)
                return done, slurm_done, lines

            with ThreadPoolExecutor(max_workers=max(1, min(args.forks, len(todo) or 1))) as pool:
                for done, slurm_done, lines in pool.map(node_dry, todo):
                    executed.extend(done)
                    steps.extend(slurm_done)
                    for line in lines:
                        emit(line)
        else:
            for n in todo:
                done, slurm_done = _remediate_node(args, n, by_name[n.node], run_id, confirmed, slurm, False, emit)
                executed.extend(done)
                steps.extend(slurm_done)
        doc["executed"] = executed
        doc["slurm"] = steps
        good = results.DRY_RUN if args.dry_run else results.DONE
        if not all(r["outcome"] == good for r in executed):
            code = EXIT_WARN
        if not args.dry_run:
            emit(f"\nAudit again to confirm: fleetops audit -i {inv}")
    elif resets:
        emit(f"\nRun with --yes to carry out the {len(resets)} GPU reset(s) (or --dry-run to check them).")
    if not text_out:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    return code


def _dry_confirmations(
    args: argparse.Namespace, plan: plan_mod.Plan, by_name: dict[str, Any]
) -> dict[tuple[str, str], tuple[int, ...]]:
    """A dry run's confirmations: those --expect-pids gives (resolved on a fresh look); the
    others are evaluated with the processes each GPU runs, as a dry run only looks."""
    wanted = parse_expect_pids(args.expect_pids)
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for n in plan.nodes:
        if n.node not in wanted or n.node not in by_name or not n.resets:
            continue
        host = by_name[n.node]
        try:
            snap = ops_reset.snapshot(host, frontend.runner(args, host), args.collect_timeout)
        except FleetopsError:
            continue  # its resets' dry runs say why
        for sel, pids in wanted[n.node]:
            out[(n.node, str(selectors.resolve(sel, snap, n.node, allow_absent=False).uuid))] = pids
    return out


# --- registration ----------------------------------------------------------------------


def register(sub: Any) -> None:
    """The ``remediate`` subcommand: the only entry point ``fleetops.cli`` uses."""
    p = sub.add_parser(
        "remediate",
        help="turn each node's latest audit result into a plan; --yes carries out the GPU resets",
    )
    frontend.inventory_arg(p)
    frontend.limit_arg(p)
    frontend.db_arg(p)
    p.add_argument("--fresh", action="store_true", help="audit now instead of using the recorded audits")
    p.add_argument("--baseline", help="baseline YAML for a fresh audit (default: the inventory's fleetops_baseline)")
    p.add_argument(
        "--max-audit-age",
        default="15m",
        metavar="DURATION",
        help="plan each node from its newest result across the recorded audits when it is younger than this "
        f"({GRAMMAR}; default 15m); --yes refuses while any node has none, and names them",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="ask each node whether its planned resets could run")
    mode.add_argument("--yes", action="store_true", help="carry out the GPU resets, one node at a time")
    p.add_argument(
        "--kill-processes",
        action="store_true",
        help="let a reset end the GPU's compute processes, only those confirmed (--expect-pids, or asked on a "
        "terminal; refused otherwise); the node is drained in Slurm first (owner reset/RUN) and resumed "
        "after a verified reset",
    )
    p.add_argument(
        "--expect-pids",
        action="append",
        metavar="NODE:GPU=PID[,PID...]",
        help="with --kill-processes: the processes that may be ended on one GPU (UUID, bus id or index); "
        "repeat per GPU. A process that runs there unconfirmed refuses that GPU's reset",
    )
    escalation.add_arguments(p)
    frontend.format_arg(p, ("text", "json"))
    frontend.forks_arg(p, "nodes audited, or dry-run checked, over SSH at the same time (resets: one node at a time)")
    frontend.action_args(p)
    frontend.ssh_args(p)
    p.set_defaults(func=guarded(cmd_remediate))
