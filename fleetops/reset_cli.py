"""``fleetops reset NODE GPU``: one GPU of one node, reset over SSH by ``fleetops-agent reset``.

GPU is a UUID, a bus id or an index; an index is first resolved to its UUID (``fleetops-agent
collect``) and the agent is then given both the UUID and the bus id, so a GPU renumbered in
between is refused, never reset by mistake. It shows the GPU, the processes on it (a fresh
snapshot) and the Slurm jobs on it (the daemon's job records, where a daemon answers) and asks
(default No) on a terminal; without a terminal it needs ``--yes``. With ``--kill-processes`` the
agent may end exactly the processes shown (``--expect-pids``), refuses if others appeared, and
resets under the GPU's jobs (which it refuses otherwise, also between job steps). The action itself is ``fleetops.ops.reset``; ``fleetops
remediate`` (``remedy/cli.py``) resets through the same functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetops import model
from fleetops.common import selectors
from fleetops.common.errors import EXIT_OK, EXIT_WARN, UsageError
from fleetops.ops import frontend, results
from fleetops.ops import reset as ops_reset
from fleetops.ops.frontend import inventory_path


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

    path = inventory_path(args.inventory)
    hosts = inventory.load(path, None)
    host = frontend.find_host(hosts, args.node)
    runner = frontend.runner(args, host)
    view = ops_reset.preview(host, args.gpu, runner, args.collect_timeout)
    gpu = view.gpu
    shown = gpu.label()
    if gpu.selector.form == selectors.INDEX:
        sys.stderr.write(f"GPU index {args.gpu} on {host.name} is {shown}\n")
    else:
        sys.stderr.write(f"GPU on {host.name}: {shown}" + ("" if gpu.enumerated else " (not enumerated now)") + "\n")
    for line in view.process_lines() + view.job_lines():
        sys.stderr.write(f"  {line}\n")
    kill = list(view.pids) if args.kill_processes else []
    if view.pids and not args.kill_processes:
        sys.stderr.write("  the GPU is busy: without --kill-processes the agent refuses to reset it\n")
    elif view.jobs and not args.kill_processes:
        sys.stderr.write("  a Slurm job holds the GPU: without --kill-processes the agent refuses to reset it\n")
    if not args.dry_run and not args.yes:
        ending = f" and end {len(kill)} process(es) (pid {', '.join(map(str, kill))})" if kill else ""
        if view.jobs:
            ending += f", under Slurm job(s) {model.job_text(view.jobs)}"
        answer = frontend.confirm(f"Reset {shown} on {host.name}{ending}?")
        if answer is None:
            raise UsageError(
                f"refusing to reset {shown} on {host.name} without confirmation: pass --yes (no terminal to ask on)"
            )
        if not answer:
            sys.stderr.write("not confirmed: nothing done\n")
            return EXIT_WARN
    result = ops_reset.run(host, gpu, runner, dry_run=args.dry_run, kill_pids=kill, timeout_s=frontend.action_timeout(args),
                           planned_backend=view.backend, inventory=path,
                           # a job between steps (or jobs not known here): the agent reads its records
                           under_jobs=bool(args.kill_processes) and view.jobs != (),
                           # exactly the jobs shown: one started since refuses the reset
                           expect_jobs=None if view.jobs is None else [j.job_id for j in view.jobs])
    if result.detail.get("backend_mismatch"):  # the report is not the planned GPU's: say so, not it
        sys.stderr.write(f"fleetops: {result.message}\n")
        if result.check:
            sys.stderr.write(f"fleetops: check with: {result.check}\n")
        return EXIT_WARN
    _print_result(result, args.json)
    return EXIT_OK if result.ok else EXIT_WARN


# --- registration ----------------------------------------------------------------------


def register(sub: Any) -> None:
    """The ``reset`` subcommand: the only entry point ``fleetops.cli`` uses."""
    p = sub.add_parser("reset", help="reset one GPU of one node over SSH, every precondition checked by the agent")
    p.add_argument("node", help="the node, as the inventory names it")
    p.add_argument("gpu", help="the GPU: UUID, PCI bus id, or index (resolved to its UUID first)")
    frontend.inventory_arg(p)
    p.add_argument("--dry-run", action="store_true", help="only evaluate the preconditions; change nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument(
        "--kill-processes",
        action="store_true",
        help="end the GPU's compute processes first: exactly those listed before the question "
        "(the agent refuses if others appeared)",
    )
    frontend.action_args(p)
    p.add_argument("--json", action="store_true", help="print the agent's JSON answer")
    frontend.ssh_args(p)
    p.set_defaults(func=frontend.guarded(cmd_reset))
