"""GPU resets over real SSH against a simulated fleet of its own (real sshd on loopback):
`fleetops reset`, `fleetops remediate` and `playbooks/gpu_reset.yml` driving `fleetops-agent reset`."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
NODES = 3
# an address block of its own (audit tests: 127.0.20.x, Ansible tests: 127.0.46.x, demo: 127.0.10.x)
FIRST_ADDRESS = os.environ.get("FLEETOPS_RESET_TEST_ADDRESS", "127.0.31.1")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    from fleetops.sim import fleet

    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetops.sim import fleet

    directory = str(tmp_path_factory.mktemp("resetfleet"))
    fleet.up(NODES, directory, first_address=FIRST_ADDRESS, port=_free_port(FIRST_ADDRESS))
    try:
        yield directory
    finally:
        fleet.down(directory)


@pytest.fixture
def d(fleet_dir):
    """The module's fleet, every node's GPU state fresh again after the test."""
    yield fleet_dir
    for n in range(1, NODES + 1):
        name = f"node{n:03d}"
        path = state(fleet_dir, name)
        sim.init_state(str(path), name)
        for leftover in (Path(str(path) + ".maintenance.lock"), path.with_suffix(".reset.jsonl")):
            leftover.unlink(missing_ok=True)


def state(d, node) -> Path:
    return Path(d) / "state" / f"{node}.json"


def inventory(d) -> str:
    return os.path.join(d, "inventory.yml")


def uuid(d, node, index):
    return sim.read_state(str(state(d, node)))["gpus"][index]["uuid"]


def inject(d, node, fault, gpu):
    from fleetops.sim import fleet

    fleet.inject(d, node, fault, gpu)


def fleetops(d, *args, timeout=120):
    return subprocess.run([*CLI, *args, "--connect-timeout", "5"], capture_output=True, text=True, check=False, timeout=timeout,
                          cwd=REPO, stdin=subprocess.DEVNULL)


def reset(d, node, gpu, *extra):
    proc = fleetops(d, "reset", node, str(gpu), "-i", inventory(d), "--json", *extra)
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, doc


def pre(doc, name):
    return next(p for p in doc["preconditions"] if p["name"] == name)


def audit_findings(d):
    proc = subprocess.run([*CLI, "audit", "-i", inventory(d), "--format", "json", "--no-history", "-q"],
                          capture_output=True, text=True, check=False, timeout=120, cwd=REPO)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    return json.loads(proc.stdout)["findings"]


def on_gpu(findings, node, gpu_uuid):
    return [f for f in findings if f["node"] == node and (f.get("gpu") or {}).get("uuid") == gpu_uuid]


def test_busy_gpu_is_refused_over_ssh_and_its_processes_are_named(d):
    inject(d, "node001", "stray-process", 2)
    before = state(d, "node001").read_bytes()
    proc, doc = reset(d, "node001", 2, "--yes")
    assert proc.returncode == 1
    busy = pre(doc, "compute_processes")
    assert busy["status"] == "failed" and busy["processes"][0]["pid"] == sim.STRAY_PID
    assert "python3 train.py" in busy["detail"]
    assert state(d, "node001").read_bytes() == before


def test_kill_processes_ends_them_resets_and_the_next_audit_is_clean(d):
    inject(d, "node001", "stray-process", 2)
    inject(d, "node001", "ecc-dbe", 2)
    gpu = uuid(d, "node001", 2)
    assert {f["check"] for f in on_gpu(audit_findings(d), "node001", gpu)} >= {"memory.ecc_dbe_volatile"}
    proc, doc = reset(d, "node001", gpu, "--yes", "--kill-processes")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert doc["result"] == "reset" and doc["verified"] is True
    ended = next(a for a in doc["actions"] if a["action"] == "end_processes")["processes"]
    assert [(p["pid"], p["ended"]) for p in ended] == [(sim.STRAY_PID, True)]
    assert on_gpu(audit_findings(d), "node001", gpu) == []


def test_after_a_successful_reset_the_next_audit_shows_no_finding_on_that_gpu(d):
    for fault in ("ecc-dbe", "row-remap-pending"):
        inject(d, "node003", fault, 4)
    inject(d, "node003", "xid:119", 4)
    gpu = uuid(d, "node003", 4)
    assert on_gpu(audit_findings(d), "node003", gpu)
    proc, doc = reset(d, "node003", 4, "--yes")  # by index: resolved to the UUID first
    assert proc.returncode == 0, proc.stderr
    assert doc["gpu"]["uuid"] == gpu
    assert f"GPU index 4 on node003 is {gpu}" in proc.stderr
    assert on_gpu(audit_findings(d), "node003", gpu) == []


def test_xid79_is_refused_with_the_advice_to_reboot_the_node(d):
    inject(d, "node002", "xid:79", 5)
    lost = uuid(d, "node002", 5)
    proc, doc = reset(d, "node002", lost, "--yes")
    assert proc.returncode == 1
    assert doc["refused"] is True and doc["remedy"].startswith("reboot the node")
    text = fleetops(d, "reset", "node002", lost, "-i", inventory(d), "--yes").stdout
    assert "remedy: reboot the node" in text and "fallen off the bus" in text


def test_two_concurrent_resets_on_one_node_the_second_is_refused_by_the_lock(d):
    with sim.locked_state(str(state(d, "node002"))) as st:
        st["node"]["reset_duration_s"] = 8.0  # long enough for the second command's snapshot and reset
    lock = Path(str(state(d, "node002")) + ".maintenance.lock")
    first = subprocess.Popen([*CLI, "reset", "node002", uuid(d, "node002", 0), "-i", inventory(d), "--yes", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not (lock.exists() and lock.read_text().strip()):
            assert time.monotonic() < deadline and first.poll() is None, "the first reset never took the lock"
            time.sleep(0.05)
        holder = json.loads(lock.read_text())
        proc, doc = reset(d, "node002", uuid(d, "node002", 1), "--yes")
        assert proc.returncode == 1
        refused = pre(doc, "maintenance_lock")
        assert refused["status"] == "failed" and f"pid {holder['pid']}" in refused["detail"]
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    assert json.loads(out)["result"] == "reset"
    assert not lock.exists()


def test_a_stale_lock_from_a_killed_run_is_recovered(d):
    path = state(d, "node003")
    with sim.locked_state(str(path)) as st:
        st["node"]["reset_duration_s"] = 60.0
    lock = Path(str(path) + ".maintenance.lock")
    run = subprocess.Popen([*CLI, "reset", "node003", uuid(d, "node003", 0), "-i", inventory(d), "--yes", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not (lock.exists() and "stopped" in lock.read_text()):
            assert time.monotonic() < deadline and run.poll() is None, "the reset never stopped its clients"
            time.sleep(0.05)
        agent_pid = json.loads(lock.read_text())["pid"]
        os.kill(agent_pid, signal.SIGKILL)  # the agent on the node dies mid-reset
        run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert lock.exists()  # left behind, as a crash leaves it
    assert sim.read_state(str(path))["node"]["services"]["nvidia-persistenced"] == "inactive"
    with sim.locked_state(str(path)) as st:
        st["node"]["reset_duration_s"] = 0.0
    proc, doc = reset(d, "node003", uuid(d, "node003", 0), "--yes")
    assert proc.returncode == 0, proc.stderr
    took = pre(doc, "maintenance_lock")
    assert took["status"] == "ok" and f"process {agent_pid} is gone" in took["detail"]
    assert "left stopped by a crashed run" in pre(doc, "gpu_clients")["detail"]
    assert sim.read_state(str(path))["node"]["services"]["nvidia-persistenced"] == "active"
    assert not lock.exists()


@pytest.mark.parametrize("gpu", ["GPU-00000000-0000-0000-0000-000000000000", "0000:ee:00.0", "8"])
def test_a_gpu_the_node_does_not_list_is_a_usage_error_in_every_form_and_nothing_is_sent(d, gpu):
    folder = state(d, "node001").parent
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("node001") and p.is_file()}
    proc, doc = reset(d, "node001", gpu, "--yes")
    assert proc.returncode == 4, proc.stderr
    assert doc is None and "node001 has no GPU with" in proc.stderr and gpu in proc.stderr
    assert uuid(d, "node001", 0) in proc.stderr  # the GPUs present, to pick from
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("node001") and p.is_file()}
    assert after == before  # no reset was sent: not even an attempt in the journal


def test_a_dry_run_changes_nothing(d):
    inject(d, "node001", "stray-process", 6)
    inject(d, "node001", "ecc-dbe", 6)
    folder = state(d, "node001").parent
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("node001") and p.is_file()}
    proc, doc = reset(d, "node001", 6, "--dry-run", "--kill-processes")
    assert proc.returncode == 0, proc.stderr
    assert doc["dry_run"] is True and doc["result"] == "would-reset" and doc["actions"] == []
    from fleetops.agent.reset.preconditions import PRECONDITIONS

    # every precondition evaluated, the device files' holders included (none: no daemon here)
    assert [c["name"] for c in doc["preconditions"]] == list(PRECONDITIONS)
    (holders,) = [c for c in doc["preconditions"] if c["name"] == "device_holders"]
    assert holders["status"] == "ok" and holders["holders"] == []
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("node001") and p.is_file()}
    assert after == before  # state byte-identical, no lock, no log


def test_without_yes_and_without_a_terminal_nothing_is_reset(d):
    inject(d, "node002", "ecc-dbe", 3)
    before = state(d, "node002").read_bytes()
    proc = fleetops(d, "reset", "node002", "3", "-i", inventory(d))
    assert proc.returncode == 4 and "--yes" in proc.stderr
    assert uuid(d, "node002", 3) in proc.stderr
    assert state(d, "node002").read_bytes() == before


def test_remediate_plans_from_the_audit_and_carries_out_the_resets(d, tmp_path):
    inject(d, "node001", "ecc-dbe", 1)
    inject(d, "node002", "xid:79", 7)
    inject(d, "node003", "row-remap-failure", 0)
    db = str(tmp_path / "history.db")
    proc = fleetops(d, "remediate", "-i", inventory(d), "--db", db, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    plan = {n["node"]: n for n in json.loads(proc.stdout)["plan"]["nodes"]}
    assert plan["node002"]["action"] == "reboot_node"
    assert plan["node003"]["action"] == "drain_and_inspect"
    assert [i["action"] for i in plan["node001"]["items"]] == ["reset_gpu"]
    gpu = uuid(d, "node001", 1)
    proc = fleetops(d, "remediate", "-i", inventory(d), "--db", db, "--yes", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"node001 GPU 1 {gpu}" in proc.stdout and ": reset" in proc.stdout
    assert "Reboot (drain first" in proc.stdout and "Drain and send for inspection: node003" in proc.stdout
    found = audit_findings(d)
    assert on_gpu(found, "node001", gpu) == []
    assert any(f["node"] == "node003" for f in found)  # not touched: it waits for inspection


def _ansible_playbook() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    found = here if os.access(here, os.X_OK) else shutil.which("ansible-playbook")
    if not found:
        pytest.skip("ansible-playbook is not installed")
    return found


def test_the_playbook_resets_through_the_agent_and_check_mode_changes_nothing(d):
    inject(d, "node003", "ecc-dbe", 2)
    gpu = uuid(d, "node003", 2)
    cmd = [_ansible_playbook(), "-i", inventory(d), "playbooks/gpu_reset.yml", "-l", "node003",
           "-e", f"fleetops_reset_gpu={gpu}"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    before = state(d, "node003").read_bytes()
    check = subprocess.run([*cmd, "--check"], capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    said = [line for line in check.stdout.splitlines() if gpu in line and "would be reset" in line]
    assert said, check.stdout[-3000:]  # the dry run names the GPU it would reset
    assert state(d, "node003").read_bytes() == before
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "changed=1" in done.stdout
    assert [f["name"] for f in sim.read_state(str(state(d, "node003")))["faults"]] == []
    # an index is refused by the playbook before the agent is asked
    bad = subprocess.run([*cmd[:-1], "fleetops_reset_gpu=2"], capture_output=True, text=True, check=False, timeout=300, cwd=REPO,
                         env=env)
    assert bad.returncode != 0 and "never an index" in bad.stdout


# --- what the operator confirmed is what the reset may do -------------------------------------


class AddsAProcessWhileAsking(io.StringIO):
    """A terminal whose operator answers yes; while the question is on screen a job starts on
    the GPU (a process the listing above the question did not show)."""

    def __init__(self, path: Path, position: int, pid: int, answer: str = "y\n") -> None:
        super().__init__(answer)
        self.path, self.position, self.pid = path, position, pid

    def isatty(self) -> bool:
        return True

    def readline(self, *args: object) -> str:  # type: ignore[override]
        with sim.locked_state(str(self.path)) as st:
            sim.add_process(st, self.position, self.pid, "late_job.py")
        return super().readline()


def _reset_in_process(d, node, gpu, *extra, stdin, monkeypatch, capsys):
    from fleetops import cli

    monkeypatch.setattr(sys, "stdin", stdin)
    code = cli.main(["reset", node, str(gpu), "-i", inventory(d), "--json", "--connect-timeout", "5", *extra])
    captured = capsys.readouterr()
    doc = json.loads(captured.out) if captured.out.strip().startswith("{") else None
    return code, doc, captured.err


def test_a_process_that_appears_after_an_idle_listing_is_refused_not_killed(d, monkeypatch, capsys):
    path = state(d, "node002")
    code, doc, err = _reset_in_process(d, "node002", 4, stdin=AddsAProcessWhileAsking(path, 4, 7777),
                                       monkeypatch=monkeypatch, capsys=capsys)
    assert "processes: none" in err and "[y/N]" in err  # what the operator was shown and asked
    assert code == 1
    assert doc["result"] == "refused" and doc["kill_processes"] is False
    busy = pre(doc, "compute_processes")
    assert busy["status"] == "failed" and [p["pid"] for p in busy["processes"]] == [7777]
    assert [p["pid"] for p in sim.gpu_processes(sim.read_state(str(path)), 4)] == [7777]  # still running


def test_a_process_that_appears_after_the_listing_is_refused_naming_it(d, monkeypatch, capsys):
    inject(d, "node001", "stray-process", 5)
    path = state(d, "node001")
    code, doc, err = _reset_in_process(d, "node001", 5, "--kill-processes",
                                       stdin=AddsAProcessWhileAsking(path, 5, 7778),
                                       monkeypatch=monkeypatch, capsys=capsys)
    assert f"pid {sim.STRAY_PID}" in err and "7778" not in err  # the listing showed only the stray job
    assert code == 1
    assert doc is not None and doc["result"] == "refused"
    assert "7778" in doc["message"]
    left = {p["pid"] for p in sim.gpu_processes(sim.read_state(str(path)), 5)}
    assert left == {sim.STRAY_PID, 7778}  # nothing was ended


def test_a_reset_longer_than_the_collect_timeout_is_reported_as_done(d):
    # the simulated reset takes longer than the snapshot before it may: the reset's own budget
    # (catalog.actions) is what the command waits for, not --collect-timeout
    with sim.locked_state(str(state(d, "node003"))) as st:
        st["node"]["reset_duration_s"] = 12.0
    inject(d, "node003", "ecc-dbe", 6)
    proc, doc = reset(d, "node003", uuid(d, "node003", 6), "--yes", "--collect-timeout", "10")
    assert proc.returncode == 0, proc.stderr
    assert doc["result"] == "reset" and doc["verified"] is True
    assert next(a for a in doc["actions"] if a["action"] == "reset")["elapsed_s"] >= 12.0


def test_a_reset_whose_answer_does_not_come_is_unknown_with_the_command_to_check(d):
    # the answer cannot arrive within --timeout: the command was sent, so "failed" would be a lie
    with sim.locked_state(str(state(d, "node001"))) as st:
        st["node"]["reset_duration_s"] = 10.0
    gpu = uuid(d, "node001", 0)
    proc = fleetops(d, "reset", "node001", gpu, "-i", inventory(d), "--yes", "--timeout", "3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the reset of" in proc.stderr and "outcome is unknown" in proc.stderr
    journal = str(state(d, "node001").with_suffix(".reset.jsonl"))
    assert (f"fleetops: check with: fleetops reset node001 {gpu} -i {inventory(d)} --dry-run; then read the agent's "
            f"journal {journal} on node001\n") in proc.stderr
    lock = Path(str(state(d, "node001")) + ".maintenance.lock")
    deadline = time.monotonic() + 60
    while lock.exists():  # the agent carries on unseen: let it finish before the next test
        assert time.monotonic() < deadline, "the reset on the node never finished"
        time.sleep(0.2)
