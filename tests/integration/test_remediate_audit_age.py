"""``fleetops remediate`` plans each node from its newest result across the recorded audits, only
when that result is recent; ``--yes`` acts only when every node in scope has one: real audits
over SSH into a real history database, then the real command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetops.catalog.durations import parse_duration
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]


def fleetops(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def state_path(f: Any, node: str) -> Path:
    return Path(f.directory) / "state" / f"{node}.json"


def audit(f: Any, db: str, *extra: str) -> None:
    proc = fleetops("audit", "-i", f.inventory_path, "--db", db, "-q", "--format", "json", *extra)
    assert proc.stdout.strip().startswith("{"), proc.stderr  # recorded whatever its exit code


def test_yes_refuses_a_result_older_than_the_limit_and_resets_nothing(clean_fleet: Any, tmp_path: Path) -> None:
    f = clean_fleet
    fleet.inject(f.directory, "node001", "ecc-dbe", 1)
    db = str(tmp_path / "history.db")
    audit(f, db, "--limit", "node001")
    time.sleep(1.5)  # the audit is now older than the 1s limit below
    before = state_path(f, "node001").read_bytes()
    proc = fleetops("remediate", "-i", f.inventory_path, "--limit", "node001", "--db", db, "--yes",
                    "--max-audit-age", "1s")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refusing --yes: 1 node(s) have no audit within 1s" in proc.stderr
    assert "node001 (last result audit #1, " in proc.stderr and "Nothing was reset or drained" in proc.stderr
    assert state_path(f, "node001").read_bytes() == before
    # the same audit within the default limit (15 min) is acted on
    proc = fleetops("remediate", "-i", f.inventory_path, "--limit", "node001", "--db", db, "--yes", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [x["name"] for x in sim.read_state(str(state_path(f, "node001")))["faults"]] == []


def test_yes_refuses_while_nodes_have_no_result_and_names_them(clean_fleet: Any, tmp_path: Path) -> None:
    f = clean_fleet
    fleet.inject(f.directory, "node001", "ecc-dbe", 2)
    db = str(tmp_path / "history.db")
    audit(f, db, "--limit", "node001,node002")
    before = state_path(f, "node001").read_bytes()
    proc = fleetops("remediate", "-i", f.inventory_path, "--db", db, "--yes", "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    missing = ["node003", "node004", "node005", "node006"]
    assert "4 node(s) have no audit within 15m" in proc.stderr
    assert ", ".join(f"{n} (never audited)" for n in missing) in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source"]["missing"] == missing and doc["executed"] == []
    assert state_path(f, "node001").read_bytes() == before


def test_a_stale_result_is_not_planned_and_every_unplanned_node_is_named(clean_fleet: Any, tmp_path: Path) -> None:
    f = clean_fleet
    fleet.inject(f.directory, "node003", "ecc-dbe", 0)
    db = str(tmp_path / "history.db")
    audit(f, db, "--limit", "node003")
    time.sleep(1.5)
    before = state_path(f, "node003").read_bytes()
    proc = fleetops("remediate", "-i", f.inventory_path, "--db", db, "--dry-run", "--max-audit-age", "1s")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a warning: not every node was looked at
    assert "WARNING: 6 node(s) have no audit within 1s (--max-audit-age)" in proc.stdout
    assert "node003 (last result audit #1, " in proc.stdout and "node006 (never audited)" in proc.stdout
    assert "Nothing to do" not in proc.stdout and ": would-reset" not in proc.stdout
    assert "No finding in the results for 0 node(s); 6 node(s) have no audit within 1s" in proc.stdout
    # within the limit the same result is planned, and the nodes never audited are still named
    proc = fleetops("remediate", "-i", f.inventory_path, "--db", db, "--dry-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ": would-reset" in proc.stdout
    assert "Not planned: 5 node(s) have no audit within 15m, so nothing is planned for them: " in proc.stdout
    assert state_path(f, "node003").read_bytes() == before


@pytest.mark.parametrize(("text", "seconds"), [("900", 900.0), ("900s", 900.0), ("15m", 900.0), ("1h", 3600.0),
                                               ("1.5h", 5400.0), ("2d", 172800.0), ("1w", 604800.0)])
def test_max_audit_age_takes_the_duration_grammar(text: str, seconds: float) -> None:
    assert parse_duration(text, flag="--max-audit-age") == seconds


@pytest.mark.parametrize("text", ["", "15 minutes", "-5m", "0"])
def test_a_bad_max_audit_age_is_a_usage_error_naming_the_flag(tmp_path: Path, text: str) -> None:
    proc = fleetops("remediate", "-i", str(tmp_path / "none.ini"), "--db", str(tmp_path / "h.db"),
                    "--max-audit-age", text)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--max-audit-age" in proc.stderr
