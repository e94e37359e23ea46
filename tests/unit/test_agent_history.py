"""``fleetops-agent history`` as a real process against a real simulated daemon."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_serve import AGENT, Daemon, _ask, _until

from fleetops.sim import gpu as sim


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    return state


@pytest.fixture()
def daemon(node: Path) -> Iterator[Daemon]:
    d = Daemon([node])
    d.start()
    yield d
    d.stop()


def _history(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"FLEETOPS_SIM_STATE": str(state), "PATH": "/usr/bin:/bin"}
    return subprocess.run([AGENT, "history", *args], check=False, env=env, capture_output=True, text=True, timeout=60)


def _error(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    doc: dict[str, Any] = json.loads(lines[0])
    return doc


def test_history_prints_the_daemons_samples_per_field(node: Path, daemon: Daemon) -> None:
    gpu = sim.read_state(str(node))["gpus"][2]
    uuid = gpu["uuid"]
    _until("three samples", lambda: len((_ask(node, f"history {uuid} temp_gpu_c 3600") or {}).get("samples", [])) >= 3)
    sim.inject(str(node), "thermal-slowdown", 2)  # the temperature moves: the last value shows it
    snap = _until(
        "the hot sample",
        lambda: next(
            (s for s in ((_ask(node, f"history {uuid} temp_gpu_c 60") or {}).get("samples") or [])[-1:] if s[1] and s[1] > 80),
            None,
        ),
    )
    proc = _history(node, "--gpu", uuid)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(doc) == ["clock_sm_mhz", "power_draw_w", "temp_gpu_c", "temp_memory_c"]
    temps = doc["temp_gpu_c"]
    assert len(temps) >= 3 and all(len(p) == 2 for p in temps)
    assert [p[0] for p in temps] == sorted(p[0] for p in temps)  # oldest first
    assert temps[-1][1] >= snap[1]  # the hot sample (or a later, hotter one) is there, as a number
    assert any(p[1] < 80 for p in temps)  # and the cool ones before it
    assert all(isinstance(p[1], float) for p in doc["power_draw_w"])

    only = json.loads(_history(node, "--gpu", uuid, "--fields", "pcie_tx_kbps", "--seconds", "30").stdout)
    assert list(only) == ["pcie_tx_kbps"] and only["pcie_tx_kbps"] and all(p[1] is None for p in only["pcie_tx_kbps"])
    assert all(p[0] >= temps[-1][0] - 40 for p in only["pcie_tx_kbps"])  # 30 s, not the hour


def test_history_errors_are_one_json_line(node: Path, daemon: Daemon) -> None:
    uuid = sim.read_state(str(node))["gpus"][0]["uuid"]
    bad_field = _history(node, "--gpu", uuid, "--fields", "temp_gpu_c,no_such_field")
    assert bad_field.returncode == 2 and bad_field.stdout == ""
    err = _error(bad_field)
    assert err["kind"] == "usage" and "no_such_field" in err["error"]
    bad_gpu = _history(node, "--gpu", "GPU-nope")
    assert bad_gpu.returncode == 1 and _error(bad_gpu)["kind"] == "no-such-gpu"
    assert _history(node, "--gpu", uuid, "--seconds", "-5").returncode == 2


def test_history_without_a_daemon_says_so(node: Path) -> None:
    uuid = sim.read_state(str(node))["gpus"][0]["uuid"]
    proc = _history(node, "--gpu", uuid)
    assert proc.returncode == 1 and proc.stdout == ""
    err = _error(proc)
    assert err["kind"] == "no-daemon" and "no fleetops-agent daemon" in err["error"]
