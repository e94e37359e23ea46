"""The fabric family, one rule at a time, on simulated nodes: which port, which severity, the
action, and what must stay silent (the management port, a healthy node, a node without RDMA)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetops import baseline, model
from fleetops.checks import REGISTRY, checks_run, run_fleet_checks, run_node_checks
from fleetops.sim import gpu as sim

FABRIC = {"compute_ports": 8, "link_layer": "InfiniBand", "rate_gbps": 400, "width": "4X",
          "firmware": "28.39.1002", "exclude_devices": ["mlx5_8"]}


def node(state: dict[str, Any], now: float | None = None) -> model.Node:
    now = time.time() if now is None else now
    doc = sim.snapshot(state, now=now)
    doc.pop("_kernel_log")
    doc["collected_at"] = now
    return model.node_from_dict(doc)


def fabric_findings(current: model.Node, base: baseline.Baseline | None = None,
                    previous: model.Node | None = None) -> list[model.Finding]:
    return [f for f in run_node_checks(current, base, previous) if f.check.startswith("fabric.")]


def pinned(**over: Any) -> baseline.Baseline:
    return baseline.from_mapping({"fabric": {**FABRIC, **over}}, "test")


def only(findings: list[model.Finding]) -> model.Finding:
    assert len(findings) == 1, [(f.check, f.severity, f.message) for f in findings]
    return findings[0]


@pytest.mark.parametrize("base", [None, "pinned"])
def test_a_healthy_simulated_node_has_no_fabric_finding(base: str | None) -> None:
    healthy = sim.build_state("n1")
    t0 = time.time()
    got = fabric_findings(node(healthy, t0 + 60), pinned() if base else None, node(healthy, t0))
    assert got == []


def test_a_compute_port_down_is_crit_and_names_device_port_netdev_and_pci() -> None:
    f = only(fabric_findings(node(sim.build_state("n1", {"faults": ["ib-port-down@3"]}))))
    assert (f.check, f.severity, f.gpu) == ("fabric.port_down", "crit", None)
    assert f.observed == {"device": "mlx5_3", "port": 1, "netdev": "ibp94s0", "pci_address": "0000:5e:00.0",
                          "link_layer": "InfiniBand", "state": "1: DOWN", "phys_state": "2: Polling"}
    assert "mlx5_3 port 1 (ibp94s0, 0000:5e:00.0)" in f.message
    assert "reseat" in (f.action or "") and "transceiver" in (f.action or "")


def _mgmt_down(state: dict[str, Any]) -> None:
    state["faults"].append({"name": "ib-port-down", "gpu": 8, "since": time.time()})  # mlx5_8


@pytest.mark.parametrize("base", [None, "pinned", "by link layer"])
def test_the_management_port_down_never_drains_the_node(base: str | None) -> None:
    state = sim.build_state("n1")
    _mgmt_down(state)
    b = {None: None, "pinned": pinned(),
         "by link layer": pinned(exclude_devices=None, exclude_link_layers=["Ethernet"])}[base]
    f = only(fabric_findings(node(state), b))
    assert (f.check, f.severity) == ("fabric.port_down", "warn")
    assert f.observed["device"] == "mlx5_8" and "not a compute port" in f.message


def test_a_disabled_port_is_told_to_be_inspected_not_recabled() -> None:
    state = sim.build_state("n1")
    current = node(state)
    assert current.fabric is not None and current.fabric.hcas is not None
    port = current.fabric.hcas[2].ports[0]
    port.state, port.phys_state = "1: DOWN", "3: Disabled"
    f = only(fabric_findings(current))
    assert f.severity == "crit" and "disabled" in (f.action or "") and "configuration" in (f.action or "")


def test_a_degraded_port_against_the_baseline_is_crit_and_against_its_peers_warn() -> None:
    state = sim.build_state("n1", {"faults": ["ib-degraded@6"]})
    f = only(fabric_findings(node(state), pinned()))
    assert (f.check, f.severity, f.observed["device"]) == ("fabric.port_degraded", "crit", "mlx5_6")
    assert f.expected == {"rate_gbps": 400.0, "width": "4X", "link_layer": "InfiniBand"}
    assert "200 Gb/s below the baseline's 400 Gb/s" in f.message and "width 2X below" in f.message
    f = only(fabric_findings(node(state)))
    assert (f.check, f.severity) == ("fabric.port_degraded", "warn")
    assert "the node's other compute ports' 400 Gb/s" in f.message
    assert f.expected == {"rate_gbps": 400.0, "width": "4X"}  # no baseline: no link layer expected


def test_a_port_slower_than_its_peers_stays_warn_when_the_baseline_pins_only_the_link_layer() -> None:
    b = baseline.from_mapping({"fabric": {"link_layer": "InfiniBand"}}, "test")
    f = only(fabric_findings(node(sim.build_state("n1", {"faults": ["ib-degraded@6"]})), b))
    assert (f.check, f.severity) == ("fabric.port_degraded", "warn")


def test_compute_ports_on_another_link_layer_than_the_baselines_are_each_reported() -> None:
    got = fabric_findings(node(sim.build_state("n1")), pinned(link_layer="Ethernet"))
    assert {(g.check, g.severity) for g in got} == {("fabric.port_degraded", "crit")}
    assert sorted(g.observed["device"] for g in got) == [f"mlx5_{i}" for i in range(8)]
    assert all("link layer InfiniBand, the baseline's is Ethernet" in g.message for g in got)


def test_firmware_drift_against_the_baseline_names_the_hca() -> None:
    f = only(fabric_findings(node(sim.build_state("n1", {"faults": ["ib-fw-drift@1"]})), pinned()))
    assert (f.check, f.severity, f.expected) == ("fabric.firmware", "warn", "28.39.1002")
    assert f.observed == {"device": "mlx5_1", "pci_address": "0000:2b:00.0", "board_id": "MT_0000000838",
                          "fw_ver": "28.37.1014"}
    assert "Update the HCA's firmware to 28.39.1002" in (f.action or "")


def test_without_a_baseline_firmware_and_port_count_are_the_fleets_majority() -> None:
    nodes = [node(sim.build_state(f"n{i}")) for i in range(4)]
    nodes.append(node(sim.build_state("n9", {"faults": ["ib-fw-drift@2", "ib-missing-hca@5"]})))
    got = {(f.check, f.node, f.severity) for f in run_fleet_checks(nodes, None) if f.check.startswith("fabric.")}
    assert got == {("fabric.firmware", "n9", "warn"), ("fabric.port_count", "n9", "warn")}
    # pinned in the baseline: the node checks judge, the majority says nothing
    assert [f for f in run_fleet_checks(nodes, pinned()) if f.check.startswith("fabric.")] == []


def test_a_node_whose_rails_all_run_slower_than_the_fleet_is_found_by_the_majority() -> None:
    nodes = [node(sim.build_state(f"n{i}")) for i in range(4)]
    slow = sim.build_state("n9", {"faults": [f"ib-degraded@{i}" for i in range(8)]})
    nodes.append(node(slow))
    assert fabric_findings(nodes[-1]) == []  # every rail alike: nothing to compare on the node itself
    f = only([f for f in run_fleet_checks(nodes, None) if f.check.startswith("fabric.")])
    assert (f.check, f.node, f.severity, f.observed, f.expected) == (
        "fabric.port_degraded", "n9", "warn", {"rate_gbps": 200.0}, {"rate_gbps": 400.0})


def test_fewer_compute_ports_than_the_baseline_is_crit() -> None:
    state = sim.build_state("n1", {"faults": ["ib-missing-hca@5"]})
    got = {f.check: f for f in fabric_findings(node(state), pinned())}
    assert sorted(got) == ["fabric.gpu_without_hca", "fabric.port_count"]
    count = got["fabric.port_count"]
    assert (count.severity, count.observed["compute_ports"], count.expected) == ("crit", 7, 8)


def test_a_node_without_rdma_is_silent_without_a_baseline_and_crit_with_one() -> None:
    state = sim.build_state("n1")
    del state["fabric"]  # the lent H200 VM has no RDMA device
    current = node(state)
    assert current.fabric is not None and current.fabric.hcas == []
    assert fabric_findings(current) == []
    f = only(fabric_findings(current, pinned()))
    assert (f.check, f.severity, f.observed["compute_ports"]) == ("fabric.port_count", "crit", 0)
    assert "no RDMA device" in f.message


def test_a_gpu_with_no_hca_on_its_switch_is_named_by_uuid_and_bus_id() -> None:
    state = sim.build_state("n1", {"faults": ["ib-missing-hca@5"]})
    f = only(fabric_findings(node(state)))
    gpu = state["gpus"][5]
    assert (f.check, f.severity) == ("fabric.gpu_without_hca", "warn")
    assert f.gpu == {"index": 5, "uuid": gpu["uuid"], "bus_id": gpu["bus_id"]}
    assert "lspci" in (f.action or "")


def test_link_downed_growth_on_an_active_port_is_crit_and_on_a_down_one_is_port_down_only() -> None:
    healthy = sim.build_state("n1")
    t0 = time.time()
    f = only(fabric_findings(node(sim.build_state("n1", {"faults": ["ib-link-downed@7"]}), t0 + 60), None,
                             node(healthy, t0)))
    assert (f.check, f.severity, f.observed["device"], f.observed["link_downed_growth"]) == (
        "fabric.link_downed", "crit", "mlx5_7", 1)
    f = only(fabric_findings(node(sim.build_state("n1", {"faults": ["ib-port-down@7"]}), t0 + 60), None,
                             node(healthy, t0)))
    assert f.check == "fabric.port_down"
    # a counter that went back (a driver reload) is a new base, not a finding
    assert fabric_findings(node(healthy, t0 + 120), None,
                           node(sim.build_state("n1", {"faults": ["ib-link-downed@7"]}), t0)) == []


def test_a_fatal_counter_that_grows_is_crit() -> None:
    healthy = sim.build_state("n1")
    grown = sim.build_state("n1")
    grown["fabric"][4]["hw_counters"]["rnr_nak_retry_err"] = 2  # added to the months-of-traffic values
    grown["fabric"][4]["counters"]["local_link_integrity_errors"] = 1
    t0 = time.time()
    f = only(fabric_findings(node(grown, t0 + 30), None, node(healthy, t0)))
    assert (f.check, f.severity) == ("fabric.error_counters", "crit")
    assert f.observed["rnr_nak_retry_err"] == 2 and f.observed["local_link_integrity_errors"] == 1


def test_symbol_errors_warn_above_10_per_s_and_are_crit_above_120_within_the_hour() -> None:
    healthy = sim.build_state("n1")
    t0 = time.time()
    burst = sim.build_state("n1")
    burst["fabric"][0]["counters"]["symbol_error"] = 115  # 10.5/s over 11 s, fewer than 120
    f = only(fabric_findings(node(burst, t0 + 11), None, node(healthy, t0)))
    assert (f.check, f.severity) == ("fabric.link_errors", "warn")
    storm = sim.build_state("n1", {"faults": ["ib-symbol-errors@0"]})
    f = only(fabric_findings(node(storm, t0 + 120), None, node(healthy, t0)))
    assert (f.check, f.severity, f.observed["device"]) == ("fabric.link_errors", "crit", "mlx5_0")
    # raised thresholds in the baseline: nothing
    lax = baseline.from_mapping({"thresholds": {"fabric_symbol_errors_per_hour_crit": 1e9,
                                                "fabric_symbol_errors_per_s_warn": 1e6}}, "t")
    assert fabric_findings(node(storm, t0 + 120), lax, node(healthy, t0)) == []


def test_unreadable_fabric_is_unknown_never_a_fault() -> None:
    current = node(sim.build_state("n1"))
    current.fabric = model.Fabric(hcas=None, unavailable={"hcas": "/sys/class/infiniband: unreadable: Permission denied"})
    f = only(fabric_findings(current, pinned()))
    assert (f.check, f.severity) == ("fabric.unreadable", "unknown")
    current.fabric = None  # an older agent: not collected
    assert fabric_findings(current, pinned()) == []


def test_every_fabric_rule_is_in_the_catalog_with_its_source() -> None:
    ids = {i for i in REGISTRY if i.startswith("fabric.")}
    assert ids == {"fabric.port_down", "fabric.port_degraded", "fabric.firmware", "fabric.port_count",
                   "fabric.gpu_without_hca", "fabric.link_downed", "fabric.error_counters", "fabric.link_errors",
                   "fabric.flap", "fabric.drop", "fabric.unreadable"}
    for i in ids - {"fabric.unreadable"}:
        assert any(s in REGISTRY[i].threshold for s in ("gpud", "NVSentinel", "AzNHC", "GCM")), i
    ran = checks_run(node(sim.build_state("n1")), pinned())
    assert {"fabric.port_down", "fabric.firmware", "fabric.port_count"} <= set(ran)


def test_counter_rates_are_taken_over_the_ports_own_read_times() -> None:
    """The daemon's rate base is an older full snapshot stamped with a ring sample's time: the
    ports were read at their own time, and the rate is over that."""
    healthy = sim.build_state("n1")
    recovering = sim.build_state("n1")
    recovering["fabric"][2]["counters"]["link_error_recovery"] = 8
    t0 = time.time()
    previous = node(healthy, t0)  # fabric.read_at = t0
    previous.collected_at = t0 + 50  # the ring sample's time
    current = node(recovering, t0 + 100)
    assert fabric_findings(current, None, previous) == []  # 8 in 100 s: 4.8/min, under 5/min
    previous.fabric.read_at = t0 + 50  # had they been read then: 8 in 50 s, 9.6/min
    f = only(fabric_findings(current, None, previous))
    assert (f.check, f.severity, f.observed["device"]) == ("fabric.link_errors", "warn", "mlx5_2")


@pytest.mark.parametrize(("fault", "codes"), [
    ("ib-port-down@3", {"fabric.port_down": "drain_and_inspect"}),
    ("ib-fw-drift@3", {"fabric.firmware": "inspect"}),  # never the GPU firmware playbook, never a reboot
    ("ib-missing-hca@3", {"fabric.port_count": "drain_and_inspect", "fabric.gpu_without_hca": "inspect"}),
])
def test_the_action_code_of_a_fabric_finding(fault: str, codes: dict[str, str]) -> None:
    from fleetops.catalog import remedies

    got = fabric_findings(node(sim.build_state("n1", {"faults": [fault]})), pinned())
    assert {f.check: remedies.action_for(f) for f in got} == codes


def test_the_management_port_down_is_only_inspected() -> None:
    from fleetops.catalog import remedies

    state = sim.build_state("n1")
    _mgmt_down(state)
    f = only(fabric_findings(node(state), pinned()))
    assert remedies.action_for(f) == "inspect"
