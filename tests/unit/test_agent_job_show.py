"""``fleetops-agent job show JOBID`` on a simulated node without its daemon: the record and the
GPUs' facts (a cold collect) come back, with no samples and a note saying why; a job the node
never ran is the quiet ``fleetops.job-absent/v1`` answer (exit 3, nothing on stderr)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fleetops.agent.main import main
from fleetops.jobs import record
from fleetops.sim import gpu as sim


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "node017.json")
    state = sim.init_state(path, "node017")
    monkeypatch.delenv("FLEETOPS_JOBS_DIR", raising=False)
    jobs = os.path.join(sim.run_dir(path), "jobs")
    gpus = tuple(record.JobGpu(uuid=state["gpus"][i]["uuid"], index=i, minor=i) for i in (2, 3))
    record.write(jobs, record.JobRecord(job_id="1234", uid=1000, user="alice", started_at=time.time() - 600, ended_at=None,
                                        cgroup=None, cpus=8, gpus=gpus, source="test"))
    return path


def test_show_without_a_daemon_gives_the_record_and_facts_and_says_why_there_are_no_samples(
    node: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["job", "show", "1234", "--backend", "sim", "--state", node]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["kind"] == "fleetops.job-show/v1"
    assert doc["daemon"] is False
    assert doc["job"]["job_id"] == "1234"
    assert [(g["index"], g["series"]) for g in doc["gpus"]] == [(2, {}), (3, {})]
    assert doc["gpus"][0]["facts"] == {"power_limit_w": 700.0, "clock_sm_max_mhz": 1980, "pcie_gen": 5,
                                       "pcie_width": 16}
    assert doc["cpu"] == {"cpus": 8, "cgroup": None, "usage_usec": []}
    assert doc["notes"] == [f"no fleetops-agent daemon answers on {sim.run_dir(node)}/agent.sock: no samples, XIDs "
                            "or CPU time; facts from a cold collect"]


def test_a_job_the_node_never_ran_is_a_quiet_answer_with_exit_3(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "show", "999", "--backend", "sim", "--state", node]) == 3
    out = capsys.readouterr()
    assert json.loads(out.out) == {"kind": "fleetops.job-absent/v1", "job_id": "999",
                                   "dir": os.path.join(sim.run_dir(node), "jobs")}
    assert out.err == ""


def test_show_refuses_a_job_id_that_is_no_plain_number(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "show", "1234.0", "--backend", "sim", "--state", node]) == 2
    assert json.loads(capsys.readouterr().err)["kind"] == "usage"
