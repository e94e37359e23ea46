"""``fleetops job`` on a simulated fleet, through the real paths: ``fleetops sim job start
--profile`` runs the shipped prolog over SSH and sets the workload on the job's GPUs, the fleet's
resident daemon (``sim up --daemon``: one sample every 2 s) samples the GPUs and the job's cgroup,
and ``fleetops job`` asks every node over SSH for ``fleetops-agent job show`` and judges the job.

One fleet, five jobs started together (one per profile), one wait until every job has what the
diagnosis asks (120 s of job and 30 samples per GPU and per cgroup), then each job's verdicts:
exactly its pathology on its GPUs, nothing for the steady one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops.agent.serve import client
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = "127.0.62.1"  # a block of its own: the endpoints bind on every node's address
WAIT_S = 420.0  # 120 s of job and 30 samples at 2 s are 2-3 minutes; a loaded 2-core machine ticks late

# job id -> (node, gres ids, profile); gres ids are NVML indices here (minor numbers in index order)
JOBS = {
    "301": ("node001", "0,1", "steady"),
    "302": ("node001", "4,5,6,7", "straggler"),
    "303": ("node002", "0,1,2,3", "nvlink-unused"),
    "304": ("node002", "5", "input-bound"),
    "305": ("node003", "2,3", "cpu-starved"),
}
# a straggler job on two nodes: the slow GPU on node003 (the seed's choice), node004's GPUs wait for it
MULTI_JOB = ("307", [("node003", "4,5,6,7", False), ("node004", "4,5,6,7", True)])
XID_JOB = ("306", "node004", "0")  # a steady job whose GPU logs an XID just before it ends: xid_end
CODES = {"steady": None, "straggler": "straggler", "nvlink-unused": "nvlink_unused", "input-bound": "input_bound",
         "cpu-starved": "cpu_starved"}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def cli(info: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    # a history store of the test's own (none is written here): never the operator's default one
    env = {**os.environ, "FLEETOPS_DB": os.path.join(info["directory"], "history.db")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, check=False, cwd=REPO, env=env)


def job_json(info: dict[str, Any], job_id: str) -> tuple[int, dict[str, Any]]:
    done = cli(info, "job", job_id, "-i", info["inventory"], "--format", "json")
    doc: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, doc


def ready(info: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Every job's document once each has 120 s and 30 samples per GPU and per cgroup; else None."""
    docs = {}
    for job_id in [*JOBS, MULTI_JOB[0]]:
        _, doc = job_json(info, job_id)
        d = doc["diagnosis"]
        if d["seconds"] < 125 or any(g["samples"] < 35 for g in d["gpus"]) or any(c["samples"] < 35 for c in d["cpu"]):
            return None
        docs[job_id] = doc
    return docs


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("jobdiag"))
    info = fleet.up(4, d, None, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
                    metrics_port=free_port(FIRST_ADDRESS))
    info["inventory"] = os.path.join(d, "inventory.yml")
    try:
        for job_id, (node, gpus, profile) in JOBS.items():
            done = cli(info, "sim", "job", "start", "--dir", d, node, job_id, "--gpus", gpus, "--profile", profile,
                       "--seed", "7")
            assert done.returncode == 0, done.stderr
        job_id, parts = MULTI_JOB
        for node, gpus, elsewhere in parts:
            done = cli(info, "sim", "job", "start", "--dir", d, node, job_id, "--gpus", gpus, "--profile", "straggler",
                       "--seed", "7", *(["--straggler-elsewhere"] if elsewhere else []))
            assert done.returncode == 0, done.stderr
        job_id, node, gpus = XID_JOB
        done = cli(info, "sim", "job", "start", "--dir", d, node, job_id, "--gpus", gpus, "--profile", "steady")
        assert done.returncode == 0, done.stderr
        docs = polling.until("120 s and 30 samples of every job", lambda: ready(info), deadline_s=WAIT_S, step_s=10.0)
        yield info, docs
    finally:
        fleet.down(d)


def expected(info: dict[str, Any], job_id: str) -> set[tuple[str, str, tuple[int, ...]]]:
    node, gpus, profile = JOBS[job_id]
    code = CODES[profile]
    if code is None:
        return set()
    if code == "straggler":  # the simulator's choice among the job's GPUs, by the seed
        state = sim.read_state(info["nodes"][node]["state"])
        slow = sim.straggler_uuid(state, job_id)
        return {(code, node, tuple(int(g["index"]) for g in state["gpus"] if g["uuid"] == slow))}
    return {(code, node, tuple(int(i) for i in gpus.split(",")))}


def verdicts(doc: dict[str, Any]) -> set[tuple[str, str, tuple[int, ...]]]:
    return {(v["code"], v["node"], tuple(sorted(g["index"] for g in v["gpus"]))) for v in doc["diagnosis"]["verdicts"]}


@pytest.mark.parametrize("job_id", sorted(JOBS))
def test_each_job_gets_exactly_its_pathology_on_its_gpus(diagnosed: tuple[dict[str, Any], Any], job_id: str) -> None:
    info, _ = diagnosed
    code, doc = job_json(info, job_id)
    want = expected(info, job_id)
    assert verdicts(doc) == want
    assert code == (1 if want else 0)
    node, gpus, _ = JOBS[job_id]
    assert doc["job"]["nodes"] == [node]
    assert sorted(g["index"] for g in doc["diagnosis"]["gpus"]) == [int(i) for i in gpus.split(",")]
    assert doc["nodes"]["with_job"] == [node]
    assert doc["nodes"]["absent"] == sorted({"node001", "node002", "node003", "node004"} - {node})
    assert doc["nodes"]["unreachable"] == {}


def test_a_job_on_two_nodes_names_the_one_slow_gpu_the_others_wait_for(diagnosed: tuple[dict[str, Any], Any]) -> None:
    """One job, eight GPUs on two nodes, the slow one on node003: the verdict names that GPU alone,
    and node004's GPUs, slowed only by waiting, get none."""
    info, _ = diagnosed
    job_id, parts = MULTI_JOB
    state = sim.read_state(info["nodes"]["node003"]["state"])
    slow = sim.straggler_uuid(state, job_id)
    [slow_index] = [int(g["index"]) for g in state["gpus"] if g["uuid"] == slow]
    assert slow_index in (4, 5, 6, 7)
    assert sim.straggler_uuid(sim.read_state(info["nodes"]["node004"]["state"]), job_id) is None
    code, doc = job_json(info, job_id)
    assert verdicts(doc) == {("straggler", "node003", (slow_index,))}
    assert code == 1
    assert doc["job"]["nodes"] == ["node003", "node004"]
    assert sorted((g["node"], g["index"]) for g in doc["diagnosis"]["gpus"]) == [
        (node, int(i)) for node, gpus, _ in parts for i in gpus.split(",")]
    assert doc["nodes"]["with_job"] == ["node003", "node004"]


def test_a_node_whose_agent_answers_past_the_timeout_could_not_be_asked(
    diagnosed: tuple[dict[str, Any], Any], tmp_path: Path
) -> None:
    """node002's agent (job 303's only node) hangs: with --timeout 3 the command comes back saying
    which node it could not ask and why, exit 3, instead of waiting on it."""
    import time

    import yaml

    info, _ = diagnosed
    slow = tmp_path / "slow-agent"
    slow.write_text("#!/bin/sh\nsleep 120\nexec fleetops-agent \"$@\"\n")
    slow.chmod(0o755)
    with open(info["inventory"]) as fh:
        inventory = yaml.safe_load(fh)
    inventory["all"]["children"]["sim"]["hosts"]["node002"]["fleetops_agent_path"] = str(slow)
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    began = time.monotonic()
    done = cli(info, "job", "303", "-i", str(path), "--timeout", "3")
    assert time.monotonic() - began < 60  # cut off at its timeout, not after the agent's 120 s
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("fleetops: job 303 is on none of the nodes that answered; 1 of 4 nodes could not "
                                  "be asked: node002: ")
    assert "timeout" in done.stderr


def test_the_json_document_is_fleetops_job_v1_with_everything(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, docs = diagnosed
    doc = docs["304"]
    assert doc["schema"] == "fleetops.job/v1"
    assert sorted(doc) == ["diagnosis", "exit_code", "found", "history", "job", "nodes", "schema", "thresholds",
                           "utilization"]
    assert doc["history"]["note"] == f"no history database at {os.path.join(info['directory'], 'history.db')}"
    assert sorted(doc["job"]) == ["duration_s", "ended_at", "gpus", "job_id", "nodes", "running", "started_at", "user"]
    assert (doc["job"]["job_id"], doc["job"]["user"], doc["job"]["gpus"], doc["job"]["running"]) == ("304", "alice", 1,
                                                                                                      True)
    assert doc["found"] is True
    assert doc["exit_code"] == 1
    [gpu] = doc["diagnosis"]["gpus"]
    assert (gpu["node"], gpu["index"], gpu["pcie_gen"], gpu["pcie_width"]) == ("node002", 5, 5, 16)
    assert gpu["pcie_rx_share"] >= 0.90
    assert len(gpu["nvlink"]) == 18  # the simulated H200's links, each with its counters
    [cpu] = doc["diagnosis"]["cpu"]
    assert (cpu["node"], cpu["cpus"]) == ("node002", 16)
    assert len(doc["utilization"]["node002:5"]) == gpu["samples"]


def test_the_table_shows_the_verdict_and_the_plot_a_line_per_gpu(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    done = cli(info, "job", "303", "-i", info["inventory"], "--plot")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "job 303  user alice  nodes node002  GPUs 4"
    assert [line.split()[:2] for line in lines if line.startswith("node002  ")] == [
        ["node002", "0"], ["node002", "1"], ["node002", "2"], ["node002", "3"]]
    assert "VERDICTS" in lines
    assert [line.split()[:3] for line in lines if line.startswith("  nvlink_unused")] == [
        ["nvlink_unused", "node002", "GPU"]]
    assert [line.split("│")[0].strip() for line in lines if "│" in line] == [
        "node002:0", "node002:1", "node002:2", "node002:3"]
    assert lines[-1].endswith(" UTC")


def test_a_job_on_no_node_exits_4_saying_so(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    done = cli(info, "job", "999", "-i", info["inventory"])
    assert done.returncode == 4
    assert done.stdout == ""
    assert done.stderr == "fleetops: job 999 is on none of the 4 nodes asked (no record of it in their job folders)\n"


def test_the_agent_answers_a_job_it_never_ran_quietly(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    entry = info["nodes"]["node004"]
    done = subprocess.run(
        ["ssh", "-i", info["client_key"], "-p", str(entry["port"]), "-o", f"UserKnownHostsFile={info['known_hosts']}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{entry['address']}",
         "fleetops-agent", "job", "show", "304"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3
    assert done.stderr == ""
    assert json.loads(done.stdout)["kind"] == "fleetops.job-absent/v1"


def test_an_ended_job_is_judged_over_its_life_and_its_workload_is_gone(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    stopped = cli(info, "sim", "job", "stop", "--dir", info["directory"], "node002", "304")
    assert stopped.returncode == 0, stopped.stderr
    state = sim.read_state(info["nodes"]["node002"]["state"])
    assert sim.job_gpus(state, "304") == []
    code, doc = job_json(info, "304")
    assert doc["job"]["running"] is False
    assert doc["job"]["ended_at"] == json.loads(stopped.stdout)["ended_at"]
    assert verdicts(doc) == {("input_bound", "node002", (5,))}
    assert code == 1


def xid_of_job(info: dict[str, Any], node: str, job_id: str) -> list[dict[str, Any]]:
    text = client.fetch_snapshot(client.socket_for("sim", info["nodes"][node]["state"], None), max_age_s=3600)
    assert text is not None
    return [x for x in json.loads(text).get("xids") or [] if job_id in (x.get("jobs") or [])]


def test_an_xid_just_before_the_end_is_named_as_why_the_job_ended(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    job_id, node, gpu = XID_JOB
    fleet.inject(info["directory"], node, "xid:31", int(gpu))
    [xid] = polling.until("the XID tagged with the job", lambda: xid_of_job(info, node, job_id), deadline_s=60.0,
                          step_s=1.0)
    assert xid["code"] == 31
    stopped = cli(info, "sim", "job", "stop", "--dir", info["directory"], node, job_id)
    assert stopped.returncode == 0, stopped.stderr
    code, doc = job_json(info, job_id)
    assert verdicts(doc) == {("xid_end", node, (0,))}
    assert code == 1
    [verdict] = doc["diagnosis"]["verdicts"]
    assert verdict["evidence"]["xid"] == 31
    table = cli(info, "job", job_id, "-i", info["inventory"])
    [row] = [line.split() for line in table.stdout.splitlines() if line.startswith(f"{node}  ")]
    assert row[-1] == "31"


def test_an_unreachable_node_outranks_the_verdicts(diagnosed: tuple[dict[str, Any], Any]) -> None:
    info, _ = diagnosed
    fleet.inject(info["directory"], "node004", "host-down", None)
    code, doc = job_json(info, "302")
    assert code == 3
    assert sorted(doc["nodes"]["unreachable"]) == ["node004"]
    assert [v["code"] for v in doc["diagnosis"]["verdicts"]] == ["straggler"]
    assert doc["exit_code"] == 3
