"""``fleetops reset`` and ``fleetops remediate``: GPU resets and remediation plans over SSH.

``fleetops reset NODE GPU`` runs ``fleetops-agent reset`` on one node. GPU is a UUID, a bus id or
an index; an index is first resolved to its UUID (``fleetops-agent collect``) and the agent is
then given both the UUID and the bus id, so a GPU renumbered in between is refused, never
reset by mistake. It shows the GPU and the processes on it (a fresh snapshot) and asks
(default No) on a terminal; without a terminal it needs ``--yes``. With ``--kill-processes`` the
agent may end exactly the processes shown (``--expect-pids``) and refuses if others appeared.

``fleetops remediate -i INVENTORY`` plans from the latest audit in the history store (a fresh
audit when there is none for these hosts): which GPUs to reset, which nodes to drain, reboot or
send for inspection. ``--dry-run`` asks each node's agent whether each planned reset could run
(``reset --dry-run``); ``--yes`` carries out the GPU resets, one node at a time and one GPU at a
time, and is refused when the audit is older than ``--max-audit-age`` or misses a host it would
act on. Reboots, drains and inspections are printed as instructions, never done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetops import model
from fleetops.fleet import sshopts
from fleetops.ops import remediate as fitness_mod
from fleetops.ops import reset as ops_reset
from fleetops.ops import results, selectors
from fleetops.ops.errors import EXIT_OK, EXIT_WARN, FleetopsError, UsageError
from fleetops.remedy import plan as plan_mod

INVENTORY_ENVS = ("FLEETOPS_INVENTORY", "ANSIBLE_INVENTORY")


def _usage(message: str) -> UsageError:
    return UsageError(message)


def _guarded(func: Any) -> Any:
    """Errors of the operations layer become ``fleetops: error: ...`` and their exit code
    (ops.errors) whichever way the CLI was started."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except FleetopsError as exc:
            sys.stderr.write(f"fleetops: error: {exc.message}\n")
            return exc.exit_code

    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


def _inventory_path(value: str | None) -> str:
    if value:
        return value
    for env in INVENTORY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    raise _usage("no inventory: pass -i INVENTORY (or set FLEETOPS_INVENTORY)")


def _run(args: argparse.Namespace, host: Any, argv: list[str], timeout: float) -> Any:
    """One-shot SSH: connect, run once, disconnect (the CLI's runner for ops actions)."""
    from fleetops.fleet import transport

    return transport.run_all(
        [host],
        argv,
        forks=1,
        connect_timeout=args.connect_timeout,
        command_timeout=timeout,
        known_hosts=args.known_hosts,
        accept_new_hostkeys=args.accept_new_hostkeys,
    )[host.name]


def _runner(args: argparse.Namespace, host: Any) -> ops_reset.Runner:
    return lambda argv, timeout: _run(args, host, argv, timeout)


def _host(hosts: list[Any], name: str) -> Any:
    for host in hosts:
        if host.name == name:
            return host
    names = ", ".join(h.name for h in hosts[:6]) + (" ..." if len(hosts) > 6 else "")
    raise _usage(f"node {name!r} is not in the inventory (hosts: {names})")


def _confirm(question: str) -> bool | None:
    """True/False from the operator (default No); None when there is no terminal to ask on."""
    if not sys.stdin.isatty():
        return None
    try:
        sys.stderr.write(question + " [y/N] ")
        sys.stderr.flush()
        answer = sys.stdin.readline()
    except (EOFError, KeyboardInterrupt):
        return False
    return answer.strip().lower() in ("y", "yes")


# --- fleetops reset ----------------------------------------------------------------------


def _action_timeout(args: argparse.Namespace) -> float:
    return float(args.timeout) if args.timeout is not None else ops_reset.command_timeout_s()


def _print_result(result: results.ActionResult, as_json: bool) -> None:
    doc = result.detail.get("report")
    if doc is not None:
        if as_json:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            sys.stdout.write(ops_reset.render(result.node, doc))
        return
    sys.stderr.write(f"fleetops: {result.message}\n")
    if result.check:
        sys.stderr.write(f"fleetops: check with: {result.check}\n")


def cmd_reset(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory

    hosts = inventory.load(_inventory_path(args.inventory), None)
    host = _host(hosts, args.node)
    runner = _runner(args, host)
    view = ops_reset.preview(host, args.gpu, runner, args.collect_timeout)
    gpu = view.gpu
    shown = gpu.label()
    if gpu.selector.form == selectors.INDEX:
        sys.stderr.write(f"GPU index {args.gpu} on {host.name} is {shown}\n")
    else:
        sys.stderr.write(f"GPU on {host.name}: {shown}" + ("" if gpu.enumerated else " (not enumerated now)") + "\n")
    for line in view.process_lines():
        sys.stderr.write(f"  {line}\n")
    kill = list(view.pids) if args.kill_processes else []
    if view.pids and not args.kill_processes:
        sys.stderr.write("  the GPU is busy: without --kill-processes the agent refuses to reset it\n")
    if not args.dry_run and not args.yes:
        ending = f" and end {len(kill)} process(es) (pid {', '.join(map(str, kill))})" if kill else ""
        answer = _confirm(f"Reset {shown} on {host.name}{ending}?")
        if answer is None:
            raise _usage(
                f"refusing to reset {shown} on {host.name} without confirmation: pass --yes (no terminal to ask on)"
            )
        if not answer:
            sys.stderr.write("not confirmed: nothing done\n")
            return EXIT_WARN
    result = ops_reset.run(host, gpu, runner, dry_run=args.dry_run, kill_pids=kill, timeout_s=_action_timeout(args),
                           planned_backend=view.backend)
    if result.detail.get("backend_mismatch"):  # the report is not the planned GPU's: say so, not it
        sys.stderr.write(f"fleetops: {result.message}\n")
        if result.check:
            sys.stderr.write(f"fleetops: check with: {result.check}\n")
        return EXIT_WARN
    _print_result(result, args.json)
    return EXIT_OK if result.ok else EXIT_WARN


# --- fleetops remediate ------------------------------------------------------------------


def _findings(args: argparse.Namespace, hosts: list[Any], inv: str) -> tuple[list[model.Finding], dict[str, Any]]:
    """The latest audit's findings for these hosts, or a fresh audit's (recorded)."""
    from fleetops.fleet.store import Store

    names = {h.name for h in hosts}
    with Store(args.db) as store:
        if not args.fresh:
            for row in store.audits(limit=20):
                covered = store.audited_nodes(row.id) & names
                if covered:
                    findings = [f for f in store.findings(row.id) if f.node in names]
                    return findings, {"audit_id": row.id, "started_at": row.started_at, "fresh": False,
                                      "nodes": sorted(covered)}
        from fleetops.fleet import audit
        from fleetops.ops.baseline import resolve_baselines

        baselines = resolve_baselines(hosts, args.baseline, inv)
        previous = store.previous_snapshots([h.name for h in hosts])
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
        code = audit.exit_code(result.findings, "warn")
        audit_id = store.record(result, code)
        return result.findings, {"audit_id": audit_id, "started_at": result.started_at, "fresh": True,
                                 "nodes": sorted(names)}


def _reset_one(args: argparse.Namespace, host: Any, item: plan_mod.Item, dry_run: bool) -> dict[str, Any]:
    """One planned reset through ops: a fresh look at the GPU (its processes, which are the only
    ones ``--kill-processes`` may end), then the agent's reset, sent once."""
    planned = item.gpu or {}
    out: dict[str, Any] = {"node": host.name, "gpu": planned, "dry_run": dry_run}
    runner = _runner(args, host)
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
    kill = list(view.pids) if args.kill_processes else []
    out["processes"] = [{"pid": p.pid, "name": p.name} for p in view.processes or ()]
    res = ops_reset.run(host, gpu, runner, dry_run=dry_run, kill_pids=kill, timeout_s=_action_timeout(args),
                        planned_backend=view.backend)
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
    if r["result"] not in ("reset", "would-reset"):
        text += f": {r.get('message')}"
        if r.get("remedy"):
            text += f"\n      remedy: {r['remedy']}"
        if r.get("check"):
            text += f"\n      check: {r['check']}"
    return text


def cmd_remediate(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory

    max_age = fitness_mod.parse_age(args.max_audit_age)
    inv = args.inventory
    hosts = inventory.load(inv, args.limit)
    by_name = {h.name: h for h in hosts}
    findings, source = _findings(args, hosts, inv)
    plan = plan_mod.build(findings, [h.name for h in hosts])
    fit = fitness_mod.fitness(source["audit_id"], source["started_at"], source["nodes"], by_name, max_age)
    source.update(age_s=round(fit.age_s, 1), max_age_s=max_age, missing=list(fit.missing))
    doc: dict[str, Any] = {"source": source, "plan": plan.to_dict(), "executed": [], "warnings": fit.problems()}
    text_out = args.format == "text"
    if text_out:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(source["started_at"]))
        kind = "a fresh audit" if source["fresh"] else "the latest audit"
        sys.stdout.write(f"Plan from {kind} #{source['audit_id']} ({stamp}, {fitness_mod.format_age(fit.age_s)} ago), "
                         f"{len(source['nodes'])} node(s)\n")
        for problem in fit.problems():
            sys.stdout.write(f"WARNING: {problem}\n")
        sys.stdout.write("\n")
        sys.stdout.write(plan_mod.render(plan))
    resets = plan.resets
    if args.yes and resets:
        try:
            fitness_mod.require_fit(fit)
        except FleetopsError:
            if not text_out:
                sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            raise
    code = EXIT_OK
    if resets and (args.dry_run or args.yes):
        if text_out:
            verb = "Checking (dry run)" if args.dry_run else "Carrying out"
            sys.stdout.write(f"\n{verb} {len(resets)} GPU reset(s), one node at a time:\n")
        executed: list[dict[str, Any]] = []
        if args.dry_run:
            # read-only: the nodes may be asked in parallel, each node's GPUs in turn
            def node_dry(n: plan_mod.NodePlan) -> list[dict[str, Any]]:
                return [_reset_one(args, by_name[n.node], i, True) for i in n.resets]

            todo = [n for n in plan.nodes if n.resets and n.node in by_name]
            with ThreadPoolExecutor(max_workers=max(1, min(args.forks, len(todo) or 1))) as pool:
                for chunk in pool.map(node_dry, todo):
                    executed.extend(chunk)
                    if text_out:
                        for r in chunk:
                            sys.stdout.write(_line(r) + "\n")
        else:
            for n in plan.nodes:
                if not n.resets or n.node not in by_name:
                    continue
                for item in n.resets:
                    r = _reset_one(args, by_name[n.node], item, False)
                    executed.append(r)
                    if text_out:
                        sys.stdout.write(_line(r) + "\n")
                        sys.stdout.flush()
                    if r["outcome"] != results.DONE:
                        if text_out:
                            sys.stdout.write(f"  {n.node}: stopping this node's resets after a {r['result']} reset\n")
                        break
        doc["executed"] = executed
        good = results.DRY_RUN if args.dry_run else results.DONE
        code = EXIT_OK if all(r["outcome"] == good for r in executed) else EXIT_WARN
        if text_out and not args.dry_run:
            sys.stdout.write(f"\nAudit again to confirm: fleetops audit -i {inv}\n")
    elif resets and text_out:
        sys.stdout.write(f"\nRun with --yes to carry out the {len(resets)} GPU reset(s) (or --dry-run to check them).\n")
    if not text_out:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    return code


# --- registration ----------------------------------------------------------------------


def _ssh_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect-timeout", type=float, default=5.0, help="seconds to connect and get the SSH banner")
    p.add_argument("--known-hosts", help="known_hosts file (default: the inventory's UserKnownHostsFile, else ~/.ssh)")
    p.add_argument("--accept-new-hostkeys", action="store_true", help="trust and record keys of hosts never seen")
    sshopts.add_ssh_config(p)


def _action_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds to wait for each reset's answer (default: the agent's own reset budget plus SSH, "
        f"{ops_reset.command_timeout_s():.0f})",
    )
    p.add_argument(
        "--collect-timeout",
        type=float,
        default=ops_reset.DEFAULT_COLLECT_TIMEOUT_S,
        help=f"seconds for the fresh snapshot taken before each reset (default {ops_reset.DEFAULT_COLLECT_TIMEOUT_S:g})",
    )


def register(sub: Any) -> None:
    """The ``reset`` and ``remediate`` subcommands: the only entry point ``fleetops.cli`` uses."""
    p = sub.add_parser("reset", help="reset one GPU of one node over SSH, every precondition checked by the agent")
    p.add_argument("node", help="the node, as the inventory names it")
    p.add_argument("gpu", help="the GPU: UUID, PCI bus id, or index (resolved to its UUID first)")
    p.add_argument("-i", "--inventory", help="Ansible inventory (default: $FLEETOPS_INVENTORY)")
    p.add_argument("--dry-run", action="store_true", help="only evaluate the preconditions; change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--kill-processes",
        action="store_true",
        help="end the GPU's compute processes first: exactly those listed before the question "
        "(the agent refuses if others appeared)",
    )
    _action_args(p)
    p.add_argument("--json", action="store_true", help="print the agent's JSON answer")
    _ssh_args(p)
    p.set_defaults(func=_guarded(cmd_reset))

    p = sub.add_parser("remediate", help="turn the latest audit's findings into a plan; --yes carries out the GPU resets")
    p.add_argument("-i", "--inventory", required=True, help="Ansible inventory")
    p.add_argument("--limit", help="Ansible host pattern")
    p.add_argument("--db", help="history database (default: $FLEETOPS_DB or ~/.local/state/fleetops/history.db)")
    p.add_argument("--fresh", action="store_true", help="audit now instead of using the latest recorded audit")
    p.add_argument("--baseline", help="baseline YAML for a fresh audit (default: the inventory's fleetops_baseline)")
    p.add_argument(
        "--max-audit-age",
        default="15m",
        help="--yes refuses an audit older than this (900s, 15m, 1h; default 15m) or one that misses a host it acts on",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="ask each node whether its planned resets could run")
    mode.add_argument("--yes", action="store_true", help="carry out the GPU resets, one node at a time")
    p.add_argument(
        "--kill-processes",
        action="store_true",
        help="let each reset end the GPU's compute processes: those a fresh snapshot lists just before it",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--forks", type=int, default=20, help="nodes audited / dry-run-checked in parallel")
    _action_args(p)
    _ssh_args(p)
    p.set_defaults(func=_guarded(cmd_remediate))
