"""``fleetops-agent slurm-healthcheck`` as a real process: a real daemon on the simulator (or
none, for the cold collect), and a fake scontrol on PATH as strict as slurmctld where the health
program touches it: ``show node -o NAME`` (an unknown node is exit 1 "Node NAME not found"),
``show nodes -o`` (every node, with Partitions= and the Reason's ``[user@time]`` stamp), and
``update`` that changes what later calls see (an unknown node, a drain without a Reason or a
resume of a node that is not drained are refused, as slurmctld refuses them)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent import lock as node_lock
from fleetops.catalog import slurm as rule
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")

FAKE_SCONTROL = r"""#!/usr/bin/env python3
import json, os, sys, time
d = os.environ["FAKE_SCONTROL_DIR"]
with open(os.path.join(d, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
mode = open(os.path.join(d, "mode")).read().strip() if os.path.exists(os.path.join(d, "mode")) else ""
if mode == "hang":
    time.sleep(60)
nodes = json.load(open(os.path.join(d, "nodes.json")))
args = sys.argv[1:]


def line(name, node):
    text = (f"NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State={node['state']} ThreadsPerCore=1 "
            f"Partitions={','.join(node.get('partitions') or ['gpu'])} BootTime=2026-12-01T08:00:00")
    if node.get("reason"):
        text += f" Reason={node['reason']} [{node.get('by', 'root')}@2026-12-02T10:00:00]"
    return text


if args[:2] == ["show", "node"]:
    name = [a for a in args[2:] if a != "-o"][0]
    if name not in nodes:
        sys.stderr.write(f"Node {name} not found\n")
        sys.exit(1)
    print(line(name, nodes[name]))
    sys.exit(0)
if args[:2] == ["show", "nodes"] and "-o" in args:
    if mode == "fail-show-nodes":
        sys.stderr.write("slurm_load_node error: Unable to contact slurm controller (connect failure)\n")
        sys.exit(1)
    for name, node in nodes.items():
        print(line(name, node))
    sys.exit(0)
if args[:1] == ["update"]:
    if mode == "fail-update":
        sys.stderr.write("slurm_update error: Invalid node state specified\n")
        sys.exit(1)
    kv = dict(a.split("=", 1) for a in args[1:])
    node = nodes.get(kv.get("NodeName"))
    if node is None:
        sys.stderr.write("slurm_update error: Invalid node name specified\n")
        sys.exit(1)
    flags = node["state"].split("+")
    if kv.get("State") == "DRAIN":
        if not kv.get("Reason"):
            sys.stderr.write("You must specify a reason when DOWNing or DRAINING a node. Request denied\n")
            sys.exit(1)
        node["state"] = flags[0] + "+DRAIN" if "DRAIN" not in flags else node["state"]
        node["reason"], node["by"] = kv["Reason"], "root"
    elif kv.get("State") == "RESUME":
        if "DRAIN" not in flags:
            sys.stderr.write("slurm_update error: Invalid node state specified\n")
            sys.exit(1)
        node["state"], node["reason"] = flags[0], None
    else:
        sys.exit(2)
    json.dump(nodes, open(os.path.join(d, "nodes.json"), "w"))
    sys.exit(0)
sys.exit(2)
"""

LEGACY = "[fleetops] healthcheck: memory.ecc_dbe_volatile on GPU GPU-x 0000:18:00.0"


def health_reason(
    node: str = "node3", age_s: float = 60.0, purpose: str = "memory.ecc_dbe_volatile on GPU GPU-y"
) -> str:
    run = f"{rule.new_run_id(time.time() - age_s)}-{node}"
    return rule.drain_reason("health", run, purpose)


class FakeSlurm:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        script = directory / "scontrol"
        script.write_text(FAKE_SCONTROL.replace("/usr/bin/env python3", sys.executable))
        script.chmod(0o755)
        self.set("node7", "IDLE", None)

    def set(self, name: str, state: str, reason: str | None, mode: str = "") -> None:
        """One node, ``name``, alone in partition gpu."""
        self.cluster({name: (state, reason)}, mode)

    def cluster(
        self, nodes: dict[str, tuple[str, str | None]], mode: str = "", partitions: str = "gpu"
    ) -> None:
        doc = {
            n: {"state": st, "reason": r, "partitions": partitions.split(",")} for n, (st, r) in nodes.items()
        }
        (self.dir / "nodes.json").write_text(json.dumps(doc))
        (self.dir / "mode").write_text(mode)
        (self.dir / "calls.jsonl").unlink(missing_ok=True)

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]

    def node(self, name: str = "node7") -> dict[str, Any]:
        node: dict[str, Any] = json.loads((self.dir / "nodes.json").read_text())[name]
        return node

    def drained(self) -> list[str]:
        nodes = json.loads((self.dir / "nodes.json").read_text())
        return sorted(n for n, v in nodes.items() if "DRAIN" in v["state"])


def _state(path: Path, name: str = "node7") -> Path:
    sim.write_state(str(path), sim.build_state(name, {}))
    return path


def _run(
    fake: FakeSlurm, state: Path, *extra: str, node_name: str | None = "node7", timeout: float = 60
) -> tuple[int, dict[str, Any] | None, str]:
    env = {**os.environ, "FAKE_SCONTROL_DIR": str(fake.dir), "PATH": f"{fake.dir}:{os.environ['PATH']}"}
    env.pop("SLURMD_NODENAME", None)
    env.pop("FLEETOPS_SLURM_HEALTHCHECK_REPORT", None)
    argv = [AGENT, "slurm-healthcheck", "--backend", "sim", "--state", str(state)]
    if node_name is not None:
        argv += ["--node-name", node_name]
    done = subprocess.run(
        [*argv, *extra], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """One real daemon on one simulated node for the module, its /metrics on loopback."""
    d = tmp_path_factory.mktemp("hc-daemon")
    state = _state(d / "node7.json")
    port = _free_port()
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--states", str(state), "--interval", "0.2", "--full-interval", "0.4",
         "--metrics-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _until_daemon(state, crit=False)
        yield state, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def served(daemon: tuple[Path, int]) -> Path:
    return daemon[0]


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
    gpu: dict[str, Any] = json.loads(state.read_text())["gpus"][index]
    return gpu


def _report(state: Path) -> dict[str, Any]:
    """The report the last pass wrote beside the simulator's state (its sim default)."""
    doc: dict[str, Any] = json.loads(state.with_name(state.stem + ".slurm-healthcheck.json").read_text())
    return doc


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # loopback only
        return str(resp.read().decode())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- owners ---------------------------------------------------------------------------------


def test_crit_finding_drains_with_the_health_owner_a_run_of_this_node_and_the_check_and_gpu(
    fake: FakeSlurm, faulty: Path
) -> None:
    before = time.time()
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert doc is not None and doc["source"] == "daemon" and doc["age_s"] < 30
    gpu = _gpu(faulty, 2)
    updates = fake.updates()
    assert len(updates) == 1, fake.calls()
    assert updates[0][:3] == ["update", "NodeName=node7", "State=DRAIN"]
    reason = updates[0][3].removeprefix("Reason=")
    owner = rule.owner_of(reason)
    assert owner.kind == "health" and not owner.legacy and owner.run is not None and owner.run == doc["run"]
    assert rule.RUN_RE.match(owner.run) and owner.run.endswith("-node7")
    started = rule.run_time(owner.run)
    assert started is not None and before - 1 <= started <= time.time()
    assert {c["check"] for c in doc["crit"]} == {"memory.ecc_dbe_volatile", "xid.recent"}
    assert owner.purpose.startswith(f"{doc['crit'][0]['check']} on GPU ") and owner.purpose.endswith(
        "(+1 more crit)"
    )
    assert gpu["uuid"] in reason and gpu["bus_id"] in reason
    assert doc["action"] == "drain" and doc["outcome"] == "done" and doc["decision"] == "drain"
    assert doc["breaker"]["open"] is False and doc["lock"]["state"] == "free"
    # slurmctld has it, with the stamp it adds; read back it is the health program's
    assert fake.node()["state"] == "IDLE+DRAIN" and rule.owner_of(fake.node()["reason"]).kind == "health"
    assert ["show", "nodes", "-o"] in fake.calls()  # the breaker looked before the drain


def test_still_faulty_and_drained_by_the_health_program_is_left_as_it_is(
    fake: FakeSlurm, faulty: Path
) -> None:
    fake.set("node7", "IDLE+DRAIN", health_reason("node7"))
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert fake.updates() == [] and doc is not None and doc["action"] == "none" and doc["decision"] == "ours"
    assert "still faulty" in doc["why"] and doc["owner"]["kind"] == "health"


@pytest.mark.parametrize("reason", [health_reason("node7", age_s=7200), LEGACY], ids=["owned", "legacy"])
def test_clean_node_drained_by_the_health_program_is_resumed(
    fake: FakeSlurm, served: Path, reason: str
) -> None:
    fake.set("node7", "IDLE+DRAIN", reason)
    code, doc, err = _run(fake, served)
    assert code == 0, err
    assert fake.updates() == [["update", "NodeName=node7", "State=RESUME"]]
    assert doc is not None and doc["action"] == "resume" and doc["source"] == "daemon"
    assert doc["owner"]["kind"] == "health" and doc["owner"]["legacy"] == (reason == LEGACY)
    assert fake.node()["state"] == "IDLE" and fake.node()["reason"] is None


OTHERS = {
    "rollout": "[fleetops] rollout/20261206T071502Z-3f9a: driver rollout 580.163.01",
    "mig": "[fleetops] mig/20261206T071502Z-0b1c: MIG layout 3g.71gb,3g.71gb",
    "reset": "[fleetops] reset/20261206T032210Z-91af: reset GPU-5d3e (memory.ecc_dbe_volatile)",
    "operator": "[fleetops] operator/alice@ctl01: xid.79 ticket 4411",
    "legacy-operator": "[fleetops] fleetops driver rollout",
    "outside": "maintenance by alice",
    "outside-healthcheck-words": "healthcheck: not marked by fleetops",
}


@pytest.mark.parametrize("reason", list(OTHERS.values()), ids=list(OTHERS))
def test_clean_node_drained_by_another_owner_is_never_resumed(
    fake: FakeSlurm, served: Path, reason: str
) -> None:
    fake.set("node7", "DRAINED", reason)
    code, doc, err = _run(fake, served)
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["reason"] == reason and fake.node()["state"] == "DRAINED"
    owner = rule.owner_of(reason)
    assert doc is not None and doc["action"] == "none" and doc["decision"] == "leave"
    assert doc["owner"]["describe"] == owner.describe() and owner.describe() in doc["why"]
    assert doc["owner"]["kind"] == owner.kind != "health"


@pytest.mark.parametrize(
    "reason",
    [OTHERS["operator"], OTHERS["rollout"], OTHERS["outside"]],
    ids=["operator", "rollout", "outside"],
)
def test_faulty_node_drained_by_another_owner_keeps_its_reason(
    fake: FakeSlurm, faulty: Path, reason: str
) -> None:
    fake.set("node7", "MIXED+DRAIN", reason)
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["reason"] == reason
    assert doc is not None and len(doc["crit"]) >= 1 and doc["action"] == "none" and doc["decision"] == "held"
    assert rule.owner_of(reason).describe() in doc["why"]


def test_dry_run_prints_the_drain_and_sends_none(fake: FakeSlurm, faulty: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code, doc, err = _run(fake, faulty, "--dry-run", "--report-file", str(report))
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["state"] == "IDLE"
    assert doc is not None and doc["outcome"] == "dry-run"
    assert doc["argv"][:4] == ["scontrol", "update", "NodeName=node7", "State=DRAIN"]
    assert rule.owner_of(doc["argv"][4].removeprefix("Reason=")).kind == "health"
    assert not report.exists()  # a dry run leaves the last real pass's report for the daemon


def test_without_a_daemon_a_cold_collect_decides_and_says_so(fake: FakeSlurm, tmp_path: Path) -> None:
    state = _state(tmp_path / "cold.json")
    sim.inject(str(state), "ecc-dbe", 5)
    code, doc, err = _run(fake, state)
    assert code == 0, err
    assert doc is not None and doc["source"] == "cold" and "no fresh daemon snapshot" in doc["why_cold"]
    assert len(fake.updates()) == 1 and _gpu(state, 5)["uuid"] in fake.updates()[0][3]
    assert _report(state)["action"] == "drain"


def test_no_daemon_and_a_failing_cold_collect_fails_without_touching_slurm(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    state = tmp_path / "broken.json"
    state.write_text("{not json")
    code, doc, err = _run(fake, state)
    assert code == 1 and doc is None
    line = json.loads(err.strip().splitlines()[-1])
    assert line["kind"] == "collect" and "cold collect failed" in line["error"]
    assert fake.calls() == []  # not even a show: a failed look neither drains nor resumes
    failed = _report(state)
    assert failed["action"] == "failed" and failed["error_kind"] == "collect" and failed["node"] == "node7"


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
    assert code == 1 and doc is None and "Node node99 not found" in err
    assert fake.updates() == []


def test_the_node_name_defaults_to_the_short_host_name(fake: FakeSlurm, served: Path) -> None:
    short = socket.gethostname().split(".", 1)[0]
    fake.set(short, "IDLE", None)
    code, doc, err = _run(fake, served, node_name=None)
    assert code == 0, err
    assert doc is not None and doc["node"] == short
    assert ["show", "node", "-o", short] in fake.calls()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--scontrol-timeout", "0"),
        ("--breaker-share", "0"),
        ("--breaker-share", "1.5"),
    ],
)
def test_bad_numbers_are_usage_errors(fake: FakeSlurm, served: Path, flag: str, value: str) -> None:
    code, doc, err = _run(fake, served, flag, value)
    assert (
        code == 2 and doc is None and json.loads(err)["kind"] == "usage" and flag in json.loads(err)["error"]
    )
    assert fake.calls() == []


# --- the circuit breaker --------------------------------------------------------------------


def _ten(others: dict[str, tuple[str, str | None]]) -> dict[str, tuple[str, str | None]]:
    """node7 and nine more in partition gpu: the breaker's 20 % is two nodes."""
    nodes: dict[str, tuple[str, str | None]] = {f"node{i}": ("IDLE", None) for i in range(1, 11)}
    nodes.update(others)
    return nodes


def test_breaker_opens_at_the_share_holds_the_drain_and_reports_it(
    fake: FakeSlurm, faulty: Path, daemon: tuple[Path, int]
) -> None:
    fake.cluster(
        _ten(
            {
                "node2": ("IDLE+DRAIN", health_reason("node2", 120)),
                "node3": ("MIXED+DRAIN", health_reason("node3", 30)),
            }
        )
    )
    code, doc, err = _run(fake, faulty)
    assert code == 0, err  # the look worked: slurmd has nothing to log
    assert fake.updates() == [] and fake.drained() == ["node2", "node3"]
    assert doc is not None and doc["action"] == "held-by-breaker" and doc["outcome"] == "none"
    assert doc["breaker"]["open"] is True and doc["breaker"]["share"] == 0.2
    assert "2 of 10 watched nodes stand drained by the health program (node2, node3)" in doc["why"]
    assert "the limit is 2" in doc["why"]
    report = _report(faulty)
    assert (
        report["action"] == "held-by-breaker"
        and report["breaker"]["open"] is True
        and report["run"] == doc["run"]
    )
    page = _scrape(daemon[1])
    assert "\nfleetops_slurm_healthcheck_breaker_open 1\n" in page
    assert '\nfleetops_slurm_healthcheck_action_info{action="held_by_breaker"} 1\n' in page
    stamp = re.search(r"^fleetops_slurm_healthcheck_last_run_timestamp_seconds (\S+)$", page, re.M)
    assert stamp and abs(float(stamp.group(1)) - doc["at"]) < 0.01


def test_breaker_below_the_share_lets_the_drain_through_and_the_metric_closes(
    fake: FakeSlurm, faulty: Path, daemon: tuple[Path, int]
) -> None:
    fake.cluster(_ten({"node2": ("IDLE+DRAIN", health_reason("node2", 120))}))
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert doc is not None and doc["action"] == "drain" and doc["breaker"]["open"] is False
    assert fake.drained() == ["node2", "node7"]
    page = _scrape(daemon[1])
    assert "\nfleetops_slurm_healthcheck_breaker_open 0\n" in page
    assert '\nfleetops_slurm_healthcheck_action_info{action="drain"} 1\n' in page


def test_breaker_counts_standing_health_drains_however_old_and_no_other_owners(
    fake: FakeSlurm, faulty: Path
) -> None:
    others = {"node4": ("IDLE+DRAIN", OTHERS["rollout"]), "node5": ("DOWN+DRAIN", OTHERS["operator"]),
              "node6": ("IDLE+DRAIN", OTHERS["outside"])}  # fmt: skip
    fake.cluster(_ten(others))
    code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert doc is not None and doc["action"] == "drain" and doc["breaker"]["open"] is False
    assert "0 of 10" in doc["breaker"]["why"]
    # health drains from weeks ago still stand: a lasting false positive keeps the breaker open
    old = {f"node{i}": ("IDLE+DRAIN", health_reason(f"node{i}", 30 * 86400)) for i in (1, 2)}
    fake.cluster(_ten({**old, **others}))
    code, doc, err = _run(fake, faulty)
    assert code == 0 and doc is not None and doc["action"] == "held-by-breaker", (err, doc)
    assert "2 of 10 watched nodes stand drained" in doc["why"]
    assert fake.updates() == []


def test_breaker_share_flag_and_the_one_node_floor(fake: FakeSlurm, faulty: Path) -> None:
    # three nodes: 20 % rounds down to none, and the floor is one; one recent health drain opens it
    fake.cluster(
        {"node6": ("IDLE+DRAIN", health_reason("node6")), "node7": ("IDLE", None), "node8": ("IDLE", None)}
    )
    code, doc, err = _run(fake, faulty)
    assert code == 0 and doc is not None and doc["action"] == "held-by-breaker", (err, doc)
    fake.cluster(
        {"node6": ("IDLE+DRAIN", health_reason("node6")), "node7": ("IDLE", None), "node8": ("IDLE", None)}
    )
    code, doc, err = _run(fake, faulty, "--breaker-share", "0.7")
    assert code == 0 and doc is not None and doc["action"] == "drain", (err, doc)


def test_breaker_watches_only_this_nodes_partitions(fake: FakeSlurm, faulty: Path) -> None:
    nodes = json.loads(json.dumps(_ten({})))
    fake.cluster(nodes)
    doc = json.loads((fake.dir / "nodes.json").read_text())
    for i in (1, 2, 3):  # three recent health drains in another partition
        doc[f"node{i}"].update(state="IDLE+DRAIN", reason=health_reason(f"node{i}"), partitions=["cpu"])
    (fake.dir / "nodes.json").write_text(json.dumps(doc))
    code, out, err = _run(fake, faulty)
    assert code == 0 and out is not None and out["action"] == "drain", (err, out)
    assert "0 of 7 watched nodes" in out["breaker"]["why"]


def test_a_failed_look_at_every_node_does_not_drain(fake: FakeSlurm, faulty: Path) -> None:
    fake.set("node7", "IDLE", None, mode="fail-show-nodes")
    code, doc, err = _run(fake, faulty)
    assert code == 1 and doc is None and fake.updates() == []
    line = json.loads(err.strip().splitlines()[-1])
    assert line["kind"] == "failed" and "scontrol show nodes failed" in line["error"]
    assert _report(faulty)["action"] == "failed"


def test_the_health_metrics_pass_promtool(fake: FakeSlurm, faulty: Path, daemon: tuple[Path, int]) -> None:
    from promtool_util import assert_clean

    fake.cluster(
        _ten(
            {"node2": ("IDLE+DRAIN", health_reason("node2")), "node3": ("IDLE+DRAIN", health_reason("node3"))}
        )
    )
    code, doc, err = _run(fake, faulty)
    assert code == 0 and doc is not None and doc["action"] == "held-by-breaker", (err, doc)
    page = _scrape(daemon[1])
    assert "fleetops_gpu_" in page and "fleetops_slurm_healthcheck_breaker_open 1" in page
    assert_clean(page)


# --- the maintenance lock -------------------------------------------------------------------


def test_a_held_maintenance_lock_holds_the_drain_naming_the_action_and_pid(
    fake: FakeSlurm, faulty: Path
) -> None:
    gpu = _gpu(faulty, 2)["uuid"]
    # the simulator's lock, where reset and MIG take it: beside the state
    with node_lock.acquire(os.path.abspath(faulty) + ".maintenance.lock", "reset", gpu):
        code, doc, err = _run(fake, faulty)
    assert code == 0, err
    assert fake.updates() == [] and fake.node()["state"] == "IDLE"
    assert ["show", "nodes", "-o"] not in fake.calls()
    assert doc is not None and doc["action"] == "held-by-lock" and doc["outcome"] == "none"
    assert (
        doc["lock"]["state"] == "held"
        and doc["lock"]["action"] == "reset"
        and doc["lock"]["pid"] == os.getpid()
    )
    assert f"reset by pid {os.getpid()}" in doc["why"] and doc["lock"]["gpu"] == gpu
    assert _report(faulty)["action"] == "held-by-lock"


def test_a_held_lock_also_holds_the_resume(fake: FakeSlurm, served: Path, tmp_path: Path) -> None:
    fake.set("node7", "IDLE+DRAIN", health_reason("node7"))
    path = tmp_path / "maintenance.lock"
    with node_lock.acquire(str(path), "mig apply"):
        code, doc, err = _run(fake, served, "--lock-file", str(path))
    assert code == 0, err
    assert fake.updates() == [] and doc is not None and doc["action"] == "held-by-lock"
    assert doc["lock"]["action"] == "mig apply"
    code, doc, err = _run(fake, served, "--lock-file", str(path))  # released: the resume goes through
    assert code == 0 and doc is not None and doc["action"] == "resume", (err, doc)


def test_a_stale_lock_holds_nothing(fake: FakeSlurm, faulty: Path, tmp_path: Path) -> None:
    path = tmp_path / "maintenance.lock"
    record = {"pid": _dead_pid(), "pid_start": 1, "action": "reset", "gpu": "GPU-x", "started_at": time.time() - 30,
              "deadline": time.time() + 300, "phase": "resetting"}  # fmt: skip
    path.write_text(json.dumps(record))
    code, doc, err = _run(fake, faulty, "--lock-file", str(path))
    assert code == 0, err
    assert doc is not None and doc["action"] == "drain" and doc["lock"]["state"] == "stale"
    assert fake.drained() == ["node7"] and path.read_text() == json.dumps(record)  # looked at, not taken


def test_no_lock_file_and_a_clean_node_read_no_lock_at_all(fake: FakeSlurm, served: Path) -> None:
    code, doc, err = _run(fake, served)
    assert code == 0 and doc is not None and doc["action"] == "none" and doc["lock"] is None, (err, doc)
    assert fake.calls() == [["show", "node", "-o", "node7"]]


# --- the fabric: a compute port drains, the management port never does -------------------------

PORT3_DOWN = "compute port mlx5_3 port 1 (ibp94s0, 0000:5e:00.0) is 1: DOWN (phys_state 2: Polling)"


@contextlib.contextmanager
def _served_with(state: Path, finding: tuple[str, str]) -> Iterator[None]:
    """A daemon of its own on ``state`` (the fault injected before it starts: the module's
    daemon stays clean), until its answer carries ``finding`` (check, severity)."""
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--states", str(state), "--interval", "0.2", "--full-interval", "0.4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while finding not in _daemon_findings(state):
            assert time.monotonic() < deadline, f"the daemon never reported {finding}: {_daemon_findings(state)}"
            time.sleep(0.2)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _with_fault(tmp_path: Path, fault: str, index: int) -> Path:
    state = _state(tmp_path / "node7.json")
    sim.inject(str(state), fault, index)
    return state


@pytest.mark.parametrize("source", ["daemon", "cold"])
def test_a_compute_port_down_drains_the_node_naming_the_port(fake: FakeSlurm, tmp_path: Path, source: str) -> None:
    state = _with_fault(tmp_path, "ib-port-down", 3)  # mlx5_3, GPU 3's rail
    with _served_with(state, ("fabric.port_down", "crit")) if source == "daemon" else contextlib.nullcontext():
        code, doc, err = _run(fake, state)
    assert code == 0, err
    assert doc is not None and doc["source"] == source
    assert doc["crit"] == [{"check": "fabric.port_down", "gpu": None, "port": "mlx5_3/1", "message": PORT3_DOWN}]
    assert (doc["action"], doc["outcome"], doc["breaker"]["open"]) == ("drain", "done", False)
    assert fake.updates() == [
        ["update", "NodeName=node7", "State=DRAIN", f"Reason=[fleetops] health/{doc['run']}: fabric.port_down on port mlx5_3/1"]
    ]
    assert fake.drained() == ["node7"]


@pytest.mark.parametrize("source", ["daemon", "cold"])
def test_the_management_port_down_never_drains_the_node(fake: FakeSlurm, tmp_path: Path, source: str) -> None:
    state = _with_fault(tmp_path, "ib-port-down", 8)  # mlx5_8: the Ethernet management port
    with _served_with(state, ("fabric.port_down", "warn")) if source == "daemon" else contextlib.nullcontext():
        code, doc, err = _run(fake, state)
    assert code == 0, err
    assert doc is not None and doc["source"] == source
    assert (doc["crit"], doc["action"], doc["decision"], doc["breaker"]) == ([], "none", "not_drained", None)
    assert fake.calls() == [["show", "node", "-o", "node7"]]  # no breaker look, no update
    assert fake.node()["state"] == "IDLE"


def test_a_fabric_drain_stops_at_the_circuit_breaker_like_any_other(fake: FakeSlurm, tmp_path: Path) -> None:
    state = _with_fault(tmp_path, "ib-port-down", 3)
    fake.cluster(_ten({"node2": ("IDLE+DRAIN", health_reason("node2", 120)),
                       "node3": ("IDLE+DRAIN", health_reason("node3", 30))}))  # fmt: skip
    code, doc, err = _run(fake, state)
    assert code == 0, err
    assert doc is not None and [c["check"] for c in doc["crit"]] == ["fabric.port_down"]
    assert (doc["action"], doc["breaker"]["open"]) == ("held-by-breaker", True)
    assert fake.updates() == [] and fake.drained() == ["node2", "node3"]
