"""Issue 27: one health order for the audit's exit code, the Prometheus node health and the JSON
``worst``/``health``; the JSON's per-node health and worst finding, and each finding's action code."""

from __future__ import annotations

import json

import pytest

from fleetops import model
from fleetops.catalog import remedies
from fleetops.checks import verdict
from fleetops.checks.verdict import NodeResult
from fleetops.common import errors
from fleetops.fleet.audit import AuditResult
from fleetops.remedy import plan
from fleetops.report import json_report, prometheus

GPU2 = {"index": 2, "uuid": "GPU-2", "bus_id": "0000:3a:00.0"}


def _f(severity: str, check: str = "x.y", node: str = "n1", gpu: dict[str, object] | None = None) -> model.Finding:
    return model.Finding(check=check, severity=severity, node=node, message=f"{check} {severity}", gpu=gpu)


def _down(node: str = "n9") -> model.Finding:
    return model.Finding(check="transport.unreachable", severity="unknown", node=node,
                         message="unreachable: connection refused", observed="unreachable")


@pytest.mark.parametrize(
    ("found", "fail_on", "code"),
    [
        ([], "warn", 0),
        ([_f("info")], "warn", 0),
        ([_f("unknown")], "warn", 3),
        ([_f("warn"), _f("unknown")], "warn", 1),  # a warning outranks an unreadable value
        ([_f("crit"), _f("warn"), _f("unknown")], "warn", 2),
        ([_f("warn"), _down()], "warn", 3),  # was 1: the warning hid the dead node
        ([_f("crit"), _down()], "warn", 3),  # was 2
        ([_f("warn"), _down()], "crit", 3),  # --fail-on crit never lets a dead node pass
        ([_f("warn")], "crit", 0),
        ([_f("warn"), _f("unknown")], "crit", 3),
    ],
)
def test_the_exit_code_is_that_of_the_worst_health_level(found: list[model.Finding], fail_on: str, code: int) -> None:
    assert verdict.exit_code(found, fail_on) == code


def test_an_unreachable_node_outranks_every_finding_and_unknown_ranks_below_warn_everywhere() -> None:
    order = model.HEALTH_ORDER
    assert order.index("unknown") < order.index("warn") < order.index("crit") < order.index(model.UNREACHABLE)
    # the finding severities keep the same relative order
    assert model.SEVERITY_RANK["unknown"] < model.SEVERITY_RANK["warn"] < model.SEVERITY_RANK["crit"]
    assert set(errors.AUDIT_EXIT) == set(order)
    assert model.finding_health(_down()) == model.UNREACHABLE
    assert model.finding_health(_f("info")) == "ok"
    assert model.worst_health(["warn", model.UNREACHABLE, "crit"]) == model.UNREACHABLE
    assert model.worst_health([]) == "ok"


def _result() -> AuditResult:
    nodes = [NodeResult("n1", True), NodeResult("n2", True), NodeResult("n3", True), NodeResult("n9", False, "unreachable")]
    findings = [
        _f("crit", "memory.ecc_dbe_volatile", "n1", GPU2),
        _f("warn", "thermal_power.power_limit", "n1", {"index": 0, "uuid": "GPU-0", "bus_id": "0000:18:00.0"}),
        _f("warn", "pcie.replay_rate", "n2", GPU2),
        _f("unknown", "memory.unreadable", "n2"),
        _f("info", "pcie.replay_rate", "n3", GPU2),
        _down("n9"),
    ]
    return AuditResult(started_at=0.0, duration_s=1.0, nodes=nodes, findings=findings)


def test_prometheus_node_health_and_json_health_follow_the_same_order() -> None:
    result = _result()
    code = verdict.exit_code(result.findings)
    assert code == errors.EXIT_UNKNOWN
    text = prometheus.render(result, code)
    values = {n: int(line.rsplit(" ", 1)[1]) for n in ("n1", "n2", "n3", "n9")
              for line in text.splitlines() if line.startswith(f'fleetops_node_health{{node="{n}"}}')}
    assert values == {"n1": 3, "n2": 2, "n3": 0, "n9": 4}  # crit, warn, ok (info), unreachable
    doc = json_report.document(result, code)
    health = {n["name"]: n["health"] for n in doc["nodes"]}
    assert health == {"n1": "crit", "n2": "warn", "n3": "ok", "n9": "unreachable"}
    assert all(values[n] == model.HEALTH_RANK[h] == prometheus.severity_value(h) for n, h in health.items())
    assert doc["summary"]["worst"] == "unreachable" and doc["summary"]["exit_code"] == 3
    assert errors.AUDIT_EXIT[doc["summary"]["worst"]] == code


def test_json_nodes_carry_their_worst_finding_and_findings_their_action_code() -> None:
    result = _result()
    doc = json.loads(json_report.render(result, verdict.exit_code(result.findings)))
    assert doc["schema"] == model.FINDINGS_SCHEMA_ID == "fleetops.audit/v2"
    worst = {n["name"]: n["worst_finding"] for n in doc["nodes"]}
    assert worst["n1"] == {
        "check": "memory.ecc_dbe_volatile", "severity": "crit", "gpu": GPU2,
        "message": "memory.ecc_dbe_volatile crit", "action_code": "reset_gpu",
    }
    assert worst["n2"] is not None and worst["n2"]["check"] == "pcie.replay_rate"  # warn over unknown
    assert worst["n3"] is None  # only info: health ok
    assert worst["n9"] is not None and worst["n9"]["check"] == "transport.unreachable"
    codes = {(f["node"], f["check"]): f["action_code"] for f in doc["findings"]}
    assert codes == {
        ("n1", "memory.ecc_dbe_volatile"): "reset_gpu",
        ("n1", "thermal_power.power_limit"): "apply_power",
        ("n2", "pcie.replay_rate"): "drain",
        ("n2", "memory.unreadable"): "none",
        ("n3", "pcie.replay_rate"): "none",
        ("n9", "transport.unreachable"): "none",
    }
    assert all(c in (*remedies.ACTIONS, *remedies.SIDE_ACTIONS) for c in codes.values())


def test_the_planner_and_the_report_share_one_action_rule() -> None:
    assert plan.action_for is remedies.action_for and plan.BY_CHECK is remedies.BY_CHECK
