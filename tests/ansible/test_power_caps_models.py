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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetops.rollout.runner import RunResult, run_playbook

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
def two_model_fleet(tmp_path: Path) -> Iterator[Fleet]:
    from fleetops.gpu import sim
    from fleetops.sim import fleet

    if os.geteuid() != 0 or fleet.find_sshd() is None:
        pytest.skip("needs root and sshd: the simulated fleet runs real sshd processes")
    with socket.socket() as sock:  # a free port on our address block
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]

    scenario = tmp_path / "scenario.yml"
    scenario.write_text(SCENARIO)
    directory = tmp_path / "fleet"
    info = fleet.up(3, str(directory), str(scenario), first_address=FIRST_ADDRESS, port=port)
    try:
        simfleet = Fleet(directory, sorted(info["nodes"]), tmp_path / "runner")
        with sim.locked_state(str(simfleet.state_path("node003"))) as state:
            for gpu in state["gpus"][MIXED_FROM:]:
                gpu["name"] = H100
        yield simfleet
    finally:
        fleet.down(str(directory))


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
