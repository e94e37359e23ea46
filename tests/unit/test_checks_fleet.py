"""Fleet drift without a baseline: the minority is named against the majority; what the
baseline pins is checked per node instead."""

from __future__ import annotations

from fleetops import baseline
from fleetops.checks import run_fleet_checks, run_node_checks


def _fleet(sim_node, faults_by_host: dict[str, list[str]], size: int = 5):
    return [sim_node(f"n{i}", faults=faults_by_host.get(f"n{i}", [])) for i in range(1, size + 1)]


def test_driver_drift_names_the_minority_node_against_the_majority(sim_node):
    findings = run_fleet_checks(_fleet(sim_node, {"n3": ["driver-drift"]}), None)
    [f] = [f for f in findings if f.check == "versions.driver"]
    assert f.node == "n3" and f.gpu is None and f.severity == "warn"
    assert f.observed == "570.133.20" and f.expected == "580.159.04"
    assert "minority nodes: n3" in f.message and "4 of 5 nodes" in f.message


def test_every_minority_node_is_named_in_each_finding(sim_node):
    findings = run_fleet_checks(_fleet(sim_node, {"n2": ["driver-drift"], "n4": ["driver-drift"]}), None)
    drift = [f for f in findings if f.check == "versions.driver"]
    assert sorted(f.node for f in drift) == ["n2", "n4"]
    assert all("minority nodes: n2, n4" in f.message for f in drift)


def test_vbios_drift_is_per_gpu_model_and_points_at_the_gpu(sim_node):
    nodes = _fleet(sim_node, {"n5": ["vbios-drift@2"]})
    [f] = [f for f in run_fleet_checks(nodes, None) if f.check == "versions.vbios"]
    assert (f.node, f.gpu["uuid"]) == ("n5", nodes[4].gpus[2].uuid)
    assert f.expected == "96.00.A5.00.1A" and "NVIDIA H200 GPUs" in f.message


def test_power_limit_drift_per_model_names_the_gpu(sim_node):
    nodes = _fleet(sim_node, {"n1": ["power-cap-drift@6"]})
    [f] = [f for f in run_fleet_checks(nodes, None) if f.check == "thermal_power.power_limit"]
    assert (f.node, f.gpu["index"], f.observed, f.expected) == ("n1", 6, 500.0, 700.0)
    assert "fleetops apply power" in f.action


def test_inforom_cuda_and_fabric_manager_drift_against_the_majority(sim_node):
    nodes = _fleet(sim_node, {})
    nodes[0].gpus[0].inforom_image = "G520.0282.00.01"
    nodes[1].cuda_driver_version = "12.8"
    nodes[2].packages["nvidia-fabricmanager-580"] = "580.95.05-1"
    got = {(f.check, f.node) for f in run_fleet_checks(nodes, None)}
    assert got == {("versions.inforom", "n1"), ("versions.cuda", "n2"), ("versions.fabric_manager", "n3")}


def test_a_split_fleet_without_majority_flags_every_side(sim_node):
    nodes = _fleet(sim_node, {"n1": ["driver-drift"]}, size=2)
    drift = [f for f in run_fleet_checks(nodes, None) if f.check == "versions.driver"]
    assert sorted(f.node for f in drift) == ["n1", "n2"]
    assert all(f.expected is None and "no majority" in f.message for f in drift)


def test_pinned_values_are_left_to_the_node_checks(sim_node, sim_baseline):
    nodes = _fleet(sim_node, {"n3": ["driver-drift", "vbios-drift@1", "power-cap-drift@2"]})
    assert run_fleet_checks(nodes, sim_baseline) == []
    node_checks = {f.check for f in run_node_checks(nodes[2], sim_baseline, None)}
    assert {"versions.driver", "versions.vbios", "thermal_power.power_limit"} <= node_checks


def test_values_the_baseline_does_not_pin_still_drift_across_the_fleet(sim_node):
    nodes = _fleet(sim_node, {"n3": ["driver-drift", "vbios-drift@1"]})
    b = baseline.from_mapping({"driver_version": "580.159.04"}, "partial")
    assert {f.check for f in run_fleet_checks(nodes, b)} == {"versions.vbios"}


def test_unreadable_values_do_not_vote_or_drift(sim_node):
    nodes = _fleet(sim_node, {})
    nodes[1].driver_version = None
    nodes[1].unavailable["driver_version"] = "NoPermission"
    assert run_fleet_checks(nodes, None) == []


def test_numa_placement_drift_is_compared_per_bus_id_where_known(sim_node, passthrough_node):
    nodes = _fleet(sim_node, {})
    nodes[3].gpus[0].numa_node = 1  # the others have their first GPU on NUMA node 0
    [f] = run_fleet_checks(nodes + [passthrough_node()], None)
    assert (f.check, f.node, f.gpu["index"], f.observed, f.expected) == ("topology.numa", "n4", 0, 1, 0)
