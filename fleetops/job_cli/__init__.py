"""``fleetops job JOBID``: which job it is, where it ran, and why it is slow.

Every node of the inventory (``--limit`` narrows it) is asked over SSH, as the audit asks, for
``fleetops-agent job show JOBID`` (``agent/job_show.py``): the job's record and, from the node's
resident daemon, its GPUs' samples over the job's life, their facts, the XIDs on them and the
cgroup's CPU time. The nodes that ran the job make one ``jobs.diagnose.Job``, judged on the
controller by the same pure diagnosis (``fleetops/jobs/diagnose.py``), and printed as a table
(``--format json``: ``fleetops.job/v1``; ``--plot``: each GPU's utilisation over time).

The nodes' answers cover their daemons' windows (about an hour of samples); the controller's
history store (``--db``, the default of ``fleetops history``) adds what the audits found on the
job's GPUs and nodes during the job and the actions taken there (``job_cli/stored.py``): the
table's HISTORY section, the document's ``history`` key. A store file that is not there is no
error; one that cannot be read is a warning naming the file, and the diagnosis is printed all
the same, its exit code unchanged. When no node holds the job's record any more (a reboot clears
``/run``), the findings of the store that name the job tell what is known of it.

Exit codes (``common.errors``, in ``model.HEALTH_ORDER``'s order: an unreachable node outranks a
verdict, since the job may have run there too): 0 no verdict, 1 one or more verdicts, or the job
on no node but findings of the history store name it, 3 a node could not be asked, 4 usage, or
the job is on no node (all answered) and no finding of the store names it. The store never
changes the exit code of a job that a node holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg
from fleetops.common.errors import EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE, EXIT_WARN, UsageError
from fleetops.ops import frontend

FORMATS = ("table", "json")
COMMAND_TIMEOUT_S = 60.0  # one request per field per GPU: 8 GPUs x ~20 fields, milliseconds each


def register(sub: Any) -> None:
    about = "a Slurm job's GPUs across the fleet and why it is slow: straggler, input-bound, NVLink unused, " \
            "CPU-starved, an XID at its end"
    p = sub.add_parser("job", help=about, description=about)
    p.add_argument("job_id", metavar="JOBID", help="the Slurm job number")
    frontend.inventory_arg(p)
    frontend.limit_arg(p)
    frontend.format_arg(p, FORMATS)
    p.add_argument("--plot", action="store_true", help="also plot each GPU's utilisation over the job (table format)")
    frontend.db_arg(p, "history database, read for the faults the audits found on the job's GPUs and nodes and the "
                    "actions taken there during the job (a missing file is no error); when no node holds the job's "
                    "record any more, the findings that name the job tell what is known of it (exit 1 when some "
                    "do, else 4)")
    frontend.forks_arg(p)
    p.add_argument("--timeout", type=duration_arg("--timeout"), default=COMMAND_TIMEOUT_S,
                   help="how long each node's agent may take to answer; a node past it is one that could not be "
                   f"asked (exit 3) ({GRAMMAR}; default {COMMAND_TIMEOUT_S:g})")
    frontend.ssh_args(p)
    p.set_defaults(func=frontend.guarded(cmd_job))


def exit_code(found: bool, verdicts: int, unreachable: int, stored: int = 0) -> int:
    """``stored``: findings of the history store that name the job; they count only when no node
    holds its record (a job that is found is judged by its diagnosis alone)."""
    if unreachable:
        return EXIT_UNKNOWN
    if not found:
        return EXIT_WARN if stored else EXIT_USAGE
    return EXIT_WARN if verdicts else EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory, transport
    from fleetops.fleet.store.layout import default_path
    from fleetops.job_cli import gather, render, stored
    from fleetops.jobs import diagnose
    from fleetops.jobs.record import JobRecordError, check_job_id

    try:
        job_id = check_job_id(args.job_id)
    except JobRecordError as exc:
        raise UsageError(str(exc)) from None
    args.inventory = frontend.inventory_path(args.inventory)
    hosts = inventory.load(args.inventory, args.limit)

    def run(group: list[Any], argv: list[str]) -> dict[str, Any]:
        return transport.run_all(group, argv, forks=args.forks, connect_timeout=args.connect_timeout,
                                 command_timeout=args.timeout, known_hosts=args.known_hosts,
                                 accept_new_hostkeys=args.accept_new_hostkeys, idempotent=True)

    got = gather.gather(hosts, job_id, run)
    db = args.db or default_path()
    nodes = {"absent": got.absent, "unreachable": got.unreachable,
             "notes": {n: d.get("notes") or [] for n, d in got.docs.items() if d.get("notes")}}
    if not got.docs:
        return _on_no_node(args, job_id, len(hosts), got, stored.section(db, job_id))
    job = gather.build_job(got)
    d = diagnose.diagnose(job)
    facts = gather.job_facts(got)
    end = facts["ended_at"] if facts["ended_at"] is not None else facts["started_at"] + facts["duration_s"]
    # the store's clock is the controller's: a running job's span runs to the controller's now
    scope = stored.Scope(job_id, facts["started_at"], max(end, time.time()) if facts["running"] else end,
                         frozenset(got.docs), frozenset(g.uuid for g in job.gpus))
    history = stored.section(db, job_id, scope)
    if history["error"]:
        sys.stderr.write(f"fleetops: warning: history not read (the diagnosis stands): {history['error']}\n")
    # the job's own samples: the nodes send a few seconds more (the first may predate the record)
    util = {f"{g.node}:{g.index}": [(t, v) for t, v in g.series.get("utilization_gpu_pct", [])
                                    if job.started_at <= t <= end]
            for g in sorted(job.gpus, key=lambda g: (g.node, g.index))}
    code = exit_code(True, len(d.verdicts), len(got.unreachable))
    if args.format == "json":
        doc = render.document(facts, d, nodes, util, code, history)
        doc["found"] = True
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return code
    out = render.table(facts, d, nodes, history)
    if args.plot:
        out += "\n" + render.plot(util, facts["started_at"], end)
    sys.stdout.write(out)
    return code


def _on_no_node(args: argparse.Namespace, job_id: str, asked: int, got: Any, history: dict[str, Any]) -> int:
    """No node holds the job's record: what the history store knows of it, if anything (its
    findings that name the job, the actions on their nodes), else the plain "on no node"."""
    from fleetops.job_cli import render

    known = [e for e in history["findings"] if e["names_job"]]
    code = exit_code(False, 0, len(got.unreachable), len(known))
    where = f"{asked} node{'s' if asked != 1 else ''}"
    if got.unreachable:
        msg = (f"job {job_id} is on none of the nodes that answered; {len(got.unreachable)} of {where} could "
               f"not be asked: " + "; ".join(f"{n}: {w}" for n, w in sorted(got.unreachable.items())))
    else:
        msg = f"job {job_id} is on none of the {where} asked (no record of it in their job folders)"
    if known:
        msg += (f"; no node holds a record of it any more, but {len(known)} finding{'s' if len(known) != 1 else ''}"
                f" in the history name it")
    if args.format == "json":
        sys.stdout.write(json.dumps({"schema": render.SCHEMA, "job": {"job_id": job_id}, "found": False,
                                     "nodes": {"with_job": [], "absent": sorted(got.absent),
                                               "unreachable": dict(sorted(got.unreachable.items()))},
                                     "history": history, "message": msg, "exit_code": code},
                                    indent=2, allow_nan=False) + "\n")
    elif known:
        sys.stdout.write(f"job {job_id}: no node holds its record any more; what the history store knows of it\n\n"
                         + "\n".join(render.history_lines(history)) + "\n")
    if history["error"]:
        sys.stderr.write(f"fleetops: warning: history not read: {history['error']}\n")
    sys.stderr.write(f"fleetops: {msg}\n")
    return code
