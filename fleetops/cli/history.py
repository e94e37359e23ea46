"""``fleetops history``: what the history store holds, as text or JSON: past audits and what
changed between them (new, resolved, persisting findings), the escalation summary (faults that
survived reboots or resets, application-wide XIDs, time between incidents), past validations,
drains and resumes, and the actions taken from the TUI."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetops.catalog.durations import GRAMMAR
from fleetops.common.errors import UsageError
from fleetops.fleet import escalation
from fleetops.ops import frontend


def register(sub: Any) -> None:
    p = sub.add_parser("history", help="past audits and what changed: new, resolved, persisting findings; "
                       "or past validations (--kind validate), drains and resumes (--kind drains), "
                       "actions taken from the TUI (--kind actions)")
    p.add_argument("node", nargs="?", help="only audits (runs) that included this node, and only its findings (GPUs); "
                   "with --kind drains: its drains and resumes (inventory or Slurm name); with --kind actions: its actions")
    p.add_argument("--kind", choices=("audit", "validate", "escalation", "drains", "actions"), default="audit",
                   help="audit: fleetops audit runs (the text view ends with the escalation summary); "
                   "validate: fleetops validate runs and each GPU's verdict and expiry; escalation: faults that "
                   "survived reboots or GPU resets, application-wide XIDs, time between incidents (p50, p90); "
                   "drains: every drain and resume fleetops made in Slurm, with its owner (kind/run), outcome, "
                   "purpose and the drain it met; actions: every action taken from the TUI (reset, drain, resume, "
                   "re-audit) with its node, GPU, outcome (sent, refused, failed, unknown, verified, cancelled) and why "
                   "(default audit)")
    p.add_argument("--since", help=f"a duration ago ({GRAMMAR}) or an ISO date")
    p.add_argument("--last", type=int, default=20,
                   help="how many audits, validate runs, drains or actions (default 20)")
    frontend.db_arg(p)
    frontend.format_arg(p, ("text", "json"))
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list persisting findings (with --kind validate: every GPU, not only those not ok; "
                   "with --kind drains: each one's message)")
    escalation.add_arguments(p)
    p.set_defaults(func=cmd_history)


def cmd_history(args: argparse.Namespace) -> int:
    from fleetops.fleet.store.database import Store, parse_since

    since = parse_since(args.since) if args.since else None
    import time as _t

    if args.kind == "validate":
        return _validate_history(args, since)
    if args.kind == "escalation":
        return _escalation_history(args)
    if args.kind == "drains":
        return _drain_history(args, since)
    if args.kind == "actions":
        return _action_history(args, since)
    with Store(args.db) as store:
        rows = store.audits(args.node, since, args.last)
        if args.format == "json":
            doc = []
            for row in rows:
                diff = store.diff(row.id, args.node)
                doc.append(
                    {
                        "id": row.id,
                        "started_at": row.started_at,
                        "worst": row.worst,
                        "exit_code": row.exit_code,
                        "summary": row.summary,
                        **{k: [f.to_dict() for f in v] for k, v in diff.items()},
                    }
                )
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return 0
        if not rows and args.node and not store.node_history(args.node, limit=1):
            # a node no audit has ever seen is a typo or the wrong database, not a quiet history
            raise UsageError(f"{args.node}: in no audit recorded in {store.path} (check the name, or --db)")
        if not rows:
            print("no audits recorded" + (f" for {args.node}" if args.node else "") + f" in {store.path}")
            return 0
        for row in rows:
            diff = store.diff(row.id, args.node)
            stamp = _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(row.started_at))
            s = row.summary
            print(
                f"#{row.id} {stamp}  {row.worst.upper():7} {s.get('nodes', '?')} nodes, "
                f"{s.get('unreachable', 0)} unreachable, exit {row.exit_code}  "
                f"new {len(diff['new'])}, resolved {len(diff['resolved'])}, persisting {len(diff['persisting'])}"
            )
            for label, sign in (("new", "+"), ("resolved", "-"), ("persisting", "=")):
                if label == "persisting" and not args.verbose:
                    continue
                for f in diff[label]:
                    gpu = f" GPU{f.gpu['index']} {f.gpu['uuid']}" if f.gpu else ""
                    print(f"    {sign} [{f.severity}] {f.node}{gpu} {f.check}: {f.message}")
    return _escalation_history(args, show_empty=False)


def _span_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _escalation_history(args: argparse.Namespace, show_empty: bool = True) -> int:
    """``fleetops history --kind escalation`` (and the tail of the audit view): the faults that
    survived reboots or GPU resets, application-wide XIDs, and the time between incidents."""
    import time as _t

    from fleetops.fleet import escalation
    from fleetops.fleet.store.database import Store

    policy = escalation.policy_from_args(args)
    since = None if policy.lookback_s is None else _t.time() - policy.lookback_s
    with Store(args.db) as store:
        timelines = store.timelines([args.node] if args.node else None, since)
    result = escalation.analyse(timelines, policy)
    if args.format == "json" and show_empty:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    span = "every stored audit" if policy.lookback_s is None else f"last {_span_text(policy.lookback_s)}"
    survived = [h for h in result.histories.values() if h.reboots or h.resets]
    if survived or show_empty:
        print(
            f"Faults that survived reboots or GPU resets ({span}; {policy.reboots} reboots or "
            f"{policy.resets} resets: hardware inspection):"
        )
    for h in sorted(survived, key=lambda h: (h.node, (h.gpu or {}).get("index", -1), h.fault)):
        gpu = f" GPU{h.gpu.get('index')} {h.gpu.get('uuid')}" if h.gpu else ""
        now = "present now" if h.current else f"last seen {escalation.stamp(h.last_seen)}"
        print(f"    {h.node}{gpu} {h.fault}: {h.text(policy)} (in {h.audits} audits, {now})")
    if show_empty and not survived:
        print("    none")
    for a in result.app_wide:
        print(f"{a.text} ({', '.join(a.nodes)})")
    fleet = escalation.fleet_mtbi(result.mtbi.values())
    if fleet.incidents or show_empty:
        print(f"Time between incidents ({span}; an incident: a node going from no warn/crit finding to one):")
        for node, m in sorted(result.mtbi.items()):
            if m.incidents:
                line = f"    {node:16} {m.incidents} incidents  p50 {_span_text(m.p50)}"
                print(f"{line}  p90 {_span_text(m.p90)}")
        p50, p90 = _span_text(fleet.p50), _span_text(fleet.p90)
        print(f"    {'fleet':16} {fleet.incidents} incidents  p50 {p50}  p90 {p90}")
    return 0


def _drain_history(args: argparse.Namespace, since: float | None) -> int:
    """``fleetops history --kind drains``: every drain and resume fleetops made in Slurm, newest
    first, with its owner (kind/run), outcome and purpose, and the drain it met."""
    import time as _t

    from fleetops.fleet.store.database import Store

    with Store(args.db) as store:
        rows = store.drains(args.node, since, args.last)
        path = store.path
    if args.format == "json":
        sys.stdout.write(json.dumps([r.to_dict() for r in rows], indent=2) + "\n")
        return 0
    if not rows:
        print("no drains recorded" + (f" for {args.node}" if args.node else "") + f" in {path}")
        return 0
    print(f"{'TIME':19}  {'NODE':16} {'ACTION':7} {'OWNER':36} {'OUTCOME':8} {'SOURCE':10} PURPOSE")
    for r in rows:
        stamp = _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(r.at))
        owner = f"{r.kind}/{r.run}"
        print(f"{stamp:19}  {r.node:16} {r.action:7} {owner:36} {r.outcome:8} {r.source:10} {r.purpose or '-'}")
        if r.previous_owner:
            if r.outcome == "refused":
                met = "held by"
            else:
                met = "lifted" if r.action == "resume" and r.outcome == "done" else "drain there"
            print(f"    {met}: {r.previous_owner}")
        if args.verbose:
            print(f"    {r.message}")
    return 0


def _action_history(args: argparse.Namespace, since: float | None) -> int:
    """``fleetops history --kind actions``: every action taken from the TUI, newest first: time,
    node, GPU, action, outcome (sent, refused, failed, unknown, verified, cancelled) and why."""
    import time as _t

    from fleetops.fleet.store.database import Store

    with Store(args.db) as store:
        rows = store.actions(args.node, since, args.last)
        path = store.path
    if args.format == "json":
        sys.stdout.write(json.dumps([r.to_dict() for r in rows], indent=2) + "\n")
        return 0
    if not rows:
        print("no actions recorded" + (f" for {args.node}" if args.node else "") + f" in {path}")
        return 0
    print(f"{'TIME':19}  {'NODE':16} {'GPU':40} {'ACTION':8} {'OUTCOME':8} WHY")
    for r in rows:
        stamp = _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(r.at))
        print(f"{stamp:19}  {r.node:16} {r.gpu or '-':40} {r.action:8} {r.outcome:8} {r.why}")
    return 0


def _validate_history(args: argparse.Namespace, since: float | None) -> int:
    """``fleetops history --kind validate``: past ``fleetops validate`` runs, each GPU's verdict,
    when it was measured and when the result expires."""
    import time as _t

    from fleetops.fleet.store.database import Store

    def stamp(t: float | None) -> str:
        return _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(t)) if t else "-"

    with Store(args.db) as store:
        runs = store.validate_runs(args.node, since, args.last)
        if args.format == "json":
            doc = [{"id": r.id, "started_at": r.started_at, "duration_s": r.duration_s, "inventory": r.inventory,
                    "level": r.level, "status": r.status, "exit_code": r.exit_code, "summary": r.summary,
                    "gpus": [v.to_dict() for v in store.validations(r.id, args.node)]} for r in runs]
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return 0
        if not runs:
            print("no validations recorded" + (f" for {args.node}" if args.node else "") + f" in {store.path}")
            return 0
        for r in runs:
            rows = store.validations(r.id, args.node)
            counts = {s: sum(1 for v in rows if v.status == s) for s in ("ok", "warn", "crit", "unknown")}
            unreachable = r.summary.get("unreachable") or {}
            if args.node:
                unreachable = {k: v for k, v in unreachable.items() if k == args.node}
            print(f"#{r.id} {stamp(r.started_at)}  {r.status.upper():7} {r.level} {len(rows)} GPUs: "
                  + ", ".join(f"{n} {s}" for s, n in counts.items())
                  + f", {len(unreachable)} unreachable, exit {r.exit_code}")
            for v in rows:
                if v.status == "ok" and not args.verbose:
                    continue
                why = "; ".join(f"{f['metric']}: {f['reason']}" for f in v.result.get("findings") or [])
                print(f"    [{v.status}] {v.node} GPU{v.gpu_index} {v.gpu_uuid} measured {stamp(v.started_at)}, "
                      f"expires {stamp(v.expires)}" + (f"  {why}" if why else ""))
            for host, why in unreachable.items():
                print(f"    [unknown] {host} {why}")
    return 0
