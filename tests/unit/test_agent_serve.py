"""``fleetops-agent serve`` as a real process on the simulator: XIDs across kill -9, a lost GPU,
a hung backend call, ``collect`` from the daemon and ``watch``. Polls with generous deadlines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops import model
from fleetops.agent.collect import collect
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
DEADLINE_S = 60.0


def _sock(state: Path) -> str:
    return str(state.with_suffix("")) + ".agent/agent.sock"


def _request(sock: str, request: str) -> dict[str, Any] | None:
    """One request line to a daemon socket; its JSON answer, or None when nothing answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    try:
        s.connect(sock)
        s.sendall(request.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        s.close()
    doc: dict[str, Any] = json.loads(data)
    return doc


def _ask(state: Path, request: str) -> dict[str, Any] | None:
    return _request(_sock(state), request)


def _until(what: str, fn: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Daemon:
    def __init__(self, states: list[Path], env: dict[str, str] | None = None) -> None:
        self.states = states
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5",
               "--hang-timeout", "1", "--states", *map(str, self.states)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for state in self.states:
            _until("the daemon's first snapshot", lambda st=state: (_ask(st, "snapshot") or {}).get("daemon"))

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=30)
        return self.proc.returncode


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    return state


@pytest.fixture()
def daemon(node: Path) -> Iterator[Daemon]:
    d = Daemon([node])
    d.start()
    yield d
    d.stop()


def _xid(state: Path, code: int, gpu: int) -> None:
    """One more XID line: clear the fault first so a repeat writes a new kernel-log record."""
    sim.clear(str(state), f"xid:{code}", gpu)
    assert sim.inject(str(state), f"xid:{code}", gpu)


def _events(state: Path) -> list[tuple[int, int, str]]:
    doc = _ask(state, "snapshot") or {}
    return [(e["seq"], e["code"], e["bus_id"]) for e in doc.get("daemon", {}).get("xid_events", [])]


def test_kill9_between_xids_loses_and_repeats_none(node: Path) -> None:
    d = Daemon([node])
    d.start()
    bus = [g["bus_id"] for g in sim.read_state(str(node))["gpus"]]
    _xid(node, 31, 0)
    _xid(node, 31, 0)  # a repeat: counted again
    _xid(node, 13, 1)
    _until("3 XIDs", lambda: len(_events(node)) == 3)
    d.kill9()
    _xid(node, 31, 0)
    _xid(node, 43, 2)
    d.start()
    try:
        got = _until("5 XIDs after the restart", lambda: (lambda e: e if len(e) >= 5 else None)(_events(node)))
        time.sleep(1.0)  # a repeat would arrive within the follower's next polls
        got = _events(node)
        assert got == [(0, 31, bus[0]), (1, 31, bus[0]), (2, 13, bus[1]), (3, 31, bus[0]), (4, 43, bus[2])]
        counts = (_ask(node, "snapshot") or {})["daemon"]["xid_counts"]
        assert counts == {f"{bus[0]}/31": 3, f"{bus[1]}/13": 1, f"{bus[2]}/43": 1}
    finally:
        assert d.stop() == 0
    assert not os.path.exists(_sock(node))


def test_lost_gpu_is_marked_lost_and_the_rest_still_sampled(node: Path, daemon: Daemon) -> None:
    gpus = sim.read_state(str(node))["gpus"]
    sim.inject(str(node), "gpu-missing", 3)
    doc = _until("GPU 3 lost", lambda: (lambda d: d if gpus[3]["uuid"] in d["daemon"]["lost"] else None)(
        _ask(node, "snapshot")))
    # as NVML: the lost GPU stays at its index with its UUID and bus id, answering GpuIsLost, and
    # no other GPU moves (a cold collect lists the same)
    assert [(g["index"], g["uuid"], g["bus_id"]) for g in doc["gpus"]] == [
        (g["index"], g["uuid"], g["bus_id"]) for g in gpus]
    assert doc["gpu_count"] == len(gpus) and doc["daemon"]["lost"][gpus[3]["uuid"]] == "GpuIsLost"
    assert doc["gpus"][3]["unavailable"]["temp_gpu_c"] == "GpuIsLost" and doc["gpus"][3]["temp_gpu_c"] is None
    cold = model.to_dict(collect("sim", str(node)))
    assert [(g["index"], g["uuid"], g["unavailable"].get("name")) for g in cold["gpus"]] == [
        (g["index"], g["uuid"], g["unavailable"].get("name")) for g in doc["gpus"]]
    assert model.gpu_tally(model.node_from_dict({k: v for k, v in doc.items() if k not in ("daemon", "mig")}),
                           [model.Finding.from_dict(f) for f in doc["daemon"]["findings"]]) == (7, 8)
    # the others keep being sampled: GPU 0's history grows
    first = (_ask(node, f"history {gpus[0]['uuid']} temp_gpu_c 3600") or {})["samples"]
    _until("newer samples of GPU 0", lambda: len((_ask(node, f"history {gpus[0]['uuid']} temp_gpu_c 3600") or {})
                                                   ["samples"]) > len(first))


def test_history_rejects_unknown_field_naming_it(node: Path, daemon: Daemon) -> None:
    uuid = sim.read_state(str(node))["gpus"][0]["uuid"]
    doc = _ask(node, f"history {uuid} no_such_field 60") or {}
    assert doc["kind"] == "usage" and "no_such_field" in doc["error"]


HANGING = textwrap.dedent('''
    import os, time
    from fleetops.sim.access import SimAccess

    class Hanging(SimAccess):
        def light(self):
            while os.path.exists(self.state_path + ".hang"):
                time.sleep(0.05)
            return super().light()
''')


def test_hung_backend_call_reports_degraded_and_xids_keep_flowing(node: Path, tmp_path: Path) -> None:
    (tmp_path / "hangmod.py").write_text(HANGING)
    env = {"FLEETOPS_AGENT_SERVE_BACKEND": "hangmod:Hanging",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    d = Daemon([node], env)
    d.start()
    try:
        Path(str(node) + ".hang").write_text("")
        doc = _until("degraded", lambda: (lambda x: x if x["daemon"]["degraded"] else None)(_ask(node, "snapshot")))
        assert doc["daemon"]["reason"].startswith("hung:") and "'sample'" in doc["daemon"]["reason"]
        _xid(node, 79, 0)
        _until("XID 79 while hung", lambda: [e for e in _events(node) if e[1] == 79])
        Path(str(node) + ".hang").unlink()
        _until("recovered", lambda: not (_ask(node, "snapshot") or {"daemon": {"degraded": True}})["daemon"]["degraded"])
    finally:
        d.stop()


def test_collect_answers_from_daemon_with_age_and_fresh_bypasses(node: Path, daemon: Daemon) -> None:
    env = {**os.environ, "FLEETOPS_SIM_STATE": str(node)}
    served = json.loads(subprocess.run([AGENT, "collect"], env=env, capture_output=True, check=True).stdout)
    assert isinstance(served["daemon"]["age_s"], float) and served["daemon"]["interval_s"] == 0.2
    cold = json.loads(subprocess.run([AGENT, "collect", "--fresh"], env=env, capture_output=True, check=True).stdout)
    assert "daemon" not in cold and cold["hostname"] == served["hostname"] == "n1"
    stale = subprocess.run([AGENT, "collect", "--max-age", "0"], env=env, capture_output=True, check=True).stdout
    assert "daemon" not in json.loads(stale)
    # the full parser's path (--max-age=N form, --pretty) answers from the daemon too
    pretty = subprocess.run([AGENT, "collect", "--pretty", "--max-age=60"], env=env, capture_output=True, check=True)
    assert pretty.stdout.startswith(b"{\n") and json.loads(pretty.stdout)["daemon"]["interval_s"] == 0.2


def test_collect_without_daemon_is_cold(node: Path) -> None:
    env = {**os.environ, "FLEETOPS_SIM_STATE": str(node)}
    doc = json.loads(subprocess.run([AGENT, "collect"], env=env, capture_output=True, check=True).stdout)
    assert "daemon" not in doc and len(doc["gpus"]) == 8


def test_watch_streams_snapshot_then_changes_until_stdin_closes(node: Path, daemon: Daemon) -> None:
    env = {**os.environ, "FLEETOPS_SIM_STATE": str(node)}
    proc = subprocess.Popen([AGENT, "watch"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    first = json.loads(proc.stdout.readline())
    assert first["schema"] == "fleetops.snapshot/v1" and len(first["gpus"]) == 8 and "daemon" in first
    _xid(node, 31, 0)
    while True:  # change lines until one carries the new XID
        change = json.loads(proc.stdout.readline())
        assert set(change) == {"change", "at"}
        if change["change"].get("daemon", {}).get("xid_counts"):
            break
    assert list(change["change"]["daemon"]["xid_counts"].values()) == [1]
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def _nvml_daemon(tmp_path: Path, mode: str = "ok", full_interval_s: float = 0.5,
                 mig: dict[str, Any] | None = None) -> tuple[Daemon, Path, Path, Path]:
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"mode": mode, "temp": 40, **({"mig": mig} if mig else {})}))
    kmsg_file = tmp_path / "kmsg"
    kmsg_file.write_text("")
    sock = tmp_path / "run" / "agent.sock"
    env = {
        "FLEETOPS_AGENT_NVML_MODULE": "fake_nvml",
        "FAKE_NVML_CONTROL": str(control),
        "FLEETOPS_AGENT_STATE_DIR": str(tmp_path / "lib"),
        "FLEETOPS_JOBS_DIR": str(tmp_path / "jobs"),  # the node's job records: none, not this machine's
        "FLEETOPS_AGENT_KMSG": str(kmsg_file),
        "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("FLEETOPS_SIM_STATE", None)
    d = Daemon([], env)
    d.env.pop("FLEETOPS_SIM_STATE", None)
    cmd = [AGENT, "serve", "--backend", "nvml", "--socket", str(sock), "--interval", "0.2",
           "--full-interval", str(full_interval_s), "--hang-timeout", "1"]
    d.proc = subprocess.Popen(cmd, env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return d, control, kmsg_file, sock


def _ask_path(sock: Path) -> dict[str, Any] | None:
    doc = _request(str(sock), "snapshot")
    return doc if doc is not None and "daemon" in doc else None


def _temps(doc: dict[str, Any] | None) -> list[Any]:
    return [g.get("temp_gpu_c") for g in (doc or {}).get("gpus", [])]


def test_nvml_driver_reload_needs_the_quiesce_and_reinitialises_after_it(tmp_path: Path) -> None:
    import fake_nvml

    from fleetops.agent.serve import client

    d, control, _, sock = _nvml_daemon(tmp_path)
    try:
        _until("GPUs at 40 C", lambda: _temps(_ask_path(sock)) == [40, 40])
        assert (_ask_path(sock) or {}).get("driver_branch") == "r580_00"  # read with the full snapshot
        assert d.proc is not None
        # the daemon holds NVML: the driver cannot be unloaded under it, and the refusal names it
        with pytest.raises(fake_nvml.InUse, match=f"pid {d.proc.pid} "):
            fake_nvml.unload(str(control))
        with client.Quiesce(str(sock), 60, "driver reload test") as pause:
            assert pause.answer is not None and pause.answer["pid"] == d.proc.pid
            assert fake_nvml.holders(str(control)) == []  # NVML shut down: no device file held
            doc = _ask_path(sock) or {}
            assert doc["daemon"]["quiesced"]["by"] == "driver reload test"
            fake_nvml.unload(str(control))
        # taken back while the driver is still out: nvmlInit fails and says so
        doc = _until("degraded while unloaded", lambda: (lambda x: x if x and x["daemon"]["degraded"] else None)(
            _ask_path(sock)))
        assert doc["daemon"]["reason"] == "sample failed: RuntimeError: nvmlInit: DriverNotLoaded"
        assert doc["daemon"]["quiesced"] is None and pause.resumed == {"resumed": True,
                                                                        "why": "resumed by driver reload test"}
        control.write_text(json.dumps({"mode": "ok", "temp": 55}))
        doc = _until("back at 55 C, not degraded", lambda: (lambda x: x if _temps(x) == [55, 55]
                                                             and not x["daemon"]["degraded"] else None)(_ask_path(sock)))
        assert [h.pid for h in fake_nvml.holders(str(control))] == [d.proc.pid]  # holds the GPUs again
        assert (stat_mode := os.stat(sock).st_mode & 0o777) == 0o600, oct(stat_mode)
        assert os.stat(sock.parent).st_mode & 0o777 == 0o700
    finally:
        d.stop()


def test_a_quiesce_whose_asker_is_killed_ends_at_once(tmp_path: Path) -> None:
    """A reset flow killed with SIGKILL during its quiesce leaves the daemon sampling again: the
    quiesce lives as long as the asking connection, which the kernel closes."""
    import fake_nvml

    d, control, _, sock = _nvml_daemon(tmp_path)
    asker = None
    try:
        _until("GPUs at 40 C", lambda: _temps(_ask_path(sock)) == [40, 40])
        code = textwrap.dedent(f"""
            import sys, time
            from fleetops.agent.serve import client
            q = client.Quiesce({str(sock)!r}, 600, "killed flow").__enter__()
            print("quiesced" if q.answer else "no daemon", flush=True)
            time.sleep(600)
        """)
        asker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert asker.stdout is not None and asker.stdout.readline().strip() == "quiesced"
        assert fake_nvml.holders(str(control)) == []
        assert (_ask_path(sock) or {})["daemon"]["quiesced"]["by"] == "killed flow"
        control.write_text(json.dumps({"mode": "ok", "temp": 61}))
        asker.kill()
        asker.wait()
        doc = _until("sampling again after the kill", lambda: (lambda x: x if _temps(x) == [61, 61] else None)(
            _ask_path(sock)), deadline_s=30)
        assert doc["daemon"]["quiesced"] is None
        assert doc["daemon"]["last_resume"]["why"] == "the asking connection closed"
        assert d.proc is not None and [h.pid for h in fake_nvml.holders(str(control))] == [d.proc.pid]
    finally:
        if asker is not None and asker.poll() is None:
            asker.kill()
        d.stop()


def test_nvml_hung_call_degraded_while_kernel_log_xids_flow(tmp_path: Path) -> None:
    d, control, kmsg_file, sock = _nvml_daemon(tmp_path)
    try:
        _until("GPUs at 40 C", lambda: _temps(_ask_path(sock)) == [40, 40])
        control.write_text(json.dumps({"mode": "hang", "temp": 40}))
        doc = _until("degraded by the watchdog", lambda: (lambda x: x if x and x["daemon"]["degraded"] else None)(
            _ask_path(sock)))
        assert doc["daemon"]["reason"].startswith("hung:")
        with kmsg_file.open("a") as fh:
            fh.write("3,0,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
                     "GPU has fallen off the bus.\n")
        doc = _until("XID 79 while hung", lambda: (lambda x: x if x and x["daemon"]["xid_counts"] else None)(
            _ask_path(sock)))
        assert doc["daemon"]["xid_counts"] == {"0000:18:00.0/79": 1} and doc["daemon"]["degraded"]
    finally:
        control.write_text(json.dumps({"mode": "ok", "temp": 40}))
        d.stop()


def test_cursor_write_failure_is_reported_and_does_not_stop_it(node: Path, daemon: Daemon) -> None:
    run_dir = Path(str(node.with_suffix("")) + ".agent")
    blocker = run_dir / "xid-state.json.tmp"
    blocker.mkdir()  # the atomic write's temporary cannot be created: as on a full disk
    _xid(node, 31, 0)
    doc = _until("write failure reported", lambda: (lambda x: x if x["daemon"]["degraded"] else None)(
        _ask(node, "snapshot")))
    assert doc["daemon"]["reason"] == f"XID cursor not saved: {blocker}: Is a directory" and list(doc["daemon"]["xid_counts"].values()) == [1]
    blocker.rmdir()
    _xid(node, 31, 0)
    doc = _until("written again", lambda: (lambda x: x if not x["daemon"]["degraded"] else None)(
        _ask(node, "snapshot")))
    assert list(doc["daemon"]["xid_counts"].values()) == [2]
    saved = json.loads((run_dir / "xid-state.json").read_text())
    assert saved["seq"] == 1 and list(saved["counts"].values()) == [2]


def test_sd_notify_ready_and_watchdog(node: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(DEADLINE_S)
    d = Daemon([node], {"NOTIFY_SOCKET": path})
    d.start()
    try:
        got = set()
        while not {"READY=1", "WATCHDOG=1"} <= got:
            got.add(rx.recv(4096).decode())
    finally:
        assert d.stop() == 0
        rx.close()
    assert got <= {"READY=1", "WATCHDOG=1", "STOPPING=1"}


def test_sighup_reloads_configuration(node: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"interval_s": 0.3, "hang_timeout_s": 5}))
    cmd = [AGENT, "serve", "--backend", "sim", "--config", str(config), "--states", str(node)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        first = _until("first snapshot", lambda: (_ask(node, "snapshot") or {}).get("daemon"))
        assert first["interval_s"] == 0.3 and first["reloaded_at"] is None
        config.write_text(json.dumps({"interval_s": 0.25}))
        proc.send_signal(signal.SIGHUP)
        doc = _until("reloaded", lambda: (lambda x: x if x and x["interval_s"] == 0.25 else None)(
            (_ask(node, "snapshot") or {}).get("daemon")))
        assert doc["reloaded_at"] is not None
        config.write_text(json.dumps({"interval_s": "fast"}))
        proc.send_signal(signal.SIGHUP)
        refusal = f"{config}: interval_s must be a positive number of seconds, got 'fast'"
        doc = _until("refusal", lambda: (lambda x: x if x and x["reload_error"] else None)(
            (_ask(node, "snapshot") or {}).get("daemon")))
        assert doc["reload_error"] == refusal and doc["interval_s"] == 0.25  # the running config stays
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert f"reload refused: {refusal}" in err.decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:  # loopback only
        return str(resp.read().decode())


@pytest.mark.promtool
def test_the_daemons_endpoint_counts_every_xid_and_passes_promtool(node: Path) -> None:
    """The daemon's own endpoint, scraped over loopback: every XID counted, repeats too (the
    'last value' gauge of other exporters hides a repeat), a crit finding exported for the GPU,
    and the page clean for promtool."""
    from promtool_util import assert_clean

    port = _free_port()
    d = Daemon([node])
    d.proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5", "--hang-timeout", "1",
         "--metrics-address", f"127.0.0.1:{port}", "--states", str(node)],
        env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        uuid0 = sim.read_state(str(node))["gpus"][0]["uuid"]
        _until("the endpoint", lambda: "fleetops_agent_up 1" in _try_scrape(port))
        _xid(node, 31, 0)
        _xid(node, 31, 0)
        _xid(node, 31, 0)
        sim.inject(str(node), "ecc-dbe", 1)

        def settled() -> str | None:
            text = _try_scrape(port)
            line = next((x for x in text.splitlines() if x.startswith("fleetops_gpu_xid_total{")
                         and f'uuid="{uuid0}"' in x and 'code="31"' in x), "")
            crit = any(x.startswith("fleetops_gpu_finding{") and 'severity="crit"' in x for x in text.splitlines())
            return text if line.endswith(" 3") and crit else None

        text = _until("3 XID 31 counted and the DBE found", settled)
        assert_clean(text)
    finally:
        assert d.stop() == 0


def _try_scrape(port: int) -> str:
    try:
        return _scrape(port)
    except OSError:
        return ""


def test_a_dbe_or_new_clock_reasons_are_judged_at_the_next_tick_not_the_next_full_snapshot(node: Path) -> None:
    """With full snapshots an hour apart, the findings can only change because a light sample
    saw a new uncorrectable error or other clocks-event reasons; a quiet tick takes none."""
    cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "3600",
           "--hang-timeout", "5", "--states", str(node)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        first = _until("the first snapshot", lambda: (_ask(node, "snapshot") or {}).get("collected_at"))
        time.sleep(1.5)  # several quiet ticks (NaN fields included): no new full snapshot
        assert (_ask(node, "snapshot") or {})["collected_at"] == first

        def checks_on(gpu: int) -> set[str]:
            doc = (_ask(node, "snapshot") or {}).get("daemon") or {}
            return {f["check"] for f in doc.get("findings", []) if (f.get("gpu") or {}).get("index") == gpu}

        assert "memory.ecc_dbe_volatile" not in checks_on(3)
        assert sim.inject(str(node), "ecc-dbe", 3)
        _until("the DBE judged", lambda: "memory.ecc_dbe_volatile" in checks_on(3))
        assert sim.inject(str(node), "thermal-slowdown", 5)
        _until("the slowdown judged", lambda: "thermal_power.throttle" in checks_on(5))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
