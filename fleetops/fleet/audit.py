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

AGENT_COMMAND_VAR = "fleetops_agent_path"
DEFAULT_AGENT = "fleetops-agent"
DEFAULT_MAX_AGE_S = 30.0

# Where a node's snapshot came from (NodeResult.source).
SOURCE_DAEMON = "daemon"
SOURCE_COLLECT = "collect"

# Where a node's rate checks got their earlier counters (NodeResult.rates).
RATES_DAEMON = "daemon window"
RATES_PREVIOUS = "previous audit"

# The checks that turn two counter readings into a rate; with a daemon's snapshot these come
# from the daemon's findings (tests/unit/test_audit_sources.py holds them to the registry).
RATE_CHECKS = frozenset({"memory.ecc_sbe_rate", "pcie.replay_rate", "nvlink.error_rate", "nvlink.idle_link"})
# The thresholds those checks read: the daemon judges with the defaults of these.
RATE_THRESHOLDS = (
    "ecc_sbe_growth_per_hour_warn",
    "pcie_replays_per_min",
    "nvlink_crc_per_min_warn",
    "nvlink_crc_per_min_crit",
    "nvlink_replays_per_min_warn",
    "nvlink_recoveries_per_min_warn",
    "nvlink_idle_window_s",
    "nvlink_idle_max_kib",
    "nvlink_idle_peer_min_kib",
    "rate_min_interval_s",
)


@dataclass
class NodeResult:
    name: str
    reachable: bool
    error: str | None = None
    snapshot: model.Node | None = None
    elapsed_s: float | None = None
    source: str | None = None  # SOURCE_DAEMON or SOURCE_COLLECT; None without a snapshot
    age_s: float | None = None  # the daemon's snapshot age when it answered; 0 for a cold collect
    rates: str | None = None  # RATES_DAEMON, RATES_PREVIOUS, or None: no rate base this audit


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
            "worst": model.worst(per_node.values()) if per_node else "ok",
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
        }

    def node_severity(self) -> dict[str, str]:
        per_node: dict[str, str] = {n.name: "ok" for n in self.nodes}
        for f in self.findings:
            per_node[f.node] = model.worst([per_node.get(f.node, "ok"), f.severity])
        return per_node


def exit_code(findings: list[model.Finding], fail_on: str = "warn") -> int:
    """0 ok, 1 warn, 2 crit, 3 only unknowns; ``fail_on=crit`` lets warnings pass with 0."""
    sevs = {f.severity for f in findings}
    if "crit" in sevs:
        return 2
    if "warn" in sevs and fail_on == "warn":
        return 1
    if "unknown" in sevs:
        return 3
    return 0


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

    The agent's answer is read by its JSON (``fleetops.ops.answers``): only exit 127 without an
    agent error line means the agent is missing; an error the agent printed (a simulator state
    file not found, a collect error) is reported as the agent's, with its kind."""
    from fleetops.ops import answers

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


def daemon_judges_rates(baseline: Any, daemon: dict[str, Any] | None = None) -> bool:
    """Whether the daemon's rate findings hold under this node's baseline: the daemon judges with
    the thresholds of its own ``--baseline`` (reported in its answer), else with the defaults."""
    from dataclasses import asdict

    from fleetops.baseline import DEFAULT_THRESHOLDS

    served = (daemon or {}).get("baseline")
    used = served.get("thresholds") if isinstance(served, dict) else None
    if not isinstance(used, dict):
        used = asdict(DEFAULT_THRESHOLDS)
    wanted = asdict(baseline.thresholds if baseline is not None else DEFAULT_THRESHOLDS)
    return all(used.get(name) == wanted[name] for name in RATE_THRESHOLDS)


def _daemon_has_window(snap: model.Node, daemon: dict[str, Any]) -> bool:
    """Whether the daemon's rate findings for this snapshot were judged over a long enough
    window: ``rate_since`` is the time of the base it judged against (None: it had none yet, so
    only totals). A daemon that does not report it is judged by its start time. One just started
    judges with no window, where the previous audit may still give a rate."""
    from fleetops.baseline import DEFAULT_THRESHOLDS

    if not snap.collected_at:
        return True  # no time to judge by: the daemon's own findings say what it had
    if "rate_since" in daemon:
        since = daemon["rate_since"]
        if not isinstance(since, (int, float)):
            return False
    else:
        since = daemon.get("started_at")
        if not isinstance(since, (int, float)):
            return True
    return float(snap.collected_at) - float(since) >= DEFAULT_THRESHOLDS.rate_min_interval_s


# Findings the daemon holds from its per-tick samples after the snapshot stopped showing them
# (a throttle until --clear-after clean samples): taken from its answer for GPUs whose
# snapshot the audit finds clean, whatever the baseline (the hold reads no threshold).
HELD_CHECKS = frozenset({"thermal_power.throttle"})


def _held(daemon: dict[str, Any], found: list[model.Finding], name: str) -> list[model.Finding]:
    have = {(f.check, (f.gpu or {}).get("uuid")) for f in found}
    out = []
    for doc in daemon.get("findings") or []:
        if not isinstance(doc, dict) or doc.get("check") not in HELD_CHECKS or doc.get("severity") not in model.SEVERITIES:
            continue
        if (doc["check"], (doc.get("gpu") or {}).get("uuid")) not in have:
            out.append(model.Finding.from_dict({**doc, "node": name}))
    return out


def node_findings(
    node_result: NodeResult,
    baseline: Any,
    previous: model.Node | None,
    validations: dict[str, Any] | None = None,
) -> list[model.Finding]:
    """The checks for one node that answered, and where its snapshot and rates came from
    (recorded on ``node_result``).

    With a daemon's snapshot whose rate judgement holds under the baseline, the rate checks'
    findings are the daemon's (same checks, its window of samples), so a storm shows in the
    first audit; the audit's own run of those checks against an older audit is dropped, as it
    measures a different (longer, older) window."""
    from fleetops import checks

    snap = node_result.snapshot
    assert snap is not None
    daemon = snap.daemon if isinstance(snap.daemon, dict) else None
    found = checks.run_node_checks(snap, baseline, previous, validations)
    if daemon is None:
        node_result.source, node_result.age_s = SOURCE_COLLECT, 0.0
        node_result.rates = RATES_PREVIOUS if previous is not None else None
        return found
    found += _held(daemon, found, node_result.name)
    age = daemon.get("age_s")
    node_result.source = SOURCE_DAEMON
    node_result.age_s = float(age) if isinstance(age, (int, float)) else None
    served = daemon.get("findings")
    if not isinstance(served, list) or not daemon_judges_rates(baseline, daemon) or not _daemon_has_window(snap, daemon):
        node_result.rates = RATES_PREVIOUS if previous is not None else None
        return found
    rate_findings = []
    for doc in served:
        if not isinstance(doc, dict) or doc.get("check") not in RATE_CHECKS:
            continue
        if doc.get("severity") not in model.SEVERITIES:
            continue  # not a finding this controller can rank; the snapshot's own checks still ran
        # the inventory name is the node's identity in reports
        rate_findings.append(model.Finding.from_dict({**doc, "node": node_result.name}))
    node_result.rates = RATES_DAEMON
    return [f for f in found if f.check not in RATE_CHECKS] + rate_findings


def run(
    hosts: list[Any],
    baselines: dict[str, Any],
    previous: dict[str, model.Node],
    forks: int = 50,
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
