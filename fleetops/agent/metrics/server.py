"""The ``/metrics`` endpoint over ``socketserver``: a deadline for the whole request, idle and
slow clients read by one thread, caps on both, TLS and basic auth from a web-config."""

from __future__ import annotations

import errno
import selectors
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetops.agent.metrics.page import CONTENT_TYPE

if TYPE_CHECKING:
    from fleetops.agent import webconfig

_INDEX = (
    "<html><head><title>fleetops-agent</title></head><body>"
    '<h1>fleetops-agent</h1><p><a href="/metrics">/metrics</a></p></body></html>\n'
)


_STATUS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
_MAX_HEADER_LINES = 100
_MAX_HEAD = 16384  # request line and headers together
_MAX_BODY = 65536
_TEXT = "text/plain; charset=utf-8"

# How long a client may take, in all, to send its request (TLS handshake, request line, headers,
# body), and then to take the answer. Counted from the accept, not per byte: a client trickling
# one byte a second is dropped when its time is up. A scrape sends its request in milliseconds.
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
# Requests answered at once, each on a thread of its own (node_exporter's --web.max-requests is
# 40); a request past it is answered 503. Prometheus keeps one scrape per target in flight.
MAX_CONNECTIONS = 40
# Connections still sending their request, read together by one thread without a thread each;
# past it, a new connection is answered 503 (closed, under TLS) at once by the accepting thread.
MAX_PENDING = 256
# Accepted-but-not-yet-served connections the kernel queues (it caps this at net.core.somaxconn).
LISTEN_BACKLOG = 1024

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nServer: fleetops-agent\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 24\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections now\n")


class _Timeout(Exception):
    """The client's time is up (or it went away): no answer."""


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        sock.settimeout(left)
        try:
            sent = sock.send(view)
        except TimeoutError:
            raise _Timeout from None
        view = view[sent:]


@dataclass
class _Request:
    method: str
    target: str
    headers: dict[str, str]


def _parse_head(head: bytes) -> _Request | int:
    """The request, or the status that refuses it."""
    lines = head.decode("latin-1").split("\n")
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        return 400
    if len(lines) > _MAX_HEADER_LINES + 1:
        return 431
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    return _Request(words[0], words[1], headers)


class _Pending:
    """One connection still sending its request: read without blocking by the reader thread."""

    __slots__ = ("server", "sock", "guard", "deadline", "handshaking", "buf", "head", "body_left", "events")

    def __init__(self, server: MetricsServer, sock: Any, guard: webconfig.Guard | None, deadline: float,
                 handshaking: bool) -> None:
        self.server = server
        self.sock = sock
        self.guard = guard
        self.deadline = deadline
        self.handshaking = handshaking
        self.buf = b""
        self.head: bytes | None = None
        self.body_left = 0
        self.events = selectors.EVENT_READ

    def step(self) -> bool | None:
        """Read what is there. True: the request is whole; False: wait for more; None: drop it."""
        if self.handshaking:
            import ssl

            try:
                self.sock.do_handshake()
            except ssl.SSLWantReadError:
                self.events = selectors.EVENT_READ
                return False
            except ssl.SSLWantWriteError:
                self.events = selectors.EVENT_WRITE
                return False
            except OSError:
                return None
            self.handshaking = False
            self.events = selectors.EVENT_READ
        while True:
            try:
                chunk = self.sock.recv(16384)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:  # ssl's want-read/want-write are OSErrors too
                name = type(exc).__name__
                if name == "SSLWantReadError":
                    self.events = selectors.EVENT_READ
                    return False
                if name == "SSLWantWriteError":
                    self.events = selectors.EVENT_WRITE
                    return False
                return None
            if not chunk:  # closed, or half-closed after a request line
                if self.head is None and b"\n" in self.buf.lstrip():
                    self.head, self.buf = self.buf, b""
                return True if self.head is not None else None
            if self.head is None:
                self.buf += chunk
                if not self._head_found():
                    if len(self.buf) > _MAX_HEAD:
                        self.head = b""  # refused as too long
                        return True
                    continue
                if self.body_left <= 0:
                    return True
            else:
                self.body_left -= len(chunk)
                if self.body_left <= 0:
                    return True

    def _head_found(self) -> bool:
        for end in (b"\r\n\r\n", b"\n\n"):
            at = self.buf.find(end)
            if at >= 0:
                self.head, rest = self.buf[:at], self.buf[at + len(end):]
                self.buf = b""
                length = ""
                for line in self.head.split(b"\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = value.strip().decode("latin-1")
                        break
                # read (and drop) what the client sends, so closing does not reset the answer away
                self.body_left = min(int(length), _MAX_BODY) - len(rest) if length.isdigit() else 0
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Reader:
    """The one thread that reads every pending request of every endpoint of the process, each
    connection under its own deadline, so a slow or idle client costs a socket and a buffer,
    never a thread. A whole request is handed to its server (``MetricsServer._dispatch``)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._new: list[_Pending] = []
        self._drop: list[MetricsServer] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: dict[int, _Pending] = {}
        self._thread: threading.Thread | None = None

    def add(self, conn: _Pending) -> None:
        with self._lock:
            self._new.append(conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleetops-metrics-read", daemon=True)
                self._thread.start()
        self._wake()

    def drop(self, server: MetricsServer) -> None:
        """Close the pending connections of a server that closes."""
        with self._lock:
            self._drop.append(server)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # already awake with bytes waiting
            pass

    def _forget(self, conn: _Pending) -> None:
        self._pending.pop(id(conn), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.server._pending_done()

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception as exc:  # noqa: BLE001  (the reader must outlive any one surprise)
                sys.stderr.write(f"fleetops-agent serve: metrics endpoint reader: {type(exc).__name__}: {exc}\n")
                time.sleep(0.1)

    def _turn(self) -> None:
        """One wait: take the new connections, drop the expired ones, read what is ready."""
        with self._lock:
            new, self._new = self._new, []
            drop, self._drop = self._drop, []
        for conn in new:
            self._pending[id(conn)] = conn
            try:
                self._selector.register(conn.sock, conn.events, conn)
            except (ValueError, OSError):  # closed meanwhile
                self._forget(conn)
                conn.close()
                continue
            self._advance(conn)
        for conn in [c for c in self._pending.values() if c.server in drop]:
            self._forget(conn)
            conn.close()
        now = time.monotonic()
        for conn in [c for c in self._pending.values() if c.deadline <= now]:
            self._forget(conn)  # its time is up: closed unanswered
            conn.close()
        wait = min((c.deadline for c in self._pending.values()), default=now + 60.0) - now
        for key, _ in self._selector.select(max(wait, 0.0) + 0.001):
            if key.data is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
                continue
            self._advance(key.data)

    def _advance(self, conn: _Pending) -> None:
        if id(conn) not in self._pending:
            return
        events = conn.events
        try:
            done = conn.step()
        except Exception as exc:  # noqa: BLE001  (one connection's surprise must not stop the reader)
            sys.stderr.write(f"fleetops-agent serve: metrics endpoint: reading a request: {type(exc).__name__}: {exc}\n")
            done = None
        if done is None:
            self._forget(conn)
            conn.close()
        elif done:
            self._forget(conn)
            conn.server._dispatch(conn)
        elif conn.events != events:
            try:
                self._selector.modify(conn.sock, conn.events, conn)
            except (KeyError, ValueError, OSError):
                self._forget(conn)
                conn.close()


_READERS: list[_Reader] = []
_READERS_LOCK = threading.Lock()


def _reader() -> _Reader:
    """The process's reader, made when the first connection comes (a process that only renders
    pages, or writes the textfile, opens nothing)."""
    with _READERS_LOCK:
        if not _READERS:
            _READERS.append(_Reader())
        return _READERS[0]


class MetricsServer(socketserver.TCPServer):
    """``server_address``, ``shutdown()`` and ``server_close()`` as ``http.server``'s have them.

    Read-only by construction: GET of two paths, nothing else is routed anywhere; one request per
    connection (HTTP/1.0, ``Connection: close``), which is what a scraper needs. The accepting
    thread hands each connection to the process's one reader thread (at most ``max_pending``
    waiting; past it, a 503 sent without waiting, or a close under TLS), which reads the TLS
    handshake and the request in ``read_timeout_s`` in all, or closes it. A whole request is
    answered on a thread of its own, at most ``max_connections`` at once (past it, 503), within
    ``write_timeout_s``. The sampler shares nothing with these threads but the immutable state
    they render, so no client can stall it."""

    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], get_text: Callable[[], str], *,
                 web: webconfig.Source | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_pending: int = MAX_PENDING, read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.get_text = get_text
        self.web = web
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.active = 0  # requests being answered now, each on its thread
        self.pending = 0  # connections still sending their request
        self.refused = 0  # connections and requests answered 503 since the start
        self._count_lock = threading.Lock()
        super().__init__(address, socketserver.BaseRequestHandler)

    # the accepting thread: never blocks on a client

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # out of descriptors: the connection stays queued, and the listening socket stays
                # readable; a pause keeps the accepting loop from spinning a core until one frees
                time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            full = self.pending >= self.max_pending
            if full:
                self.refused += 1
            else:
                self.pending += 1
        guard = self.web.guard() if self.web is not None else None
        if full:
            self._turn_away(request, tls=guard is not None and guard.tls_context is not None)
            return
        try:
            request.setblocking(False)
            sock = request
            if guard is not None and guard.tls_context is not None:
                sock = guard.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            conn = _Pending(self, sock, guard, time.monotonic() + self.read_timeout_s, sock is not request)
        except BaseException:
            self._pending_done()
            request.close()
            raise
        _reader().add(conn)

    def shutdown_request(self, request: Any) -> None:
        """The socket now belongs to the reader, then to the answering thread."""

    def _pending_done(self) -> None:
        with self._count_lock:
            self.pending -= 1

    def _turn_away(self, request: socket.socket, tls: bool) -> None:
        try:
            request.setblocking(False)
            if not tls:
                request.send(_BUSY)  # a fresh socket's send buffer takes it whole, or it is dropped
            try:
                request.recv(65536)  # what already came, so the close is a FIN, not a reset
            except OSError:
                pass
        except OSError:
            pass
        try:
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        request.close()

    # the reader thread: a whole request

    def _dispatch(self, conn: _Pending) -> None:
        with self._count_lock:
            full = self.active >= self.max_connections
            if full:
                self.refused += 1
            else:
                self.active += 1
        if full:
            self._busy(conn)
            return
        try:
            threading.Thread(target=self._answer, args=(conn,), name="fleetops-metrics-answer", daemon=True).start()
        except RuntimeError:  # no thread to be had: turned away as busy
            with self._count_lock:
                self.active -= 1
            self._busy(conn)

    def _busy(self, conn: _Pending) -> None:
        try:
            conn.sock.send(_BUSY)  # non-blocking still: taken whole by a fresh send buffer, or dropped
        except OSError:
            pass
        conn.close()

    # an answering thread

    def _answer(self, conn: _Pending) -> None:
        try:
            conn.sock.setblocking(True)
            self._respond(conn.sock, conn.head or b"", conn.guard, conn.deadline)
        except (OSError, _Timeout):  # gone, or too slow to take the answer: nothing more to do
            pass
        except Exception:  # noqa: BLE001  (a bug must not kill the endpoint: said, and the connection closed)
            self.handle_error(conn.sock, None)
        finally:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
            with self._count_lock:
                self.active -= 1

    def _send(self, sock: socket.socket, status: int, body: str, content_type: str,
              extra: Iterable[tuple[str, str]] = ()) -> None:
        data = body.encode("utf-8")
        head = [f"HTTP/1.0 {status} {_STATUS[status]}", "Server: fleetops-agent", f"Content-Type: {content_type}",
                f"Content-Length: {len(data)}", "Connection: close"]
        head += [f"{key}: {value}" for key, value in extra]
        _send_all(sock, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data,
                  time.monotonic() + self.write_timeout_s)

    def _respond(self, sock: socket.socket, head: bytes, guard: webconfig.Guard | None, deadline: float) -> None:
        extra: list[tuple[str, str]] = list(guard.headers) if guard is not None else []
        if not head:
            self._send(sock, 431, "request head too long\n", _TEXT, extra)
            return
        request = _parse_head(head)
        if isinstance(request, int):
            self._send(sock, request, "bad request\n" if request == 400 else "too many header lines\n", _TEXT, extra)
            return
        if guard is not None:
            # the credentials are checked within the read deadline (bcrypt checks queue one at a time)
            verdict = guard.check(request.headers.get("authorization"), max(deadline, time.monotonic() + 1.0))
            if verdict == "busy":
                self._send(sock, 503, "busy checking credentials\n", _TEXT, [*extra, ("Retry-After", "1")])
                return
            if verdict != "ok":
                self._send(sock, 401, "unauthorized\n", _TEXT,
                           [*extra, ("WWW-Authenticate", 'Basic realm="fleetops-agent", charset="UTF-8"')])
                return
        if request.method != "GET":
            self._send(sock, 405, "method not allowed: only GET\n", _TEXT, [*extra, ("Allow", "GET")])
            return
        path = request.target.split("?", 1)[0]
        if path == "/metrics":
            try:
                text = self.get_text()
            except Exception as exc:  # a failed render answers 500, the server stays up  # noqa: BLE001
                self._send(sock, 500, f"render failed: {type(exc).__name__}\n", _TEXT, extra)
                return
            self._send(sock, 200, text, CONTENT_TYPE, extra)
        elif path == "/":
            self._send(sock, 200, _INDEX, "text/html; charset=utf-8", extra)
        else:
            self._send(sock, 404, "not found: only /metrics\n", _TEXT, extra)

    def server_close(self) -> None:
        super().server_close()
        if _READERS:
            _READERS[0].drop(self)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        sys.stderr.write(f"fleetops-agent serve: metrics endpoint: {client_address}: {type(exc).__name__}: {exc}\n")


def start_server(address: str, port: int, get_text: Callable[[], str], poll_s: float = 0.5, *,
                 web: webconfig.Source | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_pending: int = MAX_PENDING, read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> tuple[threading.Thread, MetricsServer]:
    """Serves ``get_text()`` at ``GET /metrics`` from a daemon thread. ``port`` 0 takes a free
    one (``server.server_address[1]`` says which). Stop with ``server.shutdown()`` then
    ``server.server_close()``; ``shutdown`` waits up to ``poll_s``, which is also how often the
    idle server wakes (a resident daemon that never shuts it down asks for seldom). ``web``
    (``fleetops.agent.webconfig.Source``) adds TLS and basic authentication."""
    server = MetricsServer((address, port), get_text, web=web, max_connections=max_connections,
                           max_pending=max_pending, read_timeout_s=read_timeout_s, write_timeout_s=write_timeout_s)
    thread = threading.Thread(target=server.serve_forever, args=(poll_s,), name="fleetops-metrics", daemon=True)
    thread.start()
    return thread, server
