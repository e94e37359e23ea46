"""fleetops.ops.slurm on the controller: argv, Slurm names, where scontrol runs, and the drain /
resume decisions of the owners rule (catalog.slurm), against a stand-in scontrol as strict as the
real one, run as a real subprocess (tests/fake_scontrol.py)."""

from __future__ import annotations

from pathlib import Path

import fake_scontrol
import pytest

from fleetops.catalog import slurm as rule
from fleetops.common.errors import UsageError
from fleetops.fleet.inventory import Host
from fleetops.ops import results, slurm

ALICE = "[fleetops] operator/alice@ctl01: GPU 3 hangs, ticket 4411"
HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu01: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
ROLLOUT_OLD = "[fleetops] rollout/20261205T071502Z-aaaa: driver rollout 580.163.01"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fs = fake_scontrol.FakeSlurm(tmp_path)
    for key, value in fs.env().items():  # the fake's state, and the slurm.conf a cluster member has
        monkeypatch.setenv(key, value)

    def setup(nodes: dict, **kw) -> tuple[slurm.SlurmControl, fake_scontrol.FakeSlurm]:
        fs.set(nodes)
        return slurm.SlurmControl([], scontrol=str(fs.scontrol), **kw), fs

    return setup


def node(name: str = "gpu01.dc1.example.com", **vars: object) -> Host:
    return Host(name=name, address="127.0.0.1", vars=dict(vars))


def test_argv_is_a_list_with_the_reason_as_one_argument() -> None:
    assert slurm.show_argv("gpu01") == ["scontrol", "show", "node", "-o", "gpu01"]
    assert slurm.show_all_argv("/opt/slurm/bin/scontrol") == [
        "/opt/slurm/bin/scontrol",
        "show",
        "nodes",
        "-o",
    ]
    reason = rule.drain_reason("operator", "alice@ctl01", "GPU 3: XID 79; rm -rf /")
    assert slurm.drain_argv("gpu01", reason) == [
        "scontrol",
        "update",
        "NodeName=gpu01",
        "State=DRAIN",
        "Reason=[fleetops] operator/alice@ctl01: GPU 3: XID 79; rm -rf /",  # one argument: no shell sees it
    ]
    assert slurm.resume_argv("gpu01", "/opt/slurm/bin/scontrol") == [
        "/opt/slurm/bin/scontrol",
        "update",
        "NodeName=gpu01",
        "State=RESUME",
    ]


def test_slurm_name_is_the_variable_or_the_short_inventory_name() -> None:
    assert slurm.slurm_name(node("gpu01.dc1.example.com")) == "gpu01"
    assert slurm.slurm_name(node("gpu01")) == "gpu01"
    assert slurm.slurm_name(node("gpu01.dc1", fleetops_slurm_node_name="dc1-gpu-001")) == "dc1-gpu-001"
    assert slurm.slurm_name(node("gpu01.dc1", fleetops_slurm_node_name="  ")) == "gpu01"


def test_place_is_the_controller_an_inventory_host_or_an_address() -> None:
    ctl = Host(name="slurmctl", address="127.0.0.9", port=2222, user="ops")
    control = slurm.SlurmControl([ctl])
    assert control.place(node()).host is None
    assert control.place(node()).where == "the controller"
    by_name = control.place(node(fleetops_slurm_host="slurmctl"))
    assert by_name.host is ctl and by_name.where == "Slurm host slurmctl"
    gpu = Host(
        name="gpu01",
        address="127.0.0.5",
        user="root",
        key_file="/k",
        vars={"fleetops_slurm_host": "127.0.0.7"},
    )
    by_address = control.place(gpu)
    assert (by_address.host.address, by_address.host.user, by_address.host.key_file) == (
        "127.0.0.7",
        "root",
        "/k",
    )
    local = Host(name="here", address="localhost", connection="local")
    assert slurm.SlurmControl([local]).place(node(fleetops_slurm_host="here")).host is None


def test_drain_names_its_owner_and_resume_lifts_it(fake) -> None:
    control, fs = fake(fake_scontrol.cluster(10, gpu01="MIXED"))
    done = control.drain(node(), "GPU 3 hung", kind="operator", run="alice@ctl01")
    assert done.outcome == results.DONE and done.action == "drain", done
    want = "[fleetops] operator/alice@ctl01: GPU 3 hung"
    assert fs.nodes()["gpu01"]["state"] == "MIXED+DRAIN" and fs.nodes()["gpu01"]["reason"] == want
    assert done.detail["decision"] == "drain" and done.detail["owner"] is None
    # the same owner again: nothing sent, the owner in the detail
    again = control.drain(node(), "something else", kind="operator", run="bob@ctl02")
    assert again.outcome == results.DONE and "nothing sent" in again.message, again
    assert again.detail["owner"] == {
        "kind": "operator",
        "run": "alice@ctl01",
        "purpose": "GPU 3 hung",
        "fault": True,
    }
    resumed = control.resume(node(), kind="operator", run="bob@ctl02")  # operators own by kind
    assert resumed.outcome == results.DONE and resumed.action == "resume", resumed
    assert fs.nodes()["gpu01"]["state"] == "MIXED"
    assert fs.updates() == [
        ["update", "NodeName=gpu01", "State=DRAIN", f"Reason={want}"],
        ["update", "NodeName=gpu01", "State=RESUME"],
    ]
    nothing = control.resume(node(), kind="operator", run="bob@ctl02")
    assert nothing.outcome == results.REFUSED and "not drained" in nothing.message
    assert len(fs.updates()) == 2


def test_a_reset_run_lifts_only_its_own_run(fake) -> None:
    """remediate's signature: drain(host, purpose, kind="reset", run=...), resume(host, kind=..., run=...)."""
    control, fs = fake(fake_scontrol.cluster(10))
    done = control.drain(
        node(), "reset GPU-5d3e (memory.ecc_dbe_volatile)", kind="reset", run="20261206T032210Z-91af"
    )
    assert done.outcome == results.DONE, done
    other = control.resume(node(), kind="reset", run="20261206T040000Z-0000")
    assert (
        other.outcome == results.REFUSED
        and "remediate, for a GPU reset (run 20261206T032210Z-91af)" in other.message
    )
    assert "only an operator lifts it" in other.message and other.detail["owner"]["kind"] == "reset"
    own = control.resume(node(), kind="reset", run="20261206T032210Z-91af")
    assert own.outcome == results.DONE, own
    assert len(fs.updates()) == 2


def test_another_owners_drain_is_held_and_named_with_slurms_stamp(fake) -> None:
    nodes = fake_scontrol.cluster(10)
    nodes["gpu01"].update(state="IDLE+DRAIN", reason=HEALTH, by="slurm", at="2026-12-06T03:12:07")
    control, fs = fake(nodes)
    held = control.drain(node(), "driver rollout", kind="rollout", run="20261206T071502Z-3f9a")
    assert held.outcome == results.REFUSED and held.detail["decision"] == "held", held
    assert "the health program (run 20261206T031207Z-7c1e-gpu01)" in held.message
    assert "[set by slurm at 2026-12-06T03:12:07]" in held.message
    assert held.detail["owner"]["kind"] == "health" and held.detail["owner"]["fault"] is True
    assert held.detail["reason_set_by"] == "slurm"
    left = control.resume(node(), kind="operator", run="alice@ctl01")
    assert left.outcome == results.REFUSED and "the health program" in left.message
    assert "fleetops resume --force" in left.message
    assert fs.updates() == [] and fs.nodes()["gpu01"]["reason"] == HEALTH
    forced = control.resume(node(), kind="operator", run="alice@ctl01", force=True)
    assert forced.outcome == results.DONE and "forced by an operator" in forced.message, forced
    assert fs.updates() == [["update", "NodeName=gpu01", "State=RESUME"]]


def test_someone_outside_fleetops_is_named_and_their_reason_kept(fake) -> None:
    nodes = fake_scontrol.cluster(10)
    nodes["gpu01"].update(state="IDLE+DRAIN", reason="maintenance by alice", by="alice")
    control, fs = fake(nodes)
    res = control.resume(node(), kind="operator", run="bob@ctl01")
    assert res.outcome == results.REFUSED, res
    assert "maintenance by alice" in res.message and "alice at 2026-12-02T10:00:00" in res.message
    drained = control.drain(node(), "GPU 3 hung", kind="operator", run="bob@ctl01")
    assert drained.outcome == results.REFUSED and "someone outside fleetops" in drained.message
    assert fs.updates() == [] and fs.nodes()["gpu01"]["reason"] == "maintenance by alice"


def test_a_planned_run_takes_over_an_earlier_run_of_its_kind(fake) -> None:
    nodes = fake_scontrol.cluster(10)
    nodes["gpu01"].update(state="IDLE+DRAIN", reason=ROLLOUT_OLD)
    control, fs = fake(nodes)
    res = control.drain(node(), "driver rollout 580.163.01", kind="rollout", run="20261206T071502Z-3f9a")
    assert res.outcome == results.DONE and res.detail["decision"] == "adopt", res
    new = "[fleetops] rollout/20261206T071502Z-3f9a: driver rollout 580.163.01"
    assert fs.nodes()["gpu01"]["reason"] == new
    # the take-over needs no capacity listing: the node is out already
    assert [c for c in fs.calls() if c[:2] == ["show", "nodes"]] == []


def test_an_unmanaged_host_is_refused_without_running_anything(fake) -> None:
    control, fs = fake(fake_scontrol.cluster(3))
    for value in (False, "false", "no"):
        host = node(fleetops_slurm_managed=value)
        drained = control.drain(host, "x", kind="operator", run="alice@ctl01")
        assert drained.outcome == results.REFUSED
        assert "not managed by Slurm (fleetops_slurm_managed: false)" in drained.message
        resumed = control.resume(host, kind="operator", run="alice@ctl01")
        assert resumed.outcome == results.REFUSED and "fleetops_slurm_managed: false" in resumed.message
        assert "fleetops_slurm_managed: false" in (control.precheck(host) or "")
    assert fs.calls() == []
    assert control.drain(node(fleetops_slurm_managed=True), "x", kind="operator", run="a@b").ok


def test_the_capacity_guard_refuses_a_drain_over_the_share(fake) -> None:
    nodes = fake_scontrol.cluster(10)
    nodes["gpu03"].update(state="DOWN*", reason="Not responding")  # out of service, not by fleetops
    control, fs = fake(nodes)
    res = control.drain(node(), "GPU 3 hung", kind="operator", run="alice@ctl01")
    assert res.outcome == results.REFUSED, res
    assert "partition gpu: 1 of 10 nodes are out of service already (gpu03)" in res.message
    assert "more than the allowed 1 (10%)" in res.message and res.detail["capacity"]
    assert fs.updates() == []
    assert ["show", "nodes", "-o"] in fs.calls()
    wider, _fs = fake(nodes, max_share=0.25)
    assert wider.drain(node(), "GPU 3 hung", kind="operator", run="alice@ctl01").outcome == results.DONE
    with pytest.raises(UsageError, match="max drain share"):
        slurm.SlurmControl([], max_share=0)


def test_drain_many_checks_the_whole_set_first(fake) -> None:
    control, fs = fake(fake_scontrol.cluster(20))
    hosts = [node("gpu01"), node("gpu02"), node("gpu03")]
    refused = control.drain_many(hosts, "rack 12 PDU swap", kind="operator", run="alice@ctl01")
    assert [r.outcome for r in refused] == [results.REFUSED] * 3
    assert all(
        "draining gpu01, gpu02, gpu03 would make 3, more than the allowed 2" in r.message for r in refused
    )
    assert fs.updates() == []
    done = control.drain_many(hosts[:2], "rack 12 PDU swap", kind="operator", run="alice@ctl01")
    assert [r.outcome for r in done] == [results.DONE] * 2, done
    assert [c[1] for c in fs.updates()] == ["NodeName=gpu01", "NodeName=gpu02"]


def test_drain_many_names_an_unknown_node_and_drains_the_others(fake) -> None:
    control, fs = fake(fake_scontrol.cluster(20))
    out = control.drain_many([node("gpu01"), node("gpu99.dc1")], "x", kind="operator", run="alice@ctl01")
    assert out[0].outcome == results.DONE
    assert out[1].outcome == results.REFUSED and "'gpu99'" in out[1].message and "gpu99.dc1" in out[1].message
    assert [c[1] for c in fs.updates()] == ["NodeName=gpu01"]


def test_dry_run_says_what_would_be_sent_and_sends_nothing(fake) -> None:
    nodes = fake_scontrol.cluster(20)
    nodes["gpu02"].update(state="IDLE+DRAIN", reason=ALICE)
    control, fs = fake(nodes)
    would = control.drain(node(), "GPU 3 hung", kind="operator", run="bob@ctl01", dry_run=True)
    assert would.outcome == results.DRY_RUN and would.ok
    assert "[fleetops] operator/bob@ctl01: GPU 3 hung" in would.message
    assert would.detail["command"][-1] == "Reason=[fleetops] operator/bob@ctl01: GPU 3 hung"
    lift = control.resume(node("gpu02"), kind="operator", run="bob@ctl01", dry_run=True)
    assert lift.outcome == results.DRY_RUN and "would be resumed" in lift.message
    assert fs.updates() == []


def test_a_bad_owner_is_a_usage_error_before_anything_runs(fake) -> None:
    control, fs = fake(fake_scontrol.cluster(3))
    with pytest.raises(UsageError, match="owner kind"):
        control.drain(node(), "x", kind="janitor", run="r1")
    with pytest.raises(UsageError, match="run id"):
        control.resume(node(), kind="operator", run="alice at ctl01")
    assert fs.calls() == []


def test_unknown_node_and_missing_scontrol_are_refused_by_name(fake, tmp_path: Path) -> None:
    control, _fs = fake(fake_scontrol.cluster(3))
    res = control.drain(node("gpu99.dc1"), "x", kind="operator", run="alice@ctl01")
    assert res.outcome == results.REFUSED
    assert (
        "'gpu99'" in res.message and "fleetops_slurm_node_name" in res.message and "gpu99.dc1" in res.message
    )
    missing = slurm.SlurmControl([], scontrol=str(tmp_path / "no-scontrol"))
    res = missing.drain(node(), "x", kind="operator", run="alice@ctl01")
    assert res.outcome == results.REFUSED
    assert res.message == (
        "gpu01.dc1.example.com: nothing sent: scontrol not found on the controller: install Slurm's client "
        "there, or set fleetops_slurm_host for gpu01.dc1.example.com to a host that has it"
    )
    assert "scontrol not found on the controller" in (missing.precheck(node()) or "")


def test_a_controller_that_fails_is_failed_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")  # configured, but slurmctld does not answer
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    broken = tmp_path / "scontrol"
    broken.write_text(
        "#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    res = slurm.SlurmControl([], scontrol=str(broken)).drain(node(), "x", kind="operator", run="alice@ctl01")
    assert res.outcome == results.FAILED and "Unable to contact slurm controller" in res.message


def test_precheck_wants_a_slurm_configuration_on_the_controller(fake, tmp_path: Path, monkeypatch) -> None:
    control, _fs = fake({})
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    assert "no Slurm configuration" in (control.precheck(node()) or "")
    (tmp_path / "absent.conf").write_text("ClusterName=x\n")
    assert control.precheck(node()) is None
    # a Slurm host is asked over SSH: nothing to check locally
    assert control.precheck(node(fleetops_slurm_host="127.0.0.7")) is None


def test_an_update_whose_answer_was_lost_is_unknown_with_the_check(fake) -> None:
    """The transport's outcome-unknown (sent over SSH, connection lost) is the action's unknown:
    never retried here, and the operator gets the command that tells what happened."""
    from fleetops.fleet import transport

    control, _fs = fake(fake_scontrol.cluster(10))
    real = control._transport_run
    sent: list[list[str]] = []

    def lose_updates(host, argv):
        if argv[1] != "update":
            return real(host, argv)
        sent.append(list(argv))
        return transport.Result("slurmctl", False, None, "", "", "outcome-unknown", "sent, no answer", 0.1)

    lossy = slurm.SlurmControl([], scontrol=control.scontrol, runner=lose_updates)
    res = lossy.drain(node(), "GPU 3 hung", kind="operator", run="alice@ctl01")
    assert res.outcome == results.UNKNOWN and not res.ok
    assert res.check == f"{control.scontrol} show node -o gpu01" and res.check in res.message
    assert len(sent) == 1  # sent once, not again


def test_plan_drains_allows_nodes_in_order_up_to_each_partitions_share_and_sends_nothing(fake) -> None:
    """Two partitions of 20 (10 %: two out each); gpu31 is out already in b. The plan keeps the
    order given: a's first two are allowed, its third refused with the guard's words; b has
    room for one more; another owner's drain is held, this operator's needs nothing (both in a
    third partition), a node Slurm does not know and an unmanaged host are refused by name.
    Nothing is sent, and Slurm is asked for its nodes once."""
    nodes = {**fake_scontrol.cluster(22, "a"), **{f"gpu{i}": {"state": "IDLE", "partitions": ["b"]} for i in range(31, 51)}}
    nodes["gpu31"].update(state="DOWN+DRAIN", reason="PSU")
    nodes["gpu04"].update(state="IDLE+DRAIN", reason=HEALTH, partitions=["c"])
    nodes["gpu05"].update(state="IDLE+DRAIN", reason="[fleetops] operator/bob@ctl02: ticket 1", partitions=["c"])
    control, fs = fake(nodes)
    names = ["gpu01", "gpu02", "gpu03", "gpu32", "gpu33", "gpu04", "gpu05", "gpu99", "ws01"]
    hosts = [node(n, **({"fleetops_slurm_managed": False} if n == "ws01" else {})) for n in names]
    plan = control.plan_drains(hosts, "rack 12 PDU swap", kind="operator", run="alice@ctl01")
    assert [(r.node, r.outcome) for r in plan] == [
        ("gpu01", results.DRY_RUN),
        ("gpu02", results.DRY_RUN),
        ("gpu03", results.REFUSED),
        ("gpu32", results.DRY_RUN),
        ("gpu33", results.REFUSED),
        ("gpu04", results.REFUSED),
        ("gpu05", results.DONE),
        ("gpu99", results.REFUSED),
        ("ws01", results.REFUSED),
    ]
    assert plan[0].message == "gpu01: would be drained with Reason '[fleetops] operator/alice@ctl01: rack 12 PDU swap'"
    assert plan[2].message == (
        "gpu03: not drained: partition a: 0 of 20 nodes are out of service already (none); draining gpu01, "
        "gpu02, gpu03 would make 3, more than the allowed 2 (10%)"
    )
    assert plan[4].message == (
        "gpu33: not drained: partition b: 1 of 20 nodes are out of service already (gpu31); draining gpu32, "
        "gpu33 would make 3, more than the allowed 2 (10%)"
    )
    assert plan[5].message.startswith("gpu04: drained by the health program (run 20261206T031207Z-7c1e-gpu01)")
    assert plan[6].message == "gpu05: already drained by an operator (run bob@ctl02): ticket 1; nothing to send"
    assert "knows no node named 'gpu99'" in plan[7].message
    assert plan[8].message == "ws01: not managed by Slurm (fleetops_slurm_managed: false): nothing to drain"
    assert fs.updates() == []
    assert [c for c in fs.calls() if c[:2] == ["show", "nodes"]] == [["show", "nodes", "-o"]]  # asked once


def test_purpose_refusal_refuses_an_empty_purpose_and_one_the_reason_would_cut() -> None:
    run = "alice@ctl01"
    room = rule.MAX_REASON - len(f"[fleetops] operator/{run}: ")
    assert slurm.purpose_refusal("operator", run, "  \t ") is not None
    assert slurm.purpose_refusal("operator", run, "x" * room) is None
    assert rule.drain_reason("operator", run, "x" * room).endswith("x" * room)  # kept whole
    too_long = slurm.purpose_refusal("operator", run, "x" * (room + 1))
    assert too_long is not None and too_long.startswith(f"the reason is {room + 1} characters; at most {room} fit")


def test_without_a_slurm_configuration_nothing_is_sent_and_the_fake_refuses_as_scontrol_does(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller with scontrol but no configuration: the drain and the resume are refused
    before anything runs (the TUI's gate gives the same reason), and the fake scontrol itself
    refuses as the real one does, so no test can drain through a controller that could not."""
    import subprocess

    control, fs = fake(fake_scontrol.cluster(3, gpu01="IDLE+DRAIN"))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    drained = control.drain(node(), "x", kind="operator", run="alice@ctl01")
    resumed = control.resume(node(), kind="operator", run="alice@ctl01", force=True)
    why = (
        f"no Slurm configuration on the controller ({tmp_path / 'absent.conf'} missing): set SLURM_CONF, "
        "or fleetops_slurm_host for gpu01.dc1.example.com to a host of the cluster"
    )
    assert (drained.outcome, drained.message) == (results.REFUSED, f"gpu01.dc1.example.com: nothing sent: {why}")
    assert (resumed.outcome, resumed.message) == (results.REFUSED, f"gpu01.dc1.example.com: nothing sent: {why}")
    assert fs.calls() == []
    env = {**fs.env(), "SLURM_CONF": str(tmp_path / "absent.conf")}
    done = subprocess.run([str(fs.scontrol), "show", "nodes", "-o"], env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines()[-1] == "scontrol: fatal: Unable to process configuration file"
