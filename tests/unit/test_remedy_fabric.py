"""Remediation plans for the HCAs' findings, from the checks' own findings on simulated nodes: a
compute port down drains the node for inspection and names the port (device, port, netdev, PCI
address) and the technician's action; firmware drift is an update to look at, never a GPU reset;
a management port down, a flap or a drop on an excluded port drains nothing."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetops import checks, model
from fleetops.baseline import DEFAULT_THRESHOLDS
from fleetops.checks import fabric
from fleetops.remedy import plan


def plan_for(nodes: list[model.Node]) -> plan.Plan:
    found: list[model.Finding] = []
    for node in nodes:
        found += checks.run_node_checks(node, None)
    found += fabric.run_fleet(nodes, None)
    return plan.build(found, [n.hostname for n in nodes])


def port_of(node: model.Node, device: str) -> tuple[model.Hca, model.HcaPort]:
    assert node.fabric is not None and node.fabric.hcas is not None
    hca = next(h for h in node.fabric.hcas if h.name == device)
    return hca, hca.ports[0]


def test_a_compute_port_down_drains_for_inspection_naming_the_port_and_what_to_do(
    sim_node: Callable[..., model.Node],
) -> None:
    node = sim_node("n1", faults=["ib-port-down@3"])
    hca, port = port_of(node, "mlx5_3")
    p = plan_for([node])
    [n1] = p.nodes
    assert n1.action == "drain_and_inspect" and n1.resets == []
    [item] = n1.items
    assert item.gpu is None and item.action == "drain_and_inspect"
    [reason] = item.reasons
    assert reason["check"] == "fabric.port_down" and reason["severity"] == "crit"
    assert reason["hca"] == {"device": "mlx5_3", "port": 1, "netdev": port.netdev, "pci_address": hca.pci_address}
    assert port.netdev and hca.pci_address  # the simulated rail has both
    text = plan.render(p)
    assert f"at: mlx5_3 port 1, netdev {port.netdev}, PCI {hca.pci_address}" in text
    assert "reseat them, then replace the cable or transceiver" in text
    assert "Drain and send for inspection: n1" in text


def test_firmware_drift_is_an_update_to_look_at_never_a_reset(sim_node: Callable[..., model.Node]) -> None:
    nodes = [sim_node(f"n{i}", faults=["ib-fw-drift@2"] if i == 1 else []) for i in range(1, 5)]
    hca, _ = port_of(nodes[0], "mlx5_2")
    p = plan_for(nodes)
    assert [n.node for n in p.nodes] == ["n1"]
    [n1] = p.nodes
    assert n1.action == "none" and p.resets == []
    assert [(i.action, [r["check"] for r in i.reasons]) for i in n1.items] == [("inspect", ["fabric.firmware"])]
    assert n1.items[0].reasons[0]["hca"] == {"device": "mlx5_2", "pci_address": hca.pci_address}
    text = plan.render(p)
    assert "what to do: Update the HCA's firmware" in text and "reset GPU" not in text


def test_the_management_port_down_drains_nothing(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1", faults=["ib-port-down@8"])  # mlx5_8: the Ethernet management port
    _, port = port_of(node, "mlx5_8")
    assert port.link_layer == "Ethernet" and not port.active
    p = plan_for([node])
    [n1] = p.nodes
    assert n1.action == "none"
    assert [(i.action, i.severity, i.reasons[0]["check"], i.reasons[0]["hca"]["device"]) for i in n1.items] == [
        ("inspect", "warn", "fabric.port_down", "mlx5_8")]
    assert "Drain" not in plan.render(p)


def test_a_flap_or_drop_drains_a_compute_port_only() -> None:
    """The daemon's flaps and drops: their action text says "inspect", which would be read as a
    drain for any severity; the table keeps an excluded port's (warn) to a look."""
    th = DEFAULT_THRESHOLDS
    now = time.time()
    falls = [(now - 900 + 100 * i + dt, up, i) for i in range(3) for dt, up in ((0, False), (40, True))]
    refs = {k: {"device": k.split("/")[0], "port": 1, "netdev": "x", "pci_address": "0000:00:00.0"}
            for k in ("mlx5_0/1", "mlx5_8/1")}
    found = fabric.history_findings("n1", {"mlx5_0/1": falls}, {"mlx5_0/1"}, refs, now, th)
    found += fabric.history_findings("n2", {"mlx5_8/1": falls}, {"mlx5_0/1"}, refs, now, th)
    found += fabric.history_findings("n3", {"mlx5_8/1": [(now - 300, False, 1)]}, set(), refs, now, th)
    assert sorted((f.node, f.check, f.severity) for f in found) == [
        ("n1", "fabric.flap", "crit"), ("n2", "fabric.flap", "warn"), ("n3", "fabric.drop", "warn")]
    p = plan.build(found, ["n1", "n2", "n3"])
    assert {n.node: n.action for n in p.nodes} == {"n1": "drain_and_inspect", "n2": "none", "n3": "none"}
