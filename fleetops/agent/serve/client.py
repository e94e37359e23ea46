"""The client side of the daemon's socket, for ``collect`` and ``watch``: short timeouts, so a
node without a daemon pays one failed ``connect`` and nothing else.

``fetch_snapshot`` is ``collect``'s fast path, the whole of an answered collect besides the
interpreter's start, so it imports nothing the interpreter has not already loaded: ``_socket``
(the C module under ``socket``, whose import costs as much as the answer through ``enum``) and
no ``json`` (``re`` and ``enum`` again): the daemon's snapshot line ends with its age
(``..."age_s":N}}``, ``NodeService.snapshot_json``), read from the tail; a line that ends any
other way is parsed whole, as before.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    import socket

DEFAULT_SOCKET = "/run/fleetops/agent.sock"
CONNECT_TIMEOUT_S = 0.2


def socket_for(backend: str, state_path: str | None, explicit: str | None) -> str:
    """The socket a node's daemon listens on: ``--socket``, else the simulator's beside its state
    file (``<state>.agent/agent.sock``), else the default."""
    if explicit:
        return explicit
    state = state_path or os.environ.get("FLEETOPS_SIM_STATE")
    if state and simulated(backend, state):
        base = state[:-5] if state.endswith(".json") else state
        return os.path.join(base + ".agent", "agent.sock")
    return DEFAULT_SOCKET


def simulated(backend: str, state: str) -> bool:
    """Whether ``backend`` is the simulator here (``backend_choice.choose``: auto never is on a
    node with an NVIDIA driver, so its snapshot comes from the real daemon's socket). Raises
    ``backend_choice.BackendRefused`` for ``sim`` on such a node without consent."""
    from fleetops.gpu import backend_choice

    try:
        return backend_choice.choose(backend, bool(state)) == "sim"
    except ValueError:  # an unknown name: the command says so when it picks its backend
        return False


def _connect(path: str, timeout: float) -> socket.socket | None:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


_NUMBER = frozenset("0123456789.-+eE")


def served_age(text: str) -> float | None:
    """The age in a daemon snapshot line, None when the line is not one or has no age. The fast
    reading (the tail) is taken only when the line ends as the daemon writes it; anything else is
    parsed whole."""
    head, sep, tail = text.rpartition(',"age_s":')
    if sep and head.startswith('{"') and tail.endswith("}}") and tail[:-2] and set(tail[:-2]) <= _NUMBER:
        try:
            return float(tail[:-2])
        except ValueError:
            pass
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return None
    daemon = doc.get("daemon") if isinstance(doc, dict) else None
    if not isinstance(daemon, dict) or "error" in doc:
        return None
    age = daemon.get("age_s")
    return float(age) if isinstance(age, (int, float)) and not isinstance(age, bool) else None


class NotAnswering(OSError):
    """Nothing accepted the connection on the socket (no daemon, or a dead one)."""


def ask(path: str, request: bytes, timeout: float, connect_timeout: float = CONNECT_TIMEOUT_S) -> bytes:
    """Send one line request to the daemon and return its one-line answer (up to the newline or
    the close). ``NotAnswering`` when the connect fails, another ``OSError`` when the answer does
    not come. Uses ``_socket``: see the module's docstring."""
    import _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    chunks: list[bytes] = []
    try:
        s.settimeout(connect_timeout)
        try:
            s.connect(path)
        except OSError as exc:
            raise NotAnswering(exc.errno, exc.strerror or str(exc)) from exc
        s.settimeout(timeout)
        s.sendall(request)
        while True:
            data = s.recv(1 << 20)
            if not data:
                break
            chunks.append(data)
            if data.endswith(b"\n"):
                break
    finally:
        s.close()
    return b"".join(chunks)


def fetch_snapshot(path: str, max_age_s: float, timeout: float = 2.0) -> str | None:
    """The daemon's snapshot line when it answers and is fresher than ``max_age_s``, else None."""
    if not os.path.exists(path):
        return None
    try:
        answer = ask(path, b"snapshot\n", timeout)
    except OSError:
        return None
    text = answer.decode("utf-8", "replace").strip()
    age = served_age(text)
    if age is None or age > max_age_s:
        return None
    return text


def watch(path: str) -> int:
    """Stream the daemon's ``watch`` lines to stdout until stdin closes (or the daemon goes)."""
    import json
    import select

    conn = _connect(path, CONNECT_TIMEOUT_S * 5)
    if conn is None:
        sys.stderr.write(json.dumps({"error": f"no fleetops-agent daemon answers on {path}", "kind": "collect"}) + "\n")
        return 1
    out = sys.stdout.buffer
    with conn as s:
        s.settimeout(None)
        s.sendall(b"watch\n")
        stdin = sys.stdin.fileno()
        watching = [s.fileno(), stdin]
        while True:
            ready, _, _ = select.select(watching, [], [])
            if stdin in ready:
                if not os.read(stdin, 4096):
                    return 0
            if s.fileno() in ready:
                data = s.recv(65536)
                if not data:
                    return 0
                out.write(data)
                out.flush()


def daemon_pid(path: str) -> int | None:
    """The pid of the process that answers on the daemon's socket (the kernel's word for it,
    ``SO_PEERCRED``), or None when nothing answers: who the reset's holder check may name as
    the daemon it will pause."""
    import socket
    import struct

    conn = _connect(path, CONNECT_TIMEOUT_S * 5)
    if conn is None:
        return None
    with conn:
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid, _uid, _gid = struct.unpack("3i", raw)
    return pid if pid > 0 else None


class QuiesceError(OSError):
    """The daemon answers but would not let go of the GPUs (a hung NVML call, another quiesce)."""


class Quiesce:
    """``with Quiesce(path, lease, who) as q``: the daemon on ``path`` releases NVML for the
    block and takes it back at its end; ``q.answer`` is its answer (None: no daemon answers,
    nothing to pause). The quiesce is tied to this connection: if this process dies in the
    block, the kernel closes the socket and the daemon resumes at once (``server._quiesce``)."""

    def __init__(self, path: str, lease_s: float, who: str, timeout: float = 30.0) -> None:
        self.path, self.lease_s, self.who, self.timeout = path, lease_s, who, timeout
        self.conn: socket.socket | None = None
        self.answer: dict[str, object] | None = None
        self.resumed: dict[str, object] | None = None

    def __enter__(self) -> Quiesce:
        import json

        if not os.path.exists(self.path):
            return self
        conn = _connect(self.path, CONNECT_TIMEOUT_S * 5)
        if conn is None:
            return self
        conn.settimeout(self.timeout)
        try:
            conn.sendall(f"quiesce {self.lease_s:g} {self.who}\n".encode())
            line = _line(conn)
            doc = json.loads(line) if line else None
        except (OSError, ValueError) as exc:
            conn.close()
            raise QuiesceError(f"the daemon on {self.path} did not answer the quiesce: {exc}") from exc
        if not isinstance(doc, dict) or not doc.get("quiesced"):
            conn.close()
            why = doc.get("error") if isinstance(doc, dict) else "no answer"
            raise QuiesceError(f"the daemon on {self.path} refused to quiesce: {why}")
        self.conn, self.answer = conn, doc
        return self

    def resume(self) -> None:
        import json

        conn, self.conn = self.conn, None
        if conn is None:
            return
        with conn:
            try:
                conn.settimeout(5.0)
                conn.sendall(b"resume\n")
                line = _line(conn)
                self.resumed = json.loads(line) if line else None
            except (OSError, ValueError):
                self.resumed = None  # closing the connection resumes it all the same

    def __exit__(self, *exc: object) -> None:
        self.resume()


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.strip()


def resample(path: str, timeout: float = 30.0) -> str | None:
    """Ask the daemon to sample now and return its snapshot line taken after the call (the
    verdict after an action), or None when no daemon answers or it cannot sample now."""
    if not os.path.exists(path):
        return None
    try:
        answer = ask(path, b"resample\n", timeout)
    except OSError:
        return None
    text = answer.decode("utf-8", "replace").strip()
    return text if served_age(text) is not None else None


SOCKET_ENV = "FLEETOPS_AGENT_SOCKET"  # the daemon's socket where it is not the default (tests, a second daemon)


def action_socket(backend: str, state_path: str | None) -> str:
    """The socket of the daemon that serves the node an action just changed."""
    return os.environ.get(SOCKET_ENV) or socket_for(backend, state_path, None)


def after_action(path: str | None) -> dict[str, object] | None:
    """Ask the node's daemon to sample now, after an action (a reset, a MIG change, a setting),
    so that what it serves from then on was taken after the action, and say so in the action's
    answer: ``resampled`` true with the new snapshot's warn and crit findings, false when no
    daemon answers (nothing stale is served then: a collect runs cold) or it cannot sample now.
    None without a socket path."""
    if not path:
        return None
    import json

    line = resample(path)
    if line is None:
        return {"socket": path, "resampled": False,
                "detail": "no daemon answered or it could not sample now: collects of this node run cold"}
    doc = json.loads(line)
    daemon = doc.get("daemon") or {}
    return {"socket": path, "resampled": True, "backend": daemon.get("backend"), "collected_at": doc.get("collected_at"),
            "age_s": daemon.get("age_s"),
            "findings": [f for f in daemon.get("findings") or [] if f.get("severity") in ("warn", "crit")]}
