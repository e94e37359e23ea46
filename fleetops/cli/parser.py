"""The argument parser every ``fleetops`` command is built on: a usage error exits 4
(``EXIT_USAGE``, the table in ``fleetops.common.errors``), not argparse's 2."""

from __future__ import annotations

import argparse
import sys

from fleetops.common.errors import EXIT_USAGE


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(EXIT_USAGE)
