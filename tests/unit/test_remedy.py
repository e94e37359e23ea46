"""fleetops reset / remediate without SSH: the plan from findings, the index -> UUID resolution,
the confirmation, and carrying out the plan (the agent runs locally on simulator state)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetops import checks, cli, model
from fleetops.agent.collect import collect
from fleetops.checks import verdict
from fleetops.fleet import audit
from fleetops.fleet.store.database import Store
from fleetops.fleet.transport import Result
from fleetops.ops import frontend
from fleetops.remedy import cli as remedy_cli
from fleetops.remedy import plan
from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]


def finding(check, severity="crit", node="node001", gpu=0, action=None, observed=None):
    ref = {"index": gpu, "uuid": f"GPU-{node}-{gpu}", "bus_id": f"0000:{0x18 + gpu:02x}:00.0"} if gpu is not None else None
    return model.Finding(check=check, severity=severity, node=node, message=f"{check} on {gpu}", gpu=ref,
                         observed=observed, action=action)


def node_findings(tmp_path, name, faults):
    path = tmp_path / f"{name}.json"
    sim.init_state(str(path), name, {"faults": faults})
    snap = collect("sim", str(path))
    return path, snap, checks.run_node_checks(snap)


# --- the plan ----------------------------------------------------------------------------


def test_each_fault_gets_the_action_the_catalog_and_checks_give(tmp_path):
    _, _, found = node_findings(
        tmp_path, "node001", ["ecc-dbe@1", "row-remap-failure@2", "xid:13@3", "row-remap-pending@4", "xid:119@5"]
    )
    p = plan.build(found, ["node001"])
    (node,) = p.nodes
    by_index = {i.gpu["index"]: i.action for i in node.items if i.gpu}
    assert by_index == {1: "reset_gpu", 2: "drain_and_inspect", 3: "restart_app", 4: "reset_gpu", 5: "reset_gpu"}
    assert node.action == "drain_and_inspect"
    assert [i.gpu["index"] for i in node.resets] == [1, 4, 5]


def test_a_gpu_off_the_bus_makes_the_node_reboot_and_supersedes_its_resets(tmp_path):
    _, _, found = node_findings(tmp_path, "node002", ["xid:79@6", "ecc-dbe@0"])
    p = plan.build(found, ["node002"])
    (node,) = p.nodes
    assert node.action == "reboot_node"
    reset_item = next(i for i in node.items if i.gpu and i.gpu["index"] == 0)
    assert reset_item.action == "reset_gpu" and reset_item.superseded_by == "reboot_node"
    assert p.resets == []
    text = plan.render(p)
    assert "drain and reboot the node" in text and "superseded: reboot node" in text


def test_worst_action_per_gpu_wins_and_info_and_unknown_plan_nothing():
    found = [
        finding("memory.ecc_dbe_volatile"),
        finding("memory.row_remap_failure"),
        finding("pcie.replay_rate", "info", gpu=1),
        finding("transport.unreachable", "unknown", node="node009", gpu=None, action="Check the node is up"),
    ]
    p = plan.build(found, ["node001", "node009"])
    assert [(n.node, n.action) for n in p.nodes] == [("node001", "drain_and_inspect"), ("node009", "none")]
    assert [i.action for i in p.nodes[0].items] == ["drain_and_inspect"]
    assert p.nodes[1].cannot_plan[0]["check"] == "transport.unreachable"
    assert "cannot plan" in plan.render(p)


def test_xid_findings_follow_the_xid_catalog():
    def xid(code, sev="crit", name="x"):
        return finding("xid.recent", sev, observed=[{"code": code, "name": name, "severity": sev, "count": 1, "sxid": False}])

    assert plan.action_for(xid(48)) == "reset_gpu"
    assert plan.action_for(xid(79)) == "reboot_node"
    assert plan.action_for(xid(13, "warn")) == "restart_app"
    assert plan.action_for(xid(74)) == "reset_gpu"  # check NVLink, then reset
    assert plan.action_for(xid(154, "crit", "GPU recovery action changed: node_reboot")) == "reboot_node"
    assert plan.action_for(finding("xid.recovery_action", observed="drain_p2p")) == "reset_gpu"


def test_xid_findings_follow_the_checks_judged_action_over_the_catalog():
    # three XID 31 within 10 min escalate to drain_and_inspect; the catalog alone says restart_app
    escalated = {"code": 31, "name": "x", "severity": "crit", "count": 3, "sxid": False, "action": "drain_and_inspect"}
    assert plan.action_for(finding("xid.recent", "crit", observed=[escalated])) == "drain_and_inspect"
    plain = {k: v for k, v in escalated.items() if k != "action"} | {"severity": "warn"}
    assert plan.action_for(finding("xid.recent", "warn", observed=[plain])) == "restart_app"


def test_unknown_checks_fall_back_to_their_action_text():
    assert plan.action_for(finding("new.check", action="Drain the node and reboot it.")) == "reboot_node"
    assert plan.action_for(finding("new.check", action="Reset it: fleetops reset n g")) == "reset_gpu"
    assert plan.action_for(finding("new.check", action="Open an RMA.")) == "drain_and_inspect"
    assert plan.action_for(finding("new.check", action="Look at the graphs.")) == "inspect"
    # a reset with no GPU to aim at becomes a drain
    p = plan.build([finding("new.check", gpu=None, action="fleetops reset NODE GPU")])
    assert p.nodes[0].items[0].action == "drain"


# --- the commands, with the agent run locally instead of over SSH ----------------------------


class LocalAgent:
    """Stands in for SSH: runs the agent command in a subprocess against the node's state."""

    def __init__(self, states):
        self.states = states
        self.calls = []

    def __call__(self, args, host, argv, timeout):
        self.calls.append(list(argv))
        env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
        env.update({sim.STATE_ENV: str(self.states[host.name]), "PYTHONPATH": str(REPO)})
        proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", *argv[1:], "--no-syslog"]
                              if argv[1] == "reset" else [sys.executable, "-m", "fleetops.agent.main", *argv[1:]],
                              capture_output=True, text=True, check=False, env=env, timeout=timeout)
        ok = proc.returncode == 0
        return Result(host.name, ok, proc.returncode, proc.stdout, proc.stderr, None if ok else "command",
                      None if ok else f"exit {proc.returncode}", 0.1)


@pytest.fixture
def two_nodes(tmp_path, monkeypatch):
    states = {}
    for name, faults in (("node001", ["ecc-dbe@3", "stray-process@3"]), ("node002", ["xid:79@5", "row-remap-pending@1"])):
        states[name] = tmp_path / f"{name}.json"
        sim.init_state(str(states[name]), name, {"faults": faults})
    agent = LocalAgent(states)
    monkeypatch.setattr(frontend, "run_once", agent)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal
    return states, agent


def test_reset_by_index_resolves_the_uuid_shows_it_and_refuses_without_yes_or_tty(two_nodes, capsys):
    states, agent = two_nodes
    before = states["node001"].read_bytes()
    code = cli.main(["reset", "node001", "3", "-i", "node001,node002,"])
    err = capsys.readouterr().err
    uuid = sim.read_state(str(states["node001"]))["gpus"][3]["uuid"]
    assert code == 4
    assert f"GPU index 3 on node001 is {uuid} at 0000:5d:00.0" in err and "--yes" in err
    assert [c[1] for c in agent.calls] == ["collect"]  # asked, never reset
    assert states["node001"].read_bytes() == before


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("answer", ["\n", "n\n", ""])
def test_confirmation_on_a_terminal_defaults_to_no(two_nodes, capsys, monkeypatch, answer):
    states, _agent = two_nodes
    monkeypatch.setattr(sys, "stdin", Tty(answer))
    before = states["node001"].read_bytes()
    assert cli.main(["reset", "node001", "3", "-i", "node001,", "--kill-processes"]) == 1
    err = capsys.readouterr().err
    assert "[y/N]" in err and "not confirmed" in err
    assert states["node001"].read_bytes() == before


def test_confirmed_reset_passes_uuid_bus_id_and_exactly_the_listed_pids(two_nodes, capsys, monkeypatch):
    states, agent = two_nodes
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    cli.main(["reset", "node001", "3", "-i", "node001,", "--kill-processes"])
    err = capsys.readouterr().err
    uuid = sim.read_state(str(states["node001"]))["gpus"][3]["uuid"]
    assert f"pid {sim.STRAY_PID}" in err and "python3 train.py" in err  # listed before the question
    assert f"and end 1 process(es) (pid {sim.STRAY_PID})? [y/N]" in err
    assert [c[1] for c in agent.calls] == ["collect", "reset"]
    # the backend the preview's snapshot came from is pinned: the agent cannot answer from another
    assert agent.calls[-1][1:] == ["reset", "--gpu", uuid, "--bus-id", "0000:5d:00.0", "--json",
                                   "--kill-processes", "--expect-pids", str(sim.STRAY_PID), "--backend", "sim"]


def test_without_kill_processes_a_busy_gpu_is_sent_without_it_and_refused(two_nodes, capsys):
    states, agent = two_nodes
    before = states["node001"].read_bytes()
    assert cli.main(["reset", "node001", "3", "-i", "node001,", "--yes"]) == 1
    assert "--kill-processes" not in agent.calls[-1] and "--expect-pids" not in agent.calls[-1]
    out = capsys.readouterr().out
    assert "compute_processes" in out and f"pid {sim.STRAY_PID}" in out and ": refused" in out
    assert states["node001"].read_bytes() == before


def test_confirmed_reset_ends_the_listed_processes_and_verifies(two_nodes, capsys, monkeypatch):
    states, _agent = two_nodes
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    assert cli.main(["reset", "node001", "3", "-i", "node001,", "--kill-processes"]) == 0
    out = capsys.readouterr().out
    assert f"end pid {sim.STRAY_PID} (python3 train.py): SIGTERM: ended" in out
    assert "verify  ok" in out
    assert sim.read_state(str(states["node001"]))["faults"] == []


def test_reset_of_a_lost_gpu_prints_the_agents_refusal(two_nodes, capsys):
    states, _ = two_nodes
    lost = sim.read_state(str(states["node002"]))["gpus"][5]
    assert cli.main(["reset", "node002", lost["uuid"], "-i", "node002,", "--yes"]) == 1
    out = capsys.readouterr().out
    assert "refused" in out and "remedy: reboot the node" in out


def test_unknown_node_is_a_usage_error(two_nodes, capsys):
    assert cli.main(["reset", "node404", "0", "-i", "node001,"]) == 4
    assert "node404" in capsys.readouterr().err


def _record_audit(db, states):
    nodes, found = [], []
    for name, path in states.items():
        snap = collect("sim", str(path))
        nodes.append(verdict.NodeResult(name, True, None, snap, 0.1))
        found += checks.run_node_checks(snap)
    result = audit.AuditResult(started_at=time.time(), duration_s=0.1, nodes=nodes, findings=found)
    with Store(str(db)) as store:
        return store.record(result, verdict.exit_code(found))


def test_remediate_plans_from_the_latest_audit_and_yes_carries_out_the_resets(two_nodes, tmp_path, capsys):
    states, agent = two_nodes
    db = tmp_path / "history.db"
    audit_id = _record_audit(db, states)
    inv = "node001,node002,"

    assert cli.main(["remediate", "-i", inv, "--db", str(db), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["audit_id"] == audit_id and doc["source"]["fresh"] is False
    actions = {n["node"]: n["action"] for n in doc["plan"]["nodes"]}
    assert actions == {"node001": "none", "node002": "reboot_node"}
    assert agent.calls == []  # planning asks no node anything

    assert cli.main(["remediate", "-i", inv, "--db", str(db), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "refused" in out and "--kill-processes" in out  # node001 GPU 3 is busy
    resets = [c for c in agent.calls if c[1] == "reset"]
    assert resets and all("--dry-run" in c for c in resets)
    assert all(c[1] in ("collect", "reset") for c in agent.calls)


def test_remediate_yes_kill_processes_without_confirmed_pids_is_refused_before_anything_is_sent(
        two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    db = tmp_path / "history.db"
    _record_audit(db, states)
    before = states["node001"].read_bytes()
    assert cli.main(["remediate", "-i", "node001,node002,", "--db", str(db), "--yes", "--kill-processes"]) == 1
    err = capsys.readouterr().err
    uuid = sim.read_state(str(states["node001"]))["gpus"][3]["uuid"]
    assert "refusing --kill-processes" in err and "Nothing was reset or drained" in err
    assert f"pid {sim.STRAY_PID} (python3 train.py" in err
    assert f"--expect-pids node001:{uuid}={sim.STRAY_PID}" in err  # the PIDs it would have needed confirmed
    assert [c[1] for c in agent.calls] == ["collect"]  # one look, no reset
    assert slurm.calls() == [] and states["node001"].read_bytes() == before


def _fake_slurm(tmp_path, monkeypatch, **states):
    """The strict stand-in scontrol first on PATH, a Slurm configuration that exists, ten nodes."""
    import fake_scontrol

    folder = tmp_path / "slurm"
    folder.mkdir()
    fs = fake_scontrol.FakeSlurm(folder)
    nodes = {f"node{i:03d}": {"state": states.get(f"node{i:03d}", "IDLE"), "partitions": ["gpu"]}
             for i in range(1, 11)}
    fs.set(nodes)
    conf = folder / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    monkeypatch.setenv("FAKE_SLURM", str(fs.db))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return fs


class SeesSlurm(LocalAgent):
    """The local agent, noting node001's Slurm state at the moment each reset is sent."""

    def __init__(self, states, slurm):
        super().__init__(states)
        self.slurm = slurm
        self.at_reset = []

    def __call__(self, args, host, argv, timeout):
        if argv[1] == "reset":
            self.at_reset.append(dict(self.slurm.nodes()[host.name]))
        return super().__call__(args, host, argv, timeout)


def test_remediate_yes_with_expect_pids_drains_ends_exactly_those_resets_and_resumes(
        two_nodes, tmp_path, capsys, monkeypatch):
    states, _ = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    agent = SeesSlurm(states, slurm)
    monkeypatch.setattr(frontend, "run_once", agent)
    db = tmp_path / "history.db"
    _record_audit(db, states)
    uuid = sim.read_state(str(states["node001"]))["gpus"][3]["uuid"]
    code = cli.main(["remediate", "-i", "node001,node002,", "--db", str(db), "--yes", "--kill-processes",
                     "--expect-pids", f"node001:3={sim.STRAY_PID}"])
    out = capsys.readouterr().out
    assert code == 0, out
    run = out.split("; run ", 1)[1].split()[0]
    assert "Reboot (drain first" in out and "node002" in out
    # one reset: node001's GPU 3, ending exactly the confirmed process; node002 reboots
    resets = [c for c in agent.calls if c[1] == "reset"]
    assert len(resets) == 1 and uuid in resets[0]
    assert resets[0][resets[0].index("--expect-pids") + 1] == str(sim.STRAY_PID)
    # drained by this run before the reset, resumed after it
    (seen,) = agent.at_reset
    assert seen["state"] == "IDLE+DRAIN" and seen["reason"].startswith(f"[fleetops] reset/{run}: reset GPU 3 {uuid}")
    assert [c[:3] for c in slurm.updates()] == [["update", "NodeName=node001", "State=DRAIN"],
                                                ["update", "NodeName=node001", "State=RESUME"]]
    assert slurm.nodes()["node001"]["state"] == "IDLE"
    assert sim.read_state(str(states["node001"]))["faults"] == []
    assert {f["name"] for f in sim.read_state(str(states["node002"]))["faults"]} == {"xid:79", "row-remap-pending"}
    # both recorded in the history as this run's (fleetops history --kind drains)
    from fleetops.fleet.store.database import Store

    with Store(str(db)) as store:
        rows = store.drains("node001")
    assert [(r.action, r.outcome, r.kind, r.run, r.source) for r in rows] == [
        ("resume", "done", "reset", run, "remediate"), ("drain", "done", "reset", run, "remediate")]
    assert rows[1].purpose.startswith(f"reset GPU 3 {uuid}") and rows[1].reason == seen["reason"]


def _remediate(states, tmp_path, *extra):
    db = tmp_path / "history.db"
    if not db.exists():
        _record_audit(db, states)
    return cli.main(["remediate", "-i", "node001,node002,", "--db", str(db), *extra])


def test_a_process_nobody_confirmed_refuses_that_gpus_reset_before_it_is_sent(two_nodes, tmp_path, capsys,
                                                                              monkeypatch):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    before = states["node001"].read_bytes()
    assert _remediate(states, tmp_path, "--yes", "--kill-processes", "--expect-pids", "node001:3=999999") == 1
    out = capsys.readouterr().out
    assert f"processes nobody confirmed run on the GPU: pid {sim.STRAY_PID} (python3 train.py" in out
    assert [c[1] for c in agent.calls if c[1] == "reset"] == []  # nothing sent
    # drained for the reset, and lifted again: nothing was touched under it
    assert [c[2] for c in slurm.updates()] == ["State=DRAIN", "State=RESUME"]
    assert states["node001"].read_bytes() == before


@pytest.mark.parametrize(
    ("reason", "goes_ahead"),
    [
        ("[fleetops] rollout/20261206T071502Z-3f9a: driver rollout 580.163.01", False),  # a run works on it
        ("[fleetops] reset/20261206T070000Z-aaaa: reset GPU 1", False),  # another remediate run
        ("[fleetops] operator/alice@ctl01: GPU 3 hangs, ticket 4411", True),  # a fault drain: no jobs there
        ("bad DIMM", True),  # someone outside fleetops
    ],
)
def test_a_node_someone_else_drained_is_never_resumed(two_nodes, tmp_path, capsys, monkeypatch, reason, goes_ahead):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    nodes = slurm.nodes()
    nodes["node001"].update(state="IDLE+DRAIN", reason=reason, by="alice")
    slurm.set(nodes)
    code = _remediate(states, tmp_path, "--yes", "--kill-processes", "--expect-pids", f"node001:3={sim.STRAY_PID}")
    out = capsys.readouterr().out
    assert slurm.updates() == []  # their drain is kept: not re-marked, not lifted
    assert slurm.nodes()["node001"]["reason"] == reason
    resets = [c for c in agent.calls if c[1] == "reset"]
    if goes_ahead:
        assert code == 0 and len(resets) == 1 and "the reset goes ahead" in out
        assert sim.read_state(str(states["node001"]))["faults"] == []
    else:
        assert code == 1 and resets == [] and "could not be drained first" in out and "left as it is" in out


def test_the_capacity_guard_stops_the_resets_that_would_end_processes(two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch, node005="IDLE+DRAIN")  # 1 of 10 out: the 10% share is used
    assert _remediate(states, tmp_path, "--yes", "--kill-processes", "--expect-pids",
                      f"node001:3={sim.STRAY_PID}") == 1
    out = capsys.readouterr().out
    assert "could not be drained first" in out and "partition gpu" in out
    assert slurm.updates() == [] and [c for c in agent.calls if c[1] == "reset"] == []


def test_no_slurm_to_drain_with_means_no_process_is_ended(two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol anywhere
    assert _remediate(states, tmp_path, "--yes", "--kill-processes", "--expect-pids",
                      f"node001:3={sim.STRAY_PID}") == 1
    out = capsys.readouterr().out
    assert "cannot drain it first: scontrol not found" in out
    assert [c for c in agent.calls if c[1] == "reset"] == []


def test_the_dry_run_shows_the_drain_it_would_make_and_sends_nothing(two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    assert _remediate(states, tmp_path, "--dry-run", "--kill-processes") == 0
    out = capsys.readouterr().out
    run = out.split("; run ", 1)[1].split()[0]
    assert f"Slurm: node001: would be drained with Reason '[fleetops] reset/{run}: reset GPU 3" in out
    assert ": would-reset (would end: pid" in out
    assert slurm.updates() == [] and all("--dry-run" in c for c in agent.calls if c[1] == "reset")


def test_on_a_terminal_each_gpus_processes_are_listed_and_asked_about(two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    _fake_slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "stdin", Tty("y\n"))
    assert _remediate(states, tmp_path, "--yes", "--kill-processes") == 0
    err = capsys.readouterr().err
    assert "runs 1 process(es):" in err and f"pid {sim.STRAY_PID} (python3 train.py" in err
    assert "End exactly these and reset the GPU on node001? [y/N]" in err
    (reset,) = [c for c in agent.calls if c[1] == "reset"]
    assert reset[reset.index("--expect-pids") + 1] == str(sim.STRAY_PID)


def test_a_terminal_answer_of_no_leaves_the_gpu_alone(two_nodes, tmp_path, capsys, monkeypatch):
    states, agent = two_nodes
    slurm = _fake_slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(sys, "stdin", Tty("n\n"))
    before = states["node001"].read_bytes()
    assert _remediate(states, tmp_path, "--yes", "--kill-processes") == 1
    out = capsys.readouterr().out
    assert "its processes were not confirmed" in out and "processes nobody confirmed" in out
    assert slurm.updates() == [] and [c for c in agent.calls if c[1] == "reset"] == []
    assert states["node001"].read_bytes() == before


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("node001:3=4242", ("node001", "3", (4242,))),
        ("node001:GPU-abc=4242,4243", ("node001", "GPU-abc", (4242, 4243))),
        ("node001:0000:18:00.0=7", ("node001", "0000:18:00.0", (7,))),
        ("node001:3=", ("node001", "3", ())),
    ],
)
def test_expect_pids_takes_node_gpu_and_pids(value, parsed):
    got = remedy_cli.parse_expect_pids([value])
    ((node, [(sel, pids)]),) = got.items()
    assert (node, sel.text, pids) == parsed


@pytest.mark.parametrize("value", ["node001=4242", "node001:3", "node001:3=abc", ":3=1", "node001:MIG-x=1"])
def test_a_malformed_expect_pids_is_a_usage_error(value):
    from fleetops.common.errors import UsageError

    with pytest.raises(UsageError, match="--expect-pids"):
        remedy_cli.parse_expect_pids([value])


class RecordingSlurm:
    def __init__(self):
        self.resumed = []

    def resume(self, host, *, kind, run, force=False):
        from fleetops.ops.results import DONE, ActionResult

        self.resumed.append((host.name, kind, run))
        return ActionResult(host.name, "resume", DONE, f"{host.name}: resumed")


@pytest.mark.parametrize(
    ("done", "resumed"),
    [
        ([{"drained_for": True, "result": "reset", "verified": True, "outcome": "done"}], True),
        ([{"drained_for": True, "result": "refused", "outcome": "refused"}], True),  # nothing touched
        ([{"drained_for": True, "result": "reset", "verified": False, "outcome": "done"}], False),
        ([{"drained_for": True, "result": "failed", "outcome": "failed"}], False),
        ([{"drained_for": True, "result": "unknown", "outcome": "unknown"}], False),
    ],
)
def test_this_runs_drain_is_lifted_only_after_verified_resets(done, resumed):
    from fleetops.fleet.inventory import Host

    slurm = RecordingSlurm()
    step = remedy_cli._resume_after(slurm, Host(name="node001", address="127.0.0.1"), done, "RUN-1")
    assert bool(slurm.resumed) == resumed
    if resumed:
        assert slurm.resumed == [("node001", "reset", "RUN-1")]
    else:
        assert "left drained (reset/RUN-1)" in step["message"] and "fleetops resume node001 --force" in step["message"]
