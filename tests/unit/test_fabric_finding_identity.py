"""A fabric finding's identity is its port: two ports of one node down are two findings in the
history (one resolves when its port comes back, the other persists), not one key that hides the
second port. Findings stored before they carried a port keep their identity."""

from __future__ import annotations

import json
import time
from typing import Any

from fleetops import model
from fleetops.checks import run_node_checks
from fleetops.checks.verdict import NodeResult
from fleetops.fleet.audit import AuditResult
from fleetops.fleet.store.database import Store
from fleetops.sim import gpu as sim


def _node(faults: list[str], now: float) -> model.Node:
    doc = sim.snapshot(sim.build_state("n1", {"faults": faults}), now=now)
    doc.pop("_kernel_log")
    doc["collected_at"] = now
    return model.node_from_dict(doc)


def _audit(node: model.Node, started: float) -> AuditResult:
    findings = run_node_checks(node, None, None)
    return AuditResult(started_at=started, duration_s=1.0, nodes=[NodeResult(node.hostname, True, None, node, 0.1)],
                       findings=findings, inventory="inv.yml")


def _faults(findings: list[model.Finding]) -> list[tuple[str, str, str | None, str]]:
    return sorted((f.check, f.severity, f.port, f.key) for f in findings if f.severity in ("warn", "crit"))


def test_two_compute_ports_down_on_one_node_are_two_findings_with_their_own_keys() -> None:
    found = run_node_checks(_node(["ib-port-down@3", "ib-port-down@5"], time.time()), None, None)
    assert _faults(found) == [
        ("fabric.port_down", "crit", "mlx5_3/1", "n1|fabric.port_down||mlx5_3/1"),
        ("fabric.port_down", "crit", "mlx5_5/1", "n1|fabric.port_down||mlx5_5/1"),
    ]


def test_the_history_resolves_the_port_that_came_back_and_keeps_the_one_still_down(tmp_path) -> None:
    t0 = time.time()
    with Store(str(tmp_path / "h.db")) as store:
        store.record(_audit(_node(["ib-port-down@3", "ib-port-down@5"], t0), t0), 2)
        second = store.record(_audit(_node(["ib-port-down@3"], t0 + 60), t0 + 60), 2)
        diff = store.diff(second)
    assert [(f.check, f.port) for f in diff["resolved"]] == [("fabric.port_down", "mlx5_5/1")]
    assert [(f.check, f.port) for f in diff["persisting"]] == [("fabric.port_down", "mlx5_3/1")]
    assert diff["new"] == []


def test_the_port_is_in_a_fabric_findings_json_and_absent_from_every_other() -> None:
    fabric = model.Finding("fabric.port_down", "crit", "n1", "down", observed={"device": "mlx5_3", "port": 1},
                           port="mlx5_3/1")
    gpu = model.Finding("memory.ecc_dbe_volatile", "crit", "n1", "dbe", gpu={"index": 2, "uuid": "GPU-2", "bus_id": "b"})
    assert fabric.to_dict()["port"] == "mlx5_3/1"
    assert model.Finding.from_dict(json.loads(json.dumps(fabric.to_dict()))) == fabric
    assert list(gpu.to_dict()) == ["check", "severity", "node", "gpu", "observed", "expected", "message", "action"]
    assert gpu.key == "n1|memory.ecc_dbe_volatile|GPU-2"


def _stored(check: str, observed: Any) -> dict[str, Any]:
    # a finding as the store and the daemon wrote it before findings carried a port
    return {"check": check, "severity": "crit", "node": "n1", "gpu": None, "observed": observed,
            "expected": "4: ACTIVE", "message": "m", "action": "a"}


def test_a_fabric_finding_stored_without_a_port_reads_back_with_the_port_its_observed_names() -> None:
    port_down = model.Finding.from_dict(_stored("fabric.port_down", {"device": "mlx5_3", "port": 1, "state": "1: DOWN"}))
    firmware = model.Finding.from_dict(_stored("fabric.firmware", {"device": "mlx5_2", "fw_ver": "28.1"}))
    count = model.Finding.from_dict(_stored("fabric.port_count", {"compute_ports": 7}))
    other = model.Finding.from_dict(_stored("pcie.link", {"device": "x", "port": 1}))
    assert (port_down.port, port_down.key) == ("mlx5_3/1", "n1|fabric.port_down||mlx5_3/1")
    assert (firmware.port, firmware.key) == ("mlx5_2", "n1|fabric.firmware||mlx5_2")
    assert (count.port, count.key) == (None, "n1|fabric.port_count|")
    assert (other.port, other.key) == (None, "n1|pcie.link|")
