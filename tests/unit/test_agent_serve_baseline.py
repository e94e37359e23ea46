"""``fleetops-agent serve --baseline`` and the daemon's rates, as a real process on the simulator:
the baseline changes a finding, a bad file stops the start (file:line, exit 2) and a bad reload
keeps the running baseline, and a rate measured over the daemon's window matches the rate the
simulator injects."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_agent_serve import AGENT, _ask, _until

from fleetops.sim import gpu as sim

# The simulator's storms grow at these rates (fleetops/sim/gpu.py): the daemon must measure them.
REPLAYS_PER_MIN = sim.REPLAY_STORM_PER_MIN
SBE_PER_HOUR = sim.SBE_STORM_PER_MIN * 60


def _start(node: Path, *flags: str) -> subprocess.Popen[bytes]:
    cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5",
           "--hang-timeout", "5", *flags, "--states", str(node)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def _daemon(node: Path) -> dict[str, Any] | None:
    doc = _ask(node, "snapshot") or {}
    daemon: dict[str, Any] | None = doc.get("daemon")
    return daemon


def _judged(node: Path) -> dict[str, Any] | None:
    """The daemon's part of a snapshot that has had a full snapshot (and so findings)."""
    doc = _ask(node, "snapshot") or {}
    daemon: dict[str, Any] | None = doc.get("daemon") if doc.get("gpus") else None
    return daemon


def _findings(node: Path, check: str) -> list[dict[str, Any]]:
    return [f for f in (_daemon(node) or {}).get("findings", []) if f["check"] == check]


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    return state


def test_the_baseline_changes_the_daemons_findings(node: Path, tmp_path: Path) -> None:
    """The simulator's GPUs run at 700 W: with a 600 W baseline every GPU is off it; without a
    baseline the daemon has no power limit to compare with and says nothing."""
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("power_limit_w: 600\n")
    plain = _start(node)
    try:
        daemon = _until("the first judged snapshot", lambda: _judged(node))
        assert daemon["baseline"] is None
        assert _findings(node, "thermal_power.power_limit") == []
    finally:
        _stop(plain)
    pinned = _start(node, "--baseline", str(baseline))
    try:
        found = _until("power-limit findings", lambda: _findings(node, "thermal_power.power_limit"))
        daemon = _daemon(node)
        assert daemon is not None and daemon["baseline"]["source"] == str(baseline)
    finally:
        _stop(pinned)
    assert len(found) == len(sim.read_state(str(node))["gpus"])
    assert {f["observed"] for f in found} == {700.0} and {f["expected"] for f in found} == {600.0}


def test_a_bad_baseline_at_start_names_file_and_line_and_exits_2(node: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "bad.yml"
    baseline.write_text("power_limit_w: 600\nthresholds:\n  pcie_replays_per_mn: 3\n")
    proc = _start(node, "--baseline", str(baseline))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    error = json.loads(err.decode().strip().splitlines()[-1])
    assert error["kind"] == "usage"
    assert error["error"].startswith(f"{baseline}:3: thresholds.pcie_replays_per_mn: unknown key")


def test_sighup_reloads_the_baseline_and_a_bad_one_keeps_the_running_one(node: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("power_limit_w: 700\n")  # what the GPUs run at: nothing to find
    proc = _start(node, "--baseline", str(baseline))
    try:
        _until("the first judged snapshot", lambda: _judged(node))
        assert _findings(node, "thermal_power.power_limit") == []
        baseline.write_text("power_limit_w: 650\n")
        proc.send_signal(signal.SIGHUP)
        found = _until("the reloaded baseline's findings", lambda: _findings(node, "thermal_power.power_limit"))
        assert {f["expected"] for f in found} == {650.0}
        daemon = _daemon(node)
        assert daemon is not None and daemon["reloaded_at"] is not None and daemon["reload_error"] is None
        baseline.write_text("power_limit_w: 650\ngpu_count: eight\n")
        proc.send_signal(signal.SIGHUP)
        daemon = _until("the refusal", lambda: (lambda d: d if d and d["reload_error"] else None)(_daemon(node)))
        assert daemon["reload_error"].startswith(f"{baseline}:2: gpu_count:")
        refused_by = time.time()  # the refusal was already made when this clock was read
        # a full snapshot collected after the refusal, and the findings judged on it
        doc = _until("a full snapshot collected after the refusal",
                     lambda: (lambda d: d if d.get("collected_at", 0) > refused_by else None)(
                         _ask(node, "snapshot") or {}))
        found = [f for f in doc["daemon"]["findings"] if f["check"] == "thermal_power.power_limit"]
        assert len(found) == len(sim.read_state(str(node))["gpus"])  # still judged by the 650 W baseline
        assert {f["expected"] for f in found} == {650.0}
        assert doc["daemon"]["baseline"]["source"] == str(baseline)
        assert doc["daemon"]["reload_error"] == daemon["reload_error"]
    finally:
        err = _stop(proc)
    assert f"reload refused: {baseline}:2: gpu_count:" in err


def _rate(node: Path, check: str, uuid: str) -> dict[str, Any] | None:
    for f in _findings(node, check):
        if (f["gpu"] or {}).get("uuid") == uuid:
            return f
    return None


def test_rates_over_the_daemons_window_match_the_injected_rates(node: Path, tmp_path: Path) -> None:
    """A PCIe replay storm (600/min) on one GPU and an SBE storm (1.2M/h) on another: the
    daemon's rate findings, measured over its window (10 s here, from the baseline), within 2 %.
    The counters and the time of the window's start come from the same sample; a base time
    older than its counters (the oldest full snapshot against a newer ring sample) reads low."""
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("thresholds:\n  nvlink_idle_window_s: 10\n  rate_min_interval_s: 5\n")
    gpus = sim.read_state(str(node))["gpus"]
    assert sim.inject(str(node), "pcie-replay-storm", 1)
    assert sim.inject(str(node), "ecc-sbe-storm", 3)
    proc = _start(node, "--baseline", str(baseline))

    def settled() -> tuple[dict[str, Any], dict[str, Any]] | None:
        replay = _rate(node, "pcie.replay_rate", gpus[1]["uuid"])
        sbe = _rate(node, "memory.ecc_sbe_rate", gpus[3]["uuid"])
        if replay is None or sbe is None or replay["severity"] != "warn":
            return None
        window = re.search(r"\(\+\d+ in (\d+) s\)", replay["message"])
        assert window is not None, replay["message"]
        return (replay, sbe) if int(window.group(1)) >= 10 else None

    try:
        first = _until("rate findings over a full window", settled)
        time.sleep(6.0)  # more full snapshots: the oldest retained one is older than the base sample
        again = settled()
        assert again is not None
    finally:
        _stop(proc)
    for replay, sbe in (first, again):
        assert abs(replay["observed"]["per_min"] - REPLAYS_PER_MIN) <= 0.02 * REPLAYS_PER_MIN, replay
        assert abs(sbe["observed"] - SBE_PER_HOUR) <= 0.02 * SBE_PER_HOUR, sbe
