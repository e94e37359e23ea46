"""Turn an audit's findings into a remediation plan: per GPU and per node, one action.

Actions, from the least to the most drastic: ``none``, ``restart_app``, ``drain``,
``reset_gpu``, ``drain_and_inspect``, ``reboot_node``. Each finding (warn or crit; info and ok
need nothing; unknown ones are listed as "cannot plan") is mapped to an action by its check id,
and for XID findings by the action the check judged per code (the XID policy, escalation
included), else the XID catalog's (``fleetops.catalog.xid``);
a check this table does not know is mapped from its action text. Per GPU the most drastic action
wins. Per node, a reboot supersedes the GPU resets on that node (a reboot resets every GPU).

Pure: no SSH, no store. ``fleetops remediate`` (``remedy.cli``) feeds it and carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetops import model

ACTIONS = ("none", "restart_app", "drain", "reset_gpu", "drain_and_inspect", "reboot_node")
RANK = {a: i for i, a in enumerate(ACTIONS)}
LABEL = {
    "none": "none",
    "restart_app": "restart app",
    "drain": "drain",
    "reset_gpu": "reset GPU",
    "drain_and_inspect": "drain and inspect",
    "reboot_node": "reboot node",
}
NODE_ACTIONS = ("drain", "drain_and_inspect", "reboot_node")
NODE_HEAD = {
    "none": "GPU actions only",
    "drain": "drain the node",
    "drain_and_inspect": "drain the node and have it inspected",
    "reboot_node": "drain and reboot the node",
}

# check id -> action, or {severity: action}
BY_CHECK: dict[str, str | dict[str, str]] = {
    "memory.ecc_dbe_volatile": "reset_gpu",
    "memory.ecc_sbe_volatile": "reset_gpu",
    "memory.ecc_sbe_rate": "reset_gpu",
    "memory.row_remap_pending": "reset_gpu",
    "memory.row_remap_failure": "drain_and_inspect",
    "memory.row_remap_uncorrectable": "drain_and_inspect",
    "memory.retired_pages": {"crit": "drain_and_inspect", "warn": "reset_gpu"},
    "pcie.link_degraded": "reset_gpu",
    "pcie.replay_rate": {"warn": "drain", "info": "none"},
    "nvlink.links_down": "reset_gpu",
    "nvlink.error_rate": {"crit": "reset_gpu", "warn": "reset_gpu", "info": "none"},
    "thermal_power.throttle": "none",
    "thermal_power.temperature": {"crit": "drain", "warn": "none"},
    "thermal_power.memory_temperature": {"crit": "drain", "warn": "none"},
    "thermal_power.power_limit": "none",
    "thermal_power.power_enforced": "none",
    "xid.storm": "drain",
    "config.gpu_count": "reboot_node",
    "config.gpu_missing": "reboot_node",
    "config.services": {"crit": "drain", "warn": "none"},
    "config.fabric_state": "none",
    "config.stray_processes": "none",
    "config.ecc_mode": "none",
    "config.persistence_mode": "none",
    "config.compute_mode": "none",
    "config.mig_mode": "none",
    "config.mig_profile": "none",
    "topology.links": "none",
    "topology.numa": "none",
}
# the XID catalog's action keys -> plan actions
FROM_XID_ACTION = {
    "none": "none",
    "restart_app": "restart_app",
    "reset_gpu": "reset_gpu",
    "reboot_node": "reboot_node",
    "drain_and_inspect": "drain_and_inspect",
    "check_nvlink": "reset_gpu",
    "check_cooling_power": "none",
    "follow_other_xid": "none",
}
FROM_RECOVERY = {"gpu_reset": "reset_gpu", "drain_and_reset": "reset_gpu", "drain_p2p": "reset_gpu", "node_reboot": "reboot_node"}


def from_text(text: str | None) -> str:
    """Best guess from an action text, for checks the table does not know."""
    t = (text or "").lower()
    if "fleetops reset" in t or t.startswith("reset the gpu"):
        return "reset_gpu"
    if "reboot" in t:
        return "reboot_node"
    if "rma" in t or "inspect" in t or "hardware case" in t or "hardware service" in t:
        return "drain_and_inspect"
    if "restart the application" in t or "restart the job" in t or "restarted" in t:
        return "restart_app"
    if "drain" in t:
        return "drain"
    return "none"


def _xid_action(finding: model.Finding) -> str:
    observed = finding.observed if isinstance(finding.observed, list) else []
    try:
        from fleetops.catalog import xid as catalog
    except ImportError:  # pragma: no cover - shipped together
        return from_text(finding.action)
    best = "none"
    for entry in observed:
        if not isinstance(entry, dict) or entry.get("severity") not in ("warn", "crit"):
            continue
        code = entry.get("code")
        if not isinstance(code, int):
            continue
        name = str(entry.get("name") or "")
        if entry.get("sxid"):
            act = "drain"  # an NVSwitch error: not one GPU's reset
        elif code == 154 and ":" in name:
            act = FROM_RECOVERY.get(name.rsplit(":", 1)[1].strip(), "reset_gpu")
        else:
            # the check's judgement (the baseline's xid_policy and escalation) when it gives one
            key = entry.get("action") if isinstance(entry.get("action"), str) else catalog.lookup(code).action
            act = FROM_XID_ACTION.get(str(key), "drain_and_inspect")
        if RANK[act] > RANK[best]:
            best = act
    return best if observed else from_text(finding.action)


def action_for(finding: model.Finding) -> str:
    """The plan action for one finding."""
    if finding.severity not in ("warn", "crit"):
        return "none"
    if finding.check == "xid.recent":
        return _xid_action(finding)
    if finding.check == "xid.recovery_action":
        return FROM_RECOVERY.get(str(finding.observed), from_text(finding.action))
    if finding.check.startswith("transport.") or finding.check.endswith(".unreadable"):
        return "none"
    if finding.check.startswith("versions."):
        return "none"  # drift: fleetops rollout, not a repair
    rule = BY_CHECK.get(finding.check)
    if isinstance(rule, dict):
        return rule.get(finding.severity, from_text(finding.action))
    if isinstance(rule, str):
        return rule
    return from_text(finding.action)


class Escalating(Protocol):
    """What ``build`` asks of the history (``fleetops.fleet.escalation.Escalations``)."""

    notes: list[str]

    def adjust(
        self, f: model.Finding, action: str, action_for: Callable[[model.Finding], str]
    ) -> tuple[str, list[dict[str, Any]]]: ...


@dataclass
class Item:
    """One GPU's (or the node's own) action, with the findings that led to it."""

    node: str
    gpu: dict[str, Any] | None
    action: str
    severity: str
    reasons: list[dict[str, Any]] = field(default_factory=list)  # check, severity, message, action
    superseded_by: str | None = None

    @property
    def label(self) -> str:
        return LABEL[self.action]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "action": self.action,
            "severity": self.severity,
            "superseded_by": self.superseded_by,
            "reasons": self.reasons,
        }


@dataclass
class NodePlan:
    node: str
    action: str  # the node-level action: none, drain, drain_and_inspect, reboot_node
    items: list[Item] = field(default_factory=list)
    cannot_plan: list[dict[str, Any]] = field(default_factory=list)  # unknown findings

    @property
    def resets(self) -> list[Item]:
        return [i for i in self.items if i.action == "reset_gpu" and i.gpu and not i.superseded_by]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "items": [i.to_dict() for i in self.items],
            "cannot_plan": self.cannot_plan,
        }


@dataclass
class Plan:
    nodes: list[NodePlan]
    notes: list[str] = field(default_factory=list)  # the history's word on the plan: application-wide XIDs

    @property
    def resets(self) -> list[Item]:
        return [i for n in self.nodes for i in n.resets]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [n.to_dict() for n in self.nodes], "notes": self.notes}


def build(
    findings: Iterable[model.Finding],
    node_order: list[str] | None = None,
    *,
    escalations: Escalating | None = None,
) -> Plan:
    """The plan for ``findings`` (one audit), nodes in ``node_order`` (then the others);
    ``escalations``: what the history says (``fleet.escalation``): faults that outlived their
    repairs go to inspection, application-wide XIDs to the job."""
    per_node: dict[str, dict[str, Item]] = {}
    unknown: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        if f.severity == "unknown":
            unknown.setdefault(f.node, []).append({"check": f.check, "message": f.message, "action": f.action})
            continue
        if f.severity not in ("warn", "crit"):
            continue
        act = action_for(f)
        history: list[dict[str, Any]] = []
        if escalations is not None:
            act, history = escalations.adjust(f, act, action_for)
        gpu = f.gpu if f.gpu and f.gpu.get("uuid") else None
        if act == "reset_gpu" and gpu is None:
            act = "drain"  # nothing to aim a reset at: take the node out until someone looks
        key = gpu["uuid"] if gpu else ""
        items = per_node.setdefault(f.node, {})
        item = items.get(key)
        if item is None:
            item = items[key] = Item(f.node, dict(gpu) if gpu else None, act, f.severity)
        if RANK[act] > RANK[item.action]:
            item.action = act
        item.severity = model.worst([item.severity, f.severity])
        reason: dict[str, Any] = {
            "check": f.check,
            "severity": f.severity,
            "message": f.message,
            "action": f.action,
            "plan": act,
        }
        if history:
            reason["escalation"] = history
        item.reasons.append(reason)
    names = list(node_order or [])
    names += sorted(n for n in set(per_node) | set(unknown) if n not in names)
    nodes = []
    for name in names:
        node_items = sorted(
            per_node.get(name, {}).values(), key=lambda i: (i.gpu is None, (i.gpu or {}).get("index", -1))
        )
        if not node_items and name not in unknown:
            continue
        node_action = "none"
        for it in node_items:
            if it.action in NODE_ACTIONS and RANK[it.action] > RANK[node_action]:
                node_action = it.action
        if node_action == "reboot_node":
            for it in node_items:
                if it.action == "reset_gpu":
                    it.superseded_by = "reboot_node"
        nodes.append(NodePlan(name, node_action, node_items, unknown.get(name, [])))
    return Plan(nodes, notes=list(escalations.notes) if escalations is not None else [])


def render(plan: Plan) -> str:
    """The plan as text for a terminal or a ticket."""
    if not plan.nodes:
        return "Nothing to do: no warning or critical finding.\n"
    lines = [f"NOTE: {note}" for note in plan.notes]
    for node in plan.nodes:
        head = f"{node.node}: " + NODE_HEAD[node.action]
        if not node.items and node.cannot_plan:
            head = f"{node.node}: cannot plan"
        lines.append(head)
        for item in node.items:
            g = item.gpu
            where = f"GPU {g.get('index')} {g.get('uuid')} {g.get('bus_id')}" if g else "node"
            note = f" (superseded: {LABEL[item.superseded_by]})" if item.superseded_by else ""
            lines.append(f"  {where:60} {item.label}{note}")
            for r in item.reasons:
                lines.append(f"      [{r['severity']}] {r['check']}: {r['message']}")
                lines += [f"        history: {e['text']}" for e in r.get("escalation") or ()]
        for u in node.cannot_plan:
            lines.append(f"  cannot plan: {u['check']}: {u['message']}")
    resets = plan.resets
    reboots = [n.node for n in plan.nodes if n.action == "reboot_node"]
    inspect = [n.node for n in plan.nodes if n.action == "drain_and_inspect"]
    drains = [n.node for n in plan.nodes if n.action == "drain"]
    lines.append("")
    lines.append(f"GPU resets: {len(resets)}" + (f" ({', '.join(sorted({i.node for i in resets}))})" if resets else ""))
    if reboots:
        lines.append(f"Reboot (drain first, by hand or your scheduler): {', '.join(reboots)}")
    if inspect:
        lines.append(f"Drain and send for inspection: {', '.join(inspect)}")
    if drains:
        lines.append(f"Drain: {', '.join(drains)}")
    return "\n".join(lines) + "\n"
