"""``fleetops-agent slurm-healthcheck`` as a real process: a real daemon on the simulator (or
none, for the cold collect), and a fake scontrol on PATH that records its argv and answers
``show node -o`` from a file that its ``update`` calls change, as slurmctld would."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.gpu import sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")

FAKE_SCONTROL = r'''#!/usr/bin/env python3
import json, os, sys, time
d = os.environ["FAKE_SCONTROL_DIR"]
with open(os.path.join(d, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
mode = open(os.path.join(d, "mode")).read().strip() if os.path.exists(os.path.join(d, "mode")) else ""
if mode == "hang":
    time.sleep(60)
node = json.load(open(os.path.join(d, "node.json")))
args = sys.argv[1:]
if args[:2] == ["show", "node"]:
    name = [a for a in args[2:] if a != "-o"][0]
    if name != node["name"]:
        sys.stderr.write(f"Node {name} not found\n")
        sys.exit(1)
    line = f"NodeName={name} Arch=x86_64 CoresPerSocket=1 State={node['state']} ThreadsPerCore=1"
    if node.get("reason"):
        line += f" Reason={node['reason']} [root@2026-12-02T10:00:00]"
    print(line)
    sys.exit(0)
if args[:1] == ["update"]:
    if mode == "fail-update":
        sys.stderr.write("slurm_update error: Invalid node state specified\n")
        sys.exit(1)
    kv = dict(a.split("=", 1) for a in args[1:])
    if kv.get("State") == "DRAIN":
        node["state"], node["reason"] = "IDLE+DRAIN", kv["Reason"]
    elif kv.get("State") == "RESUME":
        node["state"], node["reason"] = "IDLE", None
    json.dump(node, open(os.path.join(d, "node.json"), "w"))
    sys.exit(0)
sys.exit(2)
'''

OURS = "[fleetops] healthcheck: memory.ecc_dbe_volatile on GPU GPU-x 0000:18:00.0"


class FakeSlurm:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        script = directory / "scontrol"
        script.write_text(FAKE_SCONTROL.replace("/usr/bin/env python3", sys.executable))
        script.chmod(0o755)
        self.set("node7", "IDLE", None)

    def set(self, name: str, state: str, reason: str | None, mode: str = "") -> None:
        (self.dir / "node.json").write_text(json.dumps({"name": name, "state": state, "reason": reason}))
        (self.dir / "mode").write_text(mode)
        (self.dir / "calls.jsonl").unlink(missing_ok=True)

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]

    def node(self) -> dict[str, Any]:
        return json.loads((self.dir / "node.json").read_text())


def _state(path: Path, name: str = "node7") -> Path:
    sim.write_state(str(path), sim.build_state(name, {}))
    return path


def _run(fake: FakeSlurm, state: Path, *extra: str, node_name: str | None = "node7", timeout: float = 60) -> tuple[int, dict[str, Any] | None, str]:
    env = {**os.environ, "FAKE_SCONTROL_DIR": str(fake.dir), "PATH": f"{fake.dir}:{os.environ['PATH']}"}
    env.pop("SLURMD_NODENAME", None)
    argv = [AGENT, "slurm-healthcheck", "--backend", "sim", "--state", str(state)]
    if node_name is not None:
        argv += ["--node-name", node_name]
    done = subprocess.run([*argv, *extra], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    doc = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, doc, done.stderr


def _daemon_findings(state: Path) -> list[tuple[str, str]]:
    env = {**os.environ, "FLEETOPS_SIM_STATE": str(state)}
    done = subprocess.run([AGENT, "collect"], capture_output=True, text=True, env=env, check=False)
    doc = json.loads(done.stdout)
    if "daemon" not in doc:
        return [("no-daemon", "")]
    return [(f["check"], f["severity"]) for f in doc["daemon"]["findings"]]


def _until_daemon(state: Path, crit: bool) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = _daemon_findings(state)
        if ("no-daemon", "") not in found and any(s == "crit" for _, s in found) == crit:
            return
        time.sleep(0.2)
    raise AssertionError(f"the daemon did not reach crit={crit}: {_daemon_findings(state)}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real daemon on one simulated node for the module."""
    d = tmp_path_factory.mktemp("hc-daemon")
    state = _state(d / "node7.json")
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--states", str(state), "--interval", "0.2", "--full-interval", "0.4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _until_daemon(state, crit=False)
        yield state
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def fake(tmp_path: Path) -> FakeSlurm:
    return FakeSlurm(tmp_path / "slurm")


@pytest.fixture
def faulty(served: Path) -> Iterator[Path]:
    sim.inject(str(served), "ecc-dbe", 2)
    _until_daemon(served, crit=True)
    yield served
    sim.clear(str(served), "all")
    _until_daemon(served, crit=False)


def _gpu(state: Path, index: int) -> dict[str, Any]:
    return json.loads(state.read_text())["gpus"][index]


def test_crit_finding_from_the_daemon_drains_with_the_check_and_the_gpu(fake: FakeSlurm, faulty: Path) -> None:
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert doc is not None and doc["source"] == "daemon" and doc["age_s"] < 30
    gpu = _gpu(faulty, 2)
    updates = fake.updates()
    assert len(updates) == 1, fake.calls()
    assert updates[0][:3] == ["update", "NodeName=node7", "State=DRAIN"]
    reason = updates[0][3].removeprefix("Reason=")
    assert reason.startswith("[fleetops] healthcheck: ")
    assert {c["check"] for c in doc["crit"]} == {"memory.ecc_dbe_volatile", "xid.recent"}
    assert f"healthcheck: {doc['crit'][0]['check']} on GPU " in reason and "(+1 more crit)" in reason
    assert gpu["uuid"] in reason and gpu["bus_id"] in reason
    assert doc["action"] == "drain" and doc["outcome"] == "done"
    assert fake.node()["state"] == "IDLE+DRAIN"


def test_still_faulty_and_drained_by_us_is_left_as_it_is(fake: FakeSlurm, faulty: Path) -> None:
    fake.set("node7", "IDLE+DRAIN", OURS)
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert fake.updates() == [] and doc is not None and doc["action"] == "none"


def test_clean_node_drained_by_the_healthcheck_is_resumed(fake: FakeSlurm, served: Path) -> None:
    fake.set("node7", "IDLE+DRAIN", OURS)
    code, doc, err = _run(fake, served)
    assert code == 0, err
    assert fake.updates() == [["update", "NodeName=node7", "State=RESUME"]]
    assert doc is not None and doc["action"] == "resume" and doc["source"] == "daemon"
    assert fake.node()["state"] == "IDLE"


@pytest.mark.parametrize(
    "reason",
    ["maintenance by alice", "[fleetops] fleetops driver rollout", "healthcheck: not marked by fleetops"],
)
def test_clean_node_drained_by_someone_else_is_never_resumed(fake: FakeSlurm, served: Path, reason: str) -> None:
    fake.set("node7", "DRAINED", reason)
    code, doc, err = _run(fake, served)
    assert code == 0, err
    assert fake.updates() == []
    assert doc is not None and doc["action"] == "none" and "someone else" in doc["why"]
    assert fake.node()["reason"] == reason


def test_faulty_node_drained_by_an_operator_keeps_the_operators_reason(fake: FakeSlurm, faulty: Path) -> None:
    fake.set("node7", "MIXED+DRAIN", "maintenance by alice")
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["reason"] == "maintenance by alice"
    assert doc is not None and len(doc["crit"]) >= 1


def test_dry_run_prints_the_drain_and_sends_none(fake: FakeSlurm, faulty: Path) -> None:
    code, doc, err = _run(fake, faulty, "--dry-run")
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["state"] == "IDLE"
    assert doc is not None and doc["outcome"] == "dry-run"
    assert doc["argv"][:4] == ["scontrol", "update", "NodeName=node7", "State=DRAIN"]


def test_without_a_daemon_a_cold_collect_decides_and_says_so(fake: FakeSlurm, tmp_path: Path) -> None:
    state = _state(tmp_path / "cold.json")
    sim.inject(str(state), "ecc-dbe", 5)
    code, doc, err = _run(fake, state)
    assert code == 0, err
    assert doc is not None and doc["source"] == "cold" and "no fresh daemon snapshot" in doc["why_cold"]
    assert len(fake.updates()) == 1 and _gpu(state, 5)["uuid"] in fake.updates()[0][3]


def test_no_daemon_and_a_failing_cold_collect_fails_without_touching_slurm(fake: FakeSlurm, tmp_path: Path) -> None:
    state = tmp_path / "broken.json"
    state.write_text("{not json")
    code, doc, err = _run(fake, state)
    assert code == 1 and doc is None
    line = json.loads(err.strip().splitlines()[-1])
    assert line["kind"] == "collect" and "cold collect failed" in line["error"]
    assert fake.calls() == []  # not even a show: a failed look neither drains nor resumes


def test_a_hanging_scontrol_times_out(fake: FakeSlurm, served: Path) -> None:
    fake.set("node7", "IDLE", None, mode="hang")
    code, doc, err = _run(fake, served, "--scontrol-timeout", "1", timeout=30)
    assert code == 1 and doc is None
    line = json.loads(err.strip().splitlines()[-1])
    assert line["kind"] == "failed" and "did not answer within 1 s" in line["error"]


def test_a_refused_update_is_reported_and_exits_1(fake: FakeSlurm, faulty: Path) -> None:
    fake.set("node7", "IDLE", None, mode="fail-update")
    code, doc, err = _run(fake, faulty)
    assert code == 1
    assert doc is not None and doc["outcome"] == "failed" and "Invalid node state" in doc["message"]
    assert json.loads(err.strip().splitlines()[-1])["kind"] == "failed"


def test_an_unknown_node_exits_1(fake: FakeSlurm, served: Path) -> None:
    code, doc, err = _run(fake, served, node_name="node99")
    assert code == 1 and doc is None and "node99 not found" in err.replace("Node ", "node ")
    assert fake.updates() == []


def test_the_node_name_defaults_to_the_short_host_name(fake: FakeSlurm, served: Path) -> None:
    short = socket.gethostname().split(".", 1)[0]
    fake.set(short, "IDLE", None)
    code, doc, err = _run(fake, served, node_name=None)
    assert code == 0, err
    assert doc is not None and doc["node"] == short
    assert ["show", "node", "-o", short] in fake.calls()


def test_bad_timeout_is_a_usage_error(fake: FakeSlurm, served: Path) -> None:
    code, doc, err = _run(fake, served, "--scontrol-timeout", "0")
    assert code == 2 and doc is None and json.loads(err)["kind"] == "usage"
