"""``fleetops``: the controller command.

Exit codes (audit): 0 ok, 1 warn, 2 crit, 3 any node unreachable (whatever else was found) or
only unknown values, 4 usage or input error (``model.HEALTH_ORDER``). Other commands: 0 success, 1 failure, 4 usage or input error. The table lives in
``fleetops.common.errors``, shared by every command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg, retention_arg
from fleetops.common.errors import EXIT_INTERRUPTED, EXIT_USAGE, FleetopsError, UsageError
from fleetops.fleet import escalation, sshopts
from fleetops.ops import frontend

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


# --- audit -------------------------------------------------------------------------------


def cmd_audit(args: argparse.Namespace) -> int:
    from fleetops.checks import verdict
    from fleetops.fleet import audit, inventory
    from fleetops.fleet.store import Store
    from fleetops.ops.baseline import resolve_baselines

    args.inventory = frontend.inventory_path(args.inventory)
    keep_s = args.keep
    if not args.max_age >= 0:  # also refuses nan
        raise UsageError(f"--max-age must be a number of seconds >= 0, not {args.max_age:g}")
    hosts = inventory.load(args.inventory, args.limit)
    baselines = resolve_baselines(hosts, args.baseline, args.inventory)
    store = None if args.no_history else Store(args.db, keep_s=keep_s)
    previous = store.previous_snapshots([h.name for h in hosts]) if store else {}
    validations = _validations_for(hosts, baselines, store, args.db)
    if store and store.unreadable:
        for name, why in sorted(store.unreadable.items()):
            sys.stderr.write(f"fleetops: {name}: the last recorded snapshot cannot be read ({why}); "
                             "its rate checks have no baseline in this audit\n")

    progress = None
    bar_ctx = None
    if sys.stderr.isatty() and not args.quiet:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar_ctx = Progress(
            TextColumn("collecting"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[last]}"),
            TimeElapsedColumn(),
            console=_stderr_console(),
            transient=True,
        )
        task = bar_ctx.add_task("collect", total=len(hosts), last="")

        def progress(host: str, ok: bool) -> None:
            bar_ctx.update(task, advance=1, last=host if ok else f"{host} (failed)")

        bar_ctx.start()
    try:
        result = audit.run(
            hosts,
            baselines,
            previous,
            forks=args.forks,
            connect_timeout=args.connect_timeout,
            command_timeout=args.timeout,
            known_hosts=args.known_hosts,
            accept_new_hostkeys=args.accept_new_hostkeys,
            on_progress=progress,
            inventory=os.path.abspath(args.inventory),
            max_age_s=args.max_age,
            fresh=args.fresh,
            validations=validations,
        )
    finally:
        if bar_ctx is not None:
            bar_ctx.stop()
    code = verdict.exit_code(result.findings, args.fail_on)
    if store:
        store.record(result, code)
        store.close()
    _write_report(result, code, args.format, args.output)
    return code


def _validations_for(hosts: list[Any], baselines: dict[str, Any], store: Any, db: str | None) -> dict[str, Any] | None:
    """The latest stored validations of the hosts whose baseline requires one. With
    --no-history the database is still read (only this audit goes unrecorded); where there is
    none, nothing was ever validated, which the checks report as missing."""
    from fleetops.fleet.store import Store, default_path

    names = [h.name for h in hosts if getattr(getattr(baselines.get(h.name), "validation", None), "require", None)]
    if not names:
        return None
    if store is not None:
        return dict(store.validations_for_audit(names))
    path = db or default_path()
    if not os.path.exists(path):
        return {}
    with Store(path, keep_s=None) as reader:
        return dict(reader.validations_for_audit(names))


def _write_report(result: Any, code: int, fmt: str, output: str | None) -> None:
    """With ``output``, every format is written whole to a temporary file in the same folder
    and renamed over ``output``: a reader (node-exporter's textfile collector, a CI job) sees
    the old report or the new one, never half of one."""
    import io

    from fleetops.report import json_report, junit, prometheus, table

    if fmt == "table":
        from rich.console import Console

        if not output:
            table.render(result, code, Console())
            return
        buffer = io.StringIO()
        table.render(result, code, Console(file=buffer, width=160, no_color=True))
        text = buffer.getvalue()
    else:
        text = {"json": json_report.render, "junit": junit.render, "prom": prometheus.render}[fmt](result, code)
    _write_out(text, output)


# --- history -----------------------------------------------------------------------------


def cmd_history(args: argparse.Namespace) -> int:
    from fleetops.fleet.store import Store, parse_since

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
    from fleetops.fleet.store import Store

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

    from fleetops.fleet.store import Store

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

    from fleetops.fleet.store import Store

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

    from fleetops.fleet.store import Store

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


# --- prometheus --------------------------------------------------------------------------


def cmd_prometheus(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory, prom_targets

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port (1-65535)")
    args.inventory = frontend.inventory_path(args.inventory)
    hosts = inventory.load(args.inventory, args.limit)
    text = prom_targets.render(prom_targets.target_groups(args.inventory, hosts, args.port))
    if not args.output:
        sys.stdout.write(text)
        return 0
    prom_targets.write(args.output, text)
    if not args.quiet:
        sys.stderr.write(f"fleetops: {len(hosts)} targets written to {args.output}\n")
    return 0


# --- sim ---------------------------------------------------------------------------------


def cmd_sim(args: argparse.Namespace) -> int:
    from fleetops.sim import fleet

    if args.sim_command == "up":
        info = fleet.up(
            args.nodes,
            args.dir,
            args.scenario,
            first_address=args.first_address,
            port=args.port,
            install=args.install,
            daemon=args.daemon,
            metrics_port=args.metrics_port,
        )
        print(f"started {len(info['nodes'])} simulated nodes in {args.dir}")
        if args.daemon:
            print(f"metrics:     each node's address, port {info['metrics_port']} "
                  f"(fleetops prometheus targets -i {os.path.join(args.dir, 'inventory.yml')})")
        print(f"inventory:   {os.path.join(args.dir, 'inventory.yml')}")
        print(f"known_hosts: {os.path.join(args.dir, 'known_hosts')}")
        print(f"try:         fleetops audit -i {os.path.join(args.dir, 'inventory.yml')}")
        return 0
    if args.sim_command == "down":
        n = fleet.down(args.dir)
        print(f"stopped {n} sshd processes (and the fleet's agent daemon, if it ran one)")
        return 0
    if args.sim_command in ("inject", "clear"):
        peer = getattr(args, "peer", None)  # inject only
        if args.sim_command == "inject":
            fleet.inject(args.dir, args.node, args.fault, args.gpu, peer)
        else:
            fleet.clear(args.dir, args.node, args.fault, args.gpu)
        where = f" GPU {args.gpu}" if args.gpu is not None else ""
        where += f" (link to GPU {peer})" if peer is not None else ""
        print(f"{args.sim_command}: {args.fault} on {args.node}{where}")
        return 0
    if args.sim_command == "status":
        rows = fleet.status(args.dir)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                faults = ", ".join(row.get("faults") or []) or "-"
                print(f"{row['node']:10} {row['address']:16} {row['status']:6} {faults}")
        return 0
    if args.sim_command == "job":
        from fleetops.sim.fleet import jobs as sim_jobs

        return sim_jobs.main(args)
    raise UsageError(f"unknown sim command {args.sim_command!r}")


# --- baseline ----------------------------------------------------------------------------


def _show_value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _write_out(text: str, output: str | None) -> None:
    """``text`` to ``output`` atomically (a reader never sees half a file), or to stdout. The
    temporary file is in the same folder (the rename stays on one file system), hidden, with no
    suffix a collector globs for, and made by ``open`` so the result has the umask's mode."""
    if not output:
        sys.stdout.write(text)
        return
    import contextlib

    folder = os.path.dirname(os.path.abspath(output))
    tmp = os.path.join(folder, f".{os.path.basename(output)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_baseline(args: argparse.Namespace) -> int:
    import difflib

    if args.baseline_command == "schema":
        from fleetops import baseline as bl

        _write_out(json.dumps(bl.json_schema(), indent=2) + "\n", args.output)
        return 0
    args.inventory = frontend.inventory_path(args.inventory)
    if args.baseline_command == "vars":
        from fleetops import baseline as bl
        from fleetops.fleet import inventory
        from fleetops.ops.baseline import PLAYBOOK_VAR, playbook_vars

        try:
            layered = playbook_vars(inventory.load(args.inventory, args.limit), args.inventory)
        except bl.BaselineError as exc:
            raise UsageError(str(exc)) from None
        _write_out(json.dumps({PLAYBOOK_VAR: layered or {"hosts": {}, "baselines": []}}, indent=1) + "\n",
                   args.output)
        return 0
    from fleetops.fleet import inventory
    from fleetops.ops.baseline import explain

    hosts = {h.name: h for h in inventory.load(args.inventory)}
    if args.host not in hosts:
        close = difflib.get_close_matches(args.host, list(hosts), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"{args.inventory}: no host {args.host!r} in the inventory{hint}")
    doc = explain(hosts[args.host], args.inventory)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0
    if not doc["keys"]:
        print(f"{args.host}: no level of {args.inventory} sets fleetops_baseline: nothing is pinned "
              "(settings are compared with the fleet's majority)")
        return 0
    print(f"{args.host}: effective baseline, layered from " + " < ".join(la["level"] for la in doc["layers"]))
    width = max(len(k["path"]) for k in doc["keys"])
    vwidth = min(40, max(len(_show_value(k["value"])) for k in doc["keys"]))
    lwidth = max(len(k["level"]) for k in doc["keys"])
    here = os.getcwd() + os.sep
    for k in doc["keys"]:
        source = k["source"]
        if source.startswith(here):  # files under the working folder, as the user typed them
            source = source[len(here):]
        where = source + (f":{k['line']}" if k["line"] is not None else "")
        print(f"  {k['path']:<{width}}  {_show_value(k['value']):<{vwidth}}  {k['level']:<{lwidth}}  ({where})")
    if doc["ansible_differs"]:
        print(f"note: Ansible alone resolves fleetops_baseline to the most specific group's mapping, with other "
              f"values for {', '.join(doc['ansible_differs'])}; fleetops rollout/apply hand the playbooks this "
              "layered baseline (for ansible-playbook: -e @FILE from fleetops baseline vars -i INVENTORY -o FILE)")
    return 0


# --- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fleetops", description="Audit and keep consistent a fleet of NVIDIA GPU nodes.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("audit", help="collect every node's GPU state and report drift and faults")
    frontend.inventory_arg(p)
    p.add_argument("--baseline", help="baseline YAML (default: fleetops_baseline from the inventory's group_vars)")
    frontend.limit_arg(p)
    frontend.format_arg(p, ("table", "json", "junit", "prom"))
    p.add_argument("-o", "--output", help="write the report to this file (atomically; default: stdout)")
    frontend.forks_arg(p)
    p.add_argument("--timeout", type=duration_arg("--timeout"), default=30.0,
                   help=f"how long the agent may take to answer ({GRAMMAR}; default 30)")
    p.add_argument("--fail-on", choices=("warn", "crit"), default="warn",
                   help="lowest severity that fails (exit 1/2; default warn)")
    p.add_argument(
        "--max-age",
        type=duration_arg("--max-age", allow_zero=True),
        default=30.0,
        metavar="DURATION",
        help="oldest snapshot a node's resident agent (fleetops-agent serve) may answer with; older, or no "
        f"daemon, and the node collects now ({GRAMMAR}; default 30)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="every node collects now, never from its daemon (rate checks then need a previous audit)",
    )
    frontend.ssh_args(p)
    frontend.db_arg(p)
    p.add_argument("--no-history", action="store_true", help="do not record this audit")
    p.add_argument(
        "--keep",
        default="30d",
        type=retention_arg("--keep", unit_required=True),
        metavar="DURATION",
        help="history retention: audits older than this are pruned when this one is recorded "
        f"({GRAMMAR}, with a unit; 'forever' keeps all; default 30d)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_audit)

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

    p = sub.add_parser("prometheus", help="Prometheus integration: scrape targets from the inventory")
    psub = p.add_subparsers(dest="prometheus_command", required=True, parser_class=_Parser)
    q = psub.add_parser("targets", help="write file_sd targets for every node's agent endpoint (fleetops-agent serve)")
    frontend.inventory_arg(q)
    q.add_argument("-o", "--output", help="file_sd JSON file to replace atomically (default: stdout)")
    q.add_argument("--port", type=int, default=9401,
                   help="agent metrics port where the host var fleetops_agent_metrics_port is unset (default 9401)")
    frontend.limit_arg(q)
    q.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    q.set_defaults(func=cmd_prometheus)

    p = sub.add_parser("baseline", help="the desired state: a host's effective (layered) baseline, the JSON Schema")
    bsub = p.add_subparsers(dest="baseline_command", required=True, parser_class=_Parser)
    q = bsub.add_parser("show", help="a host's effective baseline, key by key, with the group each key came from")
    frontend.inventory_arg(q)
    q.add_argument("host", help="inventory host name")
    q.add_argument("--json", action="store_true", help="as JSON: keys with value, level, file and line")
    q = bsub.add_parser("vars", help="every host's layered baseline as extra variables, for ansible-playbook -e @FILE")
    frontend.inventory_arg(q)
    frontend.limit_arg(q)
    q.add_argument("-o", "--output", help="write it to this file (atomically) instead of stdout")
    q = bsub.add_parser("schema", help="the baseline's JSON Schema (for editors and validators)")
    q.add_argument("-o", "--output", help="write it to this file (atomically) instead of stdout")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("sim", help="a simulated fleet: real sshd on loopback with simulated GPUs")
    ssub = p.add_subparsers(dest="sim_command", required=True, parser_class=_Parser)
    q = ssub.add_parser("up", help="start N simulated nodes")
    q.add_argument("--nodes", type=int, default=8, help="simulated nodes to start (default 8)")
    q.add_argument("--dir", required=True, help="folder for keys, state, inventory.yml and known_hosts")
    q.add_argument("--scenario", help="scenario YAML (defaults, per-node overrides and faults)")
    q.add_argument("--install", action="store_true", help="apt-get install openssh-server when sshd is missing")
    q.add_argument("--first-address", default="127.0.10.1", help="first loopback address (default 127.0.10.1)")
    q.add_argument("--port", type=int, default=2222, help="sshd port on every address (default 2222)")
    q.add_argument("--daemon", action="store_true", help="also run one fleetops-agent serve for every node")
    q.add_argument("--metrics-port", type=int, default=9401,
                   help="with --daemon: each node's metrics endpoint port on its address (default 9401)")
    q = ssub.add_parser("down", help="stop every sshd the fleet started")
    q.add_argument("--dir", required=True)
    for name in ("inject", "clear"):
        q = ssub.add_parser(name, help=f"{name} a fault on a running node")
        q.add_argument("--dir", required=True)
        q.add_argument("node")
        q.add_argument(
            "fault",
            help="e.g. ecc-dbe, xid:79, host-down, host-hang; the HCAs: ib-port-down, ib-degraded, ib-flap, "
            "ib-symbol-errors, ib-link-downed, ib-fw-drift, ib-missing-hca; for validate: slow-hbm, slow-gemm, "
            "slow-pcie, slow-nvlink, noisy" + (", all" if name == "clear" else ""),
        )
        q.add_argument("--gpu", type=int, help="GPU index (default: GPU 0, or the last for gpu-missing); "
                       "for ib-*: the HCA beside that GPU (mlx5_N); one past the last GPU: the Ethernet "
                       "management port")
        if name == "inject":
            q.add_argument("--peer", type=int, help="slow-nvlink only: the one link between --gpu and this GPU")
    q = ssub.add_parser("status", help="nodes, addresses, up/down/hung, faults")
    q.add_argument("--dir", required=True)
    q.add_argument("--json", action="store_true")
    q = ssub.add_parser("job", help="start or stop a Slurm job on a node: the shipped prolog/epilog over SSH")
    jsub = q.add_subparsers(dest="job_command", required=True, parser_class=_Parser)
    for verb in ("start", "stop"):  # fleetops/sim/fleet/jobs.py (imported when run: it loads sim.fleet)
        j = jsub.add_parser(verb, help=f"{verb} a job: runs the {'prolog' if verb == 'start' else 'epilog'}")
        j.add_argument("--dir", required=True)
        j.add_argument("node")
        j.add_argument("job_id", metavar="JOBID")
        j.add_argument("--user", default="alice", help="SLURM_JOB_USER (default alice)")
        j.add_argument("--uid", type=int, default=1000, help="SLURM_JOB_UID (default 1000)")
        if verb == "start":
            j.add_argument("--gpus", help="gres ids, SLURM_JOB_GPUS (0,3): they index the node's gres.conf, "
                           "in device-minor order")
            j.add_argument("--mig", action="append", metavar="INDEX:GI", help="a MIG device: GPU index and GPU "
                           "instance id (repeat for more)")
            j.add_argument("--cpus", type=int, help="the job's CPUs (its cgroup's cpuset)")
    p.set_defaults(func=cmd_sim)

    for module in _feature_modules():
        module.register(sub)
    return parser


# Commands that live with their front end or feature. Each of these modules is a registration
# entry point: it exposes ``register(sub)`` and keeps its internals (Textual, ansible-runner, SSH)
# behind lazy imports, so this module needs nothing else from them; tests/unit/test_frontends.py
# holds cli.py to that.
ENTRY_POINTS = ("fleetops.rollout.cli", "fleetops.reset_cli", "fleetops.remedy.cli", "fleetops.drain_cli", "fleetops.tui.cli", "fleetops.docgen.cli",
                "fleetops.validation.cli")


def _feature_modules() -> list[Any]:
    import importlib

    mods = []
    for name in ENTRY_POINTS:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):  # a missing dependency, not an absent feature
                raise
    return mods


def _input_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [FileNotFoundError]
    for mod, attr in (
        ("fleetops.fleet.inventory", "InventoryError"),
        ("fleetops.baseline", "BaselineError"),
        ("fleetops.fleet.store", "StoreError"),
        ("fleetops.sim.gpu", "SimError"),
        ("fleetops.sim.fleet", "SimFleetError"),
    ):
        try:
            module = __import__(mod, fromlist=[attr])
            errors.append(getattr(module, attr))
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sshopts.apply(args)
        return int(args.func(args))
    except KeyboardInterrupt:
        sys.stderr.write("fleetops: interrupted\n")
        return EXIT_INTERRUPTED
    except FleetopsError as exc:
        sys.stderr.write(f"fleetops: error: {exc.message}\n")
        return exc.exit_code
    except BrokenPipeError:  # `fleetops history | head`: the reader left; not an error of ours
        import os as _os

        _os.dup2(_os.open(_os.devnull, _os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _input_errors() as exc:
        sys.stderr.write(f"fleetops: error: {exc}\n")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
