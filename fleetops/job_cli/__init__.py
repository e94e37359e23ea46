"""``fleetops job JOBID``: which job it is, where it ran, and why it is slow.

Every node of the inventory (``--limit`` narrows it) is asked over SSH, as the audit asks, for
``fleetops-agent job show JOBID`` (``agent/job_show.py``): the job's record and, from the node's
resident daemon, its GPUs' samples over the job's life, their facts, the XIDs on them and the
cgroup's CPU time. The nodes that ran the job make one ``jobs.diagnose.Job``, judged on the
controller by the same pure diagnosis (``fleetops/jobs/diagnose.py``), and printed as a table
(``--format json``: ``fleetops.job/v1``; ``--plot``: each GPU's utilisation over time).

Exit codes (``common.errors``, in ``model.HEALTH_ORDER``'s order: an unreachable node outranks a
verdict, since the job may have run there too): 0 no verdict, 1 one or more verdicts, 3 a node
could not be asked, 4 usage, or the job is on no node (all answered).
"""

from __future__ import annotations

import argparse
import json
import sys
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
    frontend.forks_arg(p)
    p.add_argument("--timeout", type=duration_arg("--timeout"), default=COMMAND_TIMEOUT_S,
                   help="how long each node's agent may take to answer; a node past it is one that could not be "
                   f"asked (exit 3) ({GRAMMAR}; default {COMMAND_TIMEOUT_S:g})")
    frontend.ssh_args(p)
    p.set_defaults(func=frontend.guarded(cmd_job))


def exit_code(found: bool, verdicts: int, unreachable: int) -> int:
    if unreachable:
        return EXIT_UNKNOWN
    if not found:
        return EXIT_USAGE
    return EXIT_WARN if verdicts else EXIT_OK


def cmd_job(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory, transport
    from fleetops.job_cli import gather, render
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
    nodes = {"absent": got.absent, "unreachable": got.unreachable,
             "notes": {n: d.get("notes") or [] for n, d in got.docs.items() if d.get("notes")}}
    if not got.docs:
        code = exit_code(False, 0, len(got.unreachable))
        where = f"{len(hosts)} node{'s' if len(hosts) != 1 else ''}"
        if got.unreachable:
            msg = (f"job {job_id} is on none of the nodes that answered; {len(got.unreachable)} of {where} could "
                   f"not be asked: " + "; ".join(f"{n}: {w}" for n, w in sorted(got.unreachable.items())))
        else:
            msg = f"job {job_id} is on none of the {where} asked (no record of it in their job folders)"
        if args.format == "json":
            sys.stdout.write(json.dumps({"schema": render.SCHEMA, "job": {"job_id": job_id}, "found": False,
                                         "nodes": {"with_job": [], "absent": sorted(got.absent),
                                                   "unreachable": dict(sorted(got.unreachable.items()))},
                                         "message": msg, "exit_code": code}, indent=2) + "\n")
        sys.stderr.write(f"fleetops: {msg}\n")
        return code
    job = gather.build_job(got)
    d = diagnose.diagnose(job)
    facts = gather.job_facts(got)
    end = facts["ended_at"] if facts["ended_at"] is not None else facts["started_at"] + facts["duration_s"]
    # the job's own samples: the nodes send a few seconds more (the first may predate the record)
    util = {f"{g.node}:{g.index}": [(t, v) for t, v in g.series.get("utilization_gpu_pct", [])
                                    if job.started_at <= t <= end]
            for g in sorted(job.gpus, key=lambda g: (g.node, g.index))}
    code = exit_code(True, len(d.verdicts), len(got.unreachable))
    if args.format == "json":
        doc = render.document(facts, d, nodes, util, code)
        doc["found"] = True
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return code
    out = render.table(facts, d, nodes)
    if args.plot:
        out += "\n" + render.plot(util, facts["started_at"], end)
    sys.stdout.write(out)
    return code
