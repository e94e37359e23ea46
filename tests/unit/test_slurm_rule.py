"""Whose drain is it: one rule in fleetops.catalog.slurm, and the collection's byte-identical
copy (plugins/module_utils/slurm_rule.py, which the modules import) held to the same answers on
a table of Reasons."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.catalog import slurm as rule

REPO = Path(__file__).resolve().parents[2]
COPY = REPO / "plugins" / "module_utils" / "slurm_rule.py"
RUN = "20261206T071502Z-3f9a"
OTHER_RUN = "20261205T230000Z-0b1c"

REASONS = [
    None,
    "",
    "   ",
    "maintenance by alice",
    "fleetops driver rollout",
    "[fleetops] fleetops driver rollout",
    "[fleetops]",
    "  [fleetops] padded",
    "[fleetops] healthcheck: memory.ecc_dbe_volatile on GPU GPU-1 0000:18:00.0",
    "[fleetops] fleetops: xid.79",
    f"[fleetops] rollout/{RUN}: driver rollout 580.163.01",
    f"[fleetops] rollout/{OTHER_RUN}: driver rollout 580.163.01",
    f"[fleetops] mig/{RUN}: MIG change",
    f"[fleetops] health/{RUN}-node017: memory.ecc_dbe_volatile on GPU GPU-1",
    "[fleetops] operator/alice@ctl: GPU 3 hung",
    f"[fleetops] reset/{RUN}: reset GPU-1 (memory.ecc_dbe_volatile)",
    "[fleetops] bogus/x: an owner kind that does not exist",
    "[fleetops] rollout/: no run",
    "GPU 3 XID 79,  RMA",
    "[fleetop] typo",
    "x [fleetops] marker not at the start",
]
STATES = [None, "", "IDLE", "IDLE+DRAIN", "MIXED+DRAIN", "DRAINED", "DOWN*+DRAIN", "ALLOCATED", "idle+drain"]


@pytest.fixture(scope="module")
def copy() -> Any:
    spec = importlib.util.spec_from_file_location("fleetops_test_slurm_rule_copy", COPY)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def test_the_collection_carries_the_rule_byte_for_byte() -> None:
    source = Path(rule.__file__).read_bytes()
    assert COPY.read_bytes() == source, (
        f"copy it: cp {Path(rule.__file__).relative_to(REPO)} {COPY.relative_to(REPO)}"
    )


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("state", ["IDLE+DRAIN", "IDLE"])
def test_the_copy_gives_the_same_answers(copy: Any, reason: str | None, state: str) -> None:
    assert dataclasses.astuple(copy.owner_of(reason)) == dataclasses.astuple(rule.owner_of(reason))
    for kind in rule.OWNER_KINDS:
        for run in (RUN, OTHER_RUN):
            a, b = (
                rule.drain_decision(state, reason, kind, run),
                copy.drain_decision(state, reason, kind, run),
            )
            assert (a.action, a.why) == (b.action, b.why)
            for force in (False, True):
                a, b = (
                    rule.resume_decision(state, reason, kind, run, force),
                    copy.resume_decision(state, reason, kind, run, force),
                )
                assert (a.action, a.why) == (b.action, b.why)


def test_owners_are_read_from_the_reason() -> None:
    o = rule.owner_of(f"[fleetops] rollout/{RUN}: driver rollout 580.163.01")
    assert (o.kind, o.run, o.purpose, o.legacy, o.fault) == (
        "rollout",
        RUN,
        "driver rollout 580.163.01",
        False,
        False,
    )
    o = rule.owner_of("[fleetops] healthcheck: memory.ecc_dbe_volatile on GPU GPU-1")
    assert (o.kind, o.run, o.legacy, o.fault) == ("health", None, True, True)
    o = rule.owner_of("[fleetops] fleetops: xid.79")  # the TUI's drains before owners: an operator's
    assert (o.kind, o.legacy, o.fault) == ("operator", True, True)
    o = rule.owner_of("[fleetops] bogus/x: no such kind")
    assert (o.kind, o.legacy) == ("operator", True)
    o = rule.owner_of("maintenance by alice")
    assert (o.kind, o.ours, o.fault) == ("other", False, True)
    assert "alice" in o.describe()


def test_a_reason_written_is_read_back_as_its_owner() -> None:
    for kind in rule.OWNER_KINDS:
        text = rule.drain_reason(kind, RUN, "a purpose with Key=value  and\nnewline")
        assert text.startswith(f"[fleetops] {kind}/{RUN}: ")
        assert "=" not in text and "\n" not in text
        o = rule.owner_of(text)
        assert (o.kind, o.run, o.purpose) == (kind, RUN, "a purpose with Key:value and newline")
    assert len(rule.drain_reason("rollout", RUN, "x" * 500)) == rule.MAX_REASON
    with pytest.raises(ValueError, match="owner kind 'rolout'"):
        rule.drain_reason("rolout", RUN, "typo")
    with pytest.raises(ValueError, match="run id 'a b'"):
        rule.drain_reason("rollout", "a b", "space")


def test_run_ids_carry_their_time() -> None:
    run = rule.new_run_id(1_765_000_000)
    assert rule.RUN_RE.match(run)
    assert rule.run_time(run) == 1_765_000_000
    assert rule.run_time("alice@ctl") is None


# (state, reason, kind, run, force) -> expected action
RESUME_TABLE = [
    ("IDLE", f"[fleetops] rollout/{RUN}: x", "rollout", RUN, False, "not_drained"),
    ("IDLE+DRAIN", f"[fleetops] rollout/{RUN}: x", "rollout", RUN, False, "resume"),
    ("IDLE+DRAIN", f"[fleetops] rollout/{OTHER_RUN}: x", "rollout", RUN, False, "leave"),  # another run's
    ("IDLE+DRAIN", f"[fleetops] health/{OTHER_RUN}: dbe", "rollout", RUN, False, "leave"),  # a fault drain
    ("IDLE+DRAIN", "[fleetops] healthcheck: dbe", "rollout", RUN, False, "leave"),  # old health drain
    ("IDLE+DRAIN", "[fleetops] fleetops: xid.79", "mig", RUN, False, "leave"),  # old TUI drain
    ("IDLE+DRAIN", "[fleetops] healthcheck: dbe", "health", RUN, False, "resume"),  # its own, any pass
    ("IDLE+DRAIN", f"[fleetops] health/{OTHER_RUN}: dbe", "health", RUN, False, "resume"),
    ("IDLE+DRAIN", f"[fleetops] rollout/{RUN}: x", "health", RUN, False, "leave"),  # never a rollout's
    ("IDLE+DRAIN", "[fleetops] operator/bob: GPU 3 hung", "operator", "alice", False, "resume"),
    ("IDLE+DRAIN", f"[fleetops] health/{OTHER_RUN}: dbe", "operator", "alice", False, "leave"),
    ("IDLE+DRAIN", f"[fleetops] health/{OTHER_RUN}: dbe", "operator", "alice", True, "resume"),
    ("IDLE+DRAIN", "maintenance by alice", "operator", "bob", False, "leave"),
    ("IDLE+DRAIN", "maintenance by alice", "operator", "bob", True, "resume"),
    ("IDLE+DRAIN", "maintenance by alice", "rollout", RUN, True, "leave"),  # force is an operator's alone
    ("MIXED+DRAIN", f"[fleetops] reset/{RUN}: reset GPU-1", "reset", RUN, False, "resume"),
    ("MIXED+DRAIN", f"[fleetops] reset/{OTHER_RUN}: reset GPU-1", "reset", RUN, False, "leave"),
]


@pytest.mark.parametrize(("state", "reason", "kind", "run", "force", "expected"), RESUME_TABLE)
def test_who_may_resume(state: str, reason: str, kind: str, run: str, force: bool, expected: str) -> None:
    decision = rule.resume_decision(state, reason, kind, run, force)
    assert decision.action == expected, decision.why
    if expected == "leave":
        assert rule.owner_of(reason).describe() in decision.why


DRAIN_TABLE = [
    ("IDLE", None, "rollout", RUN, "drain"),
    ("IDLE+DRAIN", f"[fleetops] rollout/{RUN}: x", "rollout", RUN, "ours"),
    ("IDLE+DRAIN", f"[fleetops] rollout/{OTHER_RUN}: x", "rollout", RUN, "adopt"),  # a rerun takes it over
    ("IDLE+DRAIN", f"[fleetops] rollout/{OTHER_RUN}: x", "mig", RUN, "held"),
    ("IDLE+DRAIN", f"[fleetops] health/{OTHER_RUN}: dbe", "rollout", RUN, "held"),
    ("IDLE+DRAIN", "[fleetops] healthcheck: dbe", "health", RUN, "ours"),
    (
        "IDLE+DRAIN",
        "[fleetops] fleetops driver rollout",
        "rollout",
        RUN,
        "held",
    ),  # before owners: not adopted
    ("IDLE+DRAIN", f"[fleetops] reset/{OTHER_RUN}: x", "reset", RUN, "held"),  # remediate never adopts
    ("IDLE+DRAIN", "maintenance by alice", "operator", "bob", "held"),
]


@pytest.mark.parametrize(("state", "reason", "kind", "run", "expected"), DRAIN_TABLE)
def test_what_a_drain_does_on_a_drained_node(
    state: str, reason: str, kind: str, run: str, expected: str
) -> None:
    assert rule.drain_decision(state, reason, kind, run).action == expected


SHOW = "\n".join(
    [
        "NodeName=n01 Arch=x86_64 State=IDLE Partitions=gpu,all",
        "NodeName=n02 State=MIXED+DRAIN Reason=[fleetops] health/20261206T070000Z-n02: dbe [root@2026-12-06T07:00:00] Partitions=gpu",
        "NodeName=n03 State=DOWN* Reason=Not responding [slurm@2026-12-06T06:00:00] Partitions=gpu",
        "NodeName=n04 State=ALLOCATED Partitions=gpu",
        "NodeName=n05 State=IDLE Partitions=gpu",
        "NodeName=n06 State=IDLE Partitions=gpu",
        "NodeName=n07 State=IDLE Partitions=gpu",
        "NodeName=n08 State=IDLE Partitions=gpu",
        "NodeName=n09 State=IDLE Partitions=gpu",
        "NodeName=n10 State=IDLE Partitions=gpu",
        "NodeName=c01 State=IDLE Partitions=cpu",
    ]
)


def test_scontrol_show_nodes_is_read_node_by_node() -> None:
    nodes = rule.parse_nodes(SHOW)
    assert [n.name for n in nodes][:3] == ["n01", "n02", "n03"]
    assert nodes[0].partitions == ("gpu", "all")
    assert nodes[1].reason == "[fleetops] health/20261206T070000Z-n02: dbe"
    assert [n.name for n in nodes if rule.is_out(n.state)] == ["n02", "n03"]


def test_a_node_whose_slurmd_does_not_answer_is_out_as_scontrol_and_sinfo_write_it() -> None:
    # scontrol show node -o (what the guard reads) spells it out; sinfo marks it with "*"
    assert rule.is_out("IDLE+NOT_RESPONDING") and rule.is_out("MIXED+NOT_RESPONDING") and rule.is_out("IDLE*")
    assert rule.is_out("IDLE+FUTURE")
    assert not rule.is_out("IDLE") and not rule.is_out("MIXED+COMPLETING") and not rule.is_out("ALLOCATED")
    nodes = rule.parse_nodes(
        "NodeName=n01 State=IDLE+NOT_RESPONDING Partitions=gpu\nNodeName=n02 State=IDLE Partitions=gpu\n"
        "NodeName=n03 State=IDLE Partitions=gpu\n"
    )
    problems = rule.capacity_problems(nodes, ["n02"], 0.34)  # one of three may be out: n01 already is
    assert len(problems) == 1 and "partition gpu: 1 of 3 nodes are out of service already (n01)" in problems[0]


def test_capacity_counts_every_node_out_whoever_drained_it() -> None:
    nodes = rule.parse_nodes(SHOW)
    # gpu has 10 nodes; two are out already (a health drain, a node down)
    assert rule.allowed_out(10, 0.1) == 1 and rule.allowed_out(3, 0.1) == 1 and rule.allowed_out(10, 0.5) == 5
    problems = rule.capacity_problems(nodes, ["n05"], 0.1)
    assert len(problems) == 1
    assert "partition gpu: 2 of 10 nodes are out of service already (n02, n03)" in problems[0]
    assert "more than the allowed 1 (10%)" in problems[0]
    assert rule.capacity_problems(nodes, ["n05"], 0.3) == []  # 3 of 10
    assert len(rule.capacity_problems(nodes, ["n05", "n06"], 0.3)) == 1  # 4 of 10
    assert rule.capacity_problems(nodes, ["n02"], 0.1) == []  # already out: draining adds nothing
    assert rule.capacity_problems(nodes, ["c01"], 0.1) == []  # its own partition is untouched
    with pytest.raises(ValueError, match="max drain share 0"):
        rule.capacity_problems(nodes, ["n05"], 0)


def test_the_breaker_counts_standing_health_drains_of_the_watched_nodes() -> None:
    nodes = rule.parse_nodes(SHOW)
    # one standing health drain among 10 gpu nodes; at 20 % two may stand: one more is fine
    is_open, why = rule.breaker(nodes, "n05", 0.2)
    assert not is_open and "1 of 10 watched nodes stand drained by the health program (n02)" in why
    assert rule.breaker(nodes, "n05", 0.1)[0]  # limit 1: the second drain trips it
    assert not rule.breaker(nodes, "c01", 0.1)[0]  # the cpu partition has no health drain
    # however old the drain: a lasting false positive keeps the breaker open
    old = [
        rule.SlurmNode(
            n.name, n.state, n.reason.replace("20261206T070000Z", "20250101T000000Z"), n.partitions
        )
        if n.reason
        else n
        for n in nodes
    ]
    assert rule.breaker(old, "n05", 0.1)[0]
