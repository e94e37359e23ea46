"""Every shipped alert keeps the ``node`` and ``group`` labels ``fleetops prometheus targets``
gives each target (its file_sd): an aggregation ``by (...)`` names both, none aggregates
``without`` them, and every summary names the node. Read from the YAML; needs no promtool."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "prometheus" / "fleetops-rules.yml"
KEPT = ("node", "group")
# One alert per group by design, not per node (the comment on the rule says why).
FLEET_WIDE = {"FleetopsHealthDrainBreakerOpen": ("group",)}
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_WITHOUT = re.compile(r"\bwithout\s*\(([^)]*)\)")


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_the_rules_have_alerts() -> None:
    assert len(alerts()) >= 20


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_every_aggregation_keeps_node_and_group(rule: dict[str, Any]) -> None:
    kept = FLEET_WIDE.get(rule["alert"], KEPT)
    for grouping in _BY.findall(rule["expr"]):
        labels = {label.strip() for label in grouping.split(",")}
        assert set(kept) <= labels, f"{rule['alert']}: by ({grouping}) drops {sorted(set(kept) - labels)}"
    for dropped in _WITHOUT.findall(rule["expr"]):
        labels = {label.strip() for label in dropped.split(",")}
        assert not set(KEPT) & labels, f"{rule['alert']}: without ({dropped}) drops node or group"


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_every_summary_names_the_node(rule: dict[str, Any]) -> None:
    summary = rule["annotations"]["summary"]
    wanted = "{{ $labels.group }}" if rule["alert"] in FLEET_WIDE else "{{ $labels.node }}"
    assert wanted in summary, summary
    if "$labels.instance" in summary:
        assert "{{ $labels.node }}" in summary, summary


def test_the_checker_catches_a_rule_that_drops_them() -> None:
    bad = {"alert": "X", "expr": "max by (instance, gpu) (fleetops_gpu_finding) == 1"}
    with pytest.raises(AssertionError, match=r"drops \['group', 'node'\]"):
        test_every_aggregation_keeps_node_and_group(bad)
    with pytest.raises(AssertionError, match="without"):
        test_every_aggregation_keeps_node_and_group({"alert": "Y", "expr": "sum without (node) (up)"})
