"""The Prometheus endpoint held against hostile or careless clients, over real sockets on
127.0.0.1: a whole-request deadline, a connection cap answered at the door, basic auth and TLS
from the exporters' web-config file, and a bad web-config refused at startup.

Bounds are generous (a loaded two-core CI machine): the tests assert what happens (cut off,
turned away, answered), and bound only how late, never how early or how fast."""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops.agent import metrics, webconfig
from fleetops.sim import gpu as sim

PAGE = "fleetops_agent_up 1\n"
AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
LATE_S = 30.0  # the latest anything may happen on a loaded machine


class Served:
    def __init__(self, **kwargs: Any) -> None:
        self.thread, self.server = metrics.start_server("127.0.0.1", 0, lambda: PAGE, poll_s=0.1, **kwargs)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def make(**kwargs: Any) -> Served:
        started.append(Served(**kwargs))
        return started[-1]

    yield make
    for s in started:
        s.close()


def get(port: int, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None,
        path: str = "/metrics") -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=LATE_S, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=LATE_S)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed (EOF or reset); False while it still waits."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except OSError:
        return True


def until(what: str, fn: Callable[[], Any], limit_s: float = LATE_S) -> Any:
    return polling.until(what, fn, limit_s, step_s=0.05)


# --- the deadline and the cap ------------------------------------------------------------------


def test_a_client_trickling_its_request_is_cut_off_at_the_deadline_while_another_is_served(serve: Callable[..., Served]) -> None:
    served = serve(read_timeout_s=2.0)
    slow = socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S)
    try:
        start = time.monotonic()
        slow.sendall(b"GET /metrics HTTP/1.0\r\n")
        header = b"X-Slow: " + b"a" * 600 + b"\r\n\r\n"  # a minute's worth at one byte per 0.1 s
        answered: list[tuple[int, float]] = []

        def other() -> None:
            t0 = time.monotonic()
            status = get(served.port)[0]
            answered.append((status, time.monotonic() - t0))

        cut_at = None
        for i, byte in enumerate(header):
            if i == 5:  # while the slow one holds its connection, a scrape comes
                helper = threading.Thread(target=other)
                helper.start()
            try:
                slow.send(bytes([byte]))
            except OSError:
                cut_at = time.monotonic() - start
                break
            if closed_by_server(slow):
                cut_at = time.monotonic() - start
                break
            time.sleep(0.1)
        helper.join(timeout=LATE_S)
    finally:
        slow.close()
    assert cut_at is not None, "the trickling client was never cut off"
    assert 1.5 <= cut_at <= 2.0 + LATE_S, cut_at  # at its deadline: a total, not per byte
    assert i < len(header) - 1  # before its request was whole
    assert answered and answered[0][0] == 200
    assert answered[0][1] < LATE_S


def test_an_idle_connection_is_closed_unanswered_at_the_deadline(serve: Callable[..., Served]) -> None:
    served = serve(read_timeout_s=1.0)
    idle = socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S)
    try:
        until("the server to close an idle connection", lambda: closed_by_server(idle))
    finally:
        idle.close()
    until("its place freed", lambda: served.server.active == 0)


def _drain(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_idle_clients_hold_no_thread_and_a_scrape_is_answered_meanwhile(serve: Callable[..., Served]) -> None:
    served = serve(read_timeout_s=LATE_S)
    assert _status(served.port) == 200  # the reader thread is started
    threads_before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S) for _ in range(150)]
    try:
        for s in idle[::2]:
            s.sendall(b"GET /metrics HTTP/1.0\r\n")  # half of them a request line, and never the rest
        until("150 connections pending", lambda: served.server.pending == 150)
        assert threading.active_count() <= threads_before + 1
        status, _, body = get(served.port)
        assert (status, body) == (200, PAGE.encode())
        assert served.server.refused == 0
    finally:
        for s in idle:
            s.close()
    until("the closed ones forgotten", lambda: served.server.pending == 0)


def test_connections_past_the_pending_cap_are_turned_away_at_the_door_and_a_scrape_follows(
        serve: Callable[..., Served]) -> None:
    served = serve(max_pending=3, read_timeout_s=6.0)  # held past the 40 connections below
    threads_before = threading.active_count()
    holders = [socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S) for _ in range(3)]
    extra: list[socket.socket] = []
    try:
        until("three connections pending", lambda: served.server.pending == 3)
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S)
            extra.append(s)
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answers = [_drain(s) for s in extra]
        # every extra one was answered 503 (or closed) by the accepting thread
        assert all(a == b"" or a.startswith(b"HTTP/1.0 503 ") for a in answers), answers[:3]
        assert sum(a.startswith(b"HTTP/1.0 503 ") for a in answers) >= 30
        assert served.server.refused >= 40
        assert served.server.pending <= 3
        assert threading.active_count() <= threads_before + 2
        # the held ones time out; then a scrape is answered
        until("a scrape answered once the held connections timed out", lambda: _status(served.port) == 200)
    finally:
        for s in holders + extra:
            s.close()


def test_requests_past_the_answering_cap_get_503_and_the_next_one_is_served() -> None:
    release = threading.Event()
    entered: list[int] = []

    def slow_page() -> str:
        entered.append(1)
        release.wait(LATE_S)
        return PAGE

    thread, server = metrics.start_server("127.0.0.1", 0, slow_page, poll_s=0.1, max_connections=2)
    port = server.server_address[1]
    results: list[int | None] = []
    try:
        held = [threading.Thread(target=lambda: results.append(_status(port))) for _ in range(2)]
        for t in held:
            t.start()
        until("two answers in progress", lambda: len(entered) == 2 and server.active == 2)
        threads_during = threading.active_count()
        status, headers, _ = get(port)
        assert status == 503 and headers["retry-after"] == "1"
        assert threading.active_count() <= threads_during + 1
        release.set()
        for t in held:
            t.join(timeout=LATE_S)
        assert results == [200, 200]
        assert _status(port) == 200
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _status(port: int) -> int | None:
    try:
        return get(port)[0]
    except OSError:
        return None


def test_the_listen_backlog_is_no_longer_five() -> None:
    assert metrics.MetricsServer.request_queue_size >= 128


def test_a_request_head_too_long_is_refused() -> None:
    served = Served(read_timeout_s=5.0)
    try:
        s = socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S)
        s.sendall(b"GET /metrics HTTP/1.0\r\n" + b"X-Long: " + b"a" * 40000 + b"\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        s.close()
        assert data.startswith(b"HTTP/1.0 431 ")
    finally:
        served.close()


# --- basic auth ------------------------------------------------------------------------------


def _hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # the lowest cost: fast tests


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _write(path: Path, doc: Any) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_wrong_password_gets_401_and_the_right_one_200_checked_once(serve: Callable[..., Served], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import bcrypt

    config = _write(tmp_path / "web.json", {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    checks: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    served = serve(web=webconfig.Source(config))
    for headers in ({}, _basic("prometheus", "wrong"), _basic("nobody", "s3cret"), {"Authorization": "Bearer x"},
                    {"Authorization": "Basic !!notbase64"}):
        status, answer, body = get(served.port, headers)
        assert status == 401, headers
        assert answer["www-authenticate"].startswith("Basic ")
        assert PAGE.encode() not in body
    assert get(served.port, path="/")[0] == 401  # every path, not only /metrics
    status, _, body = get(served.port, _basic("prometheus", "s3cret"))
    assert (status, body) == (200, PAGE.encode())
    checked = len(checks)
    for _ in range(3):  # the next scrapes are remembered, not bcrypt-checked again
        assert get(served.port, _basic("prometheus", "s3cret"))[0] == 200
    assert len(checks) == checked
    assert get(served.port, _basic("prometheus", "s3cretX"))[0] == 401  # a remembered user, a wrong password


def test_a_changed_web_config_is_taken_and_a_broken_one_keeps_the_last_good(serve: Callable[..., Served], tmp_path: Path) -> None:
    path = tmp_path / "web.json"
    _write(path, {"basic_auth_users": {"prometheus": _hash("one")}})
    source = webconfig.Source(str(path), recheck_s=0.0)
    served = serve(web=source)
    assert get(served.port, _basic("prometheus", "one"))[0] == 200
    _write(path, {"basic_auth_users": {"prometheus": _hash("two")}})
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    until("the new password", lambda: get(served.port, _basic("prometheus", "two"))[0] == 200)
    assert get(served.port, _basic("prometheus", "one"))[0] == 401
    path.write_text('{"basic_auth_users": {"prometheus": "in the clear"}}')
    os.utime(path, ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    assert get(served.port)[0] == 401  # never unprotected
    assert get(served.port, _basic("prometheus", "two"))[0] == 200
    assert source.error is not None and "basic_auth_users.prometheus" in source.error


# --- TLS ---------------------------------------------------------------------------------------


def _self_signed(folder: Path, name: str = "server", issuer: tuple[Any, Any] | None = None) -> tuple[Path, Path, Any]:
    """A certificate for 127.0.0.1 and its key (PEM files), signed by ``issuer`` (certificate,
    key) or by itself; the key is returned for signing others."""
    crypto = pytest.importorskip("cryptography")
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer[0].subject if issuer else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                              critical=False)
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, (cert, key)


def test_tls_with_a_self_signed_certificate_and_basic_auth(serve: Callable[..., Served], tmp_path: Path) -> None:
    cert, key, _ = _self_signed(tmp_path)
    config = _write(tmp_path / "web.json", {
        "tls_server_config": {"cert_file": cert.name, "key_file": key.name},  # relative to the file's folder
        "basic_auth_users": {"prometheus": _hash("s3cret")},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    })
    served = serve(web=webconfig.Source(config), read_timeout_s=2.0)
    client = ssl.create_default_context(cafile=str(cert))
    status, headers, body = get(served.port, _basic("prometheus", "s3cret"), context=client)
    assert (status, body) == (200, PAGE.encode())
    assert headers["x-content-type-options"] == "nosniff"
    assert get(served.port, _basic("prometheus", "nope"), context=client)[0] == 401
    # plain HTTP to the TLS endpoint gets no page
    with pytest.raises((http.client.HTTPException, OSError)):
        get(served.port, _basic("prometheus", "s3cret"))
    # a client that connects and never starts its handshake is dropped at the deadline
    idle = socket.create_connection(("127.0.0.1", served.port), timeout=LATE_S)
    try:
        until("the server to drop a handshake never begun", lambda: closed_by_server(idle))
    finally:
        idle.close()
    assert get(served.port, _basic("prometheus", "s3cret"), context=client)[0] == 200


def test_client_certificates_are_verified_when_required(serve: Callable[..., Served], tmp_path: Path) -> None:
    ca_cert, _, ca = _self_signed(tmp_path, "ca")
    cert, key, _ = _self_signed(tmp_path, "server", issuer=ca)
    client_cert, client_key, _ = _self_signed(tmp_path, "client", issuer=ca)
    config = _write(tmp_path / "web.json", {"tls_server_config": {
        "cert_file": str(cert), "key_file": str(key), "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": str(ca_cert), "min_version": "TLS12"}})
    served = serve(web=webconfig.Source(config))
    anonymous = ssl.create_default_context(cafile=str(ca_cert))
    with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
        get(served.port, context=anonymous)
    known = ssl.create_default_context(cafile=str(ca_cert))
    known.load_cert_chain(str(client_cert), str(client_key))
    assert get(served.port, context=known)[0] == 200


# --- bad web-config files ----------------------------------------------------------------------


def _bad_configs(folder: Path) -> list[tuple[Any, str]]:
    cert = folder / "c.crt"
    cert.write_text("not a certificate\n")
    key = folder / "c.key"
    key.write_text("not a key\n")
    good = {"cert_file": str(cert), "key_file": str(key)}
    return [
        ({"tls_server_config": {"cert_file": str(cert)}}, "tls_server_config.key_file"),
        ({"tls_server_config": {"cert_file": str(folder / "missing.crt"), "key_file": str(key)}},
         "tls_server_config.cert_file"),
        ({"tls_server_config": good}, "tls_server_config.cert_file"),  # not PEM
        ({"tls_server_config": {**good, "min_version": "TLS9"}}, "tls_server_config.min_version"),
        ({"tls_server_config": {**good, "client_auth_type": "RequireAnyClientCert"}},
         "tls_server_config.client_auth_type"),
        ({"tls_server_config": {**good, "client_auth_type": "RequireAndVerifyClientCert"}},
         "tls_server_config.client_ca_file"),
        ({"tls_server_config": {**good, "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}},
         "tls_server_config.cipher_suites"),
        ({"basic_auth_users": {"prometheus": "s3cret"}}, "basic_auth_users.prometheus"),
        ({"basic_auth_users": ["prometheus"]}, "basic_auth_users"),
        ({"rate_limit": {"interval": "1s", "burst": 5}}, "rate_limit"),
        ({"http_server_config": {"headers": {"X-Evil": "1"}}}, "http_server_config.headers.X-Evil"),
        (["tls_server_config"], "expected a mapping"),
    ]


def test_each_malformed_web_config_is_refused_naming_the_file_and_the_field(tmp_path: Path) -> None:
    for i, (doc, field) in enumerate(_bad_configs(tmp_path)):
        path = _write(tmp_path / f"web{i}.json", doc)
        with pytest.raises(webconfig.WebConfigError) as err:
            webconfig.load(path)
        assert path in str(err.value) and field in str(err.value), (doc, str(err.value))


def test_a_yaml_web_config_reads_as_the_exporters_write_it(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    hashed = _hash("s3cret").replace("$2b$", "$2y$")  # as htpasswd -B writes it
    path = tmp_path / "web.yml"
    path.write_text(f"# as in the exporter toolkit's docs\nbasic_auth_users:\n  prometheus: {hashed}\n")
    config = webconfig.load(str(path))
    assert config.users == {"prometheus": hashed.encode()}
    guard = webconfig.Guard(config)
    assert guard.check(_basic("prometheus", "s3cret")["Authorization"], time.monotonic() + LATE_S) == "ok"
    path.write_text("basic_auth_users: [unclosed\n")
    with pytest.raises(webconfig.WebConfigError, match="web.yml: not valid JSON or YAML"):
        webconfig.load(str(path))


def test_the_daemon_refuses_to_start_on_a_bad_web_config_and_serves_with_a_good_one(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    bad = _write(tmp_path / "web.json", {"basic_auth_users": {"prometheus": "s3cret"}})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--states", str(state),
           "--metrics-address", f"127.0.0.1:{port}", "--web-config-file", bad]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    error = json.loads(proc.stderr.strip().splitlines()[-1])["error"]
    assert bad in error and "basic_auth_users.prometheus" in error
    good = _write(tmp_path / "web.json", {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    with subprocess.Popen(cmd[:-1] + [good], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as daemon:
        try:
            until("the endpoint", lambda: _status(port) == 401, limit_s=60)
            status, _, body = until("the page", lambda: (lambda a: a if a[0] == 200 and b"fleetops_agent_up 1" in a[2]
                                                         else None)(get(port, _basic("prometheus", "s3cret"))),
                                    limit_s=60)
            assert status == 200
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)


def _snapshot(state: Path) -> dict[str, Any] | None:
    """The daemon's snapshot from its unix socket (the sampler's side, not the endpoint's)."""
    path = str(state.with_suffix("")) + ".agent/agent.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(LATE_S)
    try:
        s.connect(path)
        s.sendall(b"snapshot\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        doc: dict[str, Any] = json.loads(data)
        return doc
    except (OSError, ValueError):
        return None
    finally:
        s.close()


def test_the_daemon_keeps_sampling_while_its_endpoint_is_held_and_flooded(tmp_path: Path) -> None:
    """Every connection place held by idle clients, a trickler, and a flood of new connections
    turned away at the door: the sampler still takes its samples, and once the clients are gone
    the page is served."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5", "--hang-timeout", "5",
           "--states", str(state), "--metrics-address", f"127.0.0.1:{port}"]
    held: list[socket.socket] = []
    stop = threading.Event()
    refused: list[int] = []

    def flood() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=LATE_S) as c:
                    c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    if c.recv(64).startswith(b"HTTP/1.0 503 "):
                        refused.append(1)
            except OSError:
                pass

    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as daemon:
        try:
            until("the endpoint", lambda: _status(port) == 200, limit_s=60)
            for _ in range(metrics.MAX_PENDING + 20):
                c = socket.create_connection(("127.0.0.1", port), timeout=LATE_S)
                c.sendall(b"GET /metrics HTTP/1.0\r\n")  # and never the blank line
                held.append(c)
            flooder = threading.Thread(target=flood)
            flooder.start()
            try:
                first = until("a snapshot", lambda: (_snapshot(state) or {}).get("collected_at"), limit_s=60)
                later = until("a later full snapshot while the endpoint is held",
                              lambda: (lambda d: d if d and d.get("collected_at", first) > first else None)(
                                  _snapshot(state)), limit_s=60)
                assert later["daemon"]["age_s"] < LATE_S
                until("connections turned away at the door", lambda: len(refused) >= 5, limit_s=60)
            finally:
                stop.set()
                flooder.join(timeout=LATE_S)
            for c in held:
                c.close()
            until("the page once the clients are gone", lambda: _status(port) == 200, limit_s=60)
        finally:
            for c in held:
                c.close()
            daemon.terminate()
            daemon.wait(timeout=60)


def test_the_endpoint_imports_tls_and_bcrypt_only_when_configured(tmp_path: Path) -> None:
    """The daemon stays small: ssl, bcrypt and the web-config reader are loaded only for a
    web-config that asks for them, and a JSON one is read without PyYAML."""
    config = _write(tmp_path / "web.json", {"basic_auth_users": {"prometheus": _hash("s3cret")}})
    code = (
        "import sys\n"
        "from fleetops.agent import metrics\n"
        "thread, server = metrics.start_server('127.0.0.1', 0, lambda: 'x 1\\n')\n"
        "server.shutdown(); server.server_close()\n"
        "plain = sorted(m for m in ('ssl', 'bcrypt', 'yaml', 'fleetops.agent.webconfig') if m in sys.modules)\n"
        "from fleetops.agent import webconfig\n"
        f"webconfig.Source({config!r})\n"
        "auth = sorted(m for m in ('ssl', 'bcrypt', 'yaml') if m in sys.modules)\n"
        "print(plain, auth)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "['bcrypt']"]


def test_out_of_descriptors_the_endpoint_waits_and_answers_once_clients_go(tmp_path: Path) -> None:
    """With the process out of file descriptors, accepting fails until a client goes; the
    endpoint neither dies nor spins, and answers once descriptors free up."""
    code = (
        "import resource, sys, time\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))\n"
        "from fleetops.agent import metrics\n"
        "thread, server = metrics.start_server('127.0.0.1', 0, lambda: 'x 1\\n', read_timeout_s=60.0)\n"
        "print(server.server_address[1], flush=True)\n"
        "sys.stdin.read()\n"
        "print(time.process_time(), flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    held: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(80):  # more than the server can take descriptors for
            held.append(socket.create_connection(("127.0.0.1", port), timeout=LATE_S))
        probe = held[-1]
        probe.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        probe.settimeout(2.0)
        with pytest.raises(TimeoutError):  # not accepted: no descriptor for it
            probe.recv(100)
        for s in held:
            s.close()
        held.clear()
        until("an answer once descriptors are free", lambda: _status(port) == 200)
        proc.stdin.close()
        assert float(proc.stdout.readline()) >= 0  # the server process lived through it
    finally:
        for s in held:
            s.close()
        proc.kill()
        proc.wait(timeout=30)


def test_a_yaml_web_config_without_pyyaml_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  prometheus: x\n")
    code = (
        "import sys\n"
        "sys.modules['yaml'] = None  # a node without PyYAML\n"
        "from fleetops.agent import webconfig\n"
        "try:\n"
        f"    webconfig.load({str(path)!r})\n"
        "except webconfig.WebConfigError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{path}: not JSON, and PyYAML is not installed"), proc.stdout
