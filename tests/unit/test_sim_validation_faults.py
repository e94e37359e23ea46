"""Validation degradations (slow-hbm, slow-gemm, slow-pcie, slow-nvlink, noisy) are faults of the
simulator like the others: injected and cleared on a node's state file (what ``fleetops sim
inject/clear`` call), listed by ``status``, and written in a scenario."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from fleetops.sim import gpu as sim
from fleetops.validation.node import simbackend


def _state_file(tmp_path: Path, scenario: dict | None = None) -> str:
    path = str(tmp_path / "node001.json")
    sim.write_state(path, sim.build_state("node001", scenario))
    return path


def _triad(state: dict, gpu: int) -> float:
    (result,) = simbackend.run(state, 0.0, 1, [gpu])
    return statistics.median(result["samples"]["hbm_triad_gbps"])


def test_inject_is_idempotent_changes_only_what_validate_measures_and_clear_undoes_it(tmp_path: Path) -> None:
    path = _state_file(tmp_path)
    before = sim.read_state(path)
    assert sim.inject(path, "slow-hbm", 3) is True
    assert sim.inject(path, "slow-hbm", 3) is False
    state = sim.read_state(path)
    assert state["validation_faults"] == [{"fault": "slow-hbm", "gpu": 3}]
    assert state["faults"] == before["faults"] and state["gpus"] == before["gpus"]  # collect sees nothing
    assert _triad(state, 3) == pytest.approx(simbackend.HEALTHY["hbm_triad_gbps"] * simbackend.DEGRADED_FACTOR)
    assert _triad(state, 2) == pytest.approx(simbackend.HEALTHY["hbm_triad_gbps"])
    assert sim.clear(path, "slow-hbm", 2) == 0  # another GPU's: nothing
    assert sim.clear(path, "slow-hbm", 3) == 1
    assert _triad(sim.read_state(path), 3) == pytest.approx(simbackend.HEALTHY["hbm_triad_gbps"])


def test_a_link_is_cleared_from_either_end_and_all_clears_every_kind(tmp_path: Path) -> None:
    path = _state_file(tmp_path)
    assert sim.inject(path, "slow-nvlink", 2, peer=5) is True
    assert sim.clear(path, "slow-nvlink", 5) == 1
    sim.inject(path, "slow-nvlink", 2, peer=5)
    sim.inject(path, "noisy", 6)
    sim.inject(path, "ecc-dbe", 1)
    assert sim.clear(path, "all") == 3
    state = sim.read_state(path)
    assert state["validation_faults"] == [] and state["faults"] == []


@pytest.mark.parametrize(
    ("name", "gpu", "peer", "message"),
    [
        ("slow-hbm", 8, None, "GPU index 8 out of range (0-7)"),
        ("slow-hbm", 1, 3, "a peer GPU narrows slow-nvlink to one link between two GPUs, not slow-hbm on 1-3"),
        ("slow-nvlink", 2, 2, "not slow-nvlink on 2-2"),
        ("ecc-dbe", 1, 3, "ecc-dbe takes none"),
        ("slow-disk", 1, None, "for validate: slow-hbm, slow-gemm, slow-pcie, slow-nvlink, noisy"),
    ],
)
def test_bad_injections_are_refused_and_write_nothing(
    tmp_path: Path, name: str, gpu: int, peer: int | None, message: str
) -> None:
    path = _state_file(tmp_path)
    before = Path(path).read_text()
    with pytest.raises(sim.SimError) as failed:
        sim.inject(path, name, gpu, peer)
    assert message in str(failed.value)
    assert Path(path).read_text() == before


def test_a_scenario_writes_them_as_the_other_faults(tmp_path: Path) -> None:
    scenario_file = tmp_path / "scenario.yml"
    scenario_file.write_text(
        "faults: [slow-gemm@2, 'slow-nvlink@1-4', {fault: noisy, gpu: 6}, {fault: slow-nvlink, gpu: 0, peer: 7}]\n"
    )
    state = sim.build_state("node001", sim.load_scenario(str(scenario_file)))
    assert state["validation_faults"] == [
        {"fault": "slow-gemm", "gpu": 2},
        {"fault": "slow-nvlink", "gpu": 1, "peer": 4},
        {"fault": "noisy", "gpu": 6},
        {"fault": "slow-nvlink", "gpu": 0, "peer": 7},
    ]
    scenario_file.write_text("faults: ['slow-nvlink@1-x']\n")
    with pytest.raises(sim.SimError, match=r"entry 'slow-nvlink@1-x' is neither"):
        sim.build_state("node001", sim.load_scenario(str(scenario_file)))
    scenario_file.write_text("faults: [slow-hdd@1]\n")
    with pytest.raises(sim.SimError, match=r"unknown fault 'slow-hdd'"):
        sim.load_scenario(str(scenario_file))
