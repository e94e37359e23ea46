"""The node-pair RDMA bandwidth test of ``fleetops validate --level full`` over real SSH on a
4-node simulated fleet: the server on one node and the client on its peer, each answering from
its simulated HCAs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.common.errors import EXIT_CRIT, EXIT_OK
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[2]
# A block of its own, apart from the shared session fleet's and the 32-node validate fleet's.
ADDRESS = os.environ.get("FLEETOPS_TEST_RAIL_PAIRS_ADDRESS", "127.0.61.1")
RAILS = [f"mlx5_{i}" for i in range(8)]


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def fleet4(root_sshd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = str(tmp_path_factory.mktemp("railpairs"))
    fleet.up(4, directory, first_address=ADDRESS, port=free_port(ADDRESS))
    try:
        yield directory
    finally:
        fleet.down(directory)


def _validate(directory: str, *extra: str) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "fleetops.cli", "validate", "-i",
                           os.path.join(directory, "inventory.yml"), "--level", "full", "--format", "json",
                           "--no-history", *extra],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _fleetops(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fleetops.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_a_degraded_rail_is_exactly_that_pair_and_rail_below_the_floor(fleet4: str) -> None:
    inject = _fleetops("sim", "inject", "--dir", fleet4, "node002", "ib-degraded", "--gpu", "3")
    assert inject.returncode == 0, inject.stderr
    try:
        code, doc = _validate(fleet4)
    finally:
        fleet.clear(fleet4, "node002", "all")
    assert code == EXIT_CRIT
    assert doc["unreachable"] == {}
    assert {g["status"] for g in doc["gpus"]} == {"ok"}
    assert {n["status"] for n in doc["nodes"]} == {"ok"}
    pairs = doc["pairs"]
    assert (pairs["not_applicable"], pairs["skipped"], pairs["usual_rate_gbps"]) == (None, {}, 400.0)
    results = {(p["client"], p["server"]): p for p in pairs["results"]}
    assert sorted(results) == [("node001", "node002"), ("node003", "node004")]
    bad = results[("node001", "node002")]
    assert bad["status"] == "crit"
    assert [(f["rail"], f["status"], f["floor"], f["memory"]) for f in bad["findings"]] == [
        ("mlx5_3", "crit", 360.0, "GPUDirect")]
    [finding] = bad["findings"]
    # 98 % of the 200 Gb/s the degraded port trained at, within the simulator's +-0.5 % jitter
    assert 195.0 <= finding["value"] <= 197.0
    assert finding["reason"].startswith(f"{finding['value']:.1f} below the H200 SXM 400 Gb/s rail floor 360.0")
    assert finding["action"].startswith("inspect rail mlx5_3 between node001 and node002")
    assert sorted(bad["figures"]) == RAILS
    healthy = [v for (pair, p) in results.items() for rail, v in p["figures"].items()
               if (pair, rail) != (("node001", "node002"), "mlx5_3")]
    assert len(healthy) == 15
    assert min(healthy) >= 390.0
    assert max(healthy) <= 394.0
    assert results[("node003", "node004")]["status"] == "ok"
    assert results[("node003", "node004")]["findings"] == []


def test_a_port_down_fails_its_rail_with_the_reason(fleet4: str) -> None:
    inject = _fleetops("sim", "inject", "--dir", fleet4, "node004", "ib-port-down", "--gpu", "5")
    assert inject.returncode == 0, inject.stderr
    try:
        code, doc = _validate(fleet4)
    finally:
        fleet.clear(fleet4, "node004", "all")
    assert code == EXIT_CRIT
    results = {(p["client"], p["server"]): p for p in doc["pairs"]["results"]}
    assert results[("node001", "node002")]["status"] == "ok"
    bad = results[("node003", "node004")]
    assert [(f["rail"], f["status"], f["value"], f["reason"]) for f in bad["findings"]] == [
        ("mlx5_5", "crit", None, "port mlx5_5/1 on node004 is 1: DOWN: not measured")]
    assert sorted(bad["figures"]) == [r for r in RAILS if r != "mlx5_5"]


def _validate_recorded(directory: str, db: str, *extra: str) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "fleetops.cli", "validate", "-i",
                           os.path.join(directory, "inventory.yml"), "--level", "full", "--format", "json",
                           "--db", db, *extra],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_odd_node_is_paired_with_one_already_measured_and_one_node_is_not_applicable(
    fleet4: str, tmp_path: Path
) -> None:
    import sqlite3

    db = str(tmp_path / "history.db")
    code, doc = _validate_recorded(fleet4, db, "--limit", "node001,node002,node003")
    assert code == EXIT_OK
    results = [(p["client"], p["server"], p["again"], p["status"]) for p in doc["pairs"]["results"]]
    assert results == [("node001", "node002", False, "ok"), ("node003", "node001", True, "ok")]
    assert doc["pairs"]["results"][1]["notes"] == [
        "node003 is the odd node out: paired with node001, which its own pair measured already"]
    with sqlite3.connect(db) as conn:
        [(summary,)] = conn.execute("SELECT summary FROM validate_runs").fetchall()
    recorded = json.loads(summary)["rdma_pairs"]
    assert [(p["client"], p["server"], sorted(p["figures"])) for p in recorded["results"]] == [
        ("node001", "node002", RAILS), ("node003", "node001", RAILS)]
    code, doc = _validate(fleet4, "--limit", "node001")
    assert code == EXIT_OK
    assert doc["pairs"]["not_applicable"] == "one node has RDMA compute rails: no peer to measure against"
    assert doc["pairs"]["results"] == []
    assert doc["status"] == "ok"


def test_the_table_names_the_pair_and_rail(fleet4: str) -> None:
    inject = _fleetops("sim", "inject", "--dir", fleet4, "node002", "ib-degraded", "--gpu", "3")
    assert inject.returncode == 0, inject.stderr
    try:
        proc = _fleetops("validate", "-i", os.path.join(fleet4, "inventory.yml"), "--level", "full", "--no-history")
    finally:
        fleet.clear(fleet4, "node002", "all")
    assert proc.returncode == EXIT_CRIT, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split(None, 5)[:5] == ["node001->node002", "(pair:", "RDMA", "rails)", "crit"]
    assert " mlx5_3: 19" in lines[1]
    assert lines[2] == ("32 GPUs: 32 ok, 0 warn, 0 crit, 0 unknown; 4 nodes' P2P and all_reduce: 4 ok, 0 warn, 0 crit, "
                        "0 unknown; 2 node pairs' RDMA rails: 1 ok, 0 warn, 1 crit, 0 unknown; 0 nodes without a result")


def test_a_node_without_perftest_is_skipped_not_failed(fleet4: str) -> None:
    """node004 without ib_write_bw: not applicable there, and node003, now the odd one out,
    pairs with node001."""
    path = os.path.join(fleet4, "state", "node004.json")
    state = sim.read_state(path)
    state["perftest_missing"] = True
    sim.write_state(path, state)
    try:
        code, doc = _validate(fleet4)
    finally:
        state = sim.read_state(path)
        state.pop("perftest_missing")
        sim.write_state(path, state)
    assert code == EXIT_OK
    assert doc["pairs"]["skipped"] == {"node004": "perftest not installed (no ib_write_bw on PATH)"}
    assert [(p["client"], p["server"], p["again"], p["status"]) for p in doc["pairs"]["results"]] == [
        ("node001", "node002", False, "ok"), ("node003", "node001", True, "ok")]
