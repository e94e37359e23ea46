"""Where each served node's Prometheus endpoint listens, and one thread that accepts for all.

``--metrics-address`` is one ``HOST:PORT`` (the first node there, the next ones on PORT+1 ...;
port 0: any free one each) or a comma-separated list with one ``HOST:PORT`` per served node, in
the order the nodes are served. The simulated fleet uses the list: every node's endpoint on that
node's own loopback address and the port its inventory names, where ``fleetops prometheus
targets`` points, as on a real fleet.

A process that serves many nodes (``sim up --daemon``: up to a thousand) does not give each
endpoint its own accepting thread: ``serve_all`` waits on every listening socket from one thread
and hands a ready one to its server's ``handle_request``, which serves the connection the way the
server does from ``serve_forever`` (its own connection threads, cap and deadlines).
"""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any


def parse(text: str, count: int, parse_one: Callable[[str], tuple[str, int]]) -> list[tuple[str, int]]:
    """(host, port) for each of ``count`` nodes from ``--metrics-address`` (see above);
    ``parse_one`` reads one ``HOST:PORT``. ValueError when a list does not name one per node."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) == 1:
        host, port = parse_one(parts[0])
        if port and port + count - 1 > 65535:
            raise ValueError(f"--metrics-address {text!r}: {count} nodes from port {port} run past port 65535")
        return [(host, port + i if port else 0) for i in range(count)]
    if any(not p for p in parts):
        raise ValueError(f"--metrics-address {text!r}: an empty entry in the list")
    if len(parts) != count:
        raise ValueError(f"--metrics-address: {len(parts)} addresses for {count} served nodes; give one per "
                         "node, in the order they are served, or one HOST:PORT for all")
    return [parse_one(p) for p in parts]


class Endpoint:
    """One node's endpoint accepted for by a shared ``Acceptor``: ``server_address``,
    ``shutdown()`` and ``server_close()`` as a server run by ``serve_forever`` has them."""

    def __init__(self, server: Any, acceptor: Acceptor) -> None:
        self.server = server
        self.acceptor = acceptor

    @property
    def server_address(self) -> Any:
        return self.server.server_address

    def shutdown(self) -> None:
        self.acceptor.drop(self.server)

    def server_close(self) -> None:
        self.server.server_close()


class Acceptor:
    """One thread waiting on many listening sockets; each ready one is handed to its server."""

    def __init__(self, servers: list[Any], poll_s: float) -> None:
        self.poll_s = poll_s
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.dropping: dict[Any, threading.Event] = {}
        # a byte on this pair wakes the thread at once for a drop, instead of at the next poll
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        for server in servers:
            server.timeout = 0.0  # handle_request never waits: the socket is ready when it is called
            self.selector.register(server, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, name="fleetops-metrics-accept", daemon=True)

    def _run(self) -> None:
        while True:
            with self.lock:
                for server, done in self.dropping.items():
                    self.selector.unregister(server)
                    done.set()
                self.dropping.clear()
                if len(self.selector.get_map()) <= 1:  # only the wake-up pair left
                    self.selector.close()
                    self.wake_r.close()
                    self.wake_w.close()
                    return
            for key, _ in self.selector.select(self.poll_s):
                server = key.fileobj
                if server is self.wake_r:
                    try:
                        self.wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                if server in self.dropping:
                    continue
                try:
                    server.handle_request()  # type: ignore[union-attr]
                except Exception as exc:  # one endpoint's failure must not stop the others  # noqa: BLE001
                    server.handle_error(None, f"accept: {type(exc).__name__}: {exc}")  # type: ignore[union-attr]

    def drop(self, server: Any) -> None:
        """Stop accepting for ``server``; returns once the thread no longer uses it."""
        done = threading.Event()
        with self.lock:
            if not self._registered(server):
                return
            self.dropping[server] = done
            try:
                self.wake_w.send(b"x")
            except OSError:
                pass
        if self.thread.is_alive():
            done.wait()

    def _registered(self, server: Any) -> bool:
        try:
            self.selector.get_key(server)
        except (KeyError, RuntimeError, TypeError):  # never registered, or the thread has ended
            return False
        return True


def serve_all(servers: list[Any], poll_s: float) -> list[Endpoint]:
    """Accept for every server of ``servers`` from one thread; their ``Endpoint``s."""
    acceptor = Acceptor(servers, poll_s)
    acceptor.thread.start()
    return [Endpoint(server, acceptor) for server in servers]
