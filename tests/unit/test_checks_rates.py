"""Counter rates come from two snapshots (``collected_at``); without a previous snapshot no
rate is invented."""

from __future__ import annotations

import time

import pytest

from fleetops import baseline
from fleetops.checks import run_node_checks
from fleetops.checks.pcie import replay_threshold
from fleetops.sim import gpu as sim


def _pair(sim_node, fault: str, dt: float = 120.0):
    state = sim.build_state("n1", {"faults": [fault]})
    t0 = time.time()
    return sim_node(state=state, now=t0), sim_node(state=state, now=t0 + dt)


def _by_check(findings, check):
    return [f for f in findings if f.check == check]


def test_pcie_replay_storm_rate_from_two_snapshots_is_warn(sim_node):
    prev, cur = _pair(sim_node, "pcie-replay-storm@2")
    [f] = _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate")
    assert f.severity == "warn" and f.gpu["index"] == 2
    assert f.observed["per_min"] == pytest.approx(sim.REPLAY_STORM_PER_MIN, rel=0.01)
    assert f.expected == "<= 31/min"


def test_pcie_replays_without_previous_snapshot_report_total_as_info(sim_node):
    _, cur = _pair(sim_node, "pcie-replay-storm@2")
    [f] = _by_check(run_node_checks(cur, None, None), "pcie.replay_rate")
    assert f.severity == "info" and f.observed["total"] >= sim.REPLAY_STORM_BASE
    assert "per_min" not in f.observed


def test_pcie_replays_below_the_rate_limit_are_silent(sim_node):
    prev, cur = _pair(sim_node, "pcie-replay-storm@2")
    cur.gpus[2].pcie_replay_counter = prev.gpus[2].pcie_replay_counter + 40  # 20/min < 31/min
    assert _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate") == []


def test_pcie_replay_limit_scales_with_link_generation_and_width():
    assert replay_threshold(31, 5, 16) == 31
    assert replay_threshold(31, 4, 16) == 16  # DCGM: ceil(1e-12 * 16e9 * 60 * 16) = 16
    assert replay_threshold(31, 5, 8) == 16
    assert replay_threshold(31, 4, 8) == 8
    assert replay_threshold(31, 6, 16) == 62


def test_pcie_replay_rate_on_a_downtrained_link_uses_the_lower_limit(sim_node):
    prev, cur = _pair(sim_node, "pcie-downgrade@1")  # Gen4 x8: limit 8/min
    cur.gpus[1].pcie_replay_counter = 40  # 20/min over 2 min
    [f] = _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate")
    assert f.severity == "warn" and f.expected == "<= 8/min"


def test_counter_that_went_back_is_a_reset_not_a_negative_rate(sim_node):
    prev, cur = _pair(sim_node, "pcie-replay-storm@2")
    prev.gpus[2].pcie_replay_counter = 10**6  # the GPU was reset in between
    [f] = _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate")
    assert f.severity == "info"


def test_snapshots_closer_than_the_minimum_interval_give_no_rate(sim_node):
    prev, cur = _pair(sim_node, "pcie-replay-storm@2", dt=3.0)
    [f] = _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate")
    assert f.severity == "info"


def test_nvlink_crc_storm_rate_is_warn_and_names_the_link(sim_node):
    prev, cur = _pair(sim_node, "nvlink-crc-storm@4")
    [f] = _by_check(run_node_checks(cur, None, prev), "nvlink.error_rate")
    assert f.severity == "warn" and f.gpu["index"] == 4
    assert f.observed["per_min"]["crc_errors"] == pytest.approx(sim.CRC_STORM_PER_MIN, rel=0.01)
    assert "link 0" in f.message


def test_nvlink_crc_rate_over_the_crit_threshold_is_crit(sim_node):
    prev, cur = _pair(sim_node, "nvlink-crc-storm@4")
    b = baseline.from_mapping({"thresholds": {"nvlink_crc_per_min_warn": 10, "nvlink_crc_per_min_crit": 1000}}, "t")
    [f] = _by_check(run_node_checks(cur, b, prev), "nvlink.error_rate")
    assert f.severity == "crit"


def test_nvlink_counters_without_previous_snapshot_are_info_totals(sim_node):
    _, cur = _pair(sim_node, "nvlink-crc-storm@4")
    [f] = _by_check(run_node_checks(cur, None, None), "nvlink.error_rate")
    assert f.severity == "info" and f.observed["totals"]["crc_errors"] >= sim.CRC_STORM_BASE


def test_nvlink_new_replay_or_recovery_errors_warn(sim_node):
    prev, cur = _pair(sim_node, "ecc-dbe@0")  # any state: counters edited by hand
    cur.gpus[6].nvlinks[5].recovery_errors = 1
    [f] = _by_check(run_node_checks(cur, None, prev), "nvlink.error_rate")
    assert f.severity == "warn" and f.gpu["index"] == 6 and "recoveries" in f.message


def test_sbe_growth_rate_warns_only_with_a_previous_snapshot(sim_node):
    prev, cur = _pair(sim_node, "ecc-sbe-storm@7")
    with_prev = {f.check for f in run_node_checks(cur, None, prev)}
    without = {f.check for f in run_node_checks(cur, None, None)}
    assert "memory.ecc_sbe_rate" in with_prev and "memory.ecc_sbe_rate" not in without


def test_slow_sbe_growth_is_silent(sim_node):
    state = sim.build_state("n1")
    t0 = time.time()
    prev, cur = sim_node(state=state, now=t0), sim_node(state=state, now=t0 + 3600)
    cur.gpus[0].ecc_corrected_volatile = 500  # 500/h < 1000/h
    assert run_node_checks(cur, None, prev) == []


def test_rates_match_gpus_by_uuid_not_index(sim_node):
    """After a GPU falls off the bus the driver renumbers: GPU 5 becomes index 4."""
    healthy = sim.build_state("n1", {"faults": ["pcie-replay-storm@5"]})
    t0 = time.time()
    prev = sim_node(state=healthy, now=t0)
    lost = sim.build_state("n1", {"faults": ["pcie-replay-storm@5", "gpu-missing@4"]})
    cur = sim_node(state=lost, now=t0 + 120)
    # index 4 now holds the storming GPU; by index its counter would be compared with the old GPU 4's 0
    replay = _by_check(run_node_checks(cur, None, prev), "pcie.replay_rate")
    assert [f.gpu["uuid"] for f in replay] == [healthy["gpus"][5]["uuid"]]
    assert replay[0].severity == "warn"
