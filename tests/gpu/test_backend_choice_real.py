"""On a real GPU node a stray ``$FLEETOPS_SIM_STATE`` never makes the agent a simulator.
Read-only: ``collect`` and a reset ``--dry-run`` only; the dry run is refused before it looks
at a GPU, and nothing is ever reset or set.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.gpu import backend_choice
from fleetops.sim import gpu as sim

pytestmark = pytest.mark.gpu


def _agent(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (backend_choice.MARKERS_ENV, backend_choice.CONSENT_ENV)}
    env[backend_choice.SIM_STATE_ENV] = str(state)
    return subprocess.run([sys.executable, "-m", "fleetops.agent.main", *args], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    path = tmp_path / "stray.json"
    sim.init_state(str(path), "stray-sim-node")
    return path


def test_this_node_has_a_driver_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend_choice.MARKERS_ENV, raising=False)  # the real device files
    assert backend_choice.gpu_driver_marker() is not None


def test_auto_collect_with_a_stray_sim_state_answers_from_nvml(state: Path) -> None:
    proc = _agent("collect", "--fresh", state=state)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "nvml" and doc["hostname"] != "stray-sim-node"


def test_explicit_sim_is_refused_without_the_flag_and_taken_with_it(state: Path) -> None:
    before = state.read_bytes()
    proc = _agent("reset", "--gpu", "GPU-00000000-0000-0000-0000-000000000000", "--dry-run", "--json",
                  "--backend", "sim", "--state", str(state), state=state)
    assert proc.returncode == 2 and not proc.stdout.strip()
    assert "--sim-on-gpu-node" in json.loads(proc.stderr.strip().splitlines()[-1])["error"]
    assert state.read_bytes() == before
    proc = _agent("collect", "--fresh", "--backend", "sim", "--state", str(state), "--sim-on-gpu-node", state=state)
    assert proc.returncode == 0 and json.loads(proc.stdout)["backend"] == "sim"
