"""The client side of the daemon's socket, for ``collect`` and ``watch``: stdlib only, short
timeouts, so a node without a daemon pays one failed ``connect`` and nothing else."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

DEFAULT_SOCKET = "/run/fleetops/agent.sock"
CONNECT_TIMEOUT_S = 0.2


def socket_for(backend: str, state_path: str | None, explicit: str | None) -> str:
    """The socket a node's daemon listens on: ``--socket``, else the simulator's beside its state
    file (``<state>.agent/agent.sock``), else the default."""
    if explicit:
        return explicit
    state = state_path or os.environ.get("FLEETOPS_SIM_STATE")
    if backend != "nvml" and state:
        base = state[:-5] if state.endswith(".json") else state
        return os.path.join(base + ".agent", "agent.sock")
    return DEFAULT_SOCKET


def _connect(path: str, timeout: float) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


def fetch_snapshot(path: str, max_age_s: float, timeout: float = 2.0) -> str | None:
    """The daemon's snapshot line when it answers and is fresher than ``max_age_s``, else None."""
    if not os.path.exists(path):
        return None
    s = _connect(path, CONNECT_TIMEOUT_S)
    if s is None:
        return None
    with s:
        s.settimeout(timeout)
        try:
            s.sendall(b"snapshot\n")
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
                if data.endswith(b"\n"):
                    break
        except OSError:
            return None
    text = b"".join(chunks).decode("utf-8", "replace").strip()
    try:
        doc: Any = json.loads(text)
    except ValueError:
        return None
    daemon = doc.get("daemon") if isinstance(doc, dict) else None
    if not isinstance(daemon, dict) or "error" in doc:
        return None
    age = daemon.get("age_s")
    if not isinstance(age, (int, float)) or age > max_age_s:
        return None
    return text


def watch(path: str) -> int:
    """Stream the daemon's ``watch`` lines to stdout until stdin closes (or the daemon goes)."""
    import select

    s = _connect(path, CONNECT_TIMEOUT_S * 5)
    if s is None:
        sys.stderr.write(json.dumps({"error": f"no fleetops-agent daemon answers on {path}", "kind": "collect"}) + "\n")
        return 1
    out = sys.stdout.buffer
    with s:
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
