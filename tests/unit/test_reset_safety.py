"""The reset's safety rules: only confirmed processes are ended, the NVML changing path in its exact
order (through the backend's replaceable functions), signals during a reset clean up, the lock's
deadline comes from the reset's budget, and the reports say their kind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops import model
from fleetops.agent import lock as node_lock
from fleetops.agent import reset
from fleetops.agent.reset import host
from fleetops.gpu import hostinfo
from fleetops.gpu.nvml import access as nvml_access
from fleetops.sim import gpu as sim

AGENT = [sys.executable, "-m", "fleetops.agent.main"]
REPO = Path(__file__).resolve().parents[2]
BUS = "0000:18:00.0"
UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
CLIENTS = ["nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter"]


def agent_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (sim.STATE_ENV, reset.CLIENTS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env[sim.STATE_ENV] = str(state)
    return env


def run_reset(state: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    proc = subprocess.run(AGENT + ["reset", *args, "--no-syslog"], capture_output=True, text=True, check=False,
                          env=agent_env(state), timeout=60)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def pre(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["preconditions"] if p["name"] == name)


def lock_of(state: Path) -> Path:
    return Path(str(state) + ".maintenance.lock")


def journal_of(state: Path) -> Path:
    return Path(str(state)[: -len(".json")] + ".reset.jsonl")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node011")
    return path


def uuid_of(state: Path, index: int) -> str:
    return str(sim.read_state(str(state))["gpus"][index]["uuid"])


# --- the NVML changing path, through fakes of the functions that touch a node ----------------------


class FakeNode:
    """A real node as the NVML backend sees it: every call the backend makes is recorded in order.
    Processes listed in ``stubborn`` ignore SIGTERM; the others end on it."""

    def __init__(self, pids: list[int], stubborn: tuple[int, ...] = (), appear_under_lock: int | None = None) -> None:
        self.pids = list(pids)
        self.alive = set(pids)
        self.stubborn = set(stubborn)
        self.appear_under_lock = appear_under_lock
        self.calls: list[tuple[Any, ...]] = []
        self.snapshots = 0

    def snapshot(self) -> model.Node:
        self.snapshots += 1
        self.calls.append(("snapshot",))
        if self.appear_under_lock is not None and self.snapshots == 2:
            self.pids.append(self.appear_under_lock)  # a job started after the operator looked
            self.alive.add(self.appear_under_lock)
        procs = [model.GpuProcess(pid=p, name=f"job{p}", used_memory_mib=100) for p in self.pids if p in self.alive]
        gpu = model.Gpu(index=0, uuid=UUID, bus_id=BUS, name="NVIDIA H200", remapped_rows_failure=False,
                        remapped_rows_pending=False, mig_mode_current=False, nvlinks=None,
                        unavailable={"nvlinks": "NotSupported", "fabric_state": "NotSupported"}, processes=procs)
        return model.Node(hostname="h200", backend="nvml", gpus=[gpu], services={})

    def signal(self, pid: int, sig: int) -> None:
        self.calls.append(("signal", pid, signal.Signals(sig).name))
        if pid not in self.alive:
            raise ProcessLookupError(pid)
        if sig == signal.SIGKILL or pid not in self.stubborn:
            self.alive.discard(pid)

    def systemctl(self, verb: str, unit: str, timeout: float = 60.0) -> tuple[int, str]:
        self.calls.append(("systemctl", verb, unit))
        return 0, ""

    def nvidia_smi_reset(self, bus_id: str, timeout: float) -> tuple[int, str]:
        self.calls.append(("nvidia-smi -r -i", bus_id))
        return 0, f"GPU {bus_id} was successfully reset."


@pytest.fixture
def fake_node(monkeypatch: pytest.MonkeyPatch):
    def install(node: FakeNode) -> FakeNode:
        monkeypatch.setattr(nvml_access.NvmlAccess, "snapshot", lambda self, release=False: node.snapshot())
        monkeypatch.setattr(host, "send_signal", node.signal)
        monkeypatch.setattr(host, "process_alive", lambda pid: pid in node.alive)
        monkeypatch.setattr(host, "systemctl", node.systemctl)
        monkeypatch.setattr(nvml_access, "nvidia_smi_reset", node.nvidia_smi_reset)
        monkeypatch.setattr(hostinfo, "service_states", lambda units: ({u: "active" for u in units}, None))
        monkeypatch.setattr(os, "kill", lambda *a: pytest.fail(f"os.kill{a} reached past the fake"))
        return node

    return install


def nvml_run(tmp_path: Path, expect: list[int] | None, grace_s: float = 0.2) -> tuple[dict[str, Any], int]:
    opts = reset.Options(selector=UUID, kill_processes=expect is not None, expect_pids=expect, grace_s=grace_s,
                         clients=list(CLIENTS), lock_path=str(tmp_path / "m.lock"),
                         log_path=str(tmp_path / "reset.jsonl"), use_syslog=False)
    backend = reset.nvml_backend(dry_run=False)
    backend.cross_check = lambda gpu: ("ok", "fake second look-up")  # type: ignore[method-assign]
    return reset.run(opts, backend)


def test_nvml_reset_runs_every_step_in_order_and_signals_only_the_confirmed_pid(tmp_path, fake_node):
    node = fake_node(FakeNode([4242]))
    doc, code = nvml_run(tmp_path, [4242])
    assert code == 0, doc["message"]
    assert doc["result"] == "reset" and doc["verified"] is True
    assert node.calls == [
        ("snapshot",),  # identify
        ("snapshot",),  # again, under the lock: the preconditions are judged on this one
        ("signal", 4242, "SIGTERM"),
        ("snapshot",),  # nothing left on the GPU?
        ("systemctl", "stop", "nvidia-persistenced"),
        ("systemctl", "stop", "nvidia-dcgm"),
        ("systemctl", "stop", "dcgm-exporter"),
        ("nvidia-smi -r -i", BUS),
        ("systemctl", "start", "dcgm-exporter"),
        ("systemctl", "start", "nvidia-dcgm"),
        ("systemctl", "start", "nvidia-persistenced"),
        ("snapshot",),  # verify
    ]
    reset_action = next(a for a in doc["actions"] if a["action"] == "reset")
    assert reset_action["command"] == ["nvidia-smi", "-r", "-i", BUS] and reset_action["exit_status"] == 0
    assert not (tmp_path / "m.lock").exists()
    (line,) = [json.loads(x) for x in (tmp_path / "reset.jsonl").read_text().splitlines()]
    assert line["result"] == "reset" and line["expect_pids"] == [4242]


def test_nvml_reset_escalates_to_sigkill_for_a_confirmed_process_that_ignores_sigterm(tmp_path, fake_node):
    node = fake_node(FakeNode([4242], stubborn=(4242,)))
    doc, code = nvml_run(tmp_path, [4242], grace_s=0.1)
    assert code == 0, doc["message"]
    assert [c for c in node.calls if c[0] == "signal"] == [("signal", 4242, "SIGTERM"), ("signal", 4242, "SIGKILL")]


def test_nvml_reset_refuses_an_unconfirmed_process_and_touches_nothing(tmp_path, fake_node):
    node = fake_node(FakeNode([4242, 5151]))
    doc, code = nvml_run(tmp_path, [4242])
    assert code == 1 and doc["result"] == "refused"
    check = pre(doc, "compute_processes")
    assert check["status"] == "failed" and check["unexpected_pids"] == [5151] and check["missing_pids"] == []
    assert "pid 5151 (job5151)" in check["detail"]
    assert node.calls == [("snapshot",), ("snapshot",)]  # read only: no signal, systemctl or reset
    assert doc["actions"] == []


def test_a_process_that_appears_before_the_lock_snapshot_is_refused(tmp_path, fake_node):
    """The operator confirmed 4242; 6363 starts between that and the lock: judged on the snapshot
    taken under the lock, the reset is refused and nothing is signalled."""
    node = fake_node(FakeNode([4242], appear_under_lock=6363))
    doc, code = nvml_run(tmp_path, [4242])
    assert code == 1 and pre(doc, "compute_processes")["unexpected_pids"] == [6363]
    assert not [c for c in node.calls if c[0] != "snapshot"]


def test_without_kill_processes_a_busy_gpu_is_refused_with_the_pids_to_confirm(tmp_path, fake_node):
    node = fake_node(FakeNode([4242, 4343]))
    doc, code = nvml_run(tmp_path, None)
    assert code == 1 and pre(doc, "compute_processes")["status"] == "failed"
    assert "--kill-processes --expect-pids 4242,4343" in doc["remedy"]
    assert not [c for c in node.calls if c[0] != "snapshot"]


# --- --expect-pids through the real agent on the simulator -------------------------------------------


def test_a_pid_that_appeared_after_the_confirmation_is_refused_by_name(state):
    with sim.locked_state(str(state)) as st:
        sim.add_process(st, 2, 4242, "train.py")  # what the operator was shown
    uuid = uuid_of(state, 2)
    _, dry = run_reset(state, "--gpu", uuid, "--dry-run")
    shown = [p["pid"] for p in pre(dry, "compute_processes")["processes"]]
    assert shown == [4242]
    with sim.locked_state(str(state)) as st:
        sim.add_process(st, 2, 7777, "late-job.py")  # started after the dialog
    before = state.read_bytes()
    proc, doc = run_reset(state, "--gpu", uuid, "--kill-processes", "--expect-pids", ",".join(map(str, shown)))
    assert proc.returncode == 1 and doc["result"] == "refused"
    check = pre(doc, "compute_processes")
    assert check["status"] == "failed" and check["unexpected_pids"] == [7777] and check["missing_pids"] == []
    assert "pid 7777 (late-job.py)" in check["detail"] and "4242" not in check["detail"].split("not confirmed:")[1]
    assert doc["expect_pids"] == [4242] and check["expected_pids"] == [4242]
    assert doc["actions"] == [] and state.read_bytes() == before  # nobody was ended
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["kind"] == "refused" and "7777" in err["error"]


def test_a_confirmed_pid_that_is_gone_is_named_as_missing(state):
    with sim.locked_state(str(state)) as st:
        sim.add_process(st, 1, 4242, "train.py")
    proc, doc = run_reset(state, "--gpu", uuid_of(state, 1), "--kill-processes", "--expect-pids", "4242,9999")
    assert proc.returncode == 1
    check = pre(doc, "compute_processes")
    assert check["missing_pids"] == [9999] and check["unexpected_pids"] == []
    assert "pid 9999" in check["detail"]


def test_confirming_no_process_refuses_a_gpu_that_became_busy(state):
    sim.inject(str(state), "stray-process", 0)
    proc, doc = run_reset(state, "--gpu", uuid_of(state, 0), "--kill-processes", "--expect-pids", "")
    assert proc.returncode == 1 and pre(doc, "compute_processes")["unexpected_pids"] == [sim.STRAY_PID]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--kill-processes"], "only processes the operator confirmed are ended"),
        (["--expect-pids", "4242"], "give both"),
        (["--kill-processes", "--expect-pids", "12,abc"], "'abc' is not a process id"),
    ],
)
def test_kill_processes_without_a_confirmed_list_is_a_usage_error(state, flags, words):
    sim.inject(str(state), "stray-process", 0)
    before = state.read_bytes()
    proc, doc = run_reset(state, "--gpu", uuid_of(state, 0), *flags)
    assert proc.returncode == 2 and doc is None
    err = json.loads(proc.stderr)
    assert err["kind"] == "usage" and words in err["error"]
    assert state.read_bytes() == before and not journal_of(state).exists()


def test_the_old_timeout_flag_still_sets_the_grace_with_a_plain_text_note(state):
    proc, doc = run_reset(state, "--gpu", uuid_of(state, 0), "--dry-run", "--timeout", "3")
    assert proc.returncode == 0, proc.stderr
    assert doc["grace_s"] == 3.0
    (note,) = proc.stderr.strip().splitlines()
    assert "--timeout is deprecated, use --grace" in note
    with pytest.raises(json.JSONDecodeError):
        json.loads(note)
    proc, doc = run_reset(state, "--gpu", uuid_of(state, 0), "--dry-run", "--grace", "4")
    assert proc.stderr == "" and doc["grace_s"] == 4.0


# --- report kinds and budgets -------------------------------------------------------------------------


def test_the_reset_report_says_its_kind_and_its_budget(state):
    _, doc = run_reset(state, "--gpu", uuid_of(state, 0), "--dry-run", "--grace", "2", "--reset-timeout", "30",
                       "--clients", "a,b")
    assert doc["kind"] == "fleetops.reset/v1"
    # processes: 2 s grace + 5 s after SIGKILL; 2 clients stopped and started at 60 s each;
    # reset 30 s and the verify's wait 30 s; 15 s of snapshots
    assert doc["budget_s"] == 2.0 + 5.0 + 2 * 60.0 + 30.0 + 2 * 60.0 + 30.0 + 15.0 == 322.0
    _, other = run_reset(state, "--gpu", uuid_of(state, 0), "--dry-run", "--grace", "20", "--reset-timeout", "30",
                         "--clients", "a,b")
    assert other["budget_s"] == doc["budget_s"] + 18.0  # the grace is part of the worst case


def test_mig_and_set_reports_say_their_kind(state):
    env = agent_env(state)
    mig = subprocess.run(AGENT + ["mig", "reset", "--dry-run"], capture_output=True, text=True, env=env, timeout=60,
                         check=False)
    assert json.loads(mig.stdout)["kind"] == "fleetops.mig/v1"
    setter = subprocess.run(AGENT + ["set", "power", "600", "--dry-run"], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert setter.returncode == 0, setter.stderr
    assert json.loads(setter.stdout)["kind"] == "fleetops.set/v1"


# --- the lock's deadline and heartbeat ------------------------------------------------------------------


def test_heartbeat_records_the_phase_and_moves_the_deadline(tmp_path):
    path = tmp_path / "m.lock"
    with node_lock.acquire(str(path), "gpu reset", UUID, 600.0, now=1000.0, phase="preconditions") as held:
        first = json.loads(path.read_text())
        assert (first["phase"], first["deadline"]) == ("preconditions", 1600.0)
        held.heartbeat("reset", 135.0, now=1200.0)
        again = json.loads(path.read_text())
        assert (again["phase"], again["deadline"], again["heartbeat_at"]) == ("reset", 1335.0, 1200.0)
        assert again["pid"] == os.getpid() and again["started_at"] == 1000.0


def _wait_for_phase(lock: Path, phase: str, child: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and child.poll() is None:
        try:
            record = json.loads(lock.read_text())
        except (OSError, json.JSONDecodeError):
            record = {}
        if record.get("phase") == phase:
            return record
        time.sleep(0.02)
    raise AssertionError(f"the reset never reached phase {phase!r} (exit {child.poll()})")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_reset_restarts_the_clients_frees_the_lock_and_is_journalled(state, sig):
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-dcgm", "active")
        sim.set_reset_duration(st, 4.0)  # the GPU is away while it resets: time to signal it
    child = subprocess.Popen(AGENT + ["reset", "--gpu", uuid_of(state, 0), "--no-syslog", "--grace", "1",
                                      "--reset-timeout", "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_env(state))
    try:
        record = _wait_for_phase(lock_of(state), "reset", child)
        # and the GPU is away: nvidia-smi -r has begun (the phase is written before the last look
        # at the holders, and a loaded machine can take a while between the two)
        polling.until(
            "the simulated reset under way",
            lambda: sim.read_state(str(state))["node"].get(sim.RESETTING_FIELD) == uuid_of(state, 0) or None,
            30,
            0.02,
        )
        # the deadline was moved to the worst case of what is left of the reset
        # (reset 30 s, 3 default clients started at 60 s each, the verify's 30 s, 15 s of snapshots)
        assert record["deadline"] - record["heartbeat_at"] == pytest.approx(30.0 + 3 * 60.0 + 30.0 + 15.0)
        services = sim.read_state(str(state))["node"]["services"]
        assert services["nvidia-persistenced"] == "inactive" and services["nvidia-dcgm"] == "inactive"
        child.send_signal(sig)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + sig
    doc = json.loads(out)
    assert doc["result"] == "interrupted" and doc["interrupted_by"] == signal.Signals(sig).name
    assert json.loads(err.strip().splitlines()[-1])["kind"] == "interrupted"
    steps = [(a["action"], a.get("unit")) for a in doc["actions"]]
    assert steps == [
        ("stop_service", "nvidia-persistenced"),
        ("stop_service", "nvidia-dcgm"),
        ("check_holders", None),  # right before the reset: nobody holds the device files
        ("reset", None),  # nvidia-smi -r is not cut off half-way
        ("start_service", "nvidia-dcgm"),
        ("start_service", "nvidia-persistenced"),
    ]
    assert doc["verified"] is False and doc["verification"] is None  # it stopped before verifying
    services = sim.read_state(str(state))["node"]["services"]
    assert services["nvidia-persistenced"] == "active" and services["nvidia-dcgm"] == "active"
    assert not lock_of(state).exists()
    (line,) = [json.loads(x) for x in journal_of(state).read_text().splitlines()]
    assert line["result"] == "interrupted" and line["interrupted_by"] == signal.Signals(sig).name


def test_a_signal_while_stopping_clients_starts_again_what_was_stopped(state, monkeypatch, tmp_path):
    """In-process, on the simulator: SIGTERM right after the first client stops. The handlers are
    the flow's only while it runs."""
    backend = reset.sim_backend(str(state), dry_run=False)
    real_stop = backend.stop_service

    def stop_then_signal(unit: str) -> tuple[bool, str]:
        done = real_stop(unit)
        os.kill(os.getpid(), signal.SIGTERM)
        return done

    monkeypatch.setattr(backend, "stop_service", stop_then_signal)
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-dcgm", "active")
    before = signal.getsignal(signal.SIGTERM)
    doc, code = reset.run(reset.Options(selector=uuid_of(state, 0), use_syslog=False), backend)
    assert signal.getsignal(signal.SIGTERM) == before
    assert code == 128 + signal.SIGTERM and doc["result"] == "interrupted"
    steps = [(a["action"], a.get("unit")) for a in doc["actions"]]
    assert steps == [("stop_service", "nvidia-persistenced"), ("start_service", "nvidia-persistenced")]
    services = sim.read_state(str(state))["node"]["services"]
    assert services["nvidia-persistenced"] == "active" and services["nvidia-dcgm"] == "active"
    assert not lock_of(state).exists()


def test_mig_reset_holds_the_lock_with_its_own_budget_and_a_phase_per_gpu(state, monkeypatch):
    from fleetops.agent import mig

    with sim.locked_state(str(state)) as st:
        for pos in (0, 1):
            st["gpus"][pos]["mig_mode_current"] = st["gpus"][pos]["mig_mode_pending"] = True
            sim.set_mig_instances(st, pos, ["3g.71gb", "3g.71gb"])
    seen: list[dict[str, Any]] = []
    real = reset.Backend.recreate_mig

    def recreate(self: reset.Backend, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        seen.append(json.loads(lock_of(state).read_text()))
        return real(self, uuid, profiles)

    monkeypatch.setattr(reset.Backend, "recreate_mig", recreate)
    doc, code = mig.run("all", None, False, "sim", str(state), None)
    assert code == 0 and doc["kind"] == "fleetops.mig/v1" and doc["result"] == "recreated"
    uuids = [uuid_of(state, 0), uuid_of(state, 1)]
    assert [r["phase"] for r in seen] == [f"recreate {u}" for u in uuids]
    # what is left: 3 nvidia-smi calls of 120 s per GPU still to recreate, and 15 s of snapshots
    assert [r["deadline"] - r["heartbeat_at"] for r in seen] == pytest.approx(
        [2 * 3 * 120.0 + 15.0, 1 * 3 * 120.0 + 15.0])
    assert not lock_of(state).exists()


# --- the lock handed over by a caller that holds it (mig apply) --------------------------------------


def sim_opts(state: Path, lock: Path, held: node_lock.Lock | None = None, dry_run: bool = False) -> reset.Options:
    return reset.Options(selector=uuid_of(state, 0), dry_run=dry_run, clients=list(CLIENTS), lock_path=str(lock),
                         log_path=str(state) + ".log", use_syslog=False, held_lock=held)


def test_a_reset_under_a_lock_this_process_holds_runs_and_leaves_the_lock_held(state: Path, tmp_path: Path) -> None:
    lock = tmp_path / "m.lock"
    held = node_lock.acquire(str(lock), "mig apply", uuid_of(state, 0), 600)
    try:
        doc, code = reset.run(sim_opts(state, lock, held), reset.sim_backend(str(state), False))
        assert code == 0, doc["message"]
        assert doc["result"] == "reset" and doc["lock"] == str(lock)
        assert pre(doc, "maintenance_lock")["detail"] == f"held by this process (mig apply, {lock})"
        assert not held.released and lock.exists()
        record = json.loads(lock.read_text())
        assert record["pid"] == os.getpid() and record["action"] == "mig apply"
        assert record["phase"] == "verify"  # the flow moved the deadline through its phases
        assert len(sim.read_state(str(state))["resets"]) == 1
    finally:
        held.release()
    assert not lock.exists()


def test_without_the_hand_over_the_flow_refuses_the_lock_its_own_process_holds(state: Path, tmp_path: Path) -> None:
    lock = tmp_path / "m.lock"
    held = node_lock.acquire(str(lock), "mig apply", None, 600)
    try:
        doc, code = reset.run(sim_opts(state, lock), reset.sim_backend(str(state), False))
        assert code == 1 and doc["result"] == "refused"
        assert pre(doc, "maintenance_lock")["status"] == "failed"
        assert pre(doc, "maintenance_lock")["holder"]["pid"] == os.getpid()
        assert not sim.read_state(str(state)).get("resets") and not held.released
    finally:
        held.release()


def test_a_released_lock_handed_in_is_refused_and_nothing_is_done(state: Path, tmp_path: Path) -> None:
    lock = tmp_path / "m.lock"
    held = node_lock.acquire(str(lock), "mig apply", None, 600)
    held.release()
    services = sim.read_state(str(state))["node"]["services"]
    doc, code = reset.run(sim_opts(state, lock, held), reset.sim_backend(str(state), False))
    assert code == 1 and doc["result"] == "refused"
    check = pre(doc, "maintenance_lock")
    assert check["status"] == "failed" and "already released" in check["detail"]
    assert doc["actions"] == [] and not sim.read_state(str(state)).get("resets")
    assert sim.read_state(str(state))["node"]["services"] == services


def test_a_foreign_holder_refuses_the_reset_and_the_remedy_names_where_clients_are_set() -> None:
    """A process the reset does not stop holds the device files: refused, the holder named, and
    the remedy says where a client unit is named (the node's agent: --clients or its environment),
    since the controller's ``fleetops reset`` has no --clients of its own."""
    from fleetops.agent.reset import preconditions
    from fleetops.gpu.holders import Holder

    other = Holder(pid=5150, user="alice", command="python3 train.py", devices=("/dev/nvidia3",))
    check = preconditions.check_holders([other], None, own_pid=1, daemon_pid=None, client_pids={}, end_pids=[])
    assert check.status == "failed"
    assert check.detail == ("1 process(es) that this reset does not stop hold the GPU's device files: "
                            "pid 5150 (alice: python3 train.py) holds /dev/nvidia3")
    assert check.remedy == (
        "stop them (a monitoring tool, a job outside the scheduler, another user's session), or name their "
        "systemd unit as a GPU client the reset stops and starts again (on the node: fleetops-agent reset "
        "--clients UNIT,..., or FLEETOPS_RESET_CLIENTS in the agent's environment), then retry")
