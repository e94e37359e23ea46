"""``playbooks/power_caps.yml`` on a fleet of two GPU models, through a real ansible-playbook run
(ansible-runner) on the loopback simulated fleet: each GPU is capped at its own model's limit
from the baseline (the agent matches the model as the audit does), an explicit
``gpu_power_limit_w`` caps every GPU alike, and check mode reports exactly what the run changes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetops.rollout.runner import RunResult, run_playbook
from fleetops.sim import fleet as simfleet

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
FIRST_ADDRESS = os.environ.get("FLEETOPS_ANSIBLE_TEST_ADDRESS", "127.0.46.1")

pytestmark = [pytest.mark.root, pytest.mark.slow]

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
BASELINE = {"gpu_models": {H200: {"power_limit_w": 650}, H100: {"power_limit_w": 600}}}
# node001: H200s, node002: H100s, node003: a mixed node (GPUs 4-7 are H100s)
SCENARIO = f"nodes:\n  2:\n    gpu: {{name: {H100}}}\n"
MIXED_FROM = 4


@dataclass
class Fleet:
    directory: Path
    nodes: list[str]
    artifacts: Path

    @property
    def inventory(self) -> str:
        return str(self.directory / "inventory.yml")

    def state_path(self, node: str) -> Path:
        return self.directory / "state" / f"{node}.json"

    def unit(self, node: str) -> Path:
        return self.state_path(node).with_suffix(".systemd") / "fleetops-gpu-power.service"

    def collect(self, node: str) -> dict[str, Any]:
        done = subprocess.run(
            [AGENT, "collect", "--backend", "sim", "--state", str(self.state_path(node))],
            capture_output=True, text=True, check=True,
        )
        return dict(json.loads(done.stdout))


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[Callable[[str], Fleet]]:
    """Start a 3-node fleet from a scenario; node003 is then made a mixed node (GPUs 4-7 H100s)."""
    from fleetops.sim import fleet
    from fleetops.sim import gpu as sim

    if os.geteuid() != 0 or fleet.find_sshd() is None:
        pytest.skip("needs root and sshd: the simulated fleet runs real sshd processes")
    started: list[str] = []

    def make(scenario_text: str) -> Fleet:
        with socket.socket() as sock:  # a free port on our address block
            sock.bind((FIRST_ADDRESS, 0))
            port = sock.getsockname()[1]
        scenario = tmp_path / "scenario.yml"
        scenario.write_text(scenario_text)
        directory = tmp_path / "fleet"
        info = fleet.up(3, str(directory), str(scenario), first_address=FIRST_ADDRESS, port=port)
        started.append(str(directory))
        simfleet = Fleet(directory, sorted(info["nodes"]), tmp_path / "runner")
        with sim.locked_state(str(simfleet.state_path("node003"))) as state:
            for gpu in state["gpus"][MIXED_FROM:]:
                gpu["name"] = H100
        return simfleet

    try:
        yield make
    finally:
        for directory in started:
            fleet.down(directory)


@pytest.fixture
def two_model_fleet(make_fleet: Callable[[str], Fleet]) -> Fleet:
    return make_fleet(SCENARIO)


def run(fleet: Fleet, check: bool = False, **extravars: Any) -> tuple[RunResult, list[str]]:
    lines: list[str] = []
    result = run_playbook(
        "power_caps.yml",
        [fleet.inventory],
        extravars={"fleetops_audit_history": False, **extravars},
        check=check,
        diff=check,
        emit=lambda kind, line: lines.append(line),
        private_data_dir=str(fleet.artifacts),
        keep=5,
    )
    assert not result.errors, result.errors
    assert result.ok, "\n".join(lines)
    return result, lines


def caps(fleet: Fleet) -> dict[str, list[tuple[str, float]]]:
    return {n: [(g["name"], g["power_limit_w"]) for g in fleet.collect(n)["gpus"]] for n in fleet.nodes}


def test_each_gpu_gets_its_own_models_limit_and_the_unit_reapplies_it(two_model_fleet: Fleet) -> None:
    fleet = two_model_fleet
    run(fleet, fleetops_baseline=BASELINE)
    want = {H200: 650.0, H100: 600.0}
    got = caps(fleet)
    assert [name for name, _ in got["node003"]] == [H200] * MIXED_FROM + [H100] * (8 - MIXED_FROM)
    for node, gpus in got.items():
        assert [cap for _, cap in gpus] == [want[name] for name, _ in gpus], (node, gpus)
    assert {cap for _, cap in got["node001"]} == {650.0} and {cap for _, cap in got["node002"]} == {600.0}
    # every cap here is below the GPUs' 700 W default: a reboot would undo it, so each node has the unit

    # the boot-time unit re-applies each GPU's own cap: one line per GPU on the mixed node
    unit = fleet.unit("node003").read_text()
    uuids = [g["uuid"] for g in fleet.collect("node003")["gpus"]]
    for i, uuid in enumerate(uuids):
        assert f"set power {650 if i < MIXED_FROM else 600} --gpu {uuid} --json" in unit, unit
    assert "--gpu all" not in unit.split("set power")[1]
    unit2 = fleet.unit("node002").read_text()
    assert "set power 600 --gpu all" in unit2

    again, lines = run(fleet, fleetops_baseline=BASELINE)
    assert sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)


def test_an_explicit_cap_wins_for_every_gpu_of_every_model(two_model_fleet: Fleet) -> None:
    fleet = two_model_fleet
    run(fleet, fleetops_baseline=BASELINE, gpu_power_limit_w=550)
    for node, gpus in caps(fleet).items():
        assert [cap for _, cap in gpus] == [550.0] * 8, (node, gpus)


# Never capped by the role (no unit anywhere). node001: H200s at their 700 W default, GPU 2 drifted
# to 500 W; node002: H100s whose default (and limit) is 600 W, already what the baseline wants;
# node003: H200s at 700 W (right) and H100s at 700 W (wanted 600 W, below their 700 W default).
SCENARIO_AT_DEFAULT = (
    f"nodes:\n  2:\n    gpu: {{name: {H100}, power_limit_w: 600.0, power_default_limit_w: 600.0}}\n"
)
AT_DEFAULT = {"gpu_models": {H200: {"power_limit_w": 700}, H100: {"power_limit_w": 600}}}
DRIFTED_GPU = ("node001", 2)


def set_task_gpus(result: RunResult) -> dict[str, dict[str, Any]]:
    """Per host, the power cap task's result (changed_gpus, diff) from the run's job events."""
    found: dict[str, dict[str, Any]] = {}
    events = Path(result.artifacts) / "job_events"
    for path in sorted(events.glob("*.json")):
        event = json.loads(path.read_text())
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == "Set the GPU power cap":
            found[data["host"]] = data["res"]
    return found


def changed_gpus(result: RunResult) -> dict[str, list[str]]:
    return {h: sorted(r["changed_gpus"]) for h, r in sorted(set_task_gpus(result).items()) if r["changed_gpus"]}


def test_check_mode_reports_exactly_what_the_run_changes_on_a_fleet_never_capped(
    make_fleet: Callable[[str], Fleet],
) -> None:
    fleet = make_fleet(SCENARIO_AT_DEFAULT)
    node, gpu = DRIFTED_GPU
    simfleet.inject(str(fleet.directory), node, "power-cap-drift", gpu)
    uuids = {n: [g["uuid"] for g in fleet.collect(n)["gpus"]] for n in fleet.nodes}
    want_gpus = {"node001": [uuids["node001"][gpu]], "node003": sorted(uuids["node003"][MIXED_FROM:])}
    before = {n: fleet.state_path(n).read_bytes() for n in fleet.nodes}

    check, lines = run(fleet, check=True, fleetops_baseline=AT_DEFAULT)
    assert check.changed_hosts() == ["node001", "node003"], "\n".join(lines)
    assert changed_gpus(check) == {h: sorted(u) for h, u in want_gpus.items()}
    diff = set_task_gpus(check)["node001"]["diff"]
    assert f"GPU {gpu} {uuids['node001'][gpu]}" in diff["before"] and "power=500 W" in diff["before"]
    assert "power=500 W" not in diff["after"] and diff["after"].count("power=700 W") == 8
    assert {n: fleet.state_path(n).read_bytes() for n in fleet.nodes} == before, "check mode changed a node"
    assert not any(fleet.unit(n).exists() for n in fleet.nodes)

    real, lines = run(fleet, fleetops_baseline=AT_DEFAULT)
    assert real.changed_hosts() == check.changed_hosts(), "\n".join(lines)
    assert changed_gpus(real) == changed_gpus(check)
    # only the mixed node has caps a reboot would undo (600 W below its H100s' 700 W default)
    assert [n for n in fleet.nodes if fleet.unit(n).exists()] == ["node003"]

    again, lines = run(fleet, check=True, fleetops_baseline=AT_DEFAULT)
    assert sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)
    again, lines = run(fleet, fleetops_baseline=AT_DEFAULT)
    assert sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)
    assert [c for _, c in caps(fleet)["node001"]] == [700.0] * 8
