"""``fleetops``: the controller command.

Exit codes (audit): 0 ok, 1 warn, 2 crit, 3 any node unreachable (whatever else was found) or
only unknown values, 4 usage or input error (``model.HEALTH_ORDER``). ``job``: 0 no verdict, 1 verdicts, 3
a node not asked, 4 usage or the job on no node (``fleetops.job_cli``). Other commands: 0 success, 1 failure, 4 usage or input error. The table lives in
``fleetops.common.errors``, shared by every command.

Each command family builds its own parser and runs its own command (``audit``, ``history``,
``prometheus``, ``baseline``, ``sim``, beside the front ends' registration entry points, below);
this module puts the parser together and runs a command with the exit codes above.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetops.cli import audit, baseline, history, prometheus, sim
from fleetops.cli.parser import Parser
from fleetops.common.errors import EXIT_INTERRUPTED, EXIT_USAGE, FleetopsError, UsageError
from fleetops.fleet import sshopts

__all__ = ["EXIT_USAGE", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fleetops", description="Audit and keep consistent a fleet of NVIDIA GPU nodes.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for family in (audit, history, prometheus, baseline, sim):
        family.register(sub)
    for module in _feature_modules():
        module.register(sub)
    return parser


# Commands that live with their front end or feature. Each of these modules is a registration
# entry point: it exposes ``register(sub)`` and keeps its internals (Textual, ansible-runner, SSH)
# behind lazy imports, so this module needs nothing else from them; tests/unit/test_frontends.py
# holds this package to that.
ENTRY_POINTS = ("fleetops.rollout.cli", "fleetops.reset_cli", "fleetops.remedy.cli", "fleetops.drain_cli", "fleetops.tui.cli", "fleetops.docgen.cli",
                "fleetops.validation.cli", "fleetops.job_cli")


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
        ("fleetops.fleet.store.layout", "StoreError"),
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

