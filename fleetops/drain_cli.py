"""``fleetops drain`` and ``fleetops resume``: an operator's drains, through ``fleetops.ops.slurm``.

``fleetops drain NODE... --reason TEXT`` drains the nodes in Slurm with the Reason
``[fleetops] operator/USER@HOST: TEXT`` (USER the person, under sudo too; HOST the controller's
short host name), so ``sinfo -R``, the TUI and every run can tell who drained and why. scontrol
runs on the controller or on the inventory's ``fleetops_slurm_host``, never on the node. A node
someone else drained keeps their drain and Reason (refused, the owner named); the capacity guard
refuses the whole set when it would take more than ``--max-drain-share`` of a partition out of
service, counting every node already out, whoever took it out.

``fleetops resume NODE...`` lifts an operator's drain (any operator's). Another owner's drain (the
health program, a rollout, remediate, someone outside fleetops) is refused with the owner named
and who set it when; ``--force`` lifts it anyway: read why it was drained first
(docs/runbooks/drains.md).

More than one node needs ``--yes`` or a confirmation on a terminal (default No). ``--dry-run``
shows each node's decision and the Reason it would get, and sends nothing.

Every drain and resume (done, refused, failed or unanswered; not a dry run) is recorded in the
history database (``--db``) with its owner, run and purpose: ``fleetops history --kind drains``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg
from fleetops.common.errors import EXIT_OK, EXIT_WARN, UsageError
from fleetops.ops import drain_log, frontend, results
from fleetops.ops.frontend import guarded, inventory_path

KIND = "operator"


def parse_share(text: str) -> float:
    """``10%`` or ``0.10``: the share of a partition that may be out of service at once."""
    value = str(text).strip()
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise UsageError(
            f"--max-drain-share {text!r}: a percentage (10%) or a fraction (0.10), above 0 and at most 1"
        )
    return share


def _hosts(path: str, names: list[str]) -> tuple[list[Any], list[Any]]:
    """(every inventory host, the named ones in the order given); an unknown name is a usage
    error naming it and the inventory."""
    from fleetops.fleet import inventory

    every = inventory.load(path, None)
    by_name = {h.name: h for h in every}
    missing = [n for n in names if n not in by_name]
    if missing:
        known = ", ".join(h.name for h in every[:6]) + (" ..." if len(every) > 6 else "")
        raise UsageError(
            "{} {} not in the inventory {} (its hosts: {})".format(
                "node" if len(missing) == 1 else "nodes",
                ", ".join(repr(n) for n in missing) + (" is" if len(missing) == 1 else " are"),
                path,
                known,
            )
        )
    chosen = list(dict.fromkeys(names))
    return every, [by_name[n] for n in chosen]


def _confirmed(args: argparse.Namespace, verb: str, hosts: list[Any], extra: str = "") -> bool:
    """Several nodes need --yes or a yes on a terminal; one node, or a dry run, does not."""
    if args.dry_run or args.yes or len(hosts) < 2:
        return True
    names = ", ".join(h.name for h in hosts)
    answer = frontend.confirm(f"{verb.capitalize()} {len(hosts)} nodes ({names}){extra}?")
    if answer is None:
        raise UsageError(
            f"refusing to {verb} {len(hosts)} nodes without confirmation: pass --yes (no terminal to ask on)"
        )
    if not answer:
        sys.stderr.write("not confirmed: nothing done\n")
    return answer


def _control(args: argparse.Namespace, every: list[Any], max_share: float | None = None) -> Any:
    from fleetops.ops import slurm

    kw: dict[str, Any] = {} if max_share is None else {"max_share": max_share}
    return slurm.SlurmControl(
        every,
        connect_timeout=args.connect_timeout,
        timeout=args.timeout,
        known_hosts=args.known_hosts,
        accept_new_hostkeys=args.accept_new_hostkeys,
        **kw,
    )


def _report(
    args: argparse.Namespace, action: str, run: str, done: list[results.ActionResult], **extra: Any
) -> int:
    if args.json:
        doc = {
            "action": action,
            "owner": {"kind": KIND, "run": run},
            "dry_run": bool(args.dry_run),
            **extra,
            "results": [
                {
                    "node": r.node,
                    "outcome": r.outcome,
                    "message": r.message,
                    "check": r.check,
                    "detail": r.detail,
                }
                for r in done
            ],
        }
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        for r in done:
            sys.stdout.write(f"{r.outcome:<8} {r.message}\n")
            if r.check:
                sys.stdout.write(f"         check with: {r.check}\n")
        if any(r.detail.get("capacity") for r in done):
            sys.stdout.write(
                "the capacity guard counts every node out of service, whoever took it out; "
                "--max-drain-share changes the share (read why the others are out first)\n"
            )
    return EXIT_OK if done and all(r.ok for r in done) else EXIT_WARN


# --- the commands ------------------------------------------------------------------------


def cmd_drain(args: argparse.Namespace) -> int:
    from fleetops.catalog import slurm as rule
    from fleetops.ops import slurm

    purpose = " ".join((args.reason or "").split())
    if not purpose:
        raise UsageError("--reason: say why the nodes are drained (it is kept in Slurm's Reason)")
    share = parse_share(args.max_drain_share)
    run = slurm.operator_run()
    too_long = slurm.purpose_refusal(KIND, run, purpose)
    if too_long:  # refused whole, never cut: the next shift would read half a sentence
        raise UsageError(f"--reason: {too_long}")
    path = inventory_path(args.inventory)
    every, hosts = _hosts(path, args.nodes)
    reason = rule.drain_reason(KIND, run, purpose)
    if not _confirmed(args, "drain", hosts, f" with Reason {reason!r}"):
        return EXIT_WARN
    done = _control(args, every, share).drain_many(hosts, purpose, kind=KIND, run=run, dry_run=args.dry_run)
    drain_log.record_all(args.db, done, kind=KIND, run=run, purpose=purpose, source="cli")
    return _report(args, "drain", run, done, reason=reason, max_share=share)


def cmd_resume(args: argparse.Namespace) -> int:
    from fleetops.ops import slurm

    run = slurm.operator_run()
    path = inventory_path(args.inventory)
    every, hosts = _hosts(path, args.nodes)
    extra = ", lifting other owners' drains too (--force)" if args.force else ""
    if not _confirmed(args, "resume", hosts, extra):
        return EXIT_WARN
    control = _control(args, every)
    done = [control.resume(h, kind=KIND, run=run, force=args.force, dry_run=args.dry_run) for h in hosts]
    drain_log.record_all(args.db, done, kind=KIND, run=run, source="cli")
    return _report(args, "resume", run, done, force=bool(args.force))


# --- registration ----------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("nodes", nargs="+", metavar="NODE", help="nodes, as the inventory names them")
    frontend.inventory_arg(p)
    p.add_argument(
        "--dry-run", action="store_true", help="show each node's decision and Reason; send nothing"
    )
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (several nodes)")
    p.add_argument("--json", action="store_true", help="print every node's result as JSON")
    frontend.db_arg(p, "history database where each drain and resume is recorded")
    p.add_argument("--timeout", type=duration_arg("--timeout"), default=30.0,
                   help=f"how long each scontrol call may take ({GRAMMAR}; default 30)")
    frontend.ssh_args(p)  # the Slurm host's SSH


def register(sub: Any) -> None:
    """The ``drain`` and ``resume`` subcommands: the only entry point ``fleetops.cli`` uses."""
    p = sub.add_parser(
        "drain",
        help="drain nodes in Slurm as an operator (Reason names you); another owner's drain is left as it is",
    )
    _common(p)
    p.add_argument(
        "--reason", required=True, help="why: kept in Slurm's Reason after [fleetops] operator/USER@HOST:"
    )
    p.add_argument(
        "--max-drain-share",
        default="10%",
        metavar="SHARE",
        help="refuse when the drain would take more than this share of a partition out of service, counting "
        "every node already out (10%% or 0.10; never fewer than one node; default 10%%)",
    )
    p.set_defaults(func=guarded(cmd_drain))

    p = sub.add_parser(
        "resume",
        help="resume nodes an operator drained; another owner's drain is refused (named) unless --force",
    )
    _common(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="also lift another owner's drain (the health program, a rollout, remediate, someone outside fleetops)",
    )
    p.set_defaults(func=guarded(cmd_resume))
