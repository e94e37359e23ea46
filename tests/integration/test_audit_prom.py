"""``fleetops audit --format prom`` of a real audit over SSH of the simulated fleet passes
``promtool check metrics``: a healthy fleet, and one with GPU faults, XIDs and a host down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from promtool_util import assert_clean, promtool

from fleetops.sim import fleet

pytestmark = [pytest.mark.root, pytest.mark.promtool]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
BASELINE = os.path.join(REPO, "examples", "baseline.yml")


def audit_prom(f: Any, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "audit", "-i", f.inventory_path, "--baseline", BASELINE, "--format", "prom", "-o", str(out),
         "--no-history", "-q", "--connect-timeout", "2", "--timeout", "20"],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO, stdin=subprocess.DEVNULL,
    )


def test_audit_prom_of_a_healthy_fleet_passes_promtool(clean_fleet: Any, tmp_path: Path) -> None:
    promtool()
    out = tmp_path / "fleetops.prom"
    proc = audit_prom(clean_fleet, out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert_clean(text)
    for name in sorted(clean_fleet.info["nodes"]):
        assert f'fleetops_node_health{{node="{name}"}} 0' in text


def test_audit_prom_with_faults_and_a_host_down_passes_promtool(clean_fleet: Any, tmp_path: Path) -> None:
    promtool()
    nodes = sorted(clean_fleet.info["nodes"])
    d = clean_fleet.directory
    fleet.inject(d, nodes[0], "ecc-dbe", 2)
    fleet.inject(d, nodes[0], "pcie-replay-storm", 1)
    fleet.inject(d, nodes[1], "xid:79", 3)
    fleet.inject(d, nodes[1], "nvlink-down", 0)
    fleet.inject(d, nodes[2], "power-cap-drift", 4)
    fleet.inject(d, nodes[3], "host-down")
    out = tmp_path / "fleetops.prom"
    try:
        proc = audit_prom(clean_fleet, out)
    finally:
        fleet.clear(d, nodes[3], "host-down")
    assert proc.returncode == 3, proc.stderr  # crit findings and a down host: the down host ranks worst
    text = out.read_text()
    assert_clean(text)
    assert f'fleetops_node_health{{node="{nodes[0]}"}} 3' in text
    assert f'fleetops_node_up{{node="{nodes[3]}"}} 0' in text
    assert f'fleetops_node_health{{node="{nodes[3]}"}} 4' in text  # unreachable: above crit
    assert f'fleetops_node_up{{node="{nodes[4]}"}} 1' in text
    assert "fleetops_gpu_ecc_uncorrected_volatile_errors{" in text
    assert "_total" not in text
