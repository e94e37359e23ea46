"""What every command-line front end over ``ops`` shares: the inventory it acts on, and how an
error of the operations layer reaches the terminal."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from fleetops.common.errors import FleetopsError, UsageError

INVENTORY_ENVS = ("FLEETOPS_INVENTORY", "ANSIBLE_INVENTORY")


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
    raise UsageError("no inventory: pass -i INVENTORY (or set FLEETOPS_INVENTORY)")
