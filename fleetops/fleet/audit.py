"""One audit: collect every host's snapshot in parallel, run the checks, return the result.

Transport problems (unreachable, hung, no agent, garbage output) become findings of severity
``unknown`` for that host; they never stop the audit of the others.

Where a node runs the resident agent (``fleetops-agent serve``) and its snapshot is fresher than
``max_age_s``, the node's ``collect`` answers from it, and the rate checks (SBE growth, PCIe
replays, NVLink errors) are the daemon's: it ran the same checks over its own window of samples,
so one audit sees a storm that is happening now, with no earlier audit in the store. The daemon
judges with the default thresholds; a node whose baseline sets other rate thresholds, or whose
daemon started too recently to have a window, keeps the audit's own rate checks against the
previous audit's snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetops import model
from fleetops.checks.verdict import SOURCE_COLLECT, SOURCE_DAEMON, NodeResult, node_findings
from fleetops.fleet import sshopts

AGENT_COMMAND_VAR = "fleetops_agent_path"
DEFAULT_AGENT = "fleetops-agent"
DEFAULT_MAX_AGE_S = 30.0


@dataclass
class AuditResult:
    started_at: float
    duration_s: float
    nodes: list[NodeResult]
    findings: list[model.Finding]
    inventory: str | None = None
    checks_run: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        counts = {sev: 0 for sev in model.SEVERITIES}
        for f in self.findings:
            counts[f.severity] = counts.get(f.severity, 0) + 1
        per_node = self.node_severity()
        node_counts = {sev: 0 for sev in model.SEVERITIES}
        for sev in per_node.values():
            node_counts[sev] += 1
        by_node: dict[str, list[model.Finding]] = {}
        for f in self.findings:
            by_node.setdefault(f.node, []).append(f)
        # the table's and the TUI's "n/m GPUs", summed: one rule (model.gpu_tally) for all three
        tallies = [model.gpu_tally(n.snapshot, by_node.get(n.name, [])) for n in self.nodes if n.snapshot]
        gpus_total = sum(total for _, total in tallies)
        return {
            "nodes": len(self.nodes),
            "from_daemon": sum(1 for n in self.nodes if n.source == SOURCE_DAEMON),
            "from_collect": sum(1 for n in self.nodes if n.source == SOURCE_COLLECT),
            "reachable": sum(1 for n in self.nodes if n.reachable),
            "unreachable": sum(1 for n in self.nodes if not n.reachable),
            "gpus": gpus_total,
            "gpus_with_faults": sum(total - ok for ok, total in tallies),
            "findings": counts,
            "nodes_by_severity": node_counts,
            # the worst node health (model.HEALTH_ORDER): the order the exit code follows
            "worst": model.worst_health(self.node_health().values()),
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
        }

    def node_health(self) -> dict[str, str]:
        """Each node's health level (model.HEALTH_ORDER): its worst finding, ``unreachable``
        for a node that gave no snapshot."""
        per_node: dict[str, str] = {n.name: "ok" for n in self.nodes}
        for f in self.findings:
            per_node[f.node] = model.worst_health([per_node.get(f.node, "ok"), model.finding_health(f)])
        return per_node

    def node_severity(self) -> dict[str, str]:
        per_node: dict[str, str] = {n.name: "ok" for n in self.nodes}
        for f in self.findings:
            per_node[f.node] = model.worst([per_node.get(f.node, "ok"), f.severity])
        return per_node


def parse_agent_output(host: str, stdout: str) -> model.Node:
    text = stdout.strip()
    if not text:
        raise model.SchemaError("agent printed nothing")
    node = model.node_from_json(text)
    return node


def _transport_finding(host: str, kind: str, message: str, action: str) -> model.Finding:
    return model.Finding(
        check=f"transport.{kind}",
        severity="unknown",
        node=host,
        message=message,
        observed=kind,
        expected="snapshot",
        action=action,
    )


_ACTIONS = {
    "unreachable": "Check the node is up and sshd listens (ping, console/BMC); drain it if it stays down.",
    "timeout": "The node accepts connections but does not answer: check it from its console/BMC "
    "(hung kernel, D-state processes after an XID); drain and reboot if it stays hung.",
    "auth": "Fix SSH credentials for this host (ansible_user, ansible_ssh_private_key_file).",
    "hostkey": "Verify the host key out of band, then add it to known_hosts (or run once with --accept-new-hostkeys).",
    "agent": "Install the agent on the node: ansible-playbook -i INVENTORY playbooks/agent.yml --limit NODE "
    "(role fleetops_agent).",
    "output": "The agent answered something that is not a snapshot: run 'fleetops-agent collect' on the node "
    "by hand and check its version matches the controller's.",
}


def node_from_result(host: str, result: Any) -> tuple[NodeResult, model.Finding | None]:
    """Turn one transport result into a node result, or a finding saying why there is none.

    The agent's answer is read by its JSON (``fleetops.fleet.answers``): only exit 127 without an
    agent error line means the agent is missing; an error the agent printed (a simulator state
    file not found, a collect error) is reported as the agent's, with its kind."""
    from fleetops.fleet import answers

    elapsed = getattr(result, "elapsed_s", None)
    answer = answers.read(result)
    if answer.what == answers.SNAPSHOT and answer.doc is not None:
        try:
            node = model.node_from_dict(answer.doc)
        except model.SchemaError as exc:
            msg = f"agent output unusable: {exc}"
            return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "output", msg, _ACTIONS["output"])
        if result.ok:
            return NodeResult(host, True, None, node, elapsed), None
        msg = f"agent printed a snapshot but exited {result.exit_status}"
        return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "output", msg, _ACTIONS["output"])
    if answer.what == answers.TRANSPORT:
        kind = answer.kind or "unreachable"
        msg = f"{kind}: {answer.error}" if answer.error else kind
        action = _ACTIONS.get(kind, _ACTIONS["unreachable"])
        return NodeResult(host, False, msg, None, elapsed), _transport_finding(host, kind, msg, action)
    if answer.what == answers.MISSING:
        msg = f"fleetops-agent not found on the node ({answer.error})"
        return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "agent", msg, _ACTIONS["agent"])
    if answer.what == answers.AGENT_ERROR:
        msg = f"agent failed (exit {result.exit_status}, {answer.kind or 'no kind'}): {answer.error}"
        return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "output", msg, _ACTIONS["output"])
    if answer.what == answers.UNREADABLE and not result.ok:
        msg = f"agent failed (exit {result.exit_status}): {answer.error}"
        return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "output", msg, _ACTIONS["output"])
    why = answer.error if answer.what == answers.UNREADABLE else f"a {answer.action or answer.what} report, not a snapshot"
    msg = f"agent output unusable: {why}"
    return NodeResult(host, True, msg, None, elapsed), _transport_finding(host, "output", msg, _ACTIONS["output"])


def collect_command(agent: str, max_age_s: float, fresh: bool) -> list[str]:
    """The node-side command: ``--max-age`` always travels, so the node's own default never
    decides how old an answer the audit accepts."""
    if fresh:
        return [agent, "collect", "--fresh"]
    return [agent, "collect", "--max-age", f"{max_age_s:g}"]


def run(
    hosts: list[Any],
    baselines: dict[str, Any],
    previous: dict[str, model.Node],
    forks: int = sshopts.FORKS,
    connect_timeout: float = 5.0,
    command_timeout: float = 30.0,
    known_hosts: str | None = None,
    accept_new_hostkeys: bool = False,
    on_progress: Callable[[str, bool], None] | None = None,
    inventory: str | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    fresh: bool = False,
    validations: dict[str, dict[str, Any]] | None = None,
) -> AuditResult:
    """Audit ``hosts`` (``fleet.inventory.Host``); ``baselines`` maps host name -> Baseline|None.

    ``validations`` (node -> GPU UUID -> level -> latest stored ``fleetops validate`` result, as
    ``Store.validations_for_audit`` gives it) lets the validation checks judge nodes whose
    baseline requires one; None (no history) leaves them silent.

    ``max_age_s`` is the oldest daemon snapshot a node may answer with; ``fresh`` makes every
    node collect now, daemon or not (its rate checks then need the previous audit)."""
    from fleetops import checks
    from fleetops.fleet import transport

    started = time.time()
    t0 = time.perf_counter()
    by_agent: dict[str, list[Any]] = {}
    for host in hosts:
        by_agent.setdefault(str(host.vars.get(AGENT_COMMAND_VAR, DEFAULT_AGENT)), []).append(host)

    def progress(result: Any) -> None:
        if on_progress:
            on_progress(result.host, bool(result.ok))

    results: dict[str, Any] = {}
    for agent, group in by_agent.items():
        results.update(
            transport.run_all(
                group,
                collect_command(agent, max_age_s, fresh),
                forks=forks,
                connect_timeout=connect_timeout,
                command_timeout=command_timeout,
                known_hosts=known_hosts,
                accept_new_hostkeys=accept_new_hostkeys,
                on_result=progress,
                idempotent=True,  # a collect only reads
            )
        )
    nodes: list[NodeResult] = []
    findings: list[model.Finding] = []
    checks_run: dict[str, list[str]] = {}
    for host in hosts:
        node_result, problem = node_from_result(host.name, results[host.name])
        if node_result.snapshot is not None:
            # the inventory name is the node's identity in reports and history
            node_result.snapshot.hostname = host.name
        nodes.append(node_result)
        if problem:
            findings.append(problem)
            continue
        snap = node_result.snapshot
        assert snap is not None
        base = baselines.get(host.name)
        node_validations = validations.get(host.name, {}) if validations is not None else None
        findings.extend(node_findings(node_result, base, previous.get(host.name), node_validations))
        checks_run[host.name] = checks.checks_run(snap, base)
    # fleet-wide checks, per distinct baseline (groups may carry different ones)
    groups: dict[int, tuple[Any, list[model.Node]]] = {}
    for n in nodes:
        if n.snapshot is None:
            continue
        base = baselines.get(n.name)
        groups.setdefault(id(base), (base, []))[1].append(n.snapshot)
    for base, snaps in groups.values():
        findings.extend(checks.run_fleet_checks(snaps, base))
    order = {n.name: i for i, n in enumerate(nodes)}
    findings.sort(
        key=lambda f: (-model.SEVERITY_RANK.get(f.severity, 0), order.get(f.node, 0), (f.gpu or {}).get("index", -1), f.check)
    )
    return AuditResult(
        started_at=started,
        duration_s=time.perf_counter() - t0,
        nodes=nodes,
        findings=findings,
        inventory=inventory,
        checks_run=checks_run,
    )
