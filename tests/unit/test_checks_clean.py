"""A healthy node says nothing; the registry describes every check the docs and JUnit need."""

from __future__ import annotations

import time

from fleetops import model
from fleetops.checks import FAMILIES, REGISTRY, checks_run, registry_dicts, run_fleet_checks, run_node_checks
from fleetops.sim import gpu as sim


def test_healthy_sim_node_with_matching_baseline_yields_no_findings(sim_node, sim_baseline):
    assert run_node_checks(sim_node(), sim_baseline, None) == []


def test_healthy_sim_node_without_baseline_yields_no_findings(sim_node):
    assert run_node_checks(sim_node(), None, None) == []


def test_healthy_sim_node_with_previous_snapshot_yields_no_findings(sim_node, sim_baseline):
    state = sim.build_state("n1")
    t0 = time.time()
    assert run_node_checks(sim_node(state=state, now=t0 + 120), sim_baseline, sim_node(state=state, now=t0)) == []


def test_healthy_fleet_yields_no_drift(sim_node, sim_baseline):
    nodes = [sim_node(f"n{i}") for i in range(4)]
    assert run_fleet_checks(nodes, None) == []
    assert run_fleet_checks(nodes, sim_baseline) == []


def test_findings_are_json_serialisable(sim_node, sim_baseline):
    import json

    node = sim_node(faults=["thermal-slowdown@1", "xid:48@2", "stray-process@0"])
    findings = run_node_checks(node, sim_baseline, None)
    assert findings
    json.dumps([f.to_dict() for f in findings])


def test_every_registered_check_is_documented():
    for spec in REGISTRY.values():
        assert spec.id.startswith(spec.family + ".") and spec.family in FAMILIES
        assert spec.title and spec.reads and spec.threshold and spec.action
        assert spec.severities and set(spec.severities) <= set(model.SEVERITIES) - {"ok"}
        assert spec.scope in ("node", "fleet", "node+fleet")
    assert [d["id"] for d in registry_dicts()] == list(REGISTRY)


def test_every_family_has_an_unreadable_check():
    for family in FAMILIES:
        assert REGISTRY[f"{family}.unreadable"].severities == ("unknown",)


def test_not_a_fault_notes_exist_where_false_positives_are_known():
    assert "MIG" in REGISTRY["nvlink.links_down"].not_a_fault
    assert "sw_power_cap" in REGISTRY["thermal_power.throttle"].not_a_fault
    assert "Not Supported" in REGISTRY["memory.retired_pages"].not_a_fault


def test_checks_run_lists_baseline_checks_only_when_the_baseline_sets_their_key(sim_node, sim_baseline):
    node = sim_node()
    with_baseline = set(checks_run(node, sim_baseline, fleet=False))
    without = set(checks_run(node, None, fleet=False))
    assert {"versions.driver", "config.persistence_mode", "topology.links", "config.gpu_count"} <= with_baseline
    assert not {"versions.driver", "config.persistence_mode", "topology.links", "config.gpu_count"} & without
    assert {"memory.ecc_dbe_volatile", "xid.recent", "nvlink.links_down", "pcie.replay_rate"} <= without


def test_checks_run_includes_fleet_drift_checks_for_what_the_baseline_leaves_open(sim_node):
    node = sim_node()
    assert "versions.driver" in checks_run(node, None)
    assert "versions.driver" not in checks_run(node, None, fleet=False)
    assert "topology.numa" in checks_run(node, None)


def test_checks_run_leaves_out_checks_a_passthrough_vm_cannot_run(passthrough_node):
    ran = checks_run(passthrough_node(), None)
    assert "nvlink.links_down" not in ran and "memory.retired_pages" not in ran and "config.fabric_state" not in ran


def test_threshold_texts_quote_the_current_defaults_and_every_threshold_is_used():
    import dataclasses
    import re

    from fleetops.baseline import DEFAULT_THRESHOLDS, Thresholds

    names = {f.name for f in dataclasses.fields(Thresholds)}
    quoted: dict[str, set[float]] = {}
    for spec in REGISTRY.values():
        for name, value in re.findall(r"\b([a-z_]+) \((\d+(?:\.\d+)?(?:e\d+)?)", spec.threshold):
            if name in names:
                quoted.setdefault(name, set()).add(float(value))
    assert set(quoted) == names
    for name, values in quoted.items():
        assert values == {float(getattr(DEFAULT_THRESHOLDS, name))}, name
