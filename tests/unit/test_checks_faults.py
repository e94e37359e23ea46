"""Every simulator fault is caught by the check meant for it, on the GPU it was injected on,
and by nothing else at warn or above."""

from __future__ import annotations

import time

import pytest
from expected_faults import EXPECTED, NODE_LEVEL

from fleetops import model
from fleetops.checks import checks_run, run_node_checks
from fleetops.sim import gpu as sim

TARGET = 3


def test_expected_table_covers_every_simulator_fault() -> None:
    assert set(sim.FAULT_NAMES) <= set(EXPECTED)


def _audit(fault: str, sim_baseline, sim_node):
    """Previous snapshot of the healthy node, then the fault, then a snapshot 2 minutes later."""
    healthy = sim.build_state("n1")
    entry = fault if fault == "driver-drift" else f"{fault}@{TARGET}"  # node-wide: takes no GPU
    broken = sim.build_state("n1", {"faults": [entry]})
    t0 = time.time()
    previous = sim_node(state=healthy, now=t0)
    current = sim_node(state=broken, now=t0 + 120)
    target = healthy["gpus"][TARGET]  # same host -> same UUIDs and bus ids
    return run_node_checks(current, sim_baseline, previous), current, target


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_raises_its_check_only_on_the_injected_gpu(fault: str, sim_baseline, sim_node) -> None:
    findings, _, target = _audit(fault, sim_baseline, sim_node)
    serious = [f for f in findings if model.SEVERITY_RANK[f.severity] >= model.SEVERITY_RANK["warn"]]
    assert {f.check: f.severity for f in serious} == EXPECTED[fault], [f.message for f in findings]
    for f in serious:
        if f.check in NODE_LEVEL:
            assert f.gpu is None
        else:
            assert f.gpu is not None, f.message
            assert f.gpu["uuid"] == target["uuid"] and f.gpu["bus_id"] == target["bus_id"], f.message
        assert f.node == "n1" and f.message and f.action


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_findings_use_ids_that_checks_run_lists(fault: str, sim_baseline, sim_node) -> None:
    findings, node, _ = _audit(fault, sim_baseline, sim_node)
    ran = set(checks_run(node, sim_baseline))
    assert {f.check for f in findings} <= ran


def test_fault_on_another_gpu_moves_the_finding_with_it(sim_baseline, sim_node) -> None:
    state = sim.build_state("n1", {"faults": ["ecc-dbe@6"]})
    findings = run_node_checks(sim_node(state=state), sim_baseline, None)
    dbe = [f for f in findings if f.check == "memory.ecc_dbe_volatile"]
    assert [f.gpu["uuid"] for f in dbe] == [state["gpus"][6]["uuid"]]


@pytest.mark.parametrize("fault", ["gpu-missing", "xid:79"])
def test_lost_gpu_keeps_its_index_and_is_named_by_uuid_and_the_rest_do_not_shift(
        fault, sim_baseline, sim_node) -> None:
    findings, node, target = _audit(fault, sim_baseline, sim_node)
    healthy = sim.build_state("n1")
    assert [(g.index, g.uuid) for g in node.gpus] == [(g["index"], g["uuid"]) for g in healthy["gpus"]]
    assert model.gpu_lost(node.gpus[TARGET]) and node.gpu_count == 8
    missing = [f for f in findings if f.check == "config.gpu_missing"]
    assert [f.gpu for f in missing] == [{"index": TARGET, "uuid": target["uuid"], "bus_id": target["bus_id"]}]
    count = next(f for f in findings if f.check == "config.gpu_count")
    assert (count.severity, count.observed, count.expected) == ("crit", 7, 8)
    assert model.gpu_tally(node, findings) == (7, 8)


def test_xid79_without_previous_snapshot_names_the_lost_gpu_at_its_index(sim_baseline, sim_node) -> None:
    state = sim.build_state("n1", {"faults": [f"xid:79@{TARGET}"]})
    findings = run_node_checks(sim_node(state=state), sim_baseline, None)
    ref = {"index": TARGET, "uuid": state["gpus"][TARGET]["uuid"], "bus_id": state["gpus"][TARGET]["bus_id"]}
    xid = [f for f in findings if f.check == "xid.recent"]
    assert len(xid) == 1 and xid[0].gpu == ref and xid[0].severity == "crit"
    assert state["gpus"][TARGET]["bus_id"] in xid[0].message
    assert "reboot" in xid[0].action.lower()
    assert [f.gpu for f in findings if f.check == "config.gpu_missing"] == [ref]


def test_reset_actions_name_the_node_and_gpu_uuid(sim_baseline, sim_node) -> None:
    findings, _, target = _audit("ecc-dbe", sim_baseline, sim_node)
    for f in findings:
        assert f"fleetops reset n1 {target['uuid']}" in f.action


def test_fault_is_caught_without_any_baseline_where_it_is_a_health_fault(sim_node) -> None:
    for fault, check in (("ecc-dbe", "memory.ecc_dbe_volatile"), ("nvlink-down", "nvlink.links_down"),
                         ("pcie-downgrade", "pcie.link_degraded"), ("thermal-slowdown", "thermal_power.throttle"),
                         ("row-remap-failure", "memory.row_remap_failure"), ("xid:48", "xid.recent")):
        state = sim.build_state("n1", {"faults": [f"{fault}@2"]})
        findings = run_node_checks(sim_node(state=state), None, None)
        assert {f.check: f.severity for f in findings}.get(check) == EXPECTED[fault][check], fault
