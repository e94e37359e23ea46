"""``fleetops tui``: registered into the ``fleetops`` command by ``fleetops.cli``."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg
from fleetops.ops import frontend
from fleetops.tui import liveness

SIM_FIRST_ADDRESS = "127.0.40.1"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "tui",
        help="live fleet view for incidents (k9s-like): health, GPUs, findings, XIDs; reset, drain",
        description="Live view of the fleet. Keys: ':' view, '/' filter, 'f' faults only, "
        "Shift+letter sort, Enter node detail, '?' all keys.",
    )
    frontend.inventory_arg(p, "Ansible inventory (INI or YAML file, or a folder; none with --sim)")
    p.add_argument(
        "--baseline", help="baseline YAML (default: fleetops_baseline from the inventory's group_vars)"
    )
    frontend.limit_arg(p)
    p.add_argument(
        "--readonly", action="store_true", help="no actions: re-audit, reset, drain and resume are off"
    )
    p.add_argument(
        "--interval",
        type=duration_arg("--interval"),
        help=f"time between cold collections of a node without a daemon ({GRAMMAR}; default: 2, longer for "
        "big fleets: 6 ms per node)",
    )
    p.add_argument("--db", help=f"history database for the node screen, when it exists {frontend.DB_DEFAULT}")
    p.add_argument(
        "--timeout", type=duration_arg("--timeout"), default=15.0,
        help=f"how long the agent may take to answer before a node is HUNG ({GRAMMAR}; default 15)",
    )
    frontend.forks_arg(p, "nodes without a daemon collected over SSH at the same time")
    p.add_argument(
        "--max-connecting",
        type=int,
        default=48,
        help="SSH connections opened at the same time for the nodes' daemon streams (default 48)",
    )
    p.add_argument(
        "--stream-transport",
        choices=("auto", "openssh", "paramiko"),
        default="auto",
        help="how the daemon streams connect: openssh (one ssh client process per node: the handshakes "
        "run outside the controller's Python), paramiko (in process), or auto: openssh where ssh is on "
        "PATH, else paramiko (default auto). Nodes behind a ProxyJump use paramiko either way",
    )
    p.add_argument(
        "--stale-after",
        type=duration_arg("--stale-after"),
        default=liveness.STALE_AFTER_S,
        help=f"time without news from a node's daemon before it is shown STALE ({GRAMMAR}; default 30)",
    )
    frontend.ssh_args(p)
    p.add_argument(
        "--sim", action="store_true",
        help="start a simulated fleet in a temporary folder and watch it (instead of an inventory: -i, "
        "$FLEETOPS_INVENTORY and $ANSIBLE_INVENTORY are not read)",
    )
    p.add_argument("--nodes", type=int, default=8, help="nodes of the simulated fleet (default 8)")
    p.add_argument("--scenario", help="scenario YAML for the simulated fleet (faults, per-node overrides)")
    p.set_defaults(func=run)


def default_interval(nodes: int) -> float:
    """2 s, or longer where parsing and checking every node's answer (its CPU cost per node:
    bench/tui_refresh.py, bench/RESULTS.md) would keep the refresh thread busy more than half
    the time and compete with the screen for the interpreter."""
    return max(2.0, round(nodes * 0.006, 1))


def start_sim(nodes: int, directory: str, scenario: str | None) -> dict[str, Any]:
    """``fleet.up`` on a loopback range nobody else uses (tests and other fleets may run)."""
    from fleetops.sim import fleet

    candidates = [SIM_FIRST_ADDRESS] + [f"127.{random.randint(41, 250)}.40.1" for _ in range(5)]
    last: Exception | None = None
    for first in candidates:
        try:
            return fleet.up(nodes, directory, scenario, first_address=first)
        except fleet.SimFleetError as exc:
            if "already in use" not in str(exc):
                raise
            last = exc
    assert last is not None
    raise last


def open_store(path: str | None) -> Any:
    from fleetops.fleet.store.database import Store
    from fleetops.fleet.store.layout import default_path

    if path:
        return Store(path)
    default = default_path()
    return Store(default) if os.path.exists(default) else None


def run(args: argparse.Namespace) -> int:
    from fleetops.common.errors import UsageError

    if args.sim and args.inventory:
        raise UsageError("tui: give -i INVENTORY or --sim, not both")
    if not args.sim:
        try:
            args.inventory = frontend.inventory_path(args.inventory)
        except UsageError:
            raise UsageError(f"{frontend.NO_INVENTORY}, or --sim for a simulated fleet") from None
    if args.interval is not None and args.interval <= 0:
        raise UsageError("tui: --interval must be more than 0 seconds")
    if args.max_connecting < 1:
        raise UsageError("tui: --max-connecting must be at least 1")
    if args.stale_after <= 0:
        raise UsageError("tui: --stale-after must be more than 0 seconds")
    sim_dir = None
    restore = _exit_on_hangup()
    try:
        inventory = args.inventory
        where = os.path.abspath(inventory) if inventory else ""
        if args.sim:
            sim_dir = tempfile.mkdtemp(prefix="fleetops-tui-sim-")
            start_sim(args.nodes, sim_dir, args.scenario)
            inventory = os.path.join(sim_dir, "inventory.yml")
            where = f"sim {sim_dir}"
        return _run_app(args, inventory, where, open_store(args.db))
    finally:
        if sim_dir is not None:
            from fleetops.sim import fleet

            fleet.down(sim_dir)
            shutil.rmtree(sim_dir, ignore_errors=True)
        restore()


def _exit_on_hangup() -> Any:
    """A closed terminal (SIGHUP) or a kill (SIGTERM) still stops the simulated fleet: turn
    them into SystemExit so the ``finally`` that stops it runs."""

    def leave(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, leave) for sig in (signal.SIGHUP, signal.SIGTERM)}
    return lambda: [signal.signal(sig, handler) for sig, handler in old.items()]


def _run_app(args: argparse.Namespace, inventory: str, where: str, store: Any) -> int:
    from fleetops.fleet.store.layout import default_path
    from fleetops.tui.app import FleetApp
    from fleetops.tui.source import previous_snapshots, resolve_hosts
    from fleetops.tui.stream import StreamSource

    try:
        hosts, baselines = resolve_hosts(inventory, args.baseline, args.limit)
        if not hosts:
            from fleetops.common.errors import UsageError

            raise UsageError(
                f"{inventory}: no hosts" + (f" match --limit {args.limit}" if args.limit else "")
            )
        interval = args.interval if args.interval is not None else default_interval(len(hosts))
        source = StreamSource(
            hosts,
            baselines,
            max_connecting=args.max_connecting,
            stale_after_s=args.stale_after,
            stream_transport=args.stream_transport,
            interval=interval,
            connect_timeout=args.connect_timeout,
            command_timeout=args.timeout,
            forks=args.forks,
            known_hosts=args.known_hosts,
            accept_new_hostkeys=args.accept_new_hostkeys,
            previous=previous_snapshots(store, [h.name for h in hosts]),
            drain_db=store.path if store is not None else default_path(),
        )
        if source.open_files_warning:  # before the screen takes the terminal
            print(f"fleetops tui: {source.open_files_warning}", file=sys.stderr)
        app = FleetApp(
            source, readonly=args.readonly, interval=interval, where=where, store=store,
            inventory=os.path.abspath(inventory),
        )  # fmt: skip
        app.run()
        return 0
    finally:
        if store is not None:
            store.close()
