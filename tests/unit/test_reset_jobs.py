"""The reset's ``slurm_jobs`` precondition on a simulated node (issue 30): a job the prolog recorded
on the GPU refuses its reset, naming the job and its user, even with no process on the GPU (between
two job steps); another GPU, or the job ended, is no obstacle; ``--kill-processes`` resets under it."""

from __future__ import annotations

import json

import pytest
from test_reset import pre, reset_doc, run_agent, uuid_of

from fleetops.agent.reset.preconditions import PRECONDITIONS
from fleetops.sim import gpu as sim


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node063")
    return path


def job(state, verb, job_id, *args):
    """``fleetops-agent job start|end`` on the node, as the prolog and epilog run it."""
    proc = run_agent(["job", verb, "--job-id", job_id, *args], state)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_running_job_on_the_gpu_refuses_its_reset_naming_job_and_user(state):
    started = job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    assert started["path"] == str(state.parent / "node.agent" / "jobs" / "1234.json")
    before = state.read_bytes()
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3))
    assert proc.returncode == 1
    assert doc["result"] == "refused"
    jobs = pre(doc, "slurm_jobs")
    assert jobs["status"] == "failed"
    assert jobs["detail"] == ("1 running job(s) on the GPU: job 1234 (user alice) (no process on the GPU now: "
                              "between job steps, the next step would fail)")
    assert [(j["job_id"], j["user"], j["uid"]) for j in jobs["jobs"]] == [("1234", "alice", 1000)]
    assert pre(doc, "compute_processes")["status"] == "ok"  # no process: the job alone refuses it
    assert "slurm_jobs: 1 running job(s) on the GPU: job 1234 (user alice)" in doc["message"]
    assert doc["actions"] == []
    assert state.read_bytes() == before
    assert [p["name"] for p in doc["preconditions"]] == list(PRECONDITIONS)


def test_a_dry_run_names_the_job_too(state):
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--dry-run")
    assert proc.returncode == 1
    assert doc["result"] == "refused"
    assert pre(doc, "slurm_jobs")["status"] == "failed"
    assert "job 1234 (user alice)" in pre(doc, "slurm_jobs")["detail"]


def test_a_gpu_the_job_does_not_hold_is_reset(state):
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 2))
    assert proc.returncode == 0, doc
    assert doc["result"] == "reset"
    assert pre(doc, "slurm_jobs") == {"name": "slurm_jobs", "status": "ok", "detail": "no running job on the GPU",
                                      "jobs": [], "jobs_dir": str(state.parent / "node.agent" / "jobs")}


def test_a_job_that_ended_no_longer_refuses(state):
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    job(state, "end", "1234")
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3))
    assert proc.returncode == 0, doc
    assert doc["result"] == "reset"
    assert pre(doc, "slurm_jobs")["detail"] == "no running job on the GPU (1 ended)"


def test_an_open_record_whose_cgroup_is_gone_still_refuses_and_says_how_to_close_it(state):
    """slurmd removed the job's cgroup but the epilog never closed the record: the job may have
    ended, or be between two steps without PrologFlags=Contain. The reset still refuses (resetting
    under a live job is the worse mistake), says the cgroup is gone, and names the two commands
    that settle it; once the record is closed the reset goes ahead."""
    cg = sim.make_job_cgroup(str(state), "1234")
    started = job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    assert started["job"]["cgroup"] == cg
    sim.remove_job_cgroup(str(state), "1234")
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3))
    assert proc.returncode == 1
    jobs = pre(doc, "slurm_jobs")
    assert jobs["status"] == "failed"
    assert jobs["detail"] == (f"1 running job(s) on the GPU: job 1234 (user alice; its cgroup {cg} is gone: ended "
                              "without its epilog?) (no process on the GPU now: between job steps, the next step "
                              "would fail)")
    assert jobs["remedy"].endswith("; if `scontrol show job 1234` says job 1234 has ended, close its record with "
                                   "`fleetops-agent job end --job-id 1234`")
    assert [j["cgroup_gone"] for j in jobs["jobs"]] == [cg]
    listed = run_agent(["job", "list"], state)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["cgroup_gone"] == ["1234"]
    job(state, "end", "1234")
    assert json.loads(run_agent(["job", "list"], state).stdout)["cgroup_gone"] == []
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3))
    assert proc.returncode == 0, doc
    assert pre(doc, "slurm_jobs")["detail"] == "no running job on the GPU (1 ended)"


def test_a_running_job_with_its_cgroup_is_not_called_gone(state):
    sim.make_job_cgroup(str(state), "1234")
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3))
    jobs = pre(doc, "slurm_jobs")
    assert "gone" not in jobs["detail"] and "scontrol" not in jobs["remedy"]
    assert "cgroup_gone" not in jobs["jobs"][0]


def test_kill_processes_resets_under_a_job_between_steps(state):
    job(state, "start", "1240", "--uid", "1001", "--user", "bob", "--gpus", uuid_of(state, 3))
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--kill-processes", "--expect-pids", "")
    assert proc.returncode == 0, doc
    assert doc["result"] == "reset"
    jobs = pre(doc, "slurm_jobs")
    assert jobs["status"] == "ok"
    assert jobs["detail"] == "1 running job(s) on the GPU lose it (--kill-processes): job 1240 (user bob)"


def test_a_record_that_does_not_read_refuses(state):
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    (state.parent / "node.agent" / "jobs" / "99.json").write_text("{not json", encoding="utf-8")
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 2))
    assert proc.returncode == 1
    jobs = pre(doc, "slurm_jobs")
    assert jobs["status"] == "failed"
    assert jobs["detail"].startswith("job records that do not read (they may be this GPU's jobs): ")
    assert "99.json: not JSON" in jobs["detail"]


def test_the_preview_lists_the_gpus_running_jobs_and_the_command_resets_under_them_only_when_asked():
    from types import SimpleNamespace

    from fleetops import model
    from fleetops.common import selectors
    from fleetops.ops import reset as ops_reset

    gpu = selectors.ResolvedGpu(selectors.parse("GPU-x"), "GPU-x", "0000:18:00.0")
    jobs = (model.NodeJob(job_id="1234", user="alice"), model.NodeJob(job_id="1240"))
    assert ops_reset.Preview("n1", gpu, 0.0, "sim", jobs).job_lines() == ["jobs (2): 1234 (alice), 1240"]
    assert ops_reset.Preview("n1", gpu, 0.0, "sim", ()).job_lines() == ["jobs: none running"]
    host = SimpleNamespace(name="n1", vars={})
    plain = ops_reset.command(host, gpu, kill_pids=[])
    assert "--kill-processes" not in plain
    under = ops_reset.command(host, gpu, kill_pids=[], under_jobs=True)
    at = under.index("--kill-processes")
    assert under[at: at + 3] == ["--kill-processes", "--expect-pids", ""]
    assert "--expect-jobs" not in under  # the jobs were not known here: the agent reads its records
    shown = ops_reset.command(host, gpu, kill_pids=[4242], expect_jobs=["1240", "1234"])
    at = shown.index("--kill-processes")
    assert shown[at: at + 5] == ["--kill-processes", "--expect-pids", "4242", "--expect-jobs", "1234,1240"]
    assert "--expect-jobs" not in ops_reset.command(host, gpu, kill_pids=[], expect_jobs=["1234"])  # nothing killed


def test_a_job_nobody_confirmed_refuses_a_reset_under_jobs(state):
    """--expect-jobs names the jobs the operator saw: a job started on the GPU since then refuses
    the reset, --kill-processes or not, and nothing changes; with it confirmed the reset goes."""
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    job(state, "start", "1250", "--uid", "1003", "--user", "carol", "--gpus", uuid_of(state, 3))
    before = state.read_bytes()
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--kill-processes", "--expect-pids", "",
                          "--expect-jobs", "1234")
    assert proc.returncode == 1
    assert doc["result"] == "refused"
    jobs = pre(doc, "slurm_jobs")
    assert jobs["status"] == "failed"
    assert jobs["detail"] == "job(s) nobody confirmed hold the GPU: job 1250 (user carol) (confirmed: 1234)"
    assert jobs["remedy"].endswith("rerun with --expect-jobs 1234,1250")
    assert doc["actions"] == []
    assert state.read_bytes() == before
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--kill-processes", "--expect-pids", "",
                          "--expect-jobs", "1250,1234")
    assert proc.returncode == 0, doc
    assert pre(doc, "slurm_jobs")["detail"] == ("2 running job(s) on the GPU lose it (--kill-processes): "
                                                "job 1234 (user alice), job 1250 (user carol)")


@pytest.mark.parametrize(("args", "message"), [
    (["--expect-jobs", "1234"], "--expect-jobs names the jobs --kill-processes may reset under: give both"),
    (["--kill-processes", "--expect-pids", "", "--expect-jobs", "12x"], "--expect-jobs: "),
])
def test_expect_jobs_usage_errors_change_nothing(state, args, message):
    job(state, "start", "1234", "--uid", "1000", "--user", "alice", "--gpus", uuid_of(state, 3))
    before = state.read_bytes()
    proc, _ = reset_doc(state, "--gpu", uuid_of(state, 3), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert state.read_bytes() == before


def test_mig_reset_is_refused_while_a_job_holds_one_of_the_gpus_instances(state):
    with sim.locked_state(str(state)) as st:
        st["gpus"][0]["mig_mode_current"] = st["gpus"][0]["mig_mode_pending"] = True
        sim.set_mig_instances(st, 0, ["3g.71gb", "3g.71gb"])
    job(state, "start", "1300", "--uid", "1002", "--user", "carol", "--gpus", uuid_of(state, 0))
    before = state.read_bytes()
    proc = run_agent(["mig", "reset", "--gpu", uuid_of(state, 0)], state)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["result"] == "refused"
    [entry] = doc["gpus"]
    assert entry["detail"] == "running Slurm job(s) on the GPU: job 1300 (user carol)"
    assert entry["jobs"] == ["1300"]
    assert state.read_bytes() == before
    job(state, "end", "1300")
    proc = run_agent(["mig", "reset", "--gpu", uuid_of(state, 0)], state)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["result"] == "recreated"
