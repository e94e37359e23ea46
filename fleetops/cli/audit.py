"""``fleetops audit``: collect every node's GPU state over SSH, judge it against its baseline and
the history, record it, and write the report (table, JSON, JUnit, Prometheus exposition)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg, retention_arg
from fleetops.cli.output import write_out
from fleetops.common.errors import UsageError
from fleetops.ops import frontend


def register(sub: Any) -> None:
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


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def cmd_audit(args: argparse.Namespace) -> int:
    from fleetops.checks import verdict
    from fleetops.fleet import audit, inventory
    from fleetops.fleet.store.database import Store
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
    from fleetops.fleet.store.database import Store
    from fleetops.fleet.store.layout import default_path

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
    write_out(text, output)

