"""How the audit treats a node's answer by its source: a daemon's snapshot brings the daemon's
rate findings (its window), a cold collect needs the previous audit for rates; a baseline with
its own rate thresholds keeps the audit's own judgement."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from fleetops import baseline, checks, model
from fleetops.checks import verdict
from fleetops.fleet import audit
from fleetops.sim import gpu as sim


def _pair(sim_node: Callable[..., model.Node], fault: str, dt: float) -> tuple[model.Node, model.Node]:
    state = sim.build_state("n1", {"faults": [fault]})
    t0 = time.time()
    return sim_node(state=state, now=t0), sim_node(state=state, now=t0 + dt)


def _served(node: model.Node, window_start: model.Node | None, age_s: float = 1.5) -> model.Node:
    """``node`` as the daemon serves it: its findings are the checks over its window (no baseline)."""
    found = checks.run_node_checks(node, None, window_start)
    started = (window_start or node).collected_at - 5.0
    since = window_start.collected_at if window_start is not None else None
    node.daemon = {"age_s": age_s, "interval_s": 2.0, "started_at": started, "rate_since": since,
                   "findings": [f.to_dict() for f in found], "xid_counts": {}}
    return node


def _result(snap: model.Node, name: str = "inv-name") -> verdict.NodeResult:
    return verdict.NodeResult(name, True, None, snap)


def _rates(found: list[model.Finding]) -> dict[tuple[str, str | None], str]:
    return {(f.check, (f.gpu or {}).get("uuid")): f.severity for f in found if f.check in verdict.RATE_CHECKS}


def test_rate_checks_are_the_registry_checks_that_read_two_snapshots() -> None:
    two = {cid for cid, spec in checks.REGISTRY.items() if "two snapshots" in spec.reads}
    assert verdict.RATE_CHECKS == two


def test_rate_thresholds_are_threshold_fields() -> None:
    fields = {f.name for f in dataclasses.fields(baseline.Thresholds)}
    assert set(verdict.RATE_THRESHOLDS) <= fields
    assert {n for n in fields if "per_min" in n or "per_hour" in n} <= set(verdict.RATE_THRESHOLDS)


def test_a_daemon_snapshot_brings_its_window_rate_with_no_previous_audit(sim_node: Callable[..., model.Node]) -> None:
    start, now = _pair(sim_node, "pcie-replay-storm@2", dt=40.0)
    nr = _result(_served(now, start))
    found = verdict.node_findings(nr, None, previous=None)
    uuid = now.gpus[2].uuid
    assert _rates(found) == {("pcie.replay_rate", uuid): "warn"}
    assert {f.node for f in found if f.check == "pcie.replay_rate"} == {"inv-name"}
    assert (nr.source, nr.age_s, nr.rates) == (verdict.SOURCE_DAEMON, 1.5, verdict.RATES_DAEMON)
    # the same snapshot, collected cold: only the total, as info
    cold = dataclasses.replace(now, daemon=None)
    nr_cold = _result(cold)
    assert _rates(verdict.node_findings(nr_cold, None, previous=None)) == {("pcie.replay_rate", uuid): "info"}
    assert (nr_cold.source, nr_cold.age_s, nr_cold.rates) == (verdict.SOURCE_COLLECT, 0.0, None)


def test_the_daemons_quiet_window_wins_over_an_old_audits_growth(sim_node: Callable[..., model.Node]) -> None:
    """A storm that stopped: the previous audit an hour ago would see growth; the daemon's
    window (no growth in it) is what is happening now."""
    old, now = _pair(sim_node, "pcie-replay-storm@2", dt=3600.0)
    window_start = dataclasses.replace(now, collected_at=now.collected_at - 50.0)
    nr = _result(_served(now, window_start))
    assert _rates(checks.run_node_checks(now, None, old)) == {("pcie.replay_rate", now.gpus[2].uuid): "warn"}
    assert _rates(verdict.node_findings(nr, None, previous=old)) == {}


def test_a_baseline_with_its_own_rate_threshold_keeps_the_audits_judgement(
    sim_node: Callable[..., model.Node],
) -> None:
    start, now = _pair(sim_node, "pcie-replay-storm@2", dt=40.0)
    served = _served(now, start)
    strict = baseline.from_mapping({"thresholds": {"pcie_replays_per_min": 10000}}, "strict.yml")
    assert not verdict.daemon_judges_rates(strict)
    assert verdict.daemon_judges_rates(baseline.from_mapping({"thresholds": {"xid_window_hours": 12}}, "x.yml"))
    # a daemon started with that same baseline judges as the audit would; one with another does not
    judged_strict = {"baseline": {"source": "strict.yml", "thresholds": dataclasses.asdict(strict.thresholds)}}
    assert verdict.daemon_judges_rates(strict, judged_strict)
    assert not verdict.daemon_judges_rates(None, judged_strict)
    nr = _result(served)
    found = verdict.node_findings(nr, strict, previous=None)
    # the daemon's warn was judged at 31/min; under 10000/min and with no previous audit: the total only
    assert _rates(found) == {("pcie.replay_rate", now.gpus[2].uuid): "info"}
    assert (nr.source, nr.rates) == (verdict.SOURCE_DAEMON, None)
    nr2 = _result(served)
    verdict.node_findings(nr2, strict, previous=start)
    assert nr2.rates == verdict.RATES_PREVIOUS


def test_a_daemon_just_started_leaves_the_rate_to_the_previous_audit(sim_node: Callable[..., model.Node]) -> None:
    """Its first full snapshot has no window (totals only, info); the audit an hour ago gives a rate."""
    old, now = _pair(sim_node, "pcie-replay-storm@2", dt=3600.0)
    served = _served(now, None)  # no window: the daemon started 5 s before this snapshot
    nr = _result(served)
    found = verdict.node_findings(nr, None, previous=old)
    assert _rates(found) == {("pcie.replay_rate", now.gpus[2].uuid): "warn"}
    assert (nr.source, nr.rates) == (verdict.SOURCE_DAEMON, verdict.RATES_PREVIOUS)
    nr_alone = _result(served)
    assert _rates(verdict.node_findings(nr_alone, None, previous=None)) == {("pcie.replay_rate", now.gpus[2].uuid): "info"}
    assert nr_alone.rates is None


def test_a_daemon_whose_rate_base_is_too_recent_leaves_the_rate_to_the_previous_audit(
    sim_node: Callable[..., model.Node],
) -> None:
    """The daemon started a minute ago, but its first sample came late (a loaded node): its base
    lies 5 s before the snapshot, under rate_min_interval_s, so its rate findings are totals
    only; the audit judges the rate against its previous audit instead."""
    old, now = _pair(sim_node, "pcie-replay-storm@2", dt=3600.0)
    base = dataclasses.replace(now, collected_at=now.collected_at - 5.0)
    served = _served(now, None)
    assert served.daemon is not None
    served.daemon.update(started_at=now.collected_at - 60.0, rate_since=base.collected_at)
    nr = _result(served)
    assert _rates(verdict.node_findings(nr, None, previous=old)) == {("pcie.replay_rate", now.gpus[2].uuid): "warn"}
    assert nr.rates == verdict.RATES_PREVIOUS
    # a daemon that does not report its base is judged by its start time: 60 s is a window
    del served.daemon["rate_since"]
    nr_old = _result(served)
    verdict.node_findings(nr_old, None, previous=old)
    assert nr_old.rates == verdict.RATES_DAEMON


@pytest.mark.parametrize("bad", [{"check": "pcie.replay_rate", "severity": "bogus", "node": "x", "message": ""},
                                 "not a finding"])
def test_a_daemon_finding_this_controller_cannot_rank_is_left_out(
    sim_node: Callable[..., model.Node], bad: Any
) -> None:
    start, now = _pair(sim_node, "pcie-replay-storm@2", dt=40.0)
    served = _served(now, start)
    assert served.daemon is not None
    served.daemon["findings"] = [bad, *served.daemon["findings"]]
    found = verdict.node_findings(_result(served), None, None)
    assert _rates(found) == {("pcie.replay_rate", now.gpus[2].uuid): "warn"}


def test_the_collect_command_always_carries_the_age_limit() -> None:
    assert audit.collect_command("fleetops-agent", 30.0, False) == ["fleetops-agent", "collect", "--max-age", "30"]
    assert audit.collect_command("/opt/a", 2.5, False) == ["/opt/a", "collect", "--max-age", "2.5"]
    assert audit.collect_command("fleetops-agent", 30.0, True) == ["fleetops-agent", "collect", "--fresh"]


def test_a_daemon_snapshot_brings_the_fabric_counter_findings_of_its_window(
        sim_node: Callable[..., model.Node]) -> None:
    """The symbol errors of an HCA port, judged over the daemon's window: in the first audit, with
    no previous audit; the cold collect alone has no rate and says nothing of them."""
    start, now = _pair(sim_node, "ib-symbol-errors@4", dt=60.0)
    found = verdict.node_findings(_result(_served(now, start)), None, previous=None)
    assert _rates(found) == {("fabric.link_errors", None): "crit"}
    assert [f.observed["device"] for f in found if f.check == "fabric.link_errors"] == ["mlx5_4"]
    cold = dataclasses.replace(now, daemon=None)
    assert _rates(verdict.node_findings(_result(cold), None, previous=None)) == {}
