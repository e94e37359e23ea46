"""The audit as one JSON document (schema ``fleetops.audit/v2``).

v2 over v1: each node carries its ``health`` (model.HEALTH_ORDER, the order of the exit code and
of the Prometheus node health; ``summary.worst`` is the worst of them) and its ``worst_finding``;
each finding carries its ``action_code``, the remediation planner's action for it
(``fleetops.catalog.remedies.action_for``: ``reset_gpu``, ``reboot_node``, ``none`` ...).
"""

from __future__ import annotations

import json
from typing import Any

from fleetops import model
from fleetops.catalog.remedies import action_for


def finding_dict(f: model.Finding) -> dict[str, Any]:
    return {**f.to_dict(), "action_code": action_for(f)}


def worst_finding(findings: list[model.Finding]) -> dict[str, Any] | None:
    """The finding that sets a node's health (first of the worst, in the audit's order: GPU
    index, then check id), or None for a node whose health is ok."""
    ranked = [f for f in findings if model.finding_health(f) != "ok"]
    if not ranked:
        return None
    top = min(
        ranked,
        key=lambda f: (-model.HEALTH_RANK[model.finding_health(f)], (f.gpu or {}).get("index", -1), f.check),
    )
    return {
        "check": top.check,
        "severity": top.severity,
        "gpu": top.gpu,
        "message": top.message,
        "action_code": action_for(top),
    }


def document(result: Any, exit_code: int) -> dict[str, Any]:
    health = result.node_health()
    by_node: dict[str, list[model.Finding]] = {}
    for f in result.findings:
        by_node.setdefault(f.node, []).append(f)
    return {
        "schema": model.FINDINGS_SCHEMA_ID,
        "summary": {**result.summary(), "exit_code": exit_code},
        "nodes": [
            {
                "name": n.name,
                "reachable": n.reachable,
                "error": n.error,
                "health": health[n.name],
                "worst_finding": worst_finding(by_node.get(n.name, [])),
                "source": n.source,
                "snapshot_age_s": n.age_s,
                "rates": n.rates,
                "snapshot": model.to_dict(n.snapshot) if n.snapshot else None,
            }
            for n in result.nodes
        ],
        "findings": [finding_dict(f) for f in result.findings],
    }


def render(result: Any, exit_code: int) -> str:
    # compact: an indented dump goes through json's pure-Python encoder, seconds for a large
    # fleet; pipe through `jq .` to read it
    return json.dumps(document(result, exit_code), separators=(",", ":")) + "\n"
