"""``fleetops reset`` and ``fleetops remediate``: GPU resets and remediation plans over SSH.

``fleetops reset NODE GPU`` runs ``fleetops-agent reset`` on one node. GPU is a UUID, a bus id or
an index; an index is first resolved to its UUID (``fleetops-agent collect``) and the agent is
then given both the UUID and the bus id, so a GPU renumbered in between is refused, never
reset by mistake. A real reset asks for confirmation (default No) on a terminal, and without a
terminal needs ``--yes``.

``fleetops remediate -i INVENTORY`` plans from the latest audit in the history store (a fresh
audit when there is none for these hosts): which GPUs to reset, which nodes to drain, reboot or
send for inspection. ``--dry-run`` asks each node's agent whether each planned reset could run
(``reset --dry-run``); ``--yes`` carries out the GPU resets, one node at a time and one GPU at a
time. Reboots, drains and inspections are printed as instructions, never done.
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
from fleetops.remedy import plan as plan_mod

AGENT_VAR = "fleetops_agent_path"
DEFAULT_AGENT = "fleetops-agent"
INVENTORY_ENVS = ("FLEETOPS_INVENTORY", "ANSIBLE_INVENTORY")


EXIT_USAGE = 4  # as fleetops.cli


class RemedyUsageError(Exception):
    """Bad input the user can fix (exit 4, as the main CLI's usage errors)."""


def _usage(message: str) -> Exception:
    return RemedyUsageError(message)


def _guarded(func: Any) -> Any:
    """Usage errors become ``fleetops: error: ...`` and exit 4 whichever way the CLI was started."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except RemedyUsageError as exc:
            sys.stderr.write(f"fleetops: error: {exc}\n")
            return EXIT_USAGE

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


def _agent_argv(host: Any, *args: str) -> list[str]:
    argv = [str(host.vars.get(AGENT_VAR, DEFAULT_AGENT)), *args]
    state = host.vars.get("fleetops_sim_state")
    if state:  # a simulated node: name its state, do not rely on the session's environment
        argv += ["--backend", "sim", "--state", str(state)]
    return argv


def _run(args: argparse.Namespace, host: Any, argv: list[str], timeout: float) -> Any:
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


def agent_doc(result: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The agent's JSON answer (also on a refusal, exit 1), or why there is none."""
    text = (result.stdout or "").strip()
    if text:
        try:
            doc = json.loads(text)
            if isinstance(doc, dict):
                return doc, None
        except json.JSONDecodeError:
            pass
    for line in reversed((result.stderr or "").strip().splitlines()):
        try:
            err = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(err, dict) and "error" in err:
            return None, str(err["error"])
    why = result.error or (result.stderr or "").strip() or f"exit {result.exit_status}"
    return None, f"{result.error_kind or 'error'}: {why}"


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


def resolve_gpu(args: argparse.Namespace, host: Any, selector: str) -> dict[str, Any]:
    """{"uuid", "bus_id", "index", "name"} of the node's GPU named by UUID, bus id or index."""
    text = selector.strip()
    result = _run(args, host, _agent_argv(host, "collect"), args.connect_timeout + 60)
    doc, why = agent_doc(result) if result.ok else (None, agent_doc(result)[1])
    if doc is None:
        if text.isdigit():
            raise _usage(f"{host.name}: cannot resolve GPU index {text} to a UUID: collect failed: {why}")
        return {"uuid": text if text.upper().startswith("GPU-") else None, "bus_id": None, "index": None,
                "name": None, "note": f"not confirmed by a collect ({why})"}
    try:
        node = model.node_from_dict(doc)
    except model.SchemaError as exc:
        raise _usage(f"{host.name}: the agent's snapshot is unusable: {exc}") from exc
    if text.isdigit():
        gpu = next((g for g in node.gpus if g.index == int(text)), None)
    elif text.upper().startswith("GPU-"):
        gpu = node.gpu_by_uuid(text)
    else:
        try:
            gpu = node.gpu_by_bus_id(text)
        except ValueError:
            raise _usage(f"GPU {text!r}: not a UUID (GPU-...), a bus id (0000:18:00.0) or an index") from None
    if gpu is None:
        present = ", ".join(f"{g.index}={g.uuid}@{g.bus_id}" for g in node.gpus) or "none"
        if text.isdigit():
            raise _usage(f"{host.name} has no GPU with index {text} (present: {present})")
        # the agent says why (fallen off the bus, unknown): let it answer
        return {"uuid": text if text.upper().startswith("GPU-") else None,
                "bus_id": None if text.upper().startswith("GPU-") else text, "index": None, "name": None,
                "note": f"not enumerated on {host.name} (present: {present})"}
    return {"uuid": gpu.uuid, "bus_id": gpu.bus_id, "index": gpu.index, "name": gpu.name}


def reset_argv(host: Any, gpu: dict[str, Any], dry_run: bool, kill: bool, selector: str) -> list[str]:
    target = gpu.get("uuid") or gpu.get("bus_id") or selector
    argv = ["reset", "--gpu", target, "--json"]
    if gpu.get("uuid") and gpu.get("bus_id"):
        argv += ["--bus-id", gpu["bus_id"]]
    if dry_run:
        argv.append("--dry-run")
    if kill:
        argv.append("--kill-processes")
    return _agent_argv(host, *argv)


MARK = {"ok": "ok", "failed": "FAILED", "skipped": "-"}


def render_reset(node: str, doc: dict[str, Any]) -> str:
    gpu = doc.get("gpu") or {}
    head = f"{node} {gpu.get('uuid') or gpu.get('selector')} ({gpu.get('bus_id') or '?'}"
    head += f", GPU {gpu['index']})" if gpu.get("index") is not None else ")"
    lines = [f"{head}: {doc.get('result')}" + (" [dry run]" if doc.get("dry_run") else "")]
    for c in doc.get("preconditions") or []:
        lines.append(f"  {MARK.get(c.get('status'), c.get('status')):7} {c.get('name'):20} {c.get('detail')}")
    for a in doc.get("actions") or []:
        if a.get("action") == "end_processes":
            for p in a.get("processes") or []:
                sig = " -> ".join(p.get("signals") or []) or "no signal"
                lines.append(f"  action  end pid {p['pid']} ({p.get('name') or '?'}): {sig}: "
                             + ("ended" if p.get("ended") else f"NOT ended ({p.get('detail', '')})"))
        elif a.get("action") in ("stop_service", "start_service"):
            lines.append(f"  action  {a['action'].split('_')[0]} {a.get('unit')}: {'ok' if a.get('ok') else 'FAILED'}")
        else:
            lines.append(f"  action  {a.get('action')}: {'ok' if a.get('ok') else 'FAILED'}: {a.get('detail')}")
    if doc.get("verification"):
        lines.append(f"  verify  {'ok' if doc.get('verified') else 'FAILED'}: {doc['verification'].get('detail')}")
    if doc.get("remedy"):
        lines.append(f"  remedy: {doc['remedy']}")
    return "\n".join(lines) + "\n"


def cmd_reset(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory

    hosts = inventory.load(_inventory_path(args.inventory), None)
    host = _host(hosts, args.node)
    gpu = resolve_gpu(args, host, args.gpu)
    shown = f"{gpu.get('uuid') or args.gpu}" + (f" at {gpu['bus_id']}" if gpu.get("bus_id") else "")
    shown += f" (GPU {gpu['index']}, {gpu.get('name') or 'unnamed'})" if gpu.get("index") is not None else ""
    if args.gpu.strip().isdigit():
        sys.stderr.write(f"GPU index {args.gpu} on {host.name} is {shown}\n")
    if not args.dry_run and not args.yes:
        answer = _confirm(f"Reset {shown} on {host.name}?")
        if answer is None:
            raise _usage(f"refusing to reset {shown} on {host.name} without confirmation: pass --yes (no terminal to ask on)")
        if not answer:
            sys.stderr.write("not confirmed: nothing done\n")
            return 1
    result = _run(args, host, reset_argv(host, gpu, args.dry_run, args.kill_processes, args.gpu), args.timeout)
    doc, why = agent_doc(result)
    if doc is None:
        sys.stderr.write(f"fleetops: reset on {host.name} failed: {why}\n")
        return 1
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(render_reset(host.name, doc))
    ok = doc.get("result") in ("reset", "would-reset")
    return 0 if ok and result.ok else 1


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
        from fleetops.cli import resolve_baselines
        from fleetops.fleet import audit

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
    gpu = item.gpu or {}
    argv = reset_argv(host, gpu, dry_run, args.kill_processes, str(gpu.get("uuid")))
    result = _run(args, host, argv, args.timeout)
    doc, why = agent_doc(result)
    out = {"node": host.name, "gpu": gpu, "dry_run": dry_run}
    if doc is None:
        out.update(result="error", message=why, remedy=None)
    else:
        out.update(result=doc.get("result"), message=doc.get("message"), remedy=doc.get("remedy"),
                   verified=doc.get("verified"), agent=doc)
    return out


def _line(r: dict[str, Any]) -> str:
    g = r["gpu"]
    text = f"  {r['node']} GPU {g.get('index')} {g.get('uuid')} ({g.get('bus_id')}): {r['result']}"
    if r["result"] not in ("reset", "would-reset"):
        text += f": {r.get('message')}"
        if r.get("remedy"):
            text += f"\n      remedy: {r['remedy']}"
    return text


def cmd_remediate(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory

    inv = args.inventory
    hosts = inventory.load(inv, args.limit)
    by_name = {h.name: h for h in hosts}
    findings, source = _findings(args, hosts, inv)
    plan = plan_mod.build(findings, [h.name for h in hosts])
    doc: dict[str, Any] = {"source": source, "plan": plan.to_dict(), "executed": []}
    text_out = args.format == "text"
    if text_out:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(source["started_at"]))
        age = time.time() - source["started_at"]
        kind = "a fresh audit" if source["fresh"] else "the latest audit"
        sys.stdout.write(f"Plan from {kind} #{source['audit_id']} ({stamp}, {age / 60:.0f} min ago), "
                         f"{len(source['nodes'])} node(s)\n\n")
        sys.stdout.write(plan_mod.render(plan))
    resets = plan.resets
    code = 0
    if resets and (args.dry_run or args.yes):
        if text_out:
            verb = "Checking (dry run)" if args.dry_run else "Carrying out"
            sys.stdout.write(f"\n{verb} {len(resets)} GPU reset(s), one node at a time:\n")
        results: list[dict[str, Any]] = []
        if args.dry_run:
            # read-only: the nodes may be asked in parallel, each node's GPUs in turn
            def node_dry(n: plan_mod.NodePlan) -> list[dict[str, Any]]:
                return [_reset_one(args, by_name[n.node], i, True) for i in n.resets]

            todo = [n for n in plan.nodes if n.resets and n.node in by_name]
            with ThreadPoolExecutor(max_workers=max(1, min(args.forks, len(todo) or 1))) as pool:
                for chunk in pool.map(node_dry, todo):
                    results.extend(chunk)
                    if text_out:
                        for r in chunk:
                            sys.stdout.write(_line(r) + "\n")
        else:
            for n in plan.nodes:
                if not n.resets or n.node not in by_name:
                    continue
                for item in n.resets:
                    r = _reset_one(args, by_name[n.node], item, False)
                    results.append(r)
                    if text_out:
                        sys.stdout.write(_line(r) + "\n")
                        sys.stdout.flush()
                    if r["result"] in ("failed", "error"):
                        if text_out:
                            sys.stdout.write(f"  {n.node}: stopping this node's resets after a failure\n")
                        break
        doc["executed"] = results
        good = "would-reset" if args.dry_run else "reset"
        code = 0 if all(r["result"] == good for r in results) else 1
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


def register(sub: Any) -> None:
    p = sub.add_parser("reset", help="reset one GPU of one node over SSH, every precondition checked by the agent")
    p.add_argument("node", help="the node, as the inventory names it")
    p.add_argument("gpu", help="the GPU: UUID, PCI bus id, or index (resolved to its UUID first)")
    p.add_argument("-i", "--inventory", help="Ansible inventory (default: $FLEETOPS_INVENTORY)")
    p.add_argument("--dry-run", action="store_true", help="only evaluate the preconditions; change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--kill-processes", action="store_true", help="end the GPU's compute processes first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the agent may take (default 600)")
    p.add_argument("--json", action="store_true", help="print the agent's JSON answer")
    _ssh_args(p)
    p.set_defaults(func=_guarded(cmd_reset))

    p = sub.add_parser("remediate", help="turn the latest audit's findings into a plan; --yes carries out the GPU resets")
    p.add_argument("-i", "--inventory", required=True, help="Ansible inventory")
    p.add_argument("--limit", help="Ansible host pattern")
    p.add_argument("--db", help="history database (default: $FLEETOPS_DB or ~/.local/state/fleetops/history.db)")
    p.add_argument("--fresh", action="store_true", help="audit now instead of using the latest recorded audit")
    p.add_argument("--baseline", help="baseline YAML for a fresh audit (default: the inventory's fleetops_baseline)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="ask each node whether its planned resets could run")
    mode.add_argument("--yes", action="store_true", help="carry out the GPU resets, one node at a time")
    p.add_argument("--kill-processes", action="store_true", help="let the resets end the GPUs' compute processes")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--forks", type=int, default=20, help="nodes audited / dry-run-checked in parallel")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each reset may take")
    _ssh_args(p)
    p.set_defaults(func=_guarded(cmd_remediate))
