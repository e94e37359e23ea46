"""The resident agent's systemd watchdog stands for "no backend call is hung", nothing more, and
one node has one resident agent.

Real ``fleetops-agent serve`` processes, their sd_notify datagrams caught on a unix datagram
socket set as ``NOTIFY_SOCKET``: a failed sample, a quiesce and an unloaded driver keep the
pings coming (and are reported in the snapshot), a hung backend call stops them. A second
``serve`` for a node whose daemon answers is refused, naming the socket and the first one's
pid, and the first keeps serving; a socket file nobody answers on is replaced.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops.agent.serve import claim, client
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
DEADLINE_S = 60.0
HERE = os.path.dirname(os.path.abspath(__file__))

# A simulator backend that fails its light read while ``<state>.fail`` exists and blocks in it
# while ``<state>.hang`` exists.
FLAKY = '''
import os, time
from fleetops.sim.access import SimAccess

class Flaky(SimAccess):
    def light(self):
        if os.path.exists(self.state_path + ".fail"):
            raise RuntimeError("injected sample failure")
        while os.path.exists(self.state_path + ".hang"):
            time.sleep(0.05)
        return super().light()
'''


def _until(what: str, fn: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    return polling.until(what, fn, deadline_s)


def _snapshot(sock: str) -> dict[str, Any] | None:
    try:
        text = client.ask(sock, b"snapshot\n", 5.0).decode()
    except OSError:
        return None
    doc = json.loads(text) if text.strip() else None
    return doc if isinstance(doc, dict) and "daemon" in doc else None


class Notify:
    """The receiving end of ``NOTIFY_SOCKET``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.rx.bind(self.path)

    def drain(self) -> list[str]:
        self.rx.setblocking(False)
        got = []
        try:
            while True:
                got.append(self.rx.recv(4096).decode())
        except BlockingIOError:
            pass
        finally:
            self.rx.setblocking(True)
        return got

    def pings_within(self, seconds: float) -> int:
        """How many WATCHDOG=1 arrive within ``seconds`` from now."""
        end = time.monotonic() + seconds
        n = 0
        while (left := end - time.monotonic()) > 0:
            self.rx.settimeout(left)
            try:
                if self.rx.recv(4096) == b"WATCHDOG=1":
                    n += 1
            except TimeoutError:
                break
        return n

    def close(self) -> None:
        self.rx.close()


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


def _sim_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env.pop("FLEETOPS_SIM_STATE", None)
    return env


def _sim_cmd(state: Path) -> list[str]:
    return [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5",
            "--hang-timeout", "1", "--states", str(state)]


def _sock(state: Path) -> str:
    return str(state.with_suffix("")) + ".agent/agent.sock"


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    return state


@pytest.fixture()
def notify(tmp_path: Path) -> Iterator[Notify]:
    rx = Notify(tmp_path / "notify.sock")
    yield rx
    rx.close()


def test_a_failed_sample_keeps_the_watchdog_pinged_and_a_hung_call_stops_it(
    node: Path, tmp_path: Path, notify: Notify
) -> None:
    (tmp_path / "flakymod.py").write_text(FLAKY)
    env = _sim_env({"NOTIFY_SOCKET": notify.path, "FLEETOPS_AGENT_SERVE_BACKEND": "flakymod:Flaky",
                    "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    proc = _start(_sim_cmd(node), env)
    sock = _sock(node)
    try:
        _until("the first snapshot", lambda: _snapshot(sock))
        assert notify.pings_within(5.0) >= 1

        Path(str(node) + ".fail").write_text("")
        doc = _until("the failed sample reported", lambda: (lambda d: d if d and d["daemon"]["degraded"] else None)(
            _snapshot(sock)))
        assert doc["daemon"]["reason"] == "sample failed: RuntimeError: injected sample failure"
        notify.drain()
        assert notify.pings_within(3.0) >= 2, "a degraded (not hung) daemon must keep the watchdog pinged"
        assert (_snapshot(sock) or {})["daemon"]["degraded"] is True  # still reported meanwhile

        Path(str(node) + ".fail").unlink()
        Path(str(node) + ".hang").write_text("")
        doc = _until("the hung call reported", lambda: (lambda d: d if d and str(d["daemon"]["reason"]).startswith(
            "hung:") else None)(_snapshot(sock)))
        assert "'sample'" in doc["daemon"]["reason"]
        notify.drain()  # pings sent before the watchdog saw the hang
        assert notify.pings_within(3.0) == 0, "a hung backend call must stop the watchdog's pings"

        Path(str(node) + ".hang").unlink()
        _until("recovered", lambda: (lambda d: d if d and not d["daemon"]["degraded"] else None)(_snapshot(sock)))
        assert notify.pings_within(5.0) >= 1
    finally:
        for marker in (".fail", ".hang"):
            Path(str(node) + marker).unlink(missing_ok=True)
        assert _stop(proc) == 0


def test_a_quiesce_and_an_unloaded_driver_keep_the_watchdog_pinged_and_a_hung_nvml_call_stops_it(
    tmp_path: Path, notify: Notify
) -> None:
    import fake_nvml

    control = tmp_path / "control.json"
    control.write_text(json.dumps({"mode": "ok", "temp": 40}))
    (tmp_path / "kmsg").write_text("")
    sock = tmp_path / "run" / "agent.sock"
    env = _sim_env({
        "NOTIFY_SOCKET": notify.path,
        "FLEETOPS_AGENT_NVML_MODULE": "fake_nvml",
        "FAKE_NVML_CONTROL": str(control),
        "FLEETOPS_AGENT_STATE_DIR": str(tmp_path / "lib"),
        "FLEETOPS_AGENT_KMSG": str(tmp_path / "kmsg"),
        "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
    })
    page = tmp_path / "agent.prom"  # the endpoint's page, written at each publish
    proc = _start([AGENT, "serve", "--backend", "nvml", "--socket", str(sock), "--interval", "0.2",
                   "--full-interval", "0.5", "--hang-timeout", "1", "--textfile", str(page)], env)
    try:
        _until("GPUs sampled", lambda: (lambda d: d if d and d.get("gpus") else None)(_snapshot(str(sock))))
        with client.Quiesce(str(sock), 60, "watchdog test") as pause:
            assert pause.answer is not None
            notify.drain()
            assert notify.pings_within(3.0) >= 2, "a quiesced daemon is not hung: it keeps the watchdog pinged"
            fake_nvml.unload(str(control))
        doc = _until("the unloaded driver reported", lambda: (lambda d: d if d and d["daemon"]["degraded"] else None)(
            _snapshot(str(sock))))
        assert doc["daemon"]["reason"] == "sample failed: RuntimeError: nvmlInit: DriverNotLoaded"
        notify.drain()
        assert notify.pings_within(3.0) >= 2, "an unloaded driver is degraded, not hung: no restart loop"
        assert proc.poll() is None
        # and the metrics say so meanwhile
        _until("the degraded gauge", lambda: page.exists() and "\nfleetops_agent_degraded 1\n" in page.read_text())
        assert 'fleetops_agent_degraded_reason{reason="driver_unloaded"} 1' in page.read_text()

        fake_nvml.load(str(control))
        _until("sampling again", lambda: (lambda d: d if d and not d["daemon"]["degraded"] else None)(
            _snapshot(str(sock))))
        control.write_text(json.dumps({"mode": "hang", "temp": 40}))
        _until("the hung call reported", lambda: (lambda d: d if d and str(d["daemon"]["reason"]).startswith(
            "hung:") else None)(_snapshot(str(sock))))
        notify.drain()
        assert notify.pings_within(3.0) == 0, "a hung NVML call must stop the watchdog's pings"
    finally:
        control.write_text(json.dumps({"mode": "ok", "temp": 40}))
        _stop(proc)


def test_a_second_serve_on_an_answering_socket_is_refused_naming_the_first_ones_pid(node: Path) -> None:
    first = _start(_sim_cmd(node), _sim_env())
    sock = _sock(node)
    try:
        _until("the first daemon's snapshot", lambda: _snapshot(sock))
        inode = os.stat(sock).st_ino
        second = _start(_sim_cmd(node), _sim_env())
        try:
            code = second.wait(timeout=60)
        finally:
            _stop(second)
        assert second.stderr is not None
        err = json.loads(second.stderr.read().decode().strip().splitlines()[-1])
        assert code == 1 and err["kind"] == "in-use"
        assert f"pid {first.pid}" in err["error"], err
        assert f"pid {first.pid} answers on {sock}" in err["error"], err  # the socket, and who answers on it
        # the first keeps its socket and keeps serving
        assert os.stat(sock).st_ino == inode and first.poll() is None
        doc = _snapshot(sock)
        assert doc is not None and doc["daemon"]["pid"] == first.pid
        assert client.daemon_pid(sock) == first.pid
    finally:
        assert _stop(first) == 0


def test_a_second_nvml_serve_on_another_socket_is_refused_by_the_xid_state_lock(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"mode": "ok", "temp": 40}))
    (tmp_path / "kmsg").write_text("")
    env = _sim_env({
        "FLEETOPS_AGENT_NVML_MODULE": "fake_nvml",
        "FAKE_NVML_CONTROL": str(control),
        "FLEETOPS_AGENT_STATE_DIR": str(tmp_path / "lib"),
        "FLEETOPS_AGENT_KMSG": str(tmp_path / "kmsg"),
        "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
    })

    def cmd(sock: Path) -> list[str]:
        return [AGENT, "serve", "--backend", "nvml", "--socket", str(sock), "--interval", "0.5"]

    first = _start(cmd(tmp_path / "a" / "agent.sock"), env)
    try:
        _until("the first daemon's snapshot", lambda: _snapshot(str(tmp_path / "a" / "agent.sock")))
        second = _start(cmd(tmp_path / "b" / "agent.sock"), env)
        code = second.wait(timeout=60)
        assert second.stderr is not None
        err = json.loads(second.stderr.read().decode().strip().splitlines()[-1])
        assert code == 1 and err["kind"] == "in-use"
        assert f"pid {first.pid}" in err["error"] and str(tmp_path / "lib" / claim.LOCK_NAME) in err["error"], err
        assert not (tmp_path / "b" / "agent.sock").exists()
        assert first.poll() is None and _snapshot(str(tmp_path / "a" / "agent.sock")) is not None
    finally:
        _stop(first)


def test_a_stale_socket_file_nobody_answers_on_is_replaced(node: Path) -> None:
    sock = _sock(node)
    os.makedirs(os.path.dirname(sock), mode=0o700, exist_ok=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock)  # bound, never listening, then closed: what a killed daemon leaves behind
    dead.close()
    assert os.path.exists(sock) and client.daemon_pid(sock) is None
    proc = _start(_sim_cmd(node), _sim_env())
    try:
        doc = _until("the daemon's snapshot on the replaced socket", lambda: _snapshot(sock))
        assert doc["daemon"]["pid"] == proc.pid
    finally:
        assert _stop(proc) == 0


def test_claim_refuses_while_the_lock_is_held_and_is_free_once_released(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "lib")
    fd = claim.claim(str(tmp_path / "agent.sock"), state_dir)
    try:
        with pytest.raises(claim.Taken, match=f"pid {os.getpid()}"):
            claim.claim(str(tmp_path / "other.sock"), state_dir)
    finally:
        claim.release([fd])
    claim.release([claim.claim(str(tmp_path / "other.sock"), state_dir)])
