"""fleetops-agent reset and mig reset on the simulator: preconditions, refusals, the reset, the
lock, the audit log, and that a dry run changes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fleetops import checks, model
from fleetops.agent import lock as node_lock
from fleetops.agent import reset
from fleetops.agent.collect import collect
from fleetops.agent.reset import host, journal
from fleetops.sim import gpu as sim

AGENT = [sys.executable, "-m", "fleetops.agent.main"]
REPO = Path(__file__).resolve().parents[2]


def run_agent(args, state=None, env_extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in (sim.STATE_ENV, reset.CLIENTS_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if state:
        env[sim.STATE_ENV] = str(state)
    env.update(env_extra or {})
    return subprocess.run(AGENT + args, capture_output=True, text=True, check=False, env=env, timeout=timeout)


def reset_doc(state, *args, env_extra=None):
    proc = run_agent(["reset", *args, "--no-syslog"], state, env_extra)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc, doc


def pre(doc, name):
    return next(p for p in doc["preconditions"] if p["name"] == name)


def uuid_of(state, index):
    return sim.read_state(str(state))["gpus"][index]["uuid"]


def lock_path(state):
    return Path(str(state) + ".maintenance.lock")


def log_path(state):
    return Path(str(state)[: -len(".json")] + ".reset.jsonl")


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node007")
    return path


# --- refusals ---------------------------------------------------------------------------


def test_busy_gpu_is_refused_and_its_processes_are_named(state):
    sim.inject(str(state), "stray-process", 2)
    before = state.read_bytes()
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 2))
    assert proc.returncode == 1
    assert doc["refused"] is True and doc["result"] == "refused"
    busy = pre(doc, "compute_processes")
    assert busy["status"] == "failed"
    assert busy["processes"] == [{"pid": sim.STRAY_PID, "name": "python3 train.py", "used_memory_mib": 20480}]
    assert f"pid {sim.STRAY_PID} (python3 train.py)" in busy["detail"]
    assert "--kill-processes" in doc["remedy"]
    assert doc["actions"] == []
    assert state.read_bytes() == before
    assert not lock_path(state).exists()
    err = json.loads(proc.stderr.strip())
    assert err["kind"] == "refused" and str(sim.STRAY_PID) in err["error"]


def test_every_precondition_is_reported_in_order_with_a_status(state):
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert [p["name"] for p in doc["preconditions"]] == list(reset.PRECONDITIONS)
    assert {p["status"] for p in doc["preconditions"]} <= {"ok", "failed", "skipped"}
    assert all(p["detail"] for p in doc["preconditions"])
    assert pre(doc, "fabric_manager")["detail"].startswith("NVSwitch system")


def test_xid79_is_refused_with_the_advice_to_reboot(state):
    sim.inject(str(state), "xid:79", 5)
    lost = sim.read_state(str(state))["gpus"][5]
    before = state.read_bytes()
    for selector in (lost["uuid"], lost["bus_id"]):
        proc, doc = reset_doc(state, "--gpu", selector)
        assert proc.returncode == 1
        assert doc["result"] == "refused"
        assert doc["remedy"].startswith("reboot the node")
        assert pre(doc, "on_bus")["status"] == "failed" and "fallen off the bus" in pre(doc, "on_bus")["detail"]
        assert doc["gpu"]["uuid"] == lost["uuid"] and doc["gpu"]["bus_id"] == lost["bus_id"]
    assert state.read_bytes() == before


def test_row_remap_failure_is_refused_drain_and_inspect(state):
    sim.inject(str(state), "row-remap-failure", 1)
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 1))
    assert proc.returncode == 1
    assert pre(doc, "row_remap")["status"] == "failed"
    assert doc["remedy"].startswith("drain and inspect (RMA)")


def test_mig_instances_in_use_are_refused_by_name(state):
    with sim.locked_state(str(state)) as st:
        st["gpus"][4]["mig_mode_current"] = st["gpus"][4]["mig_mode_pending"] = True
        made = sim.set_mig_instances(st, 4, ["3g.71gb", "2g.35gb", "1g.18gb"], in_use=[1])
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 4))
    assert proc.returncode == 1
    mig = pre(doc, "mig_instances")
    assert mig["status"] == "failed"
    assert made[1]["uuid"] in mig["detail"] and "2g.35gb" in mig["detail"]
    assert made[0]["uuid"] not in mig["detail"]
    assert [m["uuid"] for m in mig["in_use"]] == [made[1]["uuid"]]


def test_fabric_manager_down_on_an_nvswitch_system_is_refused(state):
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-fabricmanager", "inactive")
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0))
    assert proc.returncode == 1
    fm = pre(doc, "fabric_manager")
    assert fm["status"] == "failed" and "inactive" in fm["detail"]
    assert "systemctl start nvidia-fabricmanager" in doc["remedy"]


def _node_with_links(remote_type):
    gpus = []
    buses = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"]
    for i, bus in enumerate(buses):
        peers = [b for b in buses if b != bus]
        links = [
            model.NvLink(link=n, state="up", remote_bus_id=peers[n % 2] if remote_type == "gpu" else "0000:05:00.0",
                         remote_type=remote_type)
            for n in range(4)
        ]
        gpus.append(model.Gpu(index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=bus, nvlinks=links))
    return model.Node(hostname="pcie-box", gpus=gpus, services={"nvidia-fabricmanager": "inactive"})


def test_direct_nvlink_peers_are_refused_with_the_peer_set():
    node = _node_with_links("gpu")
    check = reset.check_nvlink_peers(node, node.gpus[0])
    assert check.status == "failed"
    assert check.remedy.startswith("reset the peer set:")
    for gpu in node.gpus:
        assert gpu.uuid in check.remedy
    # no NVSwitch: the fabric manager is not needed
    assert reset.check_fabric_manager(node, node.gpus[0]).status == "skipped"
    switched = _node_with_links("switch")
    assert reset.check_nvlink_peers(switched, switched.gpus[0]).status == "ok"
    assert reset.check_fabric_manager(switched, switched.gpus[0]).status == "failed"


def test_nvlink_not_supported_skips_peer_and_fabric_checks():
    gpu = model.Gpu(index=0, uuid="GPU-1", bus_id="0000:18:00.0", nvlinks=None, fabric_state=None,
                    unavailable={"nvlinks": "NotSupported", "fabric_state": "NotSupported"})
    node = model.Node(hostname="vm", gpus=[gpu])
    assert reset.check_nvlink_peers(node, gpu).status == "skipped"
    assert reset.check_fabric_manager(node, gpu).status == "skipped"


def test_unknown_uuid_is_an_error_before_anything_is_touched(state):
    before = state.read_bytes()
    files = {p.name for p in state.parent.iterdir()}
    bogus = "GPU-00000000-1111-2222-3333-444444444444"
    proc, doc = reset_doc(state, "--gpu", bogus)
    assert proc.returncode == 1
    assert doc["result"] == "error"
    assert pre(doc, "gpu_exists")["status"] == "failed" and bogus in pre(doc, "gpu_exists")["detail"]
    assert all(p["status"] == "skipped" for p in doc["preconditions"][1:])
    assert json.loads(proc.stderr.strip())["kind"] == "no-such-gpu"
    assert state.read_bytes() == before
    assert not lock_path(state).exists()
    assert {p.name for p in state.parent.iterdir()} == files | {"node.reset.jsonl"}  # only the attempt's log line


@pytest.mark.parametrize("selector", ["3", "MIG-1234", "not-a-bus"])
def test_an_index_or_garbage_is_a_usage_error(state, selector):
    before = state.read_bytes()
    proc, _ = reset_doc(state, "--gpu", selector)
    assert proc.returncode == 2 and proc.stdout == ""
    assert json.loads(proc.stderr)["kind"] == "usage"
    assert state.read_bytes() == before


def test_bus_id_other_than_expected_is_refused(state):
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0), "--bus-id", "0000:2a:00.0")
    assert proc.returncode == 1
    assert pre(doc, "uuid_matches_bus_id")["status"] == "failed"
    assert "renumbered" in pre(doc, "uuid_matches_bus_id")["detail"]


# --- the reset -------------------------------------------------------------------------


def test_kill_processes_ends_them_then_resets(state):
    sim.inject(str(state), "stray-process", 2)
    sim.inject(str(state), "ecc-dbe", 2)
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 2), "--kill-processes", "--expect-pids", str(sim.STRAY_PID))
    assert proc.returncode == 0, proc.stderr
    assert doc["result"] == "reset" and doc["verified"] is True
    assert doc["expect_pids"] == [sim.STRAY_PID] and pre(doc, "compute_processes")["expected_pids"] == [sim.STRAY_PID]
    ended = next(a for a in doc["actions"] if a["action"] == "end_processes")
    assert ended["processes"][0]["pid"] == sim.STRAY_PID and ended["processes"][0]["ended"] is True
    assert ended["processes"][0]["signals"] == ["SIGTERM"]
    names = [a["action"] for a in doc["actions"]]
    assert names == ["end_processes", "stop_service", "check_holders", "reset", "start_service"]
    st = sim.read_state(str(state))
    assert [f["name"] for f in st["faults"]] == []
    gpu = collect("sim", str(state)).gpu_by_uuid(uuid_of(state, 2))
    assert gpu.processes == [] and gpu.ecc_uncorrected_volatile == 0
    assert gpu.ecc_uncorrected_aggregate == 2  # lifetime counters keep what happened


def test_kill_processes_escalates_to_sigkill_for_a_process_that_ignores_sigterm(state):
    code = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(120)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with sim.locked_state(str(state)) as st:
            sim.add_process(st, 3, child.pid, "stubborn-trainer", real=True)
        proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--kill-processes", "--expect-pids", str(child.pid),
                              "--grace", "0.5")
        assert proc.returncode == 0, proc.stderr
        report = next(a for a in doc["actions"] if a["action"] == "end_processes")["processes"]
        assert report == [{"pid": child.pid, "name": "stubborn-trainer", "signals": ["SIGTERM", "SIGKILL"], "ended": True}]
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_gpu_clients_are_stopped_before_and_started_after(state):
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-dcgm", "active")
        sim.set_service(st, "dcgm-exporter", "inactive")
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0))
    assert proc.returncode == 0, proc.stderr
    steps = [(a["action"], a.get("unit")) for a in doc["actions"]]
    assert steps == [
        ("stop_service", "nvidia-persistenced"),
        ("stop_service", "nvidia-dcgm"),
        ("check_holders", None),  # right before the reset: nobody holds the device files
        ("reset", None),
        ("start_service", "nvidia-dcgm"),
        ("start_service", "nvidia-persistenced"),
    ]
    services = sim.read_state(str(state))["node"]["services"]
    assert services["nvidia-dcgm"] == "active" and services["dcgm-exporter"] == "inactive"
    # the list is configurable: flag, then environment
    _, doc = reset_doc(state, "--gpu", uuid_of(state, 0), "--clients", "")
    assert [a["action"] for a in doc["actions"]] == ["check_holders", "reset"]
    _, doc = reset_doc(state, "--gpu", uuid_of(state, 0), env_extra={reset.CLIENTS_ENV: "nvidia-dcgm"})
    assert [a.get("unit") for a in doc["actions"] if a["action"] == "stop_service"] == ["nvidia-dcgm"]


@pytest.mark.parametrize("fault", ["ecc-dbe", "ecc-sbe-storm", "row-remap-pending", "xid:119", "xid:48", "nvlink-crc-storm"])
def test_after_a_reset_the_gpu_has_no_finding(state, fault):
    sim.inject(str(state), fault, 6)
    uuid = uuid_of(state, 6)
    node = collect("sim", str(state))
    assert [f for f in checks.run_node_checks(node) if (f.gpu or {}).get("uuid") == uuid], fault
    proc, doc = reset_doc(state, "--gpu", uuid)
    assert proc.returncode == 0, proc.stderr
    assert doc["verified"] is True and doc["verification"]["same_uuid"] and doc["verification"]["same_bus_id"]
    node = collect("sim", str(state))
    assert [f for f in checks.run_node_checks(node) if (f.gpu or {}).get("uuid") == uuid] == []


def test_a_pending_row_remap_is_applied_by_the_reset(state):
    sim.inject(str(state), "row-remap-pending", 0)
    reset_doc(state, "--gpu", uuid_of(state, 0))
    gpu = collect("sim", str(state)).gpus[0]
    assert gpu.remapped_rows_pending is False and gpu.remapped_rows_uncorrected == 1


def test_a_condition_that_persists_fails_verification_with_its_action(state):
    sim.inject(str(state), "nvlink-down", 1)
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 1))
    assert proc.returncode == 1
    assert doc["result"] == "failed" and doc["verified"] is False
    assert any(f["check"] == "nvlink.links_down" for f in doc["verification"]["findings"])
    assert "inspect" in doc["remedy"]
    # the clients were started again all the same
    assert doc["actions"][-1]["action"] == "start_service"


def test_thermal_slowdown_stays_after_a_reset(state):
    sim.inject(str(state), "thermal-slowdown", 2)
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 2))
    reset_action = next(a for a in doc["actions"] if a["action"] == "reset")
    assert reset_action["kept"] == ["thermal-slowdown"]
    assert [f["name"] for f in sim.read_state(str(state))["faults"]] == ["thermal-slowdown"]
    # the reset ran and restored the clocks, but the GPU is still too hot: not verified, and the
    # remedy is the thermal check's (cooling), not another reset
    assert reset_action["ok"] is True
    assert proc.returncode == 1 and doc["result"] == "failed" and doc["verified"] is False
    assert "cooling" in doc["remedy"]


def test_every_real_attempt_goes_to_the_audit_log_and_a_dry_run_does_not(state):
    sim.inject(str(state), "stray-process", 0)
    reset_doc(state, "--gpu", uuid_of(state, 0))
    reset_doc(state, "--gpu", uuid_of(state, 0), "--dry-run")
    reset_doc(state, "--gpu", uuid_of(state, 0), "--kill-processes", "--expect-pids", str(sim.STRAY_PID))
    lines = [json.loads(x) for x in log_path(state).read_text().splitlines()]
    assert [x["result"] for x in lines] == ["refused", "reset"]
    assert lines[0]["gpu"]["uuid"] == uuid_of(state, 0) and lines[0]["dry_run"] is False
    assert lines[1]["actions"][0]["action"] == "end_processes" and lines[1]["expect_pids"] == [sim.STRAY_PID]
    other = state.parent / "audit.jsonl"
    _, doc = reset_doc(state, "--gpu", uuid_of(state, 0), "--log", str(other))
    assert doc["log"]["file"] == str(other) and len(other.read_text().splitlines()) == 1


def test_syslog_gets_one_line_per_attempt(state, monkeypatch):
    sent = []
    monkeypatch.setattr(journal, "send_syslog", lambda message, failed: sent.append((message, failed)) or "sent")
    backend = reset.sim_backend(str(state), dry_run=False)
    doc, code = reset.run(reset.Options(selector=uuid_of(state, 0)), backend)
    assert code == 0 and doc["log"]["syslog"] == "sent"
    assert sent == [(f"gpu reset reset: {uuid_of(state, 0)} (0000:18:00.0) on node007", False)]


# --- dry run ---------------------------------------------------------------------------


def test_dry_run_changes_nothing(state):
    for fault, gpu in (("stray-process", 3), ("ecc-dbe", 3), ("xid:79", 5)):
        sim.inject(str(state), fault, gpu)
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-dcgm", "active")
    before = state.read_bytes()
    files = sorted(p.name for p in state.parent.iterdir())
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--dry-run", "--kill-processes", "--expect-pids",
                          str(sim.STRAY_PID))
    assert proc.returncode == 0, proc.stderr
    assert doc["dry_run"] is True and doc["result"] == "would-reset" and doc["actions"] == []
    assert pre(doc, "compute_processes")["status"] == "ok" and str(sim.STRAY_PID) in pre(doc, "compute_processes")["detail"]
    assert pre(doc, "gpu_clients")["stop"] == ["nvidia-persistenced", "nvidia-dcgm"]
    assert state.read_bytes() == before
    assert sorted(p.name for p in state.parent.iterdir()) == files  # no lock, no log
    # a refused dry run: exit 1, still nothing changed
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 3), "--dry-run")
    assert proc.returncode == 1 and doc["refused"] is True
    assert state.read_bytes() == before


class _Forbidden(AssertionError):
    pass


def _forbid(name):
    def call(*args, **kwargs):
        raise _Forbidden(f"dry run called {name}{args}")

    return call


def test_dry_run_never_reaches_reset_systemctl_signals_or_the_lock(monkeypatch, tmp_path):
    """The NVML backend on a fake node with a busy GPU and running clients: a dry run reads,
    and calls none of the functions that change a node."""
    gpu = model.Gpu(index=0, uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", bus_id="0000:18:00.0", name="NVIDIA H200",
                    remapped_rows_failure=False, remapped_rows_pending=False, mig_mode_current=False,
                    nvlinks=None, unavailable={"nvlinks": "NotSupported"},
                    processes=[model.GpuProcess(pid=4242, name="python3", used_memory_mib=100)])
    node = model.Node(hostname="h200", backend="nvml", gpus=[gpu], services={})
    monkeypatch.setattr(reset.Backend, "snapshot", lambda self: node)
    monkeypatch.setattr(reset.Backend, "cross_check", lambda self, g: ("ok", "fake"))
    from fleetops.gpu import hostinfo

    monkeypatch.setattr(hostinfo, "service_states", lambda units: ({u: "active" for u in units}, None))
    from fleetops.gpu.nvml import access as nvml_access

    for name in ("systemctl", "send_signal"):
        monkeypatch.setattr(host, name, _forbid(name))
    for name in ("nvidia_smi_reset", "nvidia_smi_mig"):  # the NVML access runs them
        monkeypatch.setattr(nvml_access, name, _forbid(name))
    monkeypatch.setattr(journal, "send_syslog", _forbid("send_syslog"))
    monkeypatch.setattr(os, "kill", _forbid("os.kill"))
    monkeypatch.setattr(subprocess, "run", _forbid("subprocess.run"))
    monkeypatch.setattr(node_lock, "acquire", _forbid("lock.acquire"))
    lock_file = tmp_path / "maintenance.lock"
    opts = reset.Options(selector=gpu.uuid, dry_run=True, kill_processes=True, expect_pids=[4242],
                         lock_path=str(lock_file), log_path=str(tmp_path / "reset.jsonl"))
    doc, code = reset.run(opts, reset.nvml_backend(dry_run=True))
    assert code == 0 and doc["result"] == "would-reset"
    assert pre(doc, "gpu_clients")["stop"] == list(reset.DEFAULT_CLIENTS)
    assert "log" not in doc and not lock_file.exists() and not (tmp_path / "reset.jsonl").exists()


def test_a_backend_built_for_a_dry_run_refuses_every_change(state):
    backend = reset.sim_backend(str(state), dry_run=True)
    gpu = collect("sim", str(state)).gpus[0]
    before = state.read_bytes()
    for call in (
        lambda: backend.reset(gpu, 1.0),
        lambda: backend.stop_service("nvidia-persistenced"),
        lambda: backend.start_service("nvidia-persistenced"),
        lambda: backend.end_processes(gpu, [{"pid": 1}], 0.1),
        lambda: reset.nvml_backend(dry_run=True).reset(gpu, 1.0),
        lambda: reset.nvml_backend(dry_run=True).stop_service("nvidia-dcgm"),
    ):
        with pytest.raises(reset.DryRunViolation):
            call()
    assert state.read_bytes() == before


def test_the_reset_path_imports_nothing_heavy(state):
    code = textwrap.dedent(
        f"""
        import sys, io, contextlib
        from fleetops.agent import main
        with contextlib.redirect_stdout(io.StringIO()):
            main.main(["reset", "--gpu", "{uuid_of(state, 0)}", "--dry-run"])
        heavy = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'ansible', 'paramiko', 'yaml')]
        print(heavy)
        """
    )
    env = dict(os.environ, **{sim.STATE_ENV: str(state)})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --- the lock ---------------------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from fleetops.agent import lock
    held = lock.acquire(sys.argv[1], "test holder", None, float(sys.argv[2]))
    print("held", flush=True)
    time.sleep(120)
    """
)


def _holder(path, deadline_s=300.0):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(deadline_s)], stdout=subprocess.PIPE,
                             text=True, env=env)
    assert child.stdout.readline().strip() == "held"
    return child


def test_two_concurrent_resets_on_one_node_the_second_is_refused_by_the_lock(state):
    with sim.locked_state(str(state)) as st:
        st["node"]["reset_duration_s"] = 3.0  # the GPU is away while it resets
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    env.update({sim.STATE_ENV: str(state), "PYTHONPATH": str(REPO)})
    first = subprocess.Popen(AGENT + ["reset", "--gpu", uuid_of(state, 0), "--no-syslog"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 20
        while not (lock_path(state).exists() and lock_path(state).read_text().strip()):
            assert time.monotonic() < deadline and first.poll() is None, "first reset never took the lock"
            time.sleep(0.02)
        proc, doc = reset_doc(state, "--gpu", uuid_of(state, 1))
        assert proc.returncode == 1
        held = pre(doc, "maintenance_lock")
        assert held["status"] == "failed" and f"pid {first.pid}" in held["detail"]
        assert held["holder"]["gpu"] == uuid_of(state, 0)
        out, _ = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert json.loads(out)["result"] == "reset"
    assert not lock_path(state).exists()


def test_a_stale_lock_from_a_killed_run_is_recovered(state):
    holder = _holder(lock_path(state))
    holder.kill()
    holder.wait()
    assert json.loads(lock_path(state).read_text())["pid"] == holder.pid  # left behind
    _dry_proc, dry = reset_doc(state, "--gpu", uuid_of(state, 0), "--dry-run")
    assert pre(dry, "maintenance_lock")["status"] == "ok" and "stale" in pre(dry, "maintenance_lock")["detail"]
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0))
    assert proc.returncode == 0, proc.stderr
    took = pre(doc, "maintenance_lock")
    assert took["status"] == "ok" and f"process {holder.pid} is gone" in took["detail"]
    assert took["recovered"]["pid"] == holder.pid
    assert not lock_path(state).exists()


def test_a_crashed_reset_leaves_clients_stopped_and_the_next_one_starts_them(state):
    with sim.locked_state(str(state)) as st:
        sim.set_service(st, "nvidia-persistenced", "inactive")  # as the crashed run left it
    with open(lock_path(state), "w") as fh:
        json.dump({"pid": 2**22 + 7, "started_at": time.time() - 60, "deadline": time.time() + 240,
                   "action": "gpu reset", "gpu": uuid_of(state, 1), "stopped": ["nvidia-persistenced"]}, fh)
    proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0))
    assert proc.returncode == 0, proc.stderr
    assert "left stopped by a crashed run" in pre(doc, "gpu_clients")["detail"]
    assert ("start_service", "nvidia-persistenced") in [(a["action"], a.get("unit")) for a in doc["actions"]]
    assert sim.read_state(str(state))["node"]["services"]["nvidia-persistenced"] == "active"


def test_lock_held_by_a_live_process_is_refused_then_free_after_release(tmp_path):
    path = tmp_path / "m.lock"
    holder = _holder(path)
    try:
        with pytest.raises(node_lock.LockHeld) as info:
            node_lock.acquire(str(path), "second")
        assert info.value.holder["pid"] == holder.pid
        assert node_lock.peek(str(path)).state == "held"
    finally:
        holder.kill()
        holder.wait()
    with node_lock.acquire(str(path), "third") as held:
        assert held.recovered["pid"] == holder.pid
        assert json.loads(path.read_text())["action"] == "third"
    assert not path.exists()
    assert node_lock.peek(str(path)).state == "free"


def test_a_live_holder_past_its_deadline_is_never_taken_over(tmp_path):
    path = tmp_path / "m.lock"
    holder = _holder(path, deadline_s=0.2)
    try:
        while json.loads(path.read_text())["deadline"] >= time.time():
            time.sleep(0.05)
        status = node_lock.peek(str(path))
        assert status.state == "held"
        assert f"held by live pid {holder.pid} past its deadline" in status.detail()
        with pytest.raises(node_lock.LockHeld) as info:
            node_lock.acquire(str(path), "rescue")
        assert info.value.holder["pid"] == holder.pid
        assert "past its deadline" in str(info.value)
        assert json.loads(path.read_text())["pid"] == holder.pid  # the record is untouched
    finally:
        holder.kill()
        holder.wait()
    # once it is dead, its lock is stale and taken over
    with node_lock.acquire(str(path), "rescue") as held:
        assert held.recovered["pid"] == holder.pid and "is gone" in held.recovered["stale_because"]


def test_a_reset_refuses_a_node_whose_live_holder_is_past_its_deadline(state):
    holder = _holder(lock_path(state), deadline_s=0.0)
    try:
        before = state.read_bytes()
        proc, doc = reset_doc(state, "--gpu", uuid_of(state, 0))
        assert proc.returncode == 1 and doc["result"] == "refused"
        held = pre(doc, "maintenance_lock")
        assert held["status"] == "failed" and f"held by live pid {holder.pid} past its deadline" in held["detail"]
        assert doc["actions"] == [] and state.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_lock_record_of_a_reused_pid_is_stale(tmp_path):
    path = tmp_path / "m.lock"
    # the parent process is alive, but it is not the process that wrote the record
    path.write_text(json.dumps({"pid": os.getppid(), "pid_start": 1, "deadline": time.time() + 100}))
    assert node_lock.peek(str(path)).state == "stale"
    with node_lock.acquire(str(path), "mine") as held:
        assert held.recovered["pid"] == os.getppid() and "is gone" in held.recovered["stale_because"]


def test_peek_creates_nothing(tmp_path):
    path = tmp_path / "sub" / "m.lock"
    assert node_lock.peek(str(path)).state == "free"
    assert not (tmp_path / "sub").exists()


# --- the simulator's reset model ------------------------------------------------------------


def test_sim_reset_cannot_reach_a_lost_gpu_or_a_busy_one(state):
    sim.inject(str(state), "gpu-missing", 7)
    sim.inject(str(state), "stray-process", 1)
    st = sim.read_state(str(state))
    with pytest.raises(sim.SimError, match="reboot the node"):
        sim.reset_gpu(st, 7)
    with pytest.raises(sim.SimError, match=f"in use by pid {sim.STRAY_PID}"):
        sim.reset_gpu(st, 1)


def test_sim_reset_clears_volatile_faults_keeps_physical_ones_and_restores_clocks(state):
    for fault in ("ecc-dbe", "xid:94", "pcie-downgrade", "power-brake", "row-remap-failure", "power-cap-drift"):
        sim.inject(str(state), fault, 2)
    with sim.locked_state(str(state)) as st:
        st["gpus"][2]["clock_sm_mhz"] = 600
        done = sim.reset_gpu(st, 2)
    assert sorted(done["cleared"]) == ["ecc-dbe", "xid:94"]
    assert sorted(done["kept"]) == ["pcie-downgrade", "power-brake", "power-cap-drift", "row-remap-failure"]
    assert sorted(done["xids_cleared"]) == [48, 94]
    st = sim.read_state(str(state))
    assert st["gpus"][2]["clock_sm_mhz"] == sim.DEFAULT_GPU["clock_sm_mhz"]
    assert [e["code"] for e in st["kernel_log"]] == [64]  # the failure's XID stays with the failure


# --- MIG ---------------------------------------------------------------------------------


def _mig_state(state, in_use=None):
    with sim.locked_state(str(state)) as st:
        st["gpus"][0]["mig_mode_current"] = st["gpus"][0]["mig_mode_pending"] = True
        return sim.set_mig_instances(st, 0, ["3g.71gb", "3g.71gb"], in_use=in_use)


def test_mig_reset_recreates_the_configured_instances(state):
    made = _mig_state(state)
    proc = run_agent(["mig", "reset"], state)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["result"] == "recreated"
    (entry,) = doc["gpus"]
    assert [m["profile"] for m in entry["after"]] == ["3g.71gb", "3g.71gb"]
    assert {m["uuid"] for m in entry["after"]}.isdisjoint({m["uuid"] for m in made})
    gpu = collect("sim", str(state)).gpus[0]
    assert [m.uuid for m in gpu.mig_instances] == [m["uuid"] for m in entry["after"]]
    assert not lock_path(state).exists()


def test_mig_reset_is_refused_while_an_instance_is_in_use(state):
    made = _mig_state(state, in_use=[0])
    before = state.read_bytes()
    proc = run_agent(["mig", "reset", "--gpu", uuid_of(state, 0)], state)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["refused"] is True and made[0]["uuid"] in doc["message"]
    assert state.read_bytes() == before


def test_mig_reset_dry_run_and_profiles(state):
    _mig_state(state)
    before = state.read_bytes()
    proc = run_agent(["mig", "reset", "--dry-run", "--profiles", "1g.18gb,1g.18gb"], state)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["gpus"][0]["status"] == "would-recreate"
    assert state.read_bytes() == before
    proc = run_agent(["mig", "reset", "--profiles", "1g.18gb,1g.18gb,2g.35gb"], state)
    assert proc.returncode == 0, proc.stderr
    assert [m.profile for m in collect("sim", str(state)).gpus[0].mig_instances] == ["1g.18gb", "1g.18gb", "2g.35gb"]


class _FakeNvml:
    """Just what nvml_backend's cross_check calls, over a table of (uuid, bus id)."""

    class NVMLError(Exception):
        pass

    def __init__(self, table):
        self.table = table
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(i for i, (u, _) in enumerate(self.table) if u == uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        assert bus.startswith("00000000:")  # NVML's 8-digit domain
        return next(i for i, (_, b) in enumerate(self.table) if b == bus)

    def nvmlDeviceGetPciInfo(self, handle):
        return type("Pci", (), {"busId": self.table[handle][1].encode()})()

    def nvmlDeviceGetUUID(self, handle):
        return self.table[handle][0]


def test_nvml_cross_check_looks_up_by_uuid_and_by_bus_id(monkeypatch):
    gpu = model.Gpu(index=0, uuid="GPU-a", bus_id="0000:18:00.0")
    fake = _FakeNvml([("GPU-a", "00000000:18:00.0"), ("GPU-b", "00000000:2A:00.0")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    status, detail = reset.nvml_backend(dry_run=True).cross_check(gpu)
    assert status == "ok" and "NVML by UUID -> 0000:18:00.0, by bus id -> GPU-a" in detail
    assert fake.calls == ["init", "shutdown"]
    swapped = _FakeNvml([("GPU-a", "00000000:2a:00.0"), ("GPU-b", "00000000:18:00.0")])
    monkeypatch.setitem(sys.modules, "pynvml", swapped)
    status, detail = reset.nvml_backend(dry_run=True).cross_check(gpu)
    assert status == "failed" and "disagree" in detail
