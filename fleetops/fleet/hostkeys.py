"""known_hosts as OpenSSH reads it: plain and hashed names, wildcards, ``@revoked``, ``@cert-authority``.

paramiko's ``HostKeys.load`` reads one file into memory and raises ``InvalidHostKey`` on a line it
cannot take, and a marker line (``@cert-authority *.example.com ssh-ed25519 ...``) is such a line:
one CA entry made every host fail. It also knows neither markers nor wildcard patterns. So the
lines are split here (marker, host patterns) and each key is decoded by paramiko's own
``HostKeyEntry.from_line``; a line that cannot be read is skipped and named, never fatal for the
other hosts. Files are re-read when their size, mtime or inode change: a long TUI session sees a
fixed entry without a restart.

paramiko cannot verify host certificates, so a host covered only by a ``@cert-authority`` line
gets a ``hostkey`` error that says to add the host's own key.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import re
import threading
from dataclasses import dataclass, field

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys, InvalidHostKey

GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
DEFAULT_USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


def hostkey_name(address: str, port: int) -> str:
    """The name a host's key is filed under: ``addr``, or ``[addr]:port`` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


@dataclass(frozen=True)
class Entry:
    patterns: tuple[str, ...]
    key: paramiko.PKey
    marker: str  # "" | "revoked" | "cert-authority"
    where: str  # FILE:LINE, for messages


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        # OpenSSH's hashed form |1|salt|hash; paramiko computes the same hash for a name
        return hmac.compare_digest(HostKeys.hash_host(name, pattern), pattern)
    if "*" not in pattern and "?" not in pattern:
        return pattern.lower() == name.lower()
    # OpenSSH's wildcards are * and ? only: "[host]:port" brackets are literal (fnmatch's are classes)
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, name.lower()) is not None


def names_match(patterns: tuple[str, ...], name: str) -> bool:
    """OpenSSH's rule: some pattern matches and no negated (``!pat``) one does."""
    hit = False
    for pattern in patterns:
        if pattern.startswith("!"):
            if _pattern_matches(pattern[1:], name):
                return False
        elif _pattern_matches(pattern, name):
            hit = True
    return hit


def parse(text: str, path: str) -> tuple[list[Entry], list[str]]:
    """Entries of one known_hosts text, and a note for each line skipped (FILE:LINE: why)."""
    entries: list[Entry] = []
    skipped: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        marker = ""
        if line.startswith("@"):
            first, _, line = line.partition(" ")
            line = line.strip()
            if first not in ("@revoked", "@cert-authority"):
                skipped.append(f"{where}: unknown marker {first}")
                continue
            marker = first[1:]
        try:
            entry = HostKeyEntry.from_line(" ".join(line.split()), lineno)
        except (InvalidHostKey, paramiko.SSHException, ValueError) as exc:
            skipped.append(f"{where}: unreadable key ({type(exc).__name__})")
            continue
        if entry is None or entry.key is None:
            skipped.append(f"{where}: key type not supported or line incomplete")
            continue
        entries.append(Entry(tuple(entry.hostnames), entry.key, marker, where))
    return entries, skipped


@dataclass
class _File:
    signature: tuple[int, int, int] | None = None
    entries: list[Entry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """What the known_hosts files say of a host: its usable keys, revoked keys, CA lines."""

    known: dict[str, paramiko.PKey]  # keytype -> key, revoked ones left out
    revoked: list[Entry]
    authorities: list[Entry]

    def revoked_entry(self, key: paramiko.PKey) -> Entry | None:
        return next((e for e in self.revoked if e.key == key), None)


def revoked_message(name: str, key: paramiko.PKey, entry: Entry) -> str:
    return (
        f"host key of {name} ({key.get_name()} {key.fingerprint}) is REVOKED by {entry.where}: "
        "refused; the host needs a new key (or the @revoked line is wrong)"
    )


def ca_only_message(name: str, files: list[str], authorities: list[Entry]) -> str:
    return (
        f"{name} is known only through @cert-authority ({authorities[0].where}) and paramiko cannot "
        f"verify host certificates: add the host's own key to {files[0]} (verify it, then "
        f"ssh-keyscan {_keyscan_target(name)} >> {files[0]}), or run once with --accept-new-hostkeys"
    )


def _keyscan_target(name: str) -> str:
    if name.startswith("[") and "]:" in name:
        host, _, port = name[1:].partition("]:")
        return f"-p {port} {host}"
    return name


class KnownHosts:
    """known_hosts files shared by every connection of a run; appends are locked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}

    def _load(self, path: str) -> _File:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._files[path] = _File()
            return self._files[path]
        except OSError as exc:
            raise OSError(f"cannot read known_hosts {path}: {exc.strerror or exc}") from exc
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        cached = self._files.get(path)
        if cached is not None and cached.signature == signature:
            return cached
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise OSError(f"cannot read known_hosts {path}: {exc.strerror or exc}") from exc
        entries, skipped = parse(text, path)
        loaded = _File(signature, entries, skipped)
        self._files[path] = loaded
        return loaded

    def skipped(self, paths: list[str]) -> list[str]:
        with self._lock:
            return [note for p in paths for note in self._load(p).skipped]

    def verdict(self, paths: list[str], name: str) -> Verdict:
        """The keys ``paths`` hold for ``name`` (files re-read if they changed since last time)."""
        known: dict[str, paramiko.PKey] = {}
        revoked: list[Entry] = []
        authorities: list[Entry] = []
        plain: list[Entry] = []
        with self._lock:
            for path in paths:
                for entry in self._load(path).entries:
                    if not names_match(entry.patterns, name):
                        continue
                    if entry.marker == "revoked":
                        revoked.append(entry)
                    elif entry.marker == "cert-authority":
                        authorities.append(entry)
                    else:
                        plain.append(entry)
        for entry in plain:
            if any(r.key == entry.key for r in revoked):
                continue  # OpenSSH: a revoked key stays refused wherever else it is listed
            known.setdefault(entry.key.get_name(), entry.key)
        return Verdict(known, revoked, authorities)

    def add(self, path: str, name: str, key: paramiko.PKey) -> None:
        with self._lock:
            entry = self._load(path)
            if any(e.key == key and not e.marker and names_match(e.patterns, name) for e in entry.entries):
                return
            folder = os.path.dirname(path)
            if folder:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")
