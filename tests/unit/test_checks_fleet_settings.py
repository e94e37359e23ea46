"""Settings without a baseline: every GPU is judged against the strict majority of its GPU model
across the fleet; a tie, or a fleet too small to vote, reports nothing; the baseline wins."""

from __future__ import annotations

from fleetops import baseline
from fleetops.checks import REGISTRY, checks_run, run_fleet_checks


def _fleet(sim_node, faults_by_host: dict[str, list[str]], size: int = 16):
    return [sim_node(f"n{i:02d}", faults=faults_by_host.get(f"n{i:02d}", [])) for i in range(1, size + 1)]


def _one_of_each(sim_node):
    nodes = _fleet(sim_node, {"n03": ["persistence-off@2"], "n07": ["mig-drift@5"]})
    nodes[10].gpus[1].ecc_mode_current = False  # n11 GPU 1
    nodes[10].gpus[1].ecc_mode_pending = False
    nodes[14].gpus[7].compute_mode = "Exclusive_Process"  # n15 GPU 7
    return nodes


def test_each_minority_setting_is_found_on_its_gpu_with_exact_severity(sim_node):
    nodes = _one_of_each(sim_node)
    got = sorted((f.check, f.node, f.gpu["index"], f.severity) for f in run_fleet_checks(nodes, None))
    assert got == [
        ("config.compute_mode", "n15", 7, "warn"),
        ("config.ecc_mode", "n11", 1, "warn"),
        ("config.mig_mode", "n07", 5, "warn"),
        ("config.persistence_mode", "n03", 2, "warn"),
    ]


def test_the_finding_names_the_gpu_and_counts_every_value(sim_node):
    nodes = _one_of_each(sim_node)
    by_check = {f.check: f for f in run_fleet_checks(nodes, None)}
    p = by_check["config.persistence_mode"]
    uuid = nodes[2].gpus[2].uuid
    assert p.gpu["uuid"] == uuid and uuid in p.message
    assert "persistence_mode off on n03" in p.message
    assert "fleet NVIDIA H200: on 127, off 1" in p.message
    assert (p.observed, p.expected) == (False, True)
    m = by_check["config.mig_mode"]
    assert "fleet NVIDIA H200: disabled 127, enabled 1" in m.message
    assert m.observed == {"current": True, "pending": True} and m.expected is False
    c = by_check["config.compute_mode"]
    assert "fleet NVIDIA H200: Default 127, Exclusive_Process 1" in c.message
    assert (c.observed, c.expected) == ("Exclusive_Process", "Default")
    assert "-c Default" in c.action
    e = by_check["config.ecc_mode"]
    assert e.observed == {"current": False, "pending": False} and e.expected is True
    assert "-e 1" in e.action and "fleetops reset n11" in e.action


def test_a_tie_reports_nothing(sim_node):
    nodes = _fleet(sim_node, {}, size=4)
    for n in nodes:
        n.gpus = n.gpus[:1]
    nodes[0].gpus[0].persistence_mode = False
    nodes[1].gpus[0].persistence_mode = False
    nodes[2].gpus[0].power_limit_w = 500.0
    nodes[3].gpus[0].power_limit_w = 500.0
    assert run_fleet_checks(nodes, None) == []
    nodes[3].gpus[0].persistence_mode = False  # 3 against 1: now the one left with "on" is the minority
    [f] = [f for f in run_fleet_checks(nodes, None) if f.check == "config.persistence_mode"]
    assert (f.node, f.observed, f.expected) == ("n03", True, False)


def test_too_few_gpus_of_a_model_make_no_majority(sim_node):
    nodes = _fleet(sim_node, {}, size=2)
    for n in nodes:
        n.gpus = n.gpus[:1]
    nodes[0].gpus[0].compute_mode = "Prohibited"
    assert run_fleet_checks(nodes, None) == []


def test_no_strict_majority_among_three_values_reports_nothing(sim_node):
    nodes = _fleet(sim_node, {}, size=1)
    gpus = nodes[0].gpus
    for g, mode in zip(gpus, ["Default"] * 3 + ["Prohibited"] * 3 + ["Exclusive_Process"] * 2, strict=True):
        g.compute_mode = mode
    assert [f for f in run_fleet_checks(nodes, None) if f.check == "config.compute_mode"] == []


def test_mixed_models_are_judged_per_model(sim_node):
    nodes = _fleet(sim_node, {}, size=6)
    for n in nodes[:3]:  # three H100 nodes, with persistence off: the H100 majority
        for g in n.gpus:
            g.name = "NVIDIA H100 80GB HBM3"
            g.persistence_mode = False
    nodes[0].gpus[4].persistence_mode = True  # the odd H100
    findings = [f for f in run_fleet_checks(nodes, None) if f.check == "config.persistence_mode"]
    assert [(f.node, f.gpu["index"], f.observed) for f in findings] == [("n01", 4, True)]
    assert "fleet NVIDIA H100 80GB HBM3: off 23, on 1" in findings[0].message


def test_a_baseline_that_sets_the_key_wins_with_no_double_finding(sim_node):
    nodes = _one_of_each(sim_node)
    b = baseline.from_mapping({"persistence_mode": True, "mig": {"mode": False}}, "partial")
    fleet = sorted(f.check for f in run_fleet_checks(nodes, b))
    assert fleet == ["config.compute_mode", "config.ecc_mode"]
    assert REGISTRY["config.persistence_mode"].fleet_applies(b) is False
    assert REGISTRY["config.compute_mode"].fleet_applies(b) is True
    node_ids = set(checks_run(nodes[2], b, fleet=False))
    assert {"config.persistence_mode", "config.mig_mode"} <= node_ids and "config.compute_mode" not in node_ids


def test_the_check_specs_say_how_a_tie_is_judged():
    for check in ("config.persistence_mode", "config.ecc_mode", "config.compute_mode", "config.mig_mode",
                  "thermal_power.power_limit"):
        spec = REGISTRY[check]
        assert spec.scope == "node+fleet" and "no finding on a tie" in spec.threshold, check
        assert spec.fleet_applies is not None and spec.fleet_applies(None)
