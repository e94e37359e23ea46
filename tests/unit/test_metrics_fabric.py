"""The RDMA ports on the agent's Prometheus page: one series per device and port (labels device,
port and role only, so the series stay bounded by the node's HCAs), the role by the checks' own
port rule, exact counters, promtool clean."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from promtool_util import assert_clean

from fleetops import checks, model
from fleetops.agent import metrics
from fleetops.checks import fabric

_SAMPLE = re.compile(r"^(fleetops_rdma_[a-z_]+)\{(.*)\} (\S+)$")


def rdma(node: model.Node, compute_ports: frozenset[str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], str]:
    page = metrics.render(metrics.MetricsInput(
        node=node, agent=metrics.AgentInfo(started_at=node.collected_at - 60, interval_s=2.0),
        findings=tuple(checks.run_node_checks(node, None)), compute_ports=compute_ports,
    ))
    out = {}
    for line in page.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = tuple(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = m.group(3)
    return out


def test_each_port_is_one_series_by_device_and_port_with_exact_counters(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node(faults=["ib-port-down@3"])
    got = rdma(node)
    assert node.fabric is not None and node.fabric.hcas is not None
    for hca in node.fabric.hcas:
        role = "excluded" if hca.name == "mlx5_8" else "compute"  # the Ethernet management port
        key = (("device", hca.name), ("port", "1"), ("role", role))
        port = hca.ports[0]
        assert got[("fleetops_rdma_port_up", key)] == ("0" if hca.name == "mlx5_3" else "1")
        assert port.counters is not None
        assert got[("fleetops_rdma_port_transmit_bytes_total", key)] == str(port.counters["port_xmit_data"] * 4)
        assert got[("fleetops_rdma_port_link_downed_total", key)] == str(port.counters["link_downed"])
        assert got[("fleetops_rdma_hca_info", (("device", hca.name), ("fw_ver", hca.fw_ver),
                                               ("board_id", hca.board_id)))] == "1"
    assert got[("fleetops_rdma_port_rate_bytes_per_second",
                (("device", "mlx5_0"), ("port", "1"), ("role", "compute")))] == "50000000000.0"
    port_series = {labels for name, labels in got if name.startswith("fleetops_rdma_port_")}
    assert {tuple(k for k, _ in labels) for labels in port_series} == {("device", "port", "role")}
    assert len(port_series) == 9


def test_the_role_is_the_checks_rule_for_compute_ports(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node()
    assert node.fabric is not None and node.fabric.hcas is not None
    # without a baseline: the HCAs beside a GPU are compute ports, the management port is not
    want, _ = fabric.port_labels(node, None)
    roles = {dict(labels)["device"]: dict(labels)["role"] for name, labels in rdma(node) if name == "fleetops_rdma_port_up"}
    assert {d for d, r in roles.items() if r == "compute"} == {k.split("/")[0] for k in want}
    assert roles["mlx5_8"] == "excluded" and len(roles) == 9
    # the daemon's word (its baseline excludes mlx5_2) wins over the default rule
    given = frozenset(k for k in want if not k.startswith("mlx5_2/"))
    roles = {dict(labels)["device"]: dict(labels)["role"]
             for name, labels in rdma(node, given) if name == "fleetops_rdma_port_up"}
    assert roles["mlx5_2"] == "excluded" and roles["mlx5_3"] == "compute" and roles["mlx5_8"] == "excluded"


def test_a_node_without_rdma_has_no_rdma_series(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node()
    node.fabric = model.Fabric(hcas=[], note="no RDMA device")
    assert rdma(node) == {}


@pytest.mark.promtool
def test_the_page_with_rdma_ports_passes_promtool(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node(faults=["ib-degraded@2"])
    page = metrics.render(metrics.MetricsInput(
        node=node, agent=metrics.AgentInfo(started_at=node.collected_at - 60, interval_s=2.0),
        findings=tuple(checks.run_node_checks(node, None)),
    ))
    assert "fleetops_rdma_port_rate_bytes_per_second" in page
    assert_clean(page)
