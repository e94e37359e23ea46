"""The ``fleetops_audit`` role's agent mode through real ansible-playbook on the simulated fleet:
the node is judged by ``fleetops-agent check`` (the audit's node-scope checks), per GPU model, and
the host fails at ``fleetops_audit_fail_on`` or on a ``fleetops_audit_expect`` pin."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops.rollout.runner import RunResult, run_playbook
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root, pytest.mark.slow]

H100 = "NVIDIA H100 80GB HBM3"
MIXED = {"gpu_models": {"NVIDIA H200": {"power_limit_w": 700}, H100: {"power_limit_w": 600}}, "gpu_count": 8}


def audit(fleet: Any, **extravars: Any) -> tuple[RunResult, str]:
    lines: list[str] = []
    result = run_playbook(
        "audit.yml",
        [fleet.inventory],
        extravars={"fleetops_audit_history": False, "fleetops_audit_mode": "agent",
                   "fleetops_audit_baseline": MIXED, **extravars},  # fmt: skip
        emit=lambda kind, line: lines.append(line),
        private_data_dir=str(fleet.artifacts),
        keep=5,
    )
    assert not result.errors, result.errors
    return result, "\n".join(lines)


def set_gpus(fleet: Any, node: str, first: int, **values: Any) -> None:
    with sim.locked_state(str(fleet.state_path(node))) as st:
        for gpu in st["gpus"][first:]:
            gpu.update(values)


def test_an_expect_pin_fails_whatever_its_severity(sim_fleet: Any) -> None:
    fleet = sim_fleet
    result, out = audit(fleet, fleetops_audit_fail_on="crit", fleetops_audit_baseline={},
                        fleetops_audit_expect={"persistence_mode": True})  # fmt: skip
    assert result.ok, out
    fleet.inject("node001", "persistence-off", 6)  # a warn finding: below the crit gate
    pinned, out = audit(fleet, fleetops_audit_fail_on="crit", fleetops_audit_baseline={},
                        fleetops_audit_expect={"persistence_mode": True})  # fmt: skip
    assert pinned.failed_hosts == ["node001"], out
    assert "persistence mode off, baseline on" in out


def test_mixed_model_node_is_judged_per_model_and_fails_only_where_wrong(sim_fleet: Any) -> None:
    fleet = sim_fleet
    # node002: GPUs 4-7 are H100s at their model's 600 W. A power limit taken from the first model
    # in the baseline (700 W) would fail them.
    set_gpus(fleet, "node002", 4, name=H100, power_limit_w=600.0, power_enforced_limit_w=600.0)
    clean, out = audit(fleet, fleetops_audit_fail_on="warn")
    assert clean.ok and clean.failed_hosts == [], out

    set_gpus(fleet, "node002", 5, power_limit_w=700.0, power_enforced_limit_w=700.0)  # H200's limit on H100s
    wrong, out = audit(fleet, fleetops_audit_fail_on="warn")
    assert wrong.failed_hosts == ["node002"], out
    assert "GPU 5 (0000:ab:00.0): power limit 700 W, baseline 600 W for " + H100 in out, out
    assert "GPU 4 (" not in out and "GPU 3 (" not in out

    # The same warning passes a crit gate, as in controller mode; a crit finding fails it.
    warn_only, out = audit(fleet, fleetops_audit_fail_on="crit")
    assert warn_only.ok, out
    fleet.inject("node003", "ecc-dbe", 2)
    crit, out = audit(fleet, fleetops_audit_fail_on="crit")
    assert crit.failed_hosts == ["node003"], out
    assert ("2 finding(s) at or above crit: GPU 2 (0000:3a:00.0): 2 uncorrectable ECC errors since the driver "
            "loaded; its jobs may have read corrupted memory; GPU 2 (0000:3a:00.0): XID 48 Double-bit "
            "(uncorrectable) ECC error x1") in out, out
