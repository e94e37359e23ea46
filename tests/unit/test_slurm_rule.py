"""The Slurm marker rule: one rule in fleetops.catalog.slurm, the same answers from the
standalone Ansible module (which cannot import fleetops), and the controller's argv and name
resolution in fleetops.ops.slurm."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from fleetops.catalog import slurm as rule

MODULE_FILE = Path(__file__).resolve().parents[2] / "plugins" / "modules" / "fleetops_slurm_node.py"

REASONS = [
    None,
    "",
    "   ",
    "maintenance by alice",
    "fleetops driver rollout",
    "[fleetops] fleetops driver rollout",
    "[fleetops]",
    "  [fleetops] padded",
    "GPU 3 XID 79,  RMA",
    "fleetops: looks like ours but is not marked",
    "[fleetop] typo",
    "x [fleetops] marker not at the start",
]

SHOW_LINES = [
    "",
    "NodeName=g1 State=IDLE",
    "NodeName=g1 Arch=x86_64 State=MIXED+DRAIN Reason=fleetops driver rollout [root@2026-12-02T10:00:00] Comment=x",
    "NodeName=g1 State=IDLE+DRAIN Reason=[fleetops] GPU 3 hung [root@2026-12-02T10:00:00]",
    "NodeName=node102 State=DOWN+DRAIN+NOT_RESPONDING Reason=maintenance by alice [alice@2026-12-02T09:00:00]",
    "NodeName=g1 State=DRAINED Reason=no stamp here",
    "NodeName=g1 State=IDLE* Reason=Not responding [slurm@2026-12-02T10:00:00] Partitions=gpu",
]

STATES = [
    None,
    "",
    "IDLE",
    "IDLE+DRAIN",
    "MIXED+DRAIN",
    "DRAINED",
    "DRAINING",
    "DOWN*+DRAIN",
    "ALLOCATED",
    "idle+drain",
]


@pytest.fixture(scope="module")
def module() -> Any:
    spec = importlib.util.spec_from_file_location("fleetops_test_slurm_node_rule", MODULE_FILE)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_module_and_the_catalog_share_the_marker(module: Any) -> None:
    assert module.MARKER == rule.MARKER
    assert module.DEFAULT_REASON == rule.DEFAULT_REASON
    assert module.DRAIN_FLAGS == rule.DRAIN_FLAGS


@pytest.mark.parametrize("reason", REASONS)
def test_the_module_and_the_catalog_agree_on_reasons(module: Any, reason: str | None) -> None:
    assert module.is_ours(reason) == rule.is_ours(reason)
    assert module.marked_reason(reason) == rule.marked_reason(reason)
    # what fleetops sets is recognised as its own by both
    assert rule.is_ours(rule.marked_reason(reason)) and module.is_ours(module.marked_reason(reason))


@pytest.mark.parametrize("line", SHOW_LINES)
def test_the_module_and_the_catalog_read_scontrol_alike(module: Any, line: str) -> None:
    assert module.parse_node(line) == rule.parse_node(line)


@pytest.mark.parametrize("state", STATES)
def test_the_module_and_the_catalog_agree_on_drained(module: Any, state: str | None) -> None:
    assert module.is_drained(state) == rule.is_drained(state)


def test_marker_rule() -> None:
    assert rule.marked_reason("GPU 3 hung") == "[fleetops] GPU 3 hung"
    assert rule.marked_reason("[fleetops] GPU 3 hung") == "[fleetops] GPU 3 hung"  # not twice
    assert rule.marked_reason("") == "[fleetops] fleetops maintenance"
    assert rule.is_ours("[fleetops] GPU 3 hung")
    assert not rule.is_ours("maintenance by alice")
    assert not rule.is_ours("fleetops driver rollout")  # the words alone are not the marker
    assert not rule.is_ours(None)


def test_parse_node_and_the_stamp() -> None:
    line = "NodeName=n2 State=IDLE+DRAIN Reason=maintenance by alice [alice@2026-12-02T09:00:00] Comment=x"
    assert rule.parse_node(line) == ("IDLE+DRAIN", "maintenance by alice")
    assert rule.reason_stamp(line) == ("alice", "2026-12-02T09:00:00")
    assert rule.reason_stamp("NodeName=n2 State=IDLE") == (None, None)
    assert rule.reason_stamp("NodeName=n2 State=IDLE+DRAIN Reason=no stamp") == (None, None)
    assert rule.is_drained("MIXED+DRAIN") and rule.is_drained("DRAINED")
    assert not rule.is_drained("IDLE") and not rule.is_drained("ALLOCATED")
