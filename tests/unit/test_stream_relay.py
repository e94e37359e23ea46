"""The node side of a TUI stream: the relay script and its perl relay, run for real against a
unix socket served by the test (no SSH, no root)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.fleet import transport
from fleetops.tui import stream

PERL = shutil.which("perl")
pytestmark = pytest.mark.skipif(PERL is None, reason="perl is not installed")


class Server:
    """A unix socket that accepts one client, sends ``hello`` and records what it receives."""

    def __init__(self, path: str, hello: bytes) -> None:
        self.path = path
        self.received = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.hello = hello
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.sendall(self.hello)
            conn.settimeout(20)
            while True:
                try:
                    got = conn.recv(4096)
                except OSError:
                    break
                if not got:
                    break
                self.received += got
                if b"\n" in self.received:
                    self.done.set()
        self.done.set()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # sockaddr_un holds 107 bytes of path: pytest's tmp_path can be longer than that
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="fo-relay-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _perl(path: str, extra: str = "") -> subprocess.Popen[bytes]:
    assert PERL is not None
    return subprocess.Popen(
        [PERL, "-e", stream.PERL_RELAY + extra, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_perl_relay_copies_both_ways_and_ends_when_stdin_closes(short_dir: Path) -> None:
    server = Server(str(short_dir / "agent.sock"), b'{"schema": "x"}\n{"change": 1}\n')
    try:
        proc = _perl(server.path)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"watch\n")
        proc.stdin.flush()
        assert server.done.wait(20)
        assert server.received == b"watch\n"
        proc.stdin.close()
        out = proc.stdout.read()
        assert proc.wait(20) == 0
        assert out == b'{"schema": "x"}\n{"change": 1}\n'
    finally:
        server.close()


def test_perl_relay_passes_on_what_waits_on_the_socket_before_ending_at_stdin_end(short_dir: Path) -> None:
    """The daemon's line and the end of stdin are both waiting when the relay next looks (the
    order a loaded machine gives: the relay is stopped while both arrive). The line is passed
    on, then the relay ends."""
    import signal

    path = str(short_dir / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    proc = _perl(path)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        listener.settimeout(20)
        conn, _ = listener.accept()
        with conn:
            proc.stdin.write(b"watch\n")
            proc.stdin.flush()
            conn.settimeout(20)
            assert conn.recv(64) == b"watch\n"  # the relay is in its loop
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                conn.sendall(b'{"change": 7}\n')
                proc.stdin.close()
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            out = proc.stdout.read()
            assert proc.wait(20) == 0
        assert out == b'{"change": 7}\n'
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()


def test_perl_relay_loads_no_module(short_dir: Path) -> None:
    """The relay's start is paid on every node for every stream: no ``use`` and no ``%!`` (which
    loads Errno), so perl compiles only the script."""
    server = Server(str(short_dir / "agent.sock"), b"x\n")
    try:
        proc = _perl(server.path, '\nEND { print STDERR "modules:[", join(",", sort keys %INC), "]\\n" }\n')
        assert proc.stdout is not None
        assert proc.stdout.read1(4096) == b"x\n"
        _, err = proc.communicate(b"", timeout=20)
        assert proc.returncode == 0
        assert err.decode() == "modules:[]\n"
    finally:
        server.close()


def test_perl_relay_exits_3_naming_a_socket_nobody_serves(short_dir: Path) -> None:
    path = str(short_dir / "none.sock")
    proc = _perl(path)
    _, err = proc.communicate(b"", timeout=20)
    assert proc.returncode == stream.NO_DAEMON_STATUS
    assert err.decode().startswith(f"fleetops relay: cannot connect to {path}: No such file or directory")


def test_perl_relay_refuses_a_path_longer_than_sockaddr_un_holds() -> None:
    path = "/tmp/" + "d" * 120 + "/agent.sock"
    proc = _perl(path)
    _, err = proc.communicate(b"", timeout=20)
    assert proc.returncode == stream.NO_DAEMON_STATUS
    assert err.decode() == f"fleetops relay: socket path too long: {path}\n"


def test_relay_script_says_started_then_relays_through_perl_without_socat(short_dir: Path) -> None:
    """What runs on a node without socat: ``sh`` prints the started line, then execs the perl
    relay on the socket ``FLEETOPS_AGENT_SOCKET`` names."""
    bindir = short_dir / "bin"
    bindir.mkdir()
    for tool in ("sh", "perl"):
        found = shutil.which(tool)
        assert found is not None
        os.symlink(found, bindir / tool)
    server = Server(str(short_dir / "agent.sock"), b'{"snapshot": 1}\n')
    try:
        env = {"PATH": str(bindir), "FLEETOPS_AGENT_SOCKET": server.path}
        argv = stream.relay_command("fleetops-agent")
        proc = subprocess.Popen(
            [str(bindir / "sh"), *argv[1:]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        want = transport.STREAM_STARTED + b'\n{"snapshot": 1}\n'
        got = b""
        while len(got) < len(want):
            chunk = proc.stdout.read1(4096)
            if not chunk:
                break
            got += chunk
        proc.stdin.close()
        assert proc.wait(20) == 0
        assert got == want
    finally:
        server.close()
