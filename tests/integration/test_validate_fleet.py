"""``fleetops validate`` over real SSH on a 32-node simulated fleet with injected degradations."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.gpu import sim
from fleetops.ops.errors import EXIT_CRIT
from fleetops.sim import fleet

pytestmark = pytest.mark.root


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])

ROOT = Path(__file__).resolve().parents[2]
# A block of its own, apart from the shared session fleet's.
ADDRESS = os.environ.get("FLEETOPS_TEST_VALIDATE_ADDRESS", "127.0.60.1")
DEGRADED = {("node003", 1): "slow-hbm", ("node011", 6): "slow-gemm", ("node020", 0): "slow-pcie"}


@pytest.fixture(scope="module")
def fleet32(root_sshd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    directory = str(tmp_path_factory.mktemp("validate32"))
    info = fleet.up(32, directory, first_address=ADDRESS, port=free_port(ADDRESS))
    try:
        expected: dict[str, str] = {}
        for (name, gpu), fault in DEGRADED.items():
            path = info["nodes"][name]["state"]
            state = sim.read_state(path)
            sim.inject_validation_fault(state, fault, gpu)
            sim.write_state(path, state)
            expected[state["gpus"][gpu]["uuid"]] = fault
        yield os.path.join(directory, "inventory.yml"), expected
    finally:
        fleet.down(directory)


def test_validate_flags_exactly_the_degraded(fleet32: tuple[str, dict[str, str]]) -> None:
    inv, expected = fleet32
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "fleetops.cli", "validate", "-i", inv, "--format", "json"],
                              capture_output=True, text=True, env=env, timeout=300, check=False)
        assert proc.returncode == EXIT_CRIT, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["unreachable"] == {}
        assert len(doc["gpus"]) == 32 * 8
        flagged = {g["gpu"] for g in doc["gpus"] if g["status"] != "ok"}
        assert flagged == set(expected)
        # 85 % of healthy: HBM and GEMM stay above their floors (stragglers); 44 GB/s to the host
        # is under the 48 GB/s floor.
        status = {expected[g["gpu"]]: g["status"] for g in doc["gpus"] if g["gpu"] in expected}
        assert status == {"slow-hbm": "warn", "slow-gemm": "warn", "slow-pcie": "crit"}
