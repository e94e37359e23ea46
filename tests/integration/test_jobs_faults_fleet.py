"""Faults to jobs on a simulated fleet over real SSH (issue 30): a job started through ``fleetops sim
job start`` (the shipped prolog on the node) holds GPU 3 of node001; an uncorrectable ECC error on
that GPU is audited with the job named on its findings, ``fleetops remediate`` plans the GPU's reset
naming the job, and ``fleetops reset`` shows the job before asking and is refused by the node's
agent, which reads the job record; GPU 2, which no job holds, passes the same reset's dry run."""

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

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = "127.0.63.1"
NODE = "node001"
GPU = 3


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def fleetops(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=timeout, cwd=REPO,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def jobs_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("jobsfaults"))
    info = fleet.up(2, d, None, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
                    metrics_port=free_port(FIRST_ADDRESS))
    try:
        yield info
    finally:
        fleet.down(d)


def served_jobs(info: dict[str, Any], node: str) -> list[str]:
    text = client.fetch_snapshot(client.socket_for("sim", info["nodes"][node]["state"], None), max_age_s=3600)
    assert text is not None
    return [j["job_id"] for j in json.loads(text).get("jobs") or [] if j["ended_at"] is None]


def test_findings_the_plan_and_the_reset_name_the_job_on_the_gpu(jobs_fleet: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    info = jobs_fleet
    state = info["nodes"][NODE]["state"]
    uuid = sim.read_state(state)["gpus"][GPU]["uuid"]
    started = fleetops("sim", "job", "start", "--dir", info["directory"], NODE, "1234", "--gpus", str(GPU),
                       "--user", "alice")
    assert started.returncode == 0, started.stderr
    assert [g["uuid"] for g in json.loads(started.stdout)["gpus"]] == [uuid]
    polling.until("job 1234 in node001's daemon snapshot", lambda: served_jobs(info, NODE) == ["1234"])
    assert fleet.inject(info["directory"], NODE, "ecc-dbe", GPU)

    db = str(tmp_path / "history.db")
    inv = info["inventory"]

    def dbe() -> dict[str, Any] | None:
        proc = fleetops("audit", "-i", inv, "--db", db, "-q", "--format", "json")
        doc = json.loads(proc.stdout)
        checks = {f["check"]: f for f in doc["findings"] if f["node"] == NODE}
        return checks if {"memory.ecc_dbe_volatile", "xid.recent"} <= set(checks) else None

    found = polling.until("the ECC error and its XID in the daemon's snapshot", dbe)
    finding = found["memory.ecc_dbe_volatile"]
    assert finding["gpu"]["uuid"] == uuid
    assert finding["jobs"] == ["1234"]
    xid = found["xid.recent"]  # the simulator logs XID 48 with the error: the job it hit
    assert xid["gpu"]["uuid"] == uuid
    assert xid["jobs"] == ["1234"]

    proc = fleetops("remediate", "-i", inv, "--db", db, "--format", "json")
    plan = json.loads(proc.stdout)["plan"]
    [node] = [n for n in plan["nodes"] if n["node"] == NODE]
    [item] = [i for i in node["items"] if (i["gpu"] or {}).get("uuid") == uuid]
    assert item["action"] == "reset_gpu"
    assert item["jobs"] == [{"job_id": "1234", "user": "alice"}]
    assert node["jobs"] == [{"job_id": "1234", "user": "alice"}]
    text = fleetops("remediate", "-i", inv, "--db", db)
    line = next(x for x in text.stdout.splitlines() if f"GPU {GPU} {uuid}" in x)
    assert line.endswith("reset GPU (jobs 1234 alice)")

    refused = fleetops("reset", NODE, uuid, "-i", inv, "--yes", "--json")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "  jobs (1): 1234 (alice)\n" in refused.stderr
    assert "  a Slurm job holds the GPU: without --kill-processes the agent refuses to reset it\n" in refused.stderr
    report = json.loads(refused.stdout)
    assert report["result"] == "refused"
    [jobs] = [p for p in report["preconditions"] if p["name"] == "slurm_jobs"]
    assert jobs["status"] == "failed"
    assert jobs["detail"].startswith("1 running job(s) on the GPU: job 1234 (user alice)")

    free = sim.read_state(state)["gpus"][2]["uuid"]
    dry = fleetops("reset", NODE, free, "-i", inv, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "  jobs: none running\n" in dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["result"] == "would-reset"
    [ok] = [p for p in doc["preconditions"] if p["name"] == "slurm_jobs"]
    assert ok["detail"] == "no running job on the GPU"

    stopped = fleetops("sim", "job", "stop", "--dir", info["directory"], NODE, "1234")
    assert stopped.returncode == 0, stopped.stderr
    after = fleetops("reset", NODE, uuid, "-i", inv, "--dry-run", "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    doc = json.loads(after.stdout)
    assert doc["result"] == "would-reset"
    [ended] = [p for p in doc["preconditions"] if p["name"] == "slurm_jobs"]
    assert ended["detail"] == "no running job on the GPU (1 ended)"
