"""``fleetops-agent collect`` answered by a daemon: the fast path (no argparse, no json, no
socket module) prints exactly what the full parser's path prints for the same daemon line, falls
back to a whole parse when the line does not end as the daemon writes it, and honours --fresh
and --max-age. The daemon here is a unix socket serving one fixed line, so both paths see the
same document; the real daemon is exercised in test_agent_serve.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.agent.serve import client
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")


class FixedDaemon:
    """Answers every ``snapshot`` request with ``line`` (and counts the requests)."""

    def __init__(self, path: str, line: str) -> None:
        self.line = line
        self.requests: list[bytes] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(1024))
                conn.sendall(self.line.encode() + b"\n")

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _doc(node: Path, age: float | None) -> dict[str, object]:
    """A daemon document: a real snapshot of the node with a daemon block whose last key is the age."""
    cold = json.loads(subprocess.run([AGENT, "collect", "--fresh", "--backend", "sim", "--state", str(node)], capture_output=True,
                                     check=True).stdout)
    cold["daemon"] = {"interval_s": 2.0, "degraded": False, "reason": None, "findings": [],
                      "xid_counts": {"0000:18:00.0/31": 2}, "xid_events": [{"message": 'say "age_s":1}}'}],
                      "age_s": age}
    return dict(cold)


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "f1.json"
    sim.init_state(str(state), "f1")
    return state


@pytest.fixture()
def daemon_at(tmp_path: Path) -> Iterator[tuple[str, list[FixedDaemon]]]:
    path = str(tmp_path / "agent.sock")
    started: list[FixedDaemon] = []
    yield path, started
    for d in started:
        d.close()


def _collect(*args: str) -> bytes:
    return subprocess.run([AGENT, "collect", *args], capture_output=True, check=True).stdout


def test_fast_and_full_parser_paths_print_the_same_bytes(node: Path, daemon_at: tuple[str, list[FixedDaemon]]) -> None:
    path, started = daemon_at
    line = json.dumps(_doc(node, 1.25), separators=(",", ":"))
    assert client.served_age(line) == 1.25
    d = FixedDaemon(path, line)
    started.append(d)
    fast = _collect("--socket", path, "--backend", "sim", "--state", str(node))
    full = _collect("--socket", path, "--backend", "sim", "--state", str(node), "--max-age=30")  # '=' form: argparse's path
    assert fast == full == line.encode() + b"\n"
    assert d.requests == [b"snapshot\n", b"snapshot\n"]
    pretty_fast = _collect("--socket", path, "--backend", "sim", "--state", str(node), "--pretty")
    pretty_full = _collect("--socket", path, "--backend", "sim", "--state", str(node), "--pretty", "--max-age=30")
    assert pretty_fast == pretty_full and json.loads(pretty_fast) == json.loads(line)


def test_a_line_that_does_not_end_with_the_age_is_parsed_whole(node: Path,
                                                               daemon_at: tuple[str, list[FixedDaemon]]) -> None:
    path, started = daemon_at
    doc = _doc(node, 3.5)
    daemon = dict(doc.pop("daemon"))  # type: ignore[call-overload]
    doc["daemon"] = {"age_s": daemon.pop("age_s"), **daemon}  # the age first: no fast reading of the tail
    line = json.dumps(doc, separators=(",", ":"))
    assert client.served_age(line) == 3.5
    started.append(FixedDaemon(path, line))
    assert _collect("--socket", path, "--backend", "sim", "--state", str(node)) == line.encode() + b"\n"
    stale = json.loads(_collect("--socket", path, "--backend", "sim", "--state", str(node), "--max-age", "3"))
    assert "daemon" not in stale and stale["hostname"] == "f1"  # 3.5 s old: a cold collect


def test_fresh_and_max_age_bypass_the_daemon(node: Path, daemon_at: tuple[str, list[FixedDaemon]]) -> None:
    path, started = daemon_at
    d = FixedDaemon(path, json.dumps(_doc(node, 10.0), separators=(",", ":")))
    started.append(d)
    colds = []
    for args in (["--fresh"], ["--max-age", "5"], ["--max-age=5"]):
        cold = json.loads(_collect("--socket", path, "--backend", "sim", "--state", str(node), *args))
        assert "daemon" not in cold and cold["hostname"] == "f1", args
        cold = {k: v for k, v in cold.items() if k not in ("collected_at", "collect_ms", "uptime_s")}
        cold["fabric"] = {k: v for k, v in cold["fabric"].items() if k != "read_at"}  # the read's moment
        colds.append(cold)
    assert colds[0] == colds[1] == colds[2]  # a cold collect reads the same by either parser
    assert len(d.requests) == 2  # --fresh never asked; each --max-age asked and refused the answer
    assert "daemon" in json.loads(_collect("--socket", path, "--backend", "sim", "--state", str(node), "--max-age", "10"))


def test_an_error_line_or_no_age_is_not_an_answer() -> None:
    assert client.served_age('{"error":"no snapshot yet","kind":"starting"}') is None
    assert client.served_age('{"schema":"x","daemon":{"age_s":null}}') is None
    assert client.served_age('{"schema":"x","daemon":{"a":1,"age_s":1e400}}') == float("inf")
    assert client.served_age('{"schema":"x","daemon":{"a":1,"age_s":1.5}') is None  # cut short


def test_an_answered_collect_imports_no_json_socket_typing_or_argparse(
        node: Path, daemon_at: tuple[str, list[FixedDaemon]]) -> None:
    path, started = daemon_at
    started.append(FixedDaemon(path, json.dumps(_doc(node, 1.0), separators=(",", ":"))))
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from fleetops.agent.main import main\n"
        f"code = main(['collect', '--socket', {path!r}, '--backend', 'sim', '--state', {str(node)!r}])\n"
        "sys.stdout.flush()\n"
        "new = sorted(set(sys.modules) - before)\n"
        "sys.stderr.write(' '.join(new))\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True, text=True)
    assert json.loads(proc.stdout)["daemon"]["age_s"] == 1.0
    imported = set(proc.stderr.split())
    assert imported & {"json", "socket", "typing", "argparse", "re", "enum", "fleetops.model"} == set(), imported
    # the answer came through _socket, which enters sys.modules on its import whether it is
    # an extension module or built into the interpreter
    assert "_socket" in imported
