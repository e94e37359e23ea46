"""``fleetops-agent collect`` and ``check`` as processes on a simulated node: the snapshot's
fabric section read from the node's sysfs tree, and a port taken down found by port and severity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.common.errors import EXIT_CRIT
from fleetops.sim import gpu as sim

AGENT = [sys.executable, "-m", "fleetops.agent.main"]


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    return subprocess.run([*AGENT, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node004")
    return path


def test_collect_shows_the_hcas_read_from_the_nodes_sysfs(state: Path) -> None:
    proc = agent("collect", "--backend", "sim", "--state", str(state))
    assert proc.returncode == 0, proc.stderr
    fabric = json.loads(proc.stdout)["fabric"]
    names = [h["name"] for h in fabric["hcas"]]
    assert names == [f"mlx5_{i}" for i in range(9)]
    assert all(h["ports"][0]["state"] == "4: ACTIVE" for h in fabric["hcas"])
    sim.inject(str(state), "ib-port-down", 3)
    proc = agent("collect", "--backend", "sim", "--state", str(state))
    hcas = {h["name"]: h for h in json.loads(proc.stdout)["fabric"]["hcas"]}
    assert hcas["mlx5_3"]["ports"][0]["state"] == "1: DOWN"
    assert [n for n, h in hcas.items() if h["ports"][0]["state"] != "4: ACTIVE"] == ["mlx5_3"]


def test_check_finds_the_port_down_and_nothing_on_the_fabric_before(state: Path) -> None:
    proc = agent("check", "--backend", "sim", "--state", str(state), "--json")
    assert [f for f in json.loads(proc.stdout)["findings"] if f["check"].startswith("fabric.")] == []
    sim.inject(str(state), "ib-port-down", 3)
    proc = agent("check", "--backend", "sim", "--state", str(state), "--json")
    assert proc.returncode == EXIT_CRIT, proc.stderr
    fabric = [f for f in json.loads(proc.stdout)["findings"] if f["check"].startswith("fabric.")]
    assert [(f["check"], f["severity"], f["observed"]["device"], f["observed"]["netdev"]) for f in fabric] == [
        ("fabric.port_down", "crit", "mlx5_3", "ibp94s0")]
