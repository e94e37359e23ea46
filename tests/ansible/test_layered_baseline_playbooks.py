"""The roles see the layered baseline, not Ansible's replaced one.

A parent group sets the power cap, a child group sets another key: Ansible alone hands a play the
child's mapping (the cap gone, the role's 700 W default instead). Through ``fleetops apply`` the
runner passes every host's layered baseline and ``gpu_power`` plans the parent's cap; the same
playbook without it plans nothing, which is what the layering changes. Real ansible-runner runs
against the simulated fleet, in check mode (no state file changes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.fleet import inventory
from fleetops.ops.baseline import PLAYBOOK_VAR, playbook_vars
from fleetops.rollout.runner import RolloutError, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]

PARENT = {"power_limit_w": 600, "persistence_mode": True}
CHILD = {"driver_version": "580.159.04"}


def _layered_inventory(fleet: Any, tmp_path: Path, parent: dict[str, Any] = PARENT) -> Path:
    """The simulated fleet's hosts in a child group ``h200`` of a parent group ``gpu``, each group
    with its own ``fleetops_baseline`` in group_vars files."""
    hosts = yaml.safe_load(Path(fleet.inventory).read_text())["all"]["children"]["sim"]["hosts"]
    inv = tmp_path / "layered"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu": {"children": {"h200": {"hosts": hosts}}}}}}, sort_keys=False))
    (inv / "group_vars" / "gpu.yml").write_text(yaml.safe_dump({"fleetops_baseline": parent}))
    (inv / "group_vars" / "h200.yml").write_text(yaml.safe_dump({"fleetops_baseline": CHILD}))
    return inv / "hosts.yml"


def _run(fleet: Any, inv: Path, layered: bool, **extravars: Any) -> list[str]:
    lines: list[str] = []
    result = run_playbook(
        "power_caps.yml",
        [str(inv)],
        extravars=extravars or None,
        check=True,
        emit=lambda kind, line: lines.append(line),
        private_data_dir=str(fleet.artifacts),
        keep=5,
        layered_baselines=layered,
    )
    assert not result.errors, result.errors
    assert result.ok, "\n".join(lines)
    return lines


def test_playbook_vars_layer_parent_and_child_and_share_one_entry(sim_fleet, tmp_path: Path) -> None:
    inv = _layered_inventory(sim_fleet, tmp_path)
    hosts = inventory.load(str(inv))
    # what Ansible alone resolves: the child's mapping, the parent's cap gone
    assert all(dict(h.vars["fleetops_baseline"]) == CHILD for h in hosts)
    got = playbook_vars(hosts, str(inv))
    assert got is not None
    assert got["baselines"] == [{**PARENT, **CHILD}]
    assert got["hosts"] == {name: 0 for name in sim_fleet.nodes}


def test_apply_power_plans_the_parent_groups_cap_that_ansible_alone_hides(sim_fleet, tmp_path: Path) -> None:
    inv = _layered_inventory(sim_fleet, tmp_path)
    before = sim_fleet.state_bytes()

    plain = _run(sim_fleet, inv, layered=False)  # Ansible's value: the child's mapping, 700 W
    assert not [line for line in plain if "WOULD CHANGE" in line and "600 W" in line], plain

    layered = _run(sim_fleet, inv, layered=True)
    for node in sim_fleet.nodes:
        assert any(node in line and "WOULD CHANGE" in line and "600 W" in line for line in layered), (node, layered)
    assert sim_fleet.state_bytes() == before, "check mode changed a node's state"


def test_an_extra_variable_baseline_wins_over_the_inventorys_layers(sim_fleet, tmp_path: Path) -> None:
    inv = _layered_inventory(sim_fleet, tmp_path)
    lines = _run(sim_fleet, inv, layered=True, fleetops_baseline={"power_limit_w": 650})
    for node in sim_fleet.nodes:
        assert any(node in line and "WOULD CHANGE" in line and "650 W" in line for line in lines), (node, lines)
    assert not [line for line in lines if "600 W" in line], lines


def test_a_bad_level_stops_the_run_before_it_starts_naming_the_file(sim_fleet, tmp_path: Path) -> None:
    inv = _layered_inventory(sim_fleet, tmp_path, parent={"power_limit_w": "lots"})
    with pytest.raises(RolloutError) as err:
        run_playbook("power_caps.yml", [str(inv)], check=True, private_data_dir=str(sim_fleet.artifacts), keep=5)
    assert "gpu.yml" in str(err.value) and "power_limit_w" in str(err.value)


def test_baseline_vars_writes_the_extra_variables_for_ansible_playbook(sim_fleet, tmp_path: Path) -> None:
    inv = _layered_inventory(sim_fleet, tmp_path)
    out = tmp_path / "layered.json"
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli", "baseline", "vars", "-i", str(inv), "-o", str(out)],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc[PLAYBOOK_VAR]["baselines"] == [{**PARENT, **CHILD}]
    assert sorted(doc[PLAYBOOK_VAR]["hosts"]) == sim_fleet.nodes
