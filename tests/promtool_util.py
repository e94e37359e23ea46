"""promtool, from Debian's ``prometheus`` package: the reference linter for the exposition format
and the alert rules. Tests that need it are marked ``promtool`` and skip, with the reason, only
where it is not installed (CI installs it: ``FLEETOPS_SETUP_FULL=1 scripts/setup.sh``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

INSTALL = "apt-get install -y prometheus (or FLEETOPS_SETUP_FULL=1 scripts/setup.sh)"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(f"needs promtool: {INSTALL}")
    return path


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on ``text`` (stdin); exit 0 with no output means no complaint."""
    return subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


def assert_clean(text: str) -> None:
    proc = check_metrics(text)
    complaints = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and complaints == "", f"promtool check metrics (rc {proc.returncode}):\n{complaints}"
