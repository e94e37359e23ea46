"""Turn the fleet's findings into a remediation plan: per GPU and per node, what fixes it.

Repairs, from the least to the most drastic: ``none``, ``restart_app``, ``drain``,
``reset_gpu``, ``drain_and_inspect``, ``reboot_node``. Beside them, fixes that are not repairs
(``SIDE_ACTIONS``): a setting or a version to bring back to the baseline (``apply_power``,
``apply_mig``, ``apply_firmware``, ``rollout_driver``: the command to run, never run by
remediate) and ``inspect`` (look at the finding: its action says what to do). Each finding
(warn or crit; info and ok need nothing) is mapped to one action by its check id, and for XID
findings by the action the check judged per code (the XID policy, escalation included), else
the XID catalog's (``fleetops.xid.catalog``); a check this table does not know is mapped from
its action text (table and rule: ``fleetops.catalog.remedies``, which the audit's JSON report
uses too). Per GPU the most drastic repair wins; every side fix is kept, one per node and
kind, with the findings that call for it. Per node, a reboot supersedes the GPU resets on that
node (a reboot resets every GPU). A finding on an HCA (``fabric.*``) names where the technician
goes (device, port, netdev, PCI address) and its action, whatever the item's action: a drain for
inspection sends someone to a port, not to a GPU.

A node without a snapshot (``transport.*``: hung, unreachable, no agent) cannot be planned and is
listed with why; so are findings the node could not read (severity unknown).

Pure: no SSH, no store. ``fleetops remediate`` (``remedy.cli``) feeds it and carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleetops import model

# The repair ladder, the side fixes and the action of one finding are the catalog's
# (fleetops.catalog.remedies), shared with the audit's JSON report (each finding's action_code).
from fleetops.catalog.remedies import (  # noqa: F401  (re-exported for the planner's callers)
    ACTIONS,
    BY_CHECK,
    FROM_RECOVERY,
    FROM_XID_ACTION,
    RANK,
    SIDE_ACTIONS,
    action_for,
    from_text,
)

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
LABEL.update(
    {
        "inspect": "inspect",
        "apply_power": "apply the power settings",
        "apply_mig": "apply the MIG layout",
        "apply_firmware": "update the firmware",
        "rollout_driver": "roll out the driver",
    }
)
COMMAND = {
    "apply_power": "fleetops apply power -i {inventory} --limit {nodes}",
    "apply_mig": "fleetops apply mig -i {inventory} --limit {nodes}",
    "apply_firmware": "fleetops apply firmware -i {inventory} --limit {nodes}",
    "rollout_driver": "fleetops rollout driver -i {inventory} --limit {nodes} --version {version}",
}
SUMMARY = {
    "apply_power": "Apply the power settings",
    "apply_mig": "Apply the MIG layout",
    "apply_firmware": "Update the firmware",
    "rollout_driver": "Roll out the driver",
    "inspect": "Inspect (each finding's action says what to do)",
}
# why a node has no snapshot to plan from, by its transport finding
BLOCKED = {"transport.timeout": "hung", "transport.unreachable": "unreachable"}


def blocked_why(check: str) -> str | None:
    """Why a node cannot be planned, from a finding that says it has no snapshot: ``hung``,
    ``unreachable``, or ``unknown`` (no agent, credentials, output); None for any other check."""
    if check in BLOCKED:
        return BLOCKED[check]
    return "unknown" if check.startswith("transport.") else None


def command_for(action: str, nodes: Iterable[str], inventory: str, version: str | None = None) -> str | None:
    """The command that carries out a side fix on ``nodes``; None for one with no command."""
    template = COMMAND.get(action)
    if template is None:
        return None
    return template.format(inventory=inventory, nodes=",".join(nodes), version=version or "VERSION")


def _version(reasons: list[dict[str, Any]]) -> str | None:
    """The driver version a rollout is for: the baseline's, as the driver finding expects it."""
    for check in ("versions.driver", "versions.fabric_manager_match", "versions.driver_package"):
        for r in reasons:
            if r["check"] == check and isinstance(r.get("expected"), str) and r["expected"].strip():
                return str(r["expected"]).strip()
    return None


HCA_KEYS = ("device", "port", "netdev", "pci_address")


def hca_ref(f: model.Finding) -> dict[str, Any] | None:
    """Where a fabric finding's technician goes: the HCA (device, PCI address) and, for a port's,
    the port and its netdev, as the finding observed them; None for a finding on no HCA."""
    observed = f.observed if isinstance(f.observed, dict) else {}
    if not f.check.startswith("fabric.") or not observed.get("device"):
        return None
    return {k: observed[k] for k in HCA_KEYS if observed.get(k) is not None}


def _hca_text(where: dict[str, Any]) -> str:
    parts = [str(where["device"]) + (f" port {where['port']}" if "port" in where else "")]
    parts += [f"netdev {where['netdev']}"] if "netdev" in where else []
    parts += [f"PCI {where['pci_address']}"] if "pci_address" in where else []
    return ", ".join(parts)


class Escalating(Protocol):
    """What ``build`` asks of the history (``fleetops.fleet.escalation.Escalations``)."""

    @property
    def notes(self) -> list[str]: ...

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
    command: str | None = None  # a side fix's command (remediate prints it, never runs it)
    # the Slurm jobs the action hits (a reset: the GPU's; a drain or reboot: every running job of
    # the node), from the node's snapshot; None where unknown (no job records) or not an action on jobs
    jobs: list[dict[str, Any]] | None = None

    @property
    def label(self) -> str:
        return LABEL[self.action]

    @property
    def side(self) -> bool:
        return self.action in SIDE_ACTIONS

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "action": self.action,
            "severity": self.severity,
            "superseded_by": self.superseded_by,
            "command": self.command,
            "jobs": self.jobs,
            "reasons": self.reasons,
        }


@dataclass
class NodePlan:
    node: str
    action: str  # the node-level action: none, drain, drain_and_inspect, reboot_node
    items: list[Item] = field(default_factory=list)
    cannot_plan: list[dict[str, Any]] = field(default_factory=list)  # unknown findings
    # every job running on the node (what its drain or reboot hits); None: no job records
    jobs: list[dict[str, Any]] | None = None

    @property
    def resets(self) -> list[Item]:
        return [i for i in self.items if i.action == "reset_gpu" and i.gpu and not i.superseded_by]

    @property
    def fixes(self) -> list[Item]:
        """The side fixes (commands to run, findings to look at), one per kind."""
        return [i for i in self.items if i.side]

    @property
    def blocked(self) -> tuple[str, dict[str, Any]] | None:
        """(why, the finding) when the node has no snapshot to plan from (hung, unreachable,
        unknown); None when it was planned."""
        for u in self.cannot_plan:
            why = blocked_why(str(u.get("check")))
            if why is not None:
                return why, u
        if self.cannot_plan and not self.items:
            return "unknown", self.cannot_plan[0]
        return None

    def to_dict(self) -> dict[str, Any]:
        blocked = self.blocked
        return {
            "node": self.node,
            "action": self.action,
            "items": [i.to_dict() for i in self.items],
            "cannot_plan": self.cannot_plan,
            "blocked": blocked[0] if blocked else None,
            "jobs": self.jobs,
        }


@dataclass
class Plan:
    nodes: list[NodePlan]
    inventory: str = "INVENTORY"  # for the commands of side fixes
    audited: list[str] | None = None  # the nodes whose results the plan was made from (None: not said)
    unaudited: dict[str, str] = field(default_factory=dict)  # node -> why it has no result to plan from
    window: str | None = None  # the age limit of a result, as the operator wrote it (15m)
    notes: list[str] = field(default_factory=list)  # the history's word on the plan: application-wide XIDs

    @property
    def resets(self) -> list[Item]:
        return [i for n in self.nodes for i in n.resets]

    @property
    def blocked(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.blocked]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_dict() for n in self.nodes],
            "audited": self.audited,
            "unaudited": self.unaudited,
            "window": self.window,
            "notes": self.notes,
        }


def build(
    findings: Iterable[model.Finding],
    node_order: list[str] | None = None,
    *,
    inventory: str = "INVENTORY",
    audited: Iterable[str] | None = None,
    unaudited: dict[str, str] | None = None,
    window: str | None = None,
    escalations: Escalating | None = None,
    snapshots: Mapping[str, model.Node] | None = None,
) -> Plan:
    """The plan for ``findings`` (each node's latest result), nodes in ``node_order`` (then the
    others). ``audited``: the nodes the findings come from (a node there with no finding needs
    nothing); ``unaudited``: node -> why there is no result to plan it from (no recent audit),
    said next to the plan and never taken for "nothing to do"; ``window``: the age limit;
    ``escalations``: what the history says (``fleet.escalation``): faults that outlived their
    repairs go to inspection, application-wide XIDs to the job. ``snapshots``: each node's snapshot
    of the same result, whose job records name the jobs each action hits (``Item.jobs``)."""
    per_node: dict[str, dict[str, Item]] = {}
    unknown: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        if f.severity == "unknown":
            unknown.setdefault(f.node, []).append(
                {"check": f.check, "message": f.message, "action": f.action}
            )
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
        reason: dict[str, Any] = {
            "check": f.check,
            "severity": f.severity,
            "message": f.message,
            "action": f.action,
            "plan": act,
        }
        if history:
            reason["escalation"] = history
        where = hca_ref(f)
        if where:
            reason["hca"] = where
        if act in SIDE_ACTIONS:  # one per node and kind, every GPU's finding under it
            key, at = f"side:{act}", None
            reason["gpu"] = dict(f.gpu) if f.gpu else None
            if isinstance(f.expected, str):
                reason["expected"] = f.expected
        else:
            key, at = (gpu["uuid"] if gpu else ""), (dict(gpu) if gpu else None)
        items = per_node.setdefault(f.node, {})
        item = items.get(key)
        if item is None:
            item = items[key] = Item(f.node, at, act, f.severity)
        if act not in SIDE_ACTIONS and RANK[act] > RANK[item.action]:
            item.action = act
        item.severity = model.worst([item.severity, f.severity])
        item.reasons.append(reason)
    names = list(node_order or [])
    names += sorted(n for n in set(per_node) | set(unknown) if n not in names)
    nodes = []
    for name in names:
        node_items = sorted(
            per_node.get(name, {}).values(),
            key=lambda i: (
                i.side,
                SIDE_ACTIONS.index(i.action) if i.side else 0,
                i.gpu is None,
                (i.gpu or {}).get("index", -1),
            ),
        )
        for it in node_items:
            if it.side:
                it.command = command_for(it.action, [name], inventory, _version(it.reasons))
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
        snap = (snapshots or {}).get(name)
        node_jobs = _job_dicts(model.running_jobs(snap)) if snap is not None else None
        for it in node_items:
            it.jobs = _hits(it, snap, node_jobs)
        nodes.append(NodePlan(name, node_action, node_items, unknown.get(name, []), node_jobs))
    listed = None if audited is None else sorted(set(audited))
    return Plan(
        nodes,
        inventory,
        listed,
        dict(sorted((unaudited or {}).items())),
        window,
        notes=list(escalations.notes) if escalations is not None else [],
    )


JOB_ACTIONS = ("restart_app", "reset_gpu", *NODE_ACTIONS)


def _job_dicts(jobs: Iterable[model.NodeJob] | None) -> list[dict[str, Any]] | None:
    if jobs is None:
        return None
    return [{"job_id": j.job_id, "user": j.user} for j in jobs]


def _hits(item: Item, snap: model.Node | None, node_jobs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The jobs ``item``'s action hits: a drain, an inspection or a reboot takes the whole node,
    a reset or an application restart the GPU's jobs; side fixes are commands, not planned here."""
    if snap is None or item.action not in JOB_ACTIONS:
        return None
    if item.action in NODE_ACTIONS:
        return node_jobs
    return _job_dicts(model.gpu_jobs(snap, (item.gpu or {}).get("uuid")))


def _jobs_text(jobs: list[dict[str, Any]] | None) -> str:
    """`` (jobs 1234 alice, 1240)`` for a plan line; nothing where no job is known to be hit."""
    if not jobs:
        return ""
    return " (jobs " + ", ".join(f"{j['job_id']} {j['user']}" if j.get("user") else str(j["job_id"])
                                 for j in jobs) + ")"


def _coverage_line(plan: Plan) -> str | None:
    """The nodes the plan could not look at, said so that nobody takes them for healthy."""
    if not plan.unaudited:
        return None
    within = f" within {plan.window}" if plan.window else ""
    listed = ", ".join(f"{n} ({why})" for n, why in plan.unaudited.items())
    return f"{len(plan.unaudited)} node(s) have no audit{within}, so nothing is planned for them: {listed}"


def _head(node: NodePlan) -> str:
    blocked = node.blocked
    if blocked and not node.items:
        why, u = blocked
        return f"{node.node}: cannot plan: {why} ({u['check']}: {u['message']})"
    if node.action == "none" and node.items and all(i.side for i in node.items):
        return f"{node.node}: " + "; ".join(LABEL[i.action] for i in node.items)
    return f"{node.node}: " + NODE_HEAD[node.action] + (_jobs_text(node.jobs) if node.action in NODE_ACTIONS else "")


def render(plan: Plan) -> str:
    """The plan as text for a terminal or a ticket."""
    coverage = _coverage_line(plan)
    if not plan.nodes:
        seen = f" in the results for {len(plan.audited)} node(s)" if plan.audited is not None else ""
        if coverage:
            within = f" within {plan.window}" if plan.window else ""
            listed = ", ".join(f"{n} ({why})" for n, why in plan.unaudited.items())
            return (
                f"No finding{seen}; {len(plan.unaudited)} node(s) have no audit{within}: {listed}\n"
                "Nothing is planned for them: audit them first.\n"
            )
        return f"Nothing to do: no warning or critical finding{seen}.\n"
    lines = [f"NOTE: {note}" for note in plan.notes]
    for node in plan.nodes:
        lines.append(_head(node))
        for item in node.items:
            g = item.gpu
            where = f"GPU {g.get('index')} {g.get('uuid')} {g.get('bus_id')}" if g else "node"
            note = f" (superseded: {LABEL[item.superseded_by]})" if item.superseded_by else ""
            hits = _jobs_text(item.jobs) if item.action not in NODE_ACTIONS else ""  # the head names the node's
            lines.append(f"  {where:60} {item.label}{note}{hits}")
            for r in item.reasons:
                on = r.get("gpu") or {}
                at = f" (GPU {on.get('index')})" if on else ""
                lines.append(f"      [{r['severity']}] {r['check']}{at}: {r['message']}")
                lines += [f"        history: {e['text']}" for e in r.get("escalation") or ()]
                if r.get("hca"):  # the technician needs the port and what to do there
                    lines.append(f"          at: {_hca_text(r['hca'])}")
                if (item.action == "inspect" or r.get("hca")) and r.get("action"):
                    lines.append(f"          what to do: {r['action']}")
            if item.command:
                lines.append(f"      run: {item.command}")
        blocked = node.blocked
        for u in node.cannot_plan:
            if blocked and not node.items and u is blocked[1]:
                continue  # said in the head
            lines.append(f"  cannot plan: {u['check']}: {u['message']}")
    resets = plan.resets
    reboots = [n.node for n in plan.nodes if n.action == "reboot_node"]
    inspect = [n.node for n in plan.nodes if n.action == "drain_and_inspect"]
    drains = [n.node for n in plan.nodes if n.action == "drain"]
    lines.append("")
    lines.append(
        f"GPU resets: {len(resets)}" + (f" ({', '.join(sorted({i.node for i in resets}))})" if resets else "")
    )
    if reboots:
        lines.append(f"Reboot (drain first, by hand or your scheduler): {', '.join(reboots)}")
    if inspect:
        lines.append(f"Drain and send for inspection: {', '.join(inspect)}")
    if drains:
        lines.append(f"Drain: {', '.join(drains)}")
    for act in SIDE_ACTIONS:
        on = [(n.node, i) for n in plan.nodes for i in n.fixes if i.action == act]
        if not on:
            continue
        if act == "inspect":
            lines.append(
                f"{SUMMARY[act]}: "
                + ", ".join(
                    f"{name} ({', '.join(sorted({r['check'] for r in i.reasons}))})" for name, i in on
                )
            )
            continue
        by_version: dict[str | None, list[str]] = {}
        for name, i in on:
            by_version.setdefault(_version(i.reasons), []).append(name)
        for version, names in by_version.items():
            lines.append(
                f"{SUMMARY[act]}: {', '.join(names)}: {command_for(act, names, plan.inventory, version)}"
            )
    blocked_nodes = plan.blocked
    if blocked_nodes:
        lines.append(
            "Cannot plan: " + ", ".join(f"{n.node} ({(n.blocked or ('?', {}))[0]})" for n in blocked_nodes)
        )
    if coverage:
        lines.append(f"Not planned: {coverage}")
    return "\n".join(lines) + "\n"
