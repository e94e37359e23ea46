"""TLS and basic authentication for the agent's Prometheus endpoint, configured by the
web-config file that Prometheus exporters share (``--web.config.file`` of the exporter toolkit;
here ``fleetops-agent serve --web-config-file``).

What is read: ``tls_server_config`` (``cert_file``, ``key_file``, ``client_auth_type``,
``client_ca_file``, ``min_version``, ``max_version``), ``basic_auth_users`` (user: bcrypt hash)
and ``http_server_config`` (``headers``; ``http2`` is accepted and has no effect, the endpoint
speaks HTTP/1.0). Anything else the format knows (inline ``cert``/``key``, cipher suites, curve
preferences, allowed SANs, rate limits) is refused by name: a protection asked for and silently
left out would serve the page less protected than the operator believes.

The file is JSON or YAML (JSON is YAML): the node's agent reads JSON without PyYAML, which the
role does not install there, and a YAML file needs PyYAML, said clearly when it is missing.
Every error names the file and the field, and a bad file stops the daemon at startup. While
serving, a changed file (or certificate, key, CA) is read again on the next connection, as the
exporter toolkit does; a bad new version is refused on stderr and the last good one stays.

Imported only when ``--web-config-file`` is given: ``ssl`` when TLS is configured, ``bcrypt``
(the ``fleetops[web]`` extra) when users are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# client_auth_type values the endpoint can honour, as ssl's verify modes (by name: ssl is
# imported only when TLS is on). RequestClientCert and RequireAnyClientCert accept a certificate
# nobody verified, which Python's ssl cannot do; they are refused rather than quietly tightened.
CLIENT_AUTH_TYPES = {"NoClientCert": "CERT_NONE", "VerifyClientCertIfGiven": "CERT_OPTIONAL",
                     "RequireAndVerifyClientCert": "CERT_REQUIRED"}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
           "Strict-Transport-Security")
_TOP_KEYS = ("tls_server_config", "basic_auth_users", "http_server_config")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")
_HTTP_KEYS = ("headers", "http2")
# $2a$, $2b$ and $2y$ (htpasswd -B), the cost, then 22 characters of salt and 31 of hash.
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
INSTALL_HINT = "pip install 'fleetops[web]' (or add bcrypt to the agent's virtualenv)"


class WebConfigError(ValueError):
    """A web-config file that cannot be served as written; the text names the file and field."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"


@dataclass(frozen=True)
class WebConfig:
    path: str
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()

    def files(self) -> tuple[str, ...]:
        """The files whose change means reading the configuration again."""
        if self.tls is None:
            return (self.path,)
        return tuple(p for p in (self.path, self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if p)


def _fail(path: str, where: str, message: str) -> WebConfigError:
    return WebConfigError(f"{path}: {where}: {message}")


def read_document(path: str) -> Any:
    """The file's content: JSON, else YAML through PyYAML when it is installed."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read the web-config file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise WebConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        import yaml
    except ImportError:
        raise WebConfigError(f"{path}: not JSON, and PyYAML is not installed to read YAML "
                             "(write the file as JSON, which is YAML too, or install PyYAML)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not valid JSON or YAML: {exc}") from exc


def _mapping(path: str, where: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in known:
            raise _fail(path, f"{where}.{key}" if where else str(key),
                        f"not supported by fleetops-agent (supported: {', '.join(known)})")
    return value


def _string(path: str, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, where, f"expected a non-empty string, got {value!r}")
    return value


def _file(path: str, where: str, value: Any) -> str:
    """A path, relative ones taken from the web-config file's folder; it must be readable."""
    name = os.path.join(os.path.dirname(os.path.abspath(path)), _string(path, where, value))
    try:
        with open(name, "rb"):
            pass
    except OSError as exc:
        raise _fail(path, where, f"cannot read {name}: {exc.strerror or exc}") from exc
    return name


def _tls(path: str, value: Any) -> TlsSettings | None:
    if value is None:
        return None
    data = _mapping(path, "tls_server_config", value, _TLS_KEYS)
    for key in ("cert_file", "key_file"):
        if key not in data:
            raise _fail(path, f"tls_server_config.{key}", "missing (a TLS configuration needs cert_file and key_file)")
    auth = data.get("client_auth_type", "NoClientCert")
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise _fail(path, "tls_server_config.client_auth_type",
                    f"{auth} accepts client certificates nobody verifies; not supported, use "
                    "RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file")
    if auth not in CLIENT_AUTH_TYPES:
        raise _fail(path, "tls_server_config.client_auth_type",
                    f"{auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}")
    ca = _file(path, "tls_server_config.client_ca_file", data["client_ca_file"]) if data.get("client_ca_file") else None
    if ca and auth == "NoClientCert":
        raise _fail(path, "tls_server_config.client_ca_file",
                    "set without client_auth_type: say RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
    if auth != "NoClientCert" and not ca:
        raise _fail(path, "tls_server_config.client_ca_file", f"client_auth_type {auth} needs the CA to verify with")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[key] = data.get(key, default)
        if versions[key] not in TLS_VERSIONS:
            raise _fail(path, f"tls_server_config.{key}", f"{versions[key]!r} is not one of {', '.join(TLS_VERSIONS)}")
    if list(TLS_VERSIONS).index(versions["min_version"]) > list(TLS_VERSIONS).index(versions["max_version"]):
        raise _fail(path, "tls_server_config.min_version", f"{versions['min_version']} is above max_version "
                    f"{versions['max_version']}")
    return TlsSettings(cert_file=_file(path, "tls_server_config.cert_file", data["cert_file"]),
                       key_file=_file(path, "tls_server_config.key_file", data["key_file"]),
                       client_auth_type=auth, client_ca_file=ca, **versions)


def _users(path: str, value: Any) -> dict[str, bytes]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, "basic_auth_users", f"expected a mapping of user: bcrypt hash, got {type(value).__name__}")
    users: dict[str, bytes] = {}
    for user, hashed in value.items():
        where = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise _fail(path, where, "a user name is a non-empty string without ':'")
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            raise _fail(path, where, "expected a bcrypt hash ($2y$10$... as `htpasswd -nBC 10 \"\"` prints it); "
                        "passwords are never written in the clear")
        users[user] = hashed.encode("ascii")
    if users:
        try:
            import bcrypt  # noqa: F401  (checked here, so a node without it refuses to start)
        except ImportError:
            raise _fail(path, "basic_auth_users", f"needs the bcrypt package: {INSTALL_HINT}") from None
    return users


def _headers(path: str, value: Any) -> tuple[tuple[str, str], ...]:
    data = _mapping(path, "http_server_config", value, _HTTP_KEYS)
    if "http2" in data and not isinstance(data["http2"], bool):
        raise _fail(path, "http_server_config.http2", f"expected true or false, got {data['http2']!r}")
    headers = _mapping(path, "http_server_config.headers", data.get("headers"), HEADERS)
    out = []
    for name, text in headers.items():
        if text in (None, ""):
            continue
        if not isinstance(text, str) or "\r" in text or "\n" in text:
            raise _fail(path, f"http_server_config.headers.{name}", f"expected one line of text, got {text!r}")
        out.append((name, text))
    return tuple(out)


def load(path: str) -> WebConfig:
    """The configuration in ``path``, checked whole (TLS files loaded, hashes parsed); raises
    ``WebConfigError`` naming the file and the field."""
    doc = read_document(path)
    data = _mapping(path, "", doc, _TOP_KEYS)
    config = WebConfig(path=path, tls=_tls(path, data.get("tls_server_config")),
                       users=_users(path, data.get("basic_auth_users")),
                       headers=_headers(path, data.get("http_server_config")))
    if config.tls is not None:
        tls_context(config)  # a certificate that does not load refuses the start, not the first scrape
    return config


def tls_context(config: WebConfig) -> Any:
    """The server's ``ssl.SSLContext`` for ``config.tls``."""
    import ssl

    tls = config.tls
    assert tls is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = getattr(ssl.TLSVersion, TLS_VERSIONS[tls.min_version])
        ctx.maximum_version = getattr(ssl.TLSVersion, TLS_VERSIONS[tls.max_version])
    except (ValueError, ssl.SSLError) as exc:
        raise _fail(config.path, "tls_server_config.min_version", f"this OpenSSL refuses it: {exc}") from exc
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as exc:
        raise _fail(config.path, "tls_server_config.cert_file",
                    f"{tls.cert_file} and key_file {tls.key_file} are not a PEM certificate and its key: {exc}") from exc
    except OSError as exc:
        raise _fail(config.path, "tls_server_config.cert_file", f"cannot load: {exc.strerror or exc}") from exc
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise _fail(config.path, "tls_server_config.client_ca_file",
                        f"{tls.client_ca_file} is not a PEM CA certificate: {exc}") from exc
    ctx.verify_mode = getattr(ssl, CLIENT_AUTH_TYPES[tls.client_auth_type])
    return ctx


# --- at serving time ------------------------------------------------------------------------

OK, DENIED, BUSY = "ok", "denied", "busy"


class Guard:
    """One loaded configuration at work: the TLS context, and basic authentication whose
    successful checks are remembered (a bcrypt check costs tens of milliseconds by design, and
    Prometheus sends the same credentials every scrape). A remembered password is kept only as
    an HMAC under a key of this process, compared in constant time; a wrong one is checked by
    bcrypt every time, one check at a time, so a guessing client costs at most one core."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.tls_context = tls_context(config) if config.tls is not None else None
        self.headers = config.headers
        self._key = os.urandom(32)
        self._verified: dict[str, bytes] = {}
        self._bcrypt_lock = threading.Lock()
        # an unknown user is checked against a real hash too, so the answer takes as long
        self._decoy = next(iter(config.users.values()), b"")

    @property
    def auth_required(self) -> bool:
        return bool(self.config.users)

    def check(self, authorization: str | None, deadline: float) -> str:
        """OK, DENIED, or BUSY when the check could not run before ``deadline``."""
        if not self.config.users:
            return OK
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return DENIED
        user, password = credentials
        digest = hmac.new(self._key, user.encode("utf-8") + b"\0" + password, hashlib.sha256).digest()
        remembered = self._verified.get(user)
        if remembered is not None and hmac.compare_digest(remembered, digest):
            return OK
        hashed = self.config.users.get(user)
        if not self._bcrypt_lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
            return BUSY
        try:
            import bcrypt

            try:
                good = bcrypt.checkpw(password, hashed or self._decoy)
            except ValueError:  # a password bcrypt refuses (a NUL byte): no match
                good = False
        finally:
            self._bcrypt_lock.release()
        if good and hashed is not None:
            self._verified[user] = digest
            return OK
        return DENIED


def _basic_credentials(authorization: str | None) -> tuple[str, bytes] | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class Source:
    """The current ``Guard`` for a web-config file, read again when the file, or a certificate,
    key or CA it names, changes (checked at most every ``recheck_s``). A new version that does
    not load is said on stderr once and the last good one keeps serving: never less protected."""

    def __init__(self, path: str, recheck_s: float = 1.0) -> None:
        self.path = path
        self.recheck_s = recheck_s
        self._guard = Guard(load(path))
        self._stamp = self._stamps(self._guard.config)
        self._checked = time.monotonic()
        self._failed: object = None
        self._lock = threading.Lock()
        self.error: str | None = None  # why the last change was refused; None once one loads

    @staticmethod
    def _stamps(config: WebConfig) -> tuple[tuple[str, int, int], ...]:
        out = []
        for name in config.files():
            try:
                st = os.stat(name)
                out.append((name, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((name, -1, -1))
        return tuple(out)

    def current(self) -> Guard:
        """The guard in force, without looking at the files (for the accepting thread)."""
        return self._guard

    def guard(self) -> Guard:
        now = time.monotonic()
        if now - self._checked < self.recheck_s or not self._lock.acquire(blocking=False):
            return self._guard
        try:
            self._checked = now
            stamp = self._stamps(self._guard.config)
            if stamp in (self._stamp, self._failed):
                return self._guard
            try:
                guard = Guard(load(self.path))
            except WebConfigError as exc:
                self._failed = stamp
                self.error = str(exc)
                sys.stderr.write(f"fleetops-agent serve: web-config change refused, the last good one stays: {exc}\n")
                return self._guard
            self._guard, self._stamp, self._failed, self.error = guard, self._stamps(guard.config), None, None
            return guard
        finally:
            self._lock.release()
