"""Job attribution on a simulated fleet, through the real paths: ``fleetops sim job start|stop``
runs the collection's prolog and epilog over SSH with slurmd's environment, the prolog runs
``fleetops-agent job start`` on the node, and the fleet's resident daemon reads the records
(snapshot ``jobs``, XIDs' ``jobs``, ``fleetops_gpu_job_info`` on the node's endpoint).

node001's driver numbered its device files in reverse (``gpu_minor_numbers: [7..0]``): gres id 0
(``/dev/nvidia0``) is the GPU at NVML index 7. An attribution by index would name other GPUs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops.agent.serve import client
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = "127.0.71.1"  # a block of its own: the endpoints bind on every node's address

# node001's GPUs by NVML index (deterministic: the simulator derives them from the host name)
NODE1 = [
    "GPU-c5391ad3-0dbc-b32b-89de-1afaa7e73e47",
    "GPU-51be0243-b51e-4e3c-c21e-4405451285a1",
    "GPU-dc4c2805-8252-3582-662f-523f02e61d6e",
    "GPU-589545c7-6f94-1a58-7729-1bca2ce1a718",
    "GPU-75945422-c0ec-edce-b420-1037e2b9e32b",
    "GPU-f9c65784-965d-df03-b4f0-9553a46621d9",
    "GPU-1dbde0a2-9e03-95fa-4af9-c316a6b33c5d",
    "GPU-0114c8c1-108d-fe42-9b25-51055f28fb0c",
]
NODE2_GPU2 = "GPU-fff06a9c-dc01-c431-c3ba-be842ff3928c"


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def jobs_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("jobsfleet"))
    scenario = os.path.join(d, "scenario.yml")
    with open(scenario, "w", encoding="utf-8") as fh:
        fh.write("nodes:\n  node001:\n    gpu_minor_numbers: [7, 6, 5, 4, 3, 2, 1, 0]\n")
    info = fleet.up(2, d, scenario, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
                    metrics_port=free_port(FIRST_ADDRESS))
    try:
        yield info
    finally:
        fleet.down(d)


def sim_job(info: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "sim", "job", *args, "--dir", info["directory"]], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)


def agent_on(info: dict[str, Any], node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``fleetops-agent ARGV`` on the simulated node, over SSH as the fleet's inventory reaches it."""
    entry = info["nodes"][node]
    return subprocess.run(
        ["ssh", "-i", info["client_key"], "-p", str(entry["port"]), "-o", f"UserKnownHostsFile={info['known_hosts']}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{entry['address']}",
         "fleetops-agent", *argv],
        capture_output=True, text=True, timeout=600, check=False)


def daemon_snapshot(info: dict[str, Any], node: str) -> dict[str, Any]:
    text = client.fetch_snapshot(client.socket_for("sim", info["nodes"][node]["state"], None), max_age_s=3600)
    assert text is not None
    doc: dict[str, Any] = json.loads(text)
    return doc


def metrics_page(info: dict[str, Any], node: str) -> str:
    address = info["nodes"][node]["address"]
    with urllib.request.urlopen(f"http://{address}:{info['metrics_port']}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def series(page: str) -> list[str]:
    return [line for line in page.splitlines() if line and not line.startswith("#")]


def job_in_snapshot(info: dict[str, Any], node: str, job_id: str) -> dict[str, Any] | None:
    return next((j for j in daemon_snapshot(info, node).get("jobs") or [] if j["job_id"] == job_id), None)


def test_gres_ids_resolve_by_device_minor_where_index_and_minor_differ(jobs_fleet: dict[str, Any]) -> None:
    done = sim_job(jobs_fleet, "start", "node001", "1001", "--gpus", "0,3", "--user", "alice")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    # gres id 0 is /dev/nvidia0, minor 0: NVML's GPU 7; gres id 3 is minor 3: NVML's GPU 4
    assert [g["uuid"] for g in record["gpus"]] == [
        "GPU-0114c8c1-108d-fe42-9b25-51055f28fb0c",
        "GPU-75945422-c0ec-edce-b420-1037e2b9e32b",
    ]
    assert [(g["index"], g["minor"]) for g in record["gpus"]] == [(7, 0), (4, 3)]
    # the same ids taken as NVML indices (0 and 3) name two other GPUs
    by_index = [NODE1[0], NODE1[3]]
    assert by_index == ["GPU-c5391ad3-0dbc-b32b-89de-1afaa7e73e47", "GPU-589545c7-6f94-1a58-7729-1bca2ce1a718"]
    assert {g["uuid"] for g in record["gpus"]}.isdisjoint(by_index)
    assert record["user"] == "alice"
    assert record["uid"] == 1000
    assert record["cgroup"] == os.path.join(sim.run_dir(jobs_fleet["nodes"]["node001"]["state"]), "cgroup", "job_1001")
    assert record["source"].startswith("SLURM_JOB_GPUS=0,3: gres ids indexing ")
    job = polling.until("job 1001 in the daemon's snapshot", lambda: job_in_snapshot(jobs_fleet, "node001", "1001"))
    assert job["gpus"] == ["GPU-0114c8c1-108d-fe42-9b25-51055f28fb0c", "GPU-75945422-c0ec-edce-b420-1037e2b9e32b"]
    assert job["ended_at"] is None
    page = polling.until("job 1001 on the endpoint", lambda: "job=\"1001\"" in metrics_page(jobs_fleet, "node001")
                         and metrics_page(jobs_fleet, "node001"))
    assert sorted(line for line in series(page) if line.startswith("fleetops_gpu_job_info")) == [
        'fleetops_gpu_job_info{uuid="GPU-0114c8c1-108d-fe42-9b25-51055f28fb0c",gpu="7",job="1001",user="alice"} 1',
        'fleetops_gpu_job_info{uuid="GPU-75945422-c0ec-edce-b420-1037e2b9e32b",gpu="4",job="1001",user="alice"} 1',
    ]
    stopped = sim_job(jobs_fleet, "stop", "node001", "1001")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["ended_at"] is not None
    polling.until("job 1001's series gone", lambda: "job=\"1001\"" not in metrics_page(jobs_fleet, "node001"))


def test_mig_job_is_attributed_to_its_mig_device(jobs_fleet: dict[str, Any]) -> None:
    state = jobs_fleet["nodes"]["node002"]["state"]
    with sim.locked_state(state) as st:
        sim.set_mig_mode(st, 2, True)
        sim.set_mig_instances(st, 2, ["3g.71gb", "3g.71gb"])
        instances = [dict(m) for m in st["gpus"][2]["mig_instances"]]
    second = next(m for m in instances if m["gpu_instance_id"] == instances[1]["gpu_instance_id"])
    done = sim_job(jobs_fleet, "start", "node002", "2001", "--mig", f"2:{second['gpu_instance_id']}", "--user", "bob")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert len(record["gpus"]) == 1
    assert record["gpus"][0]["uuid"] == NODE2_GPU2
    assert record["gpus"][0]["mig_uuid"] == second["uuid"]
    assert record["gpus"][0]["mig_uuid"] != instances[0]["uuid"]
    assert record["gpus"][0]["mig_uuid"].startswith("MIG-")
    job = polling.until("job 2001 in the daemon's snapshot", lambda: job_in_snapshot(jobs_fleet, "node002", "2001"))
    assert job["gpus"] == [second["uuid"]]
    page = polling.until("job 2001 on the endpoint", lambda: "job=\"2001\"" in metrics_page(jobs_fleet, "node002")
                         and metrics_page(jobs_fleet, "node002"))
    assert [line for line in series(page) if line.startswith("fleetops_gpu_job_info")] == [
        f'fleetops_gpu_job_info{{uuid="{NODE2_GPU2}",gpu="2",job="2001",user="bob"}} 1',
    ]
    assert sim_job(jobs_fleet, "stop", "node002", "2001").returncode == 0


def test_a_jobs_cgroup_cpu_time_is_read_through_the_agents_history(jobs_fleet: dict[str, Any]) -> None:
    state = jobs_fleet["nodes"]["node002"]["state"]
    done = sim_job(jobs_fleet, "start", "node002", "5001", "--gpus", "0", "--cpus", "4")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["cpus"] == 4
    assert record["cgroup"] == sim.job_cgroup(state, "5001")
    # what a simulated workload does: the cgroup's CPU time grows
    with open(os.path.join(record["cgroup"], "cpu.stat"), "w", encoding="utf-8") as fh:
        fh.write("usage_usec 9007199254740993\nuser_usec 0\nsystem_usec 0\n")

    def last() -> Any:
        answer = agent_on(jobs_fleet, "node002", "history", "--job", "5001")
        samples = json.loads(answer.stdout)["cpu_usage_usec"] if answer.returncode == 0 else []
        return samples[-1][1] if samples and samples[-1][1] == 9007199254740993 else None

    assert polling.until("the job's CPU time in its history", last, 60.0, 0.5) == 9007199254740993  # exact past 2**53
    assert sim_job(jobs_fleet, "stop", "node002", "5001").returncode == 0
    assert not os.path.exists(record["cgroup"])  # gone after the epilog, as slurmd removes it


def xid_jobs(info: dict[str, Any], node: str, code: int) -> list[Any]:
    return [x.get("jobs") for x in daemon_snapshot(info, node)["xids"] if x["code"] == code]


def test_xid_during_a_job_carries_it_and_one_after_it_ended_does_not(jobs_fleet: dict[str, Any]) -> None:
    d = jobs_fleet["directory"]
    done = sim_job(jobs_fleet, "start", "node001", "3001", "--gpus", "1")  # minor 1: NVML's GPU 6
    assert done.returncode == 0, done.stderr
    assert [g["uuid"] for g in json.loads(done.stdout)["gpus"]] == ["GPU-1dbde0a2-9e03-95fa-4af9-c316a6b33c5d"]
    polling.until("job 3001 in the daemon's snapshot", lambda: job_in_snapshot(jobs_fleet, "node001", "3001"))
    fleet.inject(d, "node001", "xid:31", 6)
    assert polling.until("XID 31 attributed", lambda: xid_jobs(jobs_fleet, "node001", 31)) == [["3001"]]
    assert sim_job(jobs_fleet, "stop", "node001", "3001").returncode == 0
    polling.until("job 3001 ended in the snapshot",
                  lambda: (job_in_snapshot(jobs_fleet, "node001", "3001") or {}).get("ended_at") is not None)
    fleet.inject(d, "node001", "xid:13", 6)
    assert polling.until("XID 13 listed", lambda: xid_jobs(jobs_fleet, "node001", 13)) == [[]]
    assert xid_jobs(jobs_fleet, "node001", 31) == [["3001"]]  # the earlier one keeps its job


def test_bad_input_is_refused_naming_the_file_or_id_and_writes_nothing(jobs_fleet: dict[str, Any]) -> None:
    state = jobs_fleet["nodes"]["node001"]["state"]
    jobs_dir = os.path.join(sim.run_dir(state), "jobs")
    before = sorted(os.listdir(jobs_dir))
    unknown = sim_job(jobs_fleet, "start", "node001", "4001", "--gpus", "9")
    assert unknown.returncode != 0
    assert "job 4001: GPU id '9'" in unknown.stderr
    assert "declares 8 GPU device(s) (ids 0..7)" in unknown.stderr
    missing = agent_on(jobs_fleet, "node001", "job", "start", "--job-id", "4002", "--gpus", "0",
                       "--gres-conf", "/nonexistent/gres.conf")
    assert missing.returncode == 1
    assert json.loads(missing.stderr.strip().splitlines()[-1]) == {
        "error": "/nonexistent/gres.conf: no such file (Slurm's gres.conf: give its path with --gres-conf)",
        "kind": "gres"}
    step = agent_on(jobs_fleet, "node001", "job", "start", "--job-id", "4003.0", "--gpus", "0")
    assert step.returncode == 2
    assert "job id '4003.0': a job step" in step.stderr
    assert sorted(os.listdir(jobs_dir)) == before  # nothing written, no temporary file left
    bad = os.path.join(jobs_dir, "4004.json")
    with open(bad, "w", encoding="utf-8") as fh:
        fh.write('{"version": 1, "job_id": "4004", "uid": "alice"}\n')
    try:
        listed = agent_on(jobs_fleet, "node001", "job", "list")
        assert listed.returncode == 1
        assert json.loads(listed.stderr.strip().splitlines()[-1]) == {
            "error": f"{bad}: uid: expected int or null, got 'alice'", "kind": "job-record"}
        ended = agent_on(jobs_fleet, "node001", "job", "end", "--job-id", "4004")
        assert ended.returncode == 1
        assert f"{bad}: uid: expected int or null, got 'alice'" in ended.stderr
        with open(bad, encoding="utf-8") as fh:
            assert fh.read() == '{"version": 1, "job_id": "4004", "uid": "alice"}\n'  # left as it was
        errors = polling.until("the daemon names the bad record",
                               lambda: daemon_snapshot(jobs_fleet, "node001")["daemon"]["job_records"]["errors"])
        assert errors == [f"{bad}: uid: expected int or null, got 'alice'"]
    finally:
        os.unlink(bad)


@pytest.mark.slow
def test_series_count_is_unchanged_after_1000_jobs_started_and_ended(jobs_fleet: dict[str, Any]) -> None:
    node = "node002"
    state = jobs_fleet["nodes"][node]["state"]
    sim.write_slurm_files(state)  # gres.conf of the node as it is (GPU 2 in MIG mode, if the MIG test ran)
    whole = [d["gres_id"] for d in sim.gres_devices(state) if d["gi"] is None]
    polling.until("no job running on node002", lambda: all(
        j["ended_at"] is not None for j in daemon_snapshot(jobs_fleet, node).get("jobs") or []))
    polling.until("node002's job series gone",
                  lambda: "fleetops_gpu_job_info" not in metrics_page(jobs_fleet, node))
    before = len(series(metrics_page(jobs_fleet, node)))
    jobs = [(str(10000 + i), str(whole[i % len(whole)])) for i in range(1000)]
    script = os.path.join(jobs_fleet["directory"], "thousand_jobs.sh")
    lines = "".join(f"{j} {g}\n" for j, g in jobs)
    # start: each job on one GPU by its gres id (the prolog's path: SLURM_JOB_GPUS)
    with open(script, "w", encoding="utf-8") as fh:
        fh.write("export SLURM_JOB_UID=1000 SLURM_JOB_USER=carol\n"
                 f"printf '%s' '{lines}' | xargs -P 3 -n 2 sh -c "
                 "'SLURM_JOB_ID=\"$0\" SLURM_JOB_GPUS=\"$1\" fleetops-agent job start >/dev/null "
                 "|| echo \"failed $0\"'\n")
    started = agent_on_script(jobs_fleet, node, script)
    assert started.returncode == 0, started.stderr
    assert started.stdout == ""
    running = polling.until("1000 job series", lambda: (lambda p: p.count("fleetops_gpu_job_info{") == 1000 and p)(
        metrics_page(jobs_fleet, node)), 120.0, 1.0)
    assert len(series(running)) == before + 1000
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(f"printf '%s' '{lines}' | xargs -P 3 -n 2 sh -c "
                 "'SLURM_JOB_ID=\"$0\" fleetops-agent job end >/dev/null || echo \"failed $0\"'\n")
    ended = agent_on_script(jobs_fleet, node, script)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout == ""
    after = polling.until("the job series gone", lambda: (lambda p: "fleetops_gpu_job_info" not in p and p)(
        metrics_page(jobs_fleet, node)), 120.0, 1.0)
    assert len(series(after)) == before


def agent_on_script(info: dict[str, Any], node: str, script: str) -> subprocess.CompletedProcess[str]:
    entry = info["nodes"][node]
    return subprocess.run(
        ["ssh", "-i", info["client_key"], "-p", str(entry["port"]), "-o", f"UserKnownHostsFile={info['known_hosts']}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"root@{entry['address']}", "/bin/sh", script],
        capture_output=True, text=True, timeout=900, check=False)
