"""``fleetops rollout driver`` and ``fleetops apply power|mig|firmware``.

``register(subparsers)`` adds both commands to the main CLI; each sets ``func(args) -> int``.
Exit codes: 0 every host ok, 1 a host failed, was unreachable or was not reached because the run
stopped, 2 the playbook run itself failed, 4 usage or input error (also: a change refused
without ``--yes``). Heavy imports (ansible-runner, rich) happen inside the functions.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO

from fleetops.common.errors import EXIT_CRIT as EXIT_RUN_FAILED
from fleetops.common.errors import EXIT_OK, EXIT_USAGE
from fleetops.common.errors import EXIT_WARN as EXIT_HOSTS_FAILED
from fleetops.ops import frontend

__all__ = ["EXIT_HOSTS_FAILED", "EXIT_OK", "EXIT_RUN_FAILED", "EXIT_USAGE", "register"]

APPLY_PLAYBOOKS = {"power": "power_caps.yml", "mig": "mig.yml", "firmware": "firmware.yml"}
APPLY_WHAT = {
    "power": "enforce and persist GPU power caps",
    "mig": "apply MIG layouts: mode, GPU and compute instances (nodes are drained first)",
    "firmware": "audit GPU firmware",
}
# The collection's ansible.cfg [defaults] forks, which --forks overrides (tests/unit hold the two equal).
ANSIBLE_FORKS = 20
_VERSION = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
_BATCH = re.compile(r"^([1-9][0-9]*)(%?)$")


def batch_size(text: str) -> str:
    """``N`` hosts or ``P%`` (1-100) of them, as Ansible's ``serial`` takes it."""
    found = _BATCH.match(text.strip())
    if not found or (found.group(2) and int(found.group(1)) > 100):
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a host count (e.g. 4) nor a percentage 1-100% (e.g. 25%)"
        )
    return text.strip()


def drain_share(text: str) -> float:
    """``--max-drain-share``: a fraction (0.1) or a percentage (10%), above 0 and at most 1 (100%)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a fraction above 0 and at most 1 (e.g. 0.1) nor a percentage (e.g. 10%)"
        )
    return value


def driver_version(text: str) -> str:
    if not _VERSION.match(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not an exact driver version such as 580.159.04")
    return text.strip()


def extra_var(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    import json

    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def _common(p: argparse.ArgumentParser) -> None:
    frontend.inventory_arg(p, "Ansible inventory (INI or YAML file, or a folder; repeat for several)",
                           action="append", metavar="INVENTORY")
    frontend.limit_arg(p)
    p.add_argument(
        "--baseline",
        metavar="FILE",
        help="baseline YAML for every host, as `fleetops audit --baseline` takes it (validated first; "
        "default: each host's layered fleetops_baseline from the inventory)",
    )
    p.add_argument(
        "--check", action="store_true", help="dry run: report what would change (with diffs), change nothing"
    )
    p.add_argument("--yes", action="store_true", help="do not ask before changing nodes")
    p.add_argument("--forks", type=int, default=None,
                   help=f"Ansible worker processes at once (default: ansible.cfg's forks, {ANSIBLE_FORKS})")
    p.add_argument(
        "-e",
        "--extra-var",
        dest="extra_vars",
        action="append",
        type=extra_var,
        default=[],
        metavar="KEY=VALUE",
        help="extra variable for the playbook (JSON values accepted)",
    )
    p.add_argument(
        "--max-drain-share",
        type=drain_share,
        default=0.1,
        metavar="SHARE",
        help="largest share of a Slurm partition out of service at once, counting every node already out: "
        "a fraction or a percentage (default 10%%; never fewer than one node)",
    )
    frontend.db_arg(p, "history database where the run's Slurm drains and resumes are recorded")
    p.add_argument("-v", "--verbose", action="store_true", help="also print unchanged task results")
    p.add_argument(
        "--artifacts", help="ansible-runner private data dir (default: ~/.local/state/fleetops/rollout)"
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rollout",
        help="rolling upgrade of the pinned driver stack",
        description="Rolling upgrade through playbooks/driver_rollout.yml: a canary batch, then batches; "
        "drain, install the pinned driver, fabric manager and CUDA, reboot or reload, verify, audit gate, resume.",
    )
    what = p.add_subparsers(dest="rollout_what", required=True, metavar="WHAT")
    d = what.add_parser(
        "driver", help="roll out an exact NVIDIA driver version (fabric manager pinned to it)"
    )
    d.add_argument(
        "--version", required=True, type=driver_version, help="exact driver version, e.g. 580.159.04"
    )
    d.add_argument(
        "--batch",
        type=batch_size,
        default="25%",
        help="hosts per batch after the canary: N or P%% (default 25%%)",
    )
    d.add_argument(
        "--canary",
        type=int,
        default=1,
        help="hosts in the canary batch (default 1); any failure there stops the rollout",
    )
    d.add_argument(
        "--max-fail-percentage",
        type=int,
        default=0,
        help="stop when more than this percentage of a batch fails (default 0: any failure)",
    )
    d.add_argument(
        "--activation",
        choices=["reboot", "reload", "none"],
        help="how the new driver is loaded (default: the inventory's, else reboot)",
    )
    d.add_argument("--no-cuda", action="store_true", help="leave the CUDA toolkit alone")
    _common(d)
    d.set_defaults(func=rollout_driver)

    a = subparsers.add_parser(
        "apply",
        help="apply GPU settings: power caps, MIG layouts, firmware",
        description="Runs playbooks/power_caps.yml, mig.yml or firmware.yml through ansible-runner.",
    )
    a.add_argument("what", choices=sorted(APPLY_PLAYBOOKS), help="power, mig or firmware")
    a.add_argument(
        "--layout",
        help="mig: comma-separated GPU instance profiles for every managed GPU (3g.71gb,3g.71gb), or 'off'; "
        "default: the baseline's mig.layout (gpu_mig_layout)",
    )
    a.add_argument(
        "--no-reset",
        action="store_true",
        help="mig: leave a MIG mode that waits for a GPU reset pending (reported) instead of resetting the GPU "
        "through the safe reset flow (gpu_mig_reset=false)",
    )
    a.add_argument(
        "--update-firmware",
        action="store_true",
        help="firmware: run the nvfwupd update path (one node at a time, drained first)",
    )
    _common(a)
    a.set_defaults(func=apply)


# --- commands ------------------------------------------------------------------------------


def rollout_driver(args: argparse.Namespace) -> int:
    if args.canary < 1:
        return _usage("--canary must be at least 1")
    if not 0 <= args.max_fail_percentage <= 100:
        return _usage("--max-fail-percentage must be 0-100")
    extravars: dict[str, Any] = {
        "fleetops_driver_version": args.version,
        "fleetops_rollout_batch": args.batch,
        "fleetops_rollout_canary": args.canary,
        "fleetops_rollout_max_fail_percentage": args.max_fail_percentage,
    }
    if args.activation:
        extravars["nvidia_driver_activation"] = args.activation
    if args.no_cuda:
        extravars["fleetops_rollout_cuda"] = False
    action = f"roll out NVIDIA driver {args.version} (drain, install, {args.activation or 'reboot'}, resume)"
    return _run(args, "driver_rollout.yml", extravars, action, ident="rollout-driver")


def apply(args: argparse.Namespace) -> int:
    extravars: dict[str, Any] = {}
    action = APPLY_WHAT[args.what]
    layout = getattr(args, "layout", None)
    if layout is not None:
        if args.what != "mig":
            return _usage("--layout goes with 'apply mig'")
        profiles = [p.strip() for p in layout.split(",") if p.strip()]
        if not profiles:
            return _usage("--layout: give GPU instance profiles (3g.71gb,3g.71gb) or 'off'")
        if profiles == ["off"]:
            extravars.update(gpu_mig_layout=[], gpu_mig_mode=False)
            action = "turn MIG mode off (instances destroyed; nodes are drained first)"
        else:
            extravars.update(gpu_mig_layout=profiles, gpu_mig_mode=True)
            action = f"apply the MIG layout {', '.join(profiles)} (nodes are drained first)"
    if getattr(args, "no_reset", False):
        if args.what != "mig":
            return _usage("--no-reset goes with 'apply mig'")
        extravars["gpu_mig_reset"] = False
        action += "; a MIG mode that waits for a GPU reset is left pending"
    if args.update_firmware:
        if args.what != "firmware":
            return _usage("--update-firmware goes with 'apply firmware'")
        extravars["gpu_firmware_update"] = True
        action = "update GPU firmware with nvfwupd (one node at a time, drained first)"
    elif args.what == "firmware":
        # Without --update-firmware the firmware playbook only reads: no confirmation needed.
        args.yes = True
    return _run(args, APPLY_PLAYBOOKS[args.what], extravars, action, ident=f"apply-{args.what}")


def _usage(message: str) -> int:
    sys.stderr.write(f"fleetops: {message}\n")
    return EXIT_USAGE


def confirm(
    action: str, args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None
) -> bool:
    """Destructive runs need --yes, or a typed 'yes' on a terminal."""
    if args.check or args.yes:
        return True
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    if not stdin.isatty():
        return False
    where = args.limit or "every host"
    stdout.write(f"About to {action} on {where} of {', '.join(args.inventory)}.\nType 'yes' to go on: ")
    stdout.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


def _printer(stream: TextIO) -> Callable[[str, str], None]:
    styles = {
        "play": "bold",
        "changed": "yellow",
        "failed": "bold red",
        "unreachable": "bold magenta",
        "ok": "green",
        "held": "bold yellow",
        "note": "cyan",
    }
    if stream.isatty():
        from rich.console import Console

        console = Console(file=stream, highlight=False, soft_wrap=True)

        def emit(kind: str, line: str) -> None:
            console.print(line, style=styles.get(kind), markup=False)

        return emit

    def plain(kind: str, line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return plain


def _run(args: argparse.Namespace, playbook: str, extravars: dict[str, Any], action: str, ident: str) -> int:
    from fleetops.rollout.progress import summary_text
    from fleetops.rollout.runner import RolloutError, run_playbook

    args.inventory = args.inventory or [frontend.inventory_path(None)]
    for inv in args.inventory:
        import os

        if not os.path.exists(inv):
            return _usage(f"inventory {inv} does not exist")
    if not confirm(action, args):
        return _usage(f"refusing to {action} without --yes (or run with --check to see what would change)")
    from fleetops.catalog.slurm import check_owner, new_run_id

    extravars = {
        **extravars,
        "fleetops_max_drain_share": args.max_drain_share,
        **dict(args.extra_vars),
    }
    if getattr(args, "baseline", None):
        # the audit's --baseline: one file for every host, in place of the inventory's layers;
        # a file the audit would refuse stops the run here, naming file and line
        from fleetops import baseline as bl
        from fleetops.fleet.inventory import BASELINE_VAR

        try:
            loaded = bl.load_file(args.baseline)
        except bl.BaselineError as exc:
            return _usage(str(exc))
        extravars[BASELINE_VAR] = json.loads(json.dumps(dict(loaded.raw), default=str))
    # One id for the whole run: every drain it makes carries it in its Slurm Reason, and its
    # resumes lift only drains that carry it.
    run_id = str(extravars.setdefault("fleetops_run_id", new_run_id()))
    try:
        check_owner("rollout", run_id)
    except ValueError as exc:
        return _usage(f"fleetops_run_id: {exc}")
    out = sys.stdout
    emit = _printer(out)
    mode = "CHECK (nothing is changed)" if args.check else "APPLY"
    emit("play", f"{mode}: {action} — playbooks/{playbook}")
    emit("play", f"run id {run_id}")
    try:
        result = run_playbook(
            playbook,
            args.inventory,
            extravars=extravars,
            limit=args.limit,
            check=args.check,
            forks=args.forks,
            verbose=args.verbose,
            emit=emit,
            private_data_dir=args.artifacts,
            ident_prefix=ident,
        )
    except RolloutError as exc:
        return _usage(str(exc))
    out.write("\n" + summary_text(result.rows) + "\n")
    for error in result.errors:
        out.write(error + "\n")
    for host, why in sorted(result.held.items()):
        out.write(f"HELD (left drained, not changed, not failed): {host}: {why}\n")
    if result.failed_hosts:
        out.write(f"FAILED: {', '.join(result.failed_hosts)}\n")
    if result.not_reached:
        out.write(f"NOT REACHED (run stopped): {', '.join(result.not_reached)}\n")
    if not args.check:
        record_drains(
            args.db,
            result.slurm,
            source="rollout" if ident == "rollout-driver" else ident.removeprefix("apply-"),
            stream=out,
        )
    out.write(f"run id {run_id}; {result.elapsed_s:.1f}s; artifacts in {result.artifacts}\n")
    out.flush()
    if result.failed_hosts or result.not_reached:
        return EXIT_HOSTS_FAILED
    if result.errors or result.rc not in (0, None) or result.status != "successful":
        return EXIT_RUN_FAILED
    return EXIT_OK


def record_drains(db: str | None, events: list[dict[str, Any]], *, source: str, stream: TextIO) -> int:
    """Write the run's drains and resumes (as the drain module reported them) to the history
    store, where ``fleetops history --kind drains`` reads them; the number written. The nodes
    were drained already: a store that cannot be written is a warning, not a failed run."""
    import sqlite3

    from fleetops.catalog import slurm as rule
    from fleetops.fleet.store.database import Store
    from fleetops.fleet.store.layout import StoreError
    from fleetops.fleet.store.rows import DrainRow

    rows = []
    for e in events:
        if e.get("kind") not in rule.OWNER_KINDS or not e.get("run"):
            continue
        reason = None
        if e["action"] == "drain" and e["outcome"] == "done":
            reason = rule.drain_reason(e["kind"], e["run"], e.get("purpose"))
        rows.append(
            DrainRow(
                at=e["at"],
                node=e["host"],
                action=e["action"],
                kind=e["kind"],
                run=e["run"],
                outcome=e["outcome"],
                message=e.get("message") or "",
                source=source,
                slurm_name=e.get("slurm_name"),
                purpose=e.get("purpose"),
                reason=reason,
                previous_owner=e.get("previous_owner"),
            )  # fmt: skip
        )
    if not rows:
        return 0
    try:
        with Store(db, keep_s=None) as store:  # writing drains never prunes audits
            for row in rows:
                store.record_drain(row)
    except (StoreError, sqlite3.Error, OSError) as exc:
        stream.write(f"warning: {len(rows)} drain(s) and resume(s) of this run not recorded in the history "
                     f"({db or 'the default database'}): {exc}\n")  # fmt: skip
        return 0
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m fleetops.rollout``) until the main CLI wires ``register``."""
    parser = argparse.ArgumentParser(prog="fleetops")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))
