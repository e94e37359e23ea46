"""One node's verdict: the node-scope checks of one snapshot, merged with what the node's daemon
already judged (its rate findings over its own window of samples, its held findings), and the exit
code of a list of findings.

Node side: ``fleetops-agent check`` judges its own node with it, and the controller's audit
(``fleetops.fleet.audit``) judges every node that answered with it, so the node and the fleet give
one verdict. The daemon judges with the default thresholds; a node whose baseline sets other rate
thresholds, or whose daemon started too recently to have a window, keeps the caller's own rate
checks against the previous snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetops import model

# Where a node's snapshot came from (NodeResult.source).
SOURCE_DAEMON = "daemon"
SOURCE_COLLECT = "collect"

# Where a node's rate checks got their earlier counters (NodeResult.rates).
RATES_DAEMON = "daemon window"
RATES_PREVIOUS = "previous audit"

# The checks that turn two counter readings into a rate; with a daemon's snapshot these come
# from the daemon's findings (tests/unit/test_audit_sources.py holds them to the registry).
RATE_CHECKS = frozenset({"memory.ecc_sbe_rate", "pcie.replay_rate", "nvlink.error_rate", "nvlink.idle_link",
                         "fabric.link_downed", "fabric.error_counters", "fabric.link_errors"})
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
    "fabric_link_downed_crit",
    "fabric_symbol_errors_per_s_warn",
    "fabric_symbol_errors_per_hour_crit",
    "fabric_link_recoveries_per_min_warn",
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


def exit_code(findings: list[model.Finding], fail_on: str = "warn") -> int:
    """The exit code of the worst health level among ``findings`` (model.HEALTH_ORDER, mapped
    by common.errors.AUDIT_EXIT): 0 ok, 1 warn, 2 crit, 3 an unreachable host (whatever else was
    found) or nothing worse than unknowns. ``fail_on=crit`` lets warnings pass: they count as
    nothing, so what remains decides."""
    from fleetops.common.errors import AUDIT_EXIT

    levels = [model.finding_health(f) for f in findings]
    if fail_on == "crit":
        levels = [level for level in levels if level != "warn"]
    return AUDIT_EXIT[model.worst_health(levels)]


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
# (a throttle until --clear-after clean samples; an RDMA port's flaps and drops, which only its
# samples see): taken from its answer for GPUs whose snapshot the audit finds clean, whatever
# the baseline.
HELD_CHECKS = frozenset({"thermal_power.throttle", "fabric.flap", "fabric.drop"})


def _held(daemon: dict[str, Any], found: list[model.Finding], name: str) -> list[model.Finding]:
    have = {f.key for f in found}  # by GPU, and by HCA port for the fabric's
    out = []
    for doc in daemon.get("findings") or []:
        if not isinstance(doc, dict) or doc.get("check") not in HELD_CHECKS or doc.get("severity") not in model.SEVERITIES:
            continue
        held = model.Finding.from_dict({**doc, "node": name})
        if held.key not in have:
            out.append(held)
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
    found += _retagged(snap, _held(daemon, found, node_result.name))
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
    return [f for f in found if f.check not in RATE_CHECKS] + _retagged(snap, rate_findings)


def _retagged(snap: model.Node, findings: list[model.Finding]) -> list[model.Finding]:
    """The daemon's findings with the jobs running on their GPU in the snapshot the audit judges
    (they are faults seen now), whatever the daemon's answer said, which may predate a job."""
    from fleetops.checks.base import running_job_ids

    for f in findings:
        f.jobs = running_job_ids(snap, f.gpu)
    return findings
