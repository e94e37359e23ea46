"""What every command-line front end over ``ops`` shares: the inventory it acts on (``-i``,
else $FLEETOPS_INVENTORY, else $ANSIBLE_INVENTORY, for every command that reads one), the options
that mean the same in several commands (``--limit``, ``--db``, ``--format``, ``--forks``, the SSH
options: one help text and one default each), how an error of the operations layer reaches the terminal, the operator's yes, the host named on the
command line, one-shot SSH to it and the SSH options, and the time budgets of a GPU reset
(``fleetops reset`` and ``fleetops remediate`` both reset GPUs)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from fleetops.catalog.durations import GRAMMAR, duration_arg
from fleetops.common.errors import FleetopsError, UsageError
from fleetops.fleet import sshopts
from fleetops.ops import reset as ops_reset

INVENTORY_ENVS = ("FLEETOPS_INVENTORY", "ANSIBLE_INVENTORY")
# The words every command's -i help ends with: one resolution (``inventory_path``), one text.
INVENTORY_DEFAULT = "(default: $FLEETOPS_INVENTORY, else $ANSIBLE_INVENTORY)"
NO_INVENTORY = "no inventory: pass -i INVENTORY (or set FLEETOPS_INVENTORY)"
DB_DEFAULT = "(default: $FLEETOPS_DB, else ~/.local/state/fleetops/history.db)"
LIMIT_HELP = "Ansible host pattern, as ansible's --limit (default: every host of the inventory)"
CONNECT_TIMEOUT_S = 5.0


def guarded(func: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], int]:
    """Errors of the operations layer become ``fleetops: error: ...`` and their exit code
    (common.errors) whichever way the CLI was started."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except FleetopsError as exc:
            sys.stderr.write(f"fleetops: error: {exc.message}\n")
            return exc.exit_code

    run.__name__ = func.__name__
    run.__doc__ = func.__doc__
    return run


def inventory_path(value: str | None) -> str:
    """``-i`` when given, else $FLEETOPS_INVENTORY, else $ANSIBLE_INVENTORY."""
    if value:
        return value
    for env in INVENTORY_ENVS:
        if os.environ.get(env):
            return os.environ[env]
    raise UsageError(NO_INVENTORY)


def inventory_arg(p: argparse.ArgumentParser, what: str = "Ansible inventory (INI or YAML file, or a folder)",
                  **kwargs: Any) -> None:
    """``-i/--inventory``, optional everywhere: ``inventory_path`` resolves what it leaves out."""
    p.add_argument("-i", "--inventory", help=f"{what} {INVENTORY_DEFAULT}", **kwargs)


def limit_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", help=LIMIT_HELP)


def db_arg(p: argparse.ArgumentParser, what: str = "history database") -> None:
    p.add_argument("--db", help=f"{what} {DB_DEFAULT}")


def format_arg(p: argparse.ArgumentParser, choices: tuple[str, ...], what: str = "") -> None:
    """``--format``: the first choice is the default."""
    p.add_argument("--format", choices=choices, default=choices[0],
                   help=f"output format{what} (default {choices[0]})")


def forks_arg(p: argparse.ArgumentParser, what: str = "nodes reached over SSH at the same time") -> None:
    """``--forks`` of every command that collects over SSH: one default, ``sshopts.FORKS``."""
    p.add_argument("--forks", type=int, default=sshopts.FORKS, help=f"{what} (default {sshopts.FORKS})")


def run_once(args: argparse.Namespace, host: Any, argv: list[str], timeout: float) -> Any:
    """One-shot SSH: connect, run once, disconnect (the CLI's runner for ops actions)."""
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


def runner(args: argparse.Namespace, host: Any) -> ops_reset.Runner:
    return lambda argv, timeout: run_once(args, host, argv, timeout)


def find_host(hosts: list[Any], name: str) -> Any:
    for host in hosts:
        if host.name == name:
            return host
    names = ", ".join(h.name for h in hosts[:6]) + (" ..." if len(hosts) > 6 else "")
    raise UsageError(f"node {name!r} is not in the inventory (hosts: {names})")


def confirm(question: str) -> bool | None:
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


def ssh_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect-timeout", type=duration_arg("--connect-timeout"), default=CONNECT_TIMEOUT_S,
                   help=f"how long to connect and get the SSH banner ({GRAMMAR}; default {CONNECT_TIMEOUT_S:g})")
    p.add_argument("--known-hosts", help="known_hosts file (default: the inventory's UserKnownHostsFile, else ~/.ssh)")
    p.add_argument("--accept-new-hostkeys", action="store_true", help="trust and record keys of hosts never seen")
    sshopts.add_ssh_config(p)


def action_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=duration_arg("--timeout"),
        help=f"how long to wait for each reset's answer ({GRAMMAR}; default: the agent's own reset budget "
        f"plus SSH, {ops_reset.command_timeout_s():.0f})",
    )
    p.add_argument(
        "--collect-timeout",
        type=duration_arg("--collect-timeout"),
        default=ops_reset.DEFAULT_COLLECT_TIMEOUT_S,
        help=f"how long the fresh snapshot taken before each reset may take ({GRAMMAR}; "
        f"default {ops_reset.DEFAULT_COLLECT_TIMEOUT_S:g})",
    )


def action_timeout(args: argparse.Namespace) -> float:
    """``--timeout`` when given, else the agent's own reset budget plus SSH."""
    return float(args.timeout) if args.timeout is not None else ops_reset.command_timeout_s()
