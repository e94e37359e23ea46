"""Run one command on many hosts in parallel: SSH through paramiko, or locally.

``run_all`` connects to every host (at most ``forks`` at a time), runs the command, and returns
one ``Result`` per host; ``SessionPool`` keeps one connection per host open and re-runs a command
on demand (a TUI refreshing every few seconds).

Every failure comes back as a ``Result`` with an ``error_kind``, never as an exception:

- ``unreachable``: refused, no route, unknown name, connection lost
- ``timeout``: TCP connect, SSH banner/negotiation, authentication or the command ran out of time.
  A host that accepts TCP but never says anything (a hung sshd) comes back after about
  ``connect_timeout`` and never holds up the others.
- ``auth``: the key was refused, or sudo refused the become (``ansible_become``: a password wanted)
- ``hostkey``: the host key is unknown (refused unless ``accept_new_hostkeys`` or
  StrictHostKeyChecking accept-new/no), changed, revoked (``@revoked``), or the host is covered only
  by a ``@cert-authority`` line (paramiko cannot verify host certificates). Always refused except
  the unknown case when accepting. Files: the ``known_hosts`` argument when given, else
  UserKnownHostsFile (inventory ssh args, then ssh_config), else ``~/.ssh/known_hosts``; plus
  GlobalKnownHostsFile (default ``/etc/ssh/ssh_known_hosts``). See ``hostkeys``.
- ``command``: it ran and exited non-zero (stderr kept; a missing program is exit 127, "not found")
- ``local``: a problem on this side (unreadable key file, cannot start a local process)
- ``outcome-unknown``: the command was sent, then the connection was lost before its answer came:
  it may have run, in part or in full. Never sent again by the transport; check the node.

A command is sent at most once. A pooled connection found dead before the command went out is
reopened and the command sent on the new one; once the exec request has gone out, a lost
connection is ``outcome-unknown``, unless the caller says the command only reads
(``idempotent=True``, e.g. a collect): then it is sent again once on a fresh connection by
``SessionPool`` and reported as ``unreachable`` if it still fails.

How a host is reached (address, port, user, key, ProxyJump chain, known_hosts files, become) is
resolved by ``sshconfig`` from the inventory and ssh_config as OpenSSH under Ansible would; a
ProxyJump hop is a paramiko connection whose ``direct-tcpip`` channel carries the next one.

The command is a list of arguments, quoted with ``shlex.join`` for the remote shell; ``env`` is
passed as ``env K=V ...`` in front of it (sshd drops most environment requests).

Long-lived streams (the TUI's daemon streams) have two openers with one contract:
``StreamOpener`` (a paramiko connection per stream) and ``OpenSSHStreamOpener`` (an ``ssh``
client process per stream, given the resolved Target as ``-o`` options with ``-F none``: the
handshake runs in C outside this interpreter and the stream is a pipe; targets behind jump
hosts go through paramiko). ``stream_opener`` picks one (``auto``: openssh where ``ssh`` is on
PATH).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import paramiko

from fleetops.fleet import hostkeys, sshconfig

OUTCOME_UNKNOWN = "outcome-unknown"
ERROR_KINDS = ("unreachable", "timeout", "auth", "hostkey", "command", "local", OUTCOME_UNKNOWN)
DEFAULT_KNOWN_HOSTS = hostkeys.DEFAULT_USER_KNOWN_HOSTS
GLOBAL_KNOWN_HOSTS = hostkeys.GLOBAL_KNOWN_HOSTS
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_READ_CHUNK = 65536

# paramiko logs every failed handshake with a traceback from its own thread; with no handler
# configured, logging's last resort prints that on stderr. Each failure is in its Result.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Result:
    host: str
    ok: bool
    exit_status: int | None
    stdout: str
    stderr: str
    error_kind: str | None
    error: str | None
    elapsed_s: float


class _Failure(Exception):
    """A classified failure on one host; becomes a Result."""

    def __init__(
        self,
        kind: str,
        message: str,
        stdout: str = "",
        stderr: str = "",
        exit_status: int | None = None,
        sent: bool = False,
    ):
        super().__init__(message)
        self.kind, self.message = kind, message
        self.stdout, self.stderr, self.exit_status = stdout, stderr, exit_status
        self.sent = sent  # the exec request went out: sending it again could run it twice


_default_ssh_config: str | None = None


def set_default_ssh_config(path: str | None) -> None:
    """The ssh_config (``-F``) for connections whose caller names none: the CLI's option, set once
    per process so that every connection of a command (a Slurm host's too) reads the same file.
    A missing file is refused now, with its name."""
    global _default_ssh_config
    if path is not None:
        sshconfig.load_config(path)
    _default_ssh_config = path


def _chain(target: sshconfig.Target) -> str:
    return " -> ".join([j.name for j in target.jumps] + [target.name])


def command_line(
    command: Sequence[str], env: dict[str, str] | None = None, become: sshconfig.Become | None = None
) -> str:
    """The remote shell line for ``command``: ``shlex.join``, with ``env K=V`` in front if asked,
    and ``sudo -n -u USER --`` in front of that for ``become`` (``-n``: never wait on a password
    prompt nobody will answer)."""
    if isinstance(command, (str, bytes)):
        raise TypeError("command is a list of arguments (quoted with shlex.join), not a shell string")
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("command is empty")
    if env:
        bad = [k for k in env if not _ENV_NAME.match(str(k))]
        if bad:
            raise ValueError(f"env: not valid variable names: {bad}")
        argv = ["env"] + [f"{k}={v}" for k, v in env.items()] + argv
    if become is not None:
        argv = ["sudo", "-n", "-u", become.user, "--"] + argv
    return shlex.join(argv)


def become_refused(become: sshconfig.Become | None, status: int, stderr: str) -> str | None:
    """sudo's own refusal (password wanted, not allowed), which means the command never ran."""
    if become is None or status != 1:
        return None
    # sudo's word is its last line (sshd may have written a line of its own before it)
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if last.startswith("sudo:") and any(p in last for p in _SUDO_REFUSED):
        return (
            f"become: sudo -n -u {become.user} refused ({last}); the command did not run: give the "
            f"login user passwordless sudo for the agent (NOPASSWD in sudoers), or log in as {become.user}"
        )
    return None


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko when the host's key is not among the usable ones we loaded for it."""

    def __init__(self, store: hostkeys.KnownHosts, target: sshconfig.Target, verdict: hostkeys.Verdict) -> None:
        self.store, self.target, self.verdict = store, target, verdict

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        revoked = self.verdict.revoked_entry(key)
        if revoked is not None:
            raise _Failure("hostkey", hostkeys.revoked_message(hostname, key, revoked))
        files = list(self.target.known_hosts)
        if self.target.strict in ("accept-new", "no") and files:
            try:
                self.store.add(files[0], hostname, key)
            except OSError as exc:
                raise _Failure("local", f"cannot record the host key in {files[0]}: {exc}") from exc
            return
        every = files + list(self.target.global_known_hosts)
        if self.verdict.authorities and not self.verdict.known:
            raise _Failure("hostkey", hostkeys.ca_only_message(hostname, files or every, self.verdict.authorities))
        skipped = self.store.skipped(every)
        note = f" (lines skipped there: {'; '.join(skipped[:3])})" if skipped else ""
        raise _Failure(
            "hostkey",
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in {', '.join(every)}{note}: "
            "verify it and add it (ssh-keyscan), or accept new keys (--accept-new-hostkeys)",
        )


class _Client(paramiko.SSHClient):
    """An SSH client that owns the jump hosts' connections it was opened through."""

    def __init__(self) -> None:
        super().__init__()
        self.jumps: list[paramiko.SSHClient] = []

    def close(self) -> None:
        super().close()
        for jump in reversed(self.jumps):
            jump.close()
        self.jumps = []


_SUDO_REFUSED = ("a password is required", "a terminal is required", "is not in the sudoers", "not allowed to")


def classify_connect(exc: Exception, where: str, elapsed: float, t: float) -> _Failure:
    """The error kind and message of a failed connection attempt (``t``: its timeout, seconds)."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return _Failure(
            "hostkey",
            f"host key of {where} CHANGED: got {exc.key.get_name()} {exc.key.fingerprint}, known "
            f"{exc.expected_key.fingerprint}; if the host was reinstalled, verify and replace its known_hosts entry",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        if "timeout" in str(exc).lower():
            return _Failure("timeout", f"authentication timed out after {t:g}s on {where}")
        return _Failure("auth", f"authentication failed on {where}: {exc}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {
            os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
            for e in exc.errors.values()
        }
        return _Failure("unreachable", f"{where}: {'; '.join(sorted(reasons)).lower()}")
    if isinstance(exc, socket.gaierror):
        return _Failure("unreachable", f"{where}: cannot resolve the name ({exc.strerror or exc})")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return _Failure("timeout", f"{where}: TCP connect timed out after {t:g}s")
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        low = text.lower()
        if "banner" in low or "timed out" in low or "timeout" in low or elapsed >= 0.9 * t:
            return _Failure(
                "timeout",
                f"{where}: no SSH banner/handshake within {t:g}s (host accepts TCP but does not answer)",
            )
        return _Failure("unreachable", f"{where}: SSH negotiation failed: {text}")
    if isinstance(exc, EOFError):
        return _Failure("unreachable", f"{where}: connection closed by the host during the SSH handshake")
    if isinstance(exc, OSError):
        if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET):
            return _Failure("unreachable", f"{where}: {os.strerror(exc.errno).lower()}")
        return _Failure("unreachable", f"{where}: {exc}")
    return _Failure("local", f"{where}: {type(exc).__name__}: {exc}")


class _Runner:
    """Connects, runs and classifies; shared by run_all and SessionPool."""

    def __init__(
        self,
        connect_timeout: float,
        command_timeout: float,
        known_hosts: str | None,
        accept_new_hostkeys: bool,
        ssh_config: str | None = None,
        global_known_hosts: str | None = None,
    ) -> None:
        self.connect_timeout = float(connect_timeout)
        self.command_timeout = float(command_timeout)
        self.known_hosts = known_hosts
        self.accept_new = accept_new_hostkeys
        self.ssh_config = ssh_config if ssh_config is not None else _default_ssh_config
        self.store = hostkeys.KnownHosts()
        self._keys: dict[str, paramiko.PKey] = {}
        self._keys_lock = threading.Lock()
        try:
            config = sshconfig.load_config(self.ssh_config)
            self.config_error: str | None = None
        except sshconfig.ConfigError as exc:
            config, self.config_error = paramiko.SSHConfig(), str(exc)
        self.resolver = sshconfig.Resolver(config, known_hosts, accept_new_hostkeys, global_known_hosts)

    # -- keys -------------------------------------------------------------------------------

    def _pkey(self, path: str) -> paramiko.PKey:
        path = os.path.expanduser(path)
        with self._keys_lock:
            key = self._keys.get(path)
            if key is None:
                try:
                    key = paramiko.PKey.from_path(path)
                except paramiko.PasswordRequiredException as exc:
                    raise _Failure("local", f"key file {path} is encrypted; use an unencrypted key") from exc
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    raise _Failure("local", f"cannot read key file {path}: {exc}") from exc
                self._keys[path] = key
            return key

    def target(self, host: Any) -> sshconfig.Target:
        """How to reach ``host``: inventory, then ssh_config (a _Failure ``local`` if unusable)."""
        if self.config_error:
            raise _Failure("local", self.config_error)
        try:
            return self.resolver.resolve(host)
        except sshconfig.ConfigError as exc:
            raise _Failure("local", str(exc)) from exc

    # -- connect ----------------------------------------------------------------------------

    def connect(self, host: Any) -> paramiko.SSHClient:
        return self.connect_target(self.target(host))

    def connect_target(self, target: sshconfig.Target) -> paramiko.SSHClient:
        """Connect through ``target.jumps`` in order (each one's host key verified), then to it."""
        client = _Client()
        try:
            sock: paramiko.Channel | None = None
            hops = list(target.jumps) + [target]
            for i, hop in enumerate(hops):
                last = i == len(hops) - 1
                step = client if last else _Client()
                if not last:
                    client.jumps.append(step)
                try:
                    self._open(step, hop, sock)
                except _Failure as f:
                    if last and not target.jumps:
                        raise
                    via = f"jump host {hop.name} ({hop.where}): " if not last else ""
                    raise _Failure(f.kind, f"via {_chain(target)}: {via}{f.message}") from None
                if not last:
                    sock = self._forward(step, hops[i + 1], target)
            return client
        except BaseException:
            client.close()
            raise

    def _forward(self, jump: paramiko.SSHClient, nxt: sshconfig.Target, target: sshconfig.Target) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from ``jump`` to the next hop (what ``ssh -W`` does)."""
        transport = jump.get_transport()
        timeout = nxt.connect_timeout or self.connect_timeout
        try:
            assert transport is not None
            return transport.open_channel(
                "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=timeout
            )
        except (paramiko.SSHException, OSError, EOFError, AssertionError) as exc:
            text = str(exc) or type(exc).__name__
            kind = "timeout" if "timeout" in text.lower() or isinstance(exc, TimeoutError) else "unreachable"
            raise _Failure(
                kind, f"via {_chain(target)}: the jump host could not open a channel to {nxt.where}: {text}"
            ) from exc

    def _open(self, client: paramiko.SSHClient, target: sshconfig.Target, sock: paramiko.Channel | None) -> None:
        name = hostkeys.hostkey_name(target.hostname, target.port)
        files = list(target.known_hosts) + list(target.global_known_hosts)
        try:
            verdict = self.store.verdict(files, name)
        except OSError as exc:
            raise _Failure("local", str(exc)) from exc
        for keytype, key in verdict.known.items():
            client.get_host_keys().add(name, keytype, key)
        client.set_missing_host_key_policy(_HostKeyPolicy(self.store, target, verdict))
        # as ssh: IdentityFile entries that do not exist are passed over; none at all is an error
        present = [f for f in target.key_files if os.path.exists(os.path.expanduser(f))]
        if target.key_files and not present:
            raise _Failure("local", f"cannot read key file {target.key_files[0]}: no such file")
        pkey = self._pkey(present[0]) if present else None
        timeout = target.connect_timeout or self.connect_timeout
        started = time.monotonic()
        try:
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                pkey=pkey,
                key_filename=present[1:] or None,  # type: ignore[arg-type]  # paramiko takes a list (documented); the stubs say str
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                look_for_keys=pkey is None,
                allow_agent=pkey is None,
                sock=sock,
            )
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("no SSH session after connecting")
        except BaseException as exc:
            client.close()
            if isinstance(exc, _Failure):
                raise
            if isinstance(exc, paramiko.BadHostKeyException):
                revoked = verdict.revoked_entry(exc.key)
                if revoked is not None:
                    raise _Failure("hostkey", hostkeys.revoked_message(name, exc.key, revoked)) from exc
            if isinstance(exc, Exception):
                raise self._classify_connect(exc, target.where, time.monotonic() - started, timeout) from exc
            raise

    def _classify_connect(
        self, exc: Exception, where: str, elapsed: float, timeout: float | None = None
    ) -> _Failure:
        return classify_connect(exc, where, elapsed, self.connect_timeout if timeout is None else timeout)

    # -- run --------------------------------------------------------------------------------

    def execute(
        self, client: paramiko.SSHClient, line: str, host: str = "", timeout: float | None = None
    ) -> tuple[int, str, str]:
        """Run ``line`` on an open connection; (exit status, stdout, stderr) or a _Failure.

        The failure's ``sent`` says whether the exec request had gone out: before that, nothing
        can have run and the caller may send it on a new connection; after it, a lost connection
        is ``outcome-unknown``, never a reason to send it again."""
        limit = self.command_timeout if timeout is None else float(timeout)
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise _Failure("unreachable", "connection lost before the command was sent")
        timed_out = threading.Event()

        def expire() -> None:  # unblocks paramiko calls that have no timeout of their own
            timed_out.set()
            transport.close()

        def unknown(cause: object) -> _Failure:
            where = f"on {host}" if host else "on the host"
            return _Failure(
                OUTCOME_UNKNOWN,
                f"the command was sent {where} and no answer came (connection lost: {cause}); it may have "
                f"run in part or in full and was not sent again: check {host or 'the host'} before "
                f"retrying it: {line}",
                _text(out),
                _text(err),
                sent=True,
            )

        watchdog = threading.Timer(limit, expire)
        watchdog.daemon = True
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + limit
        chan = None
        sent = False
        watchdog.start()
        try:
            try:
                open_timeout = min(self.connect_timeout, limit)
                try:
                    chan = transport.open_session(timeout=open_timeout)
                except paramiko.SSHException as exc:
                    if "timeout" in str(exc).lower():
                        raise _Failure(
                            "timeout", f"no answer to opening a session within {open_timeout:g}s"
                        ) from exc
                    raise
                # From here on the request may have reached sshd even if exec_command raises:
                # count it as sent (at most once beats at least once for an action).
                sent = True
                chan.exec_command(line)
                while True:
                    busy = False
                    while chan.recv_ready():
                        out += chan.recv(_READ_CHUNK)
                        busy = True
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(_READ_CHUNK)
                        busy = True
                    # done only at EOF: sshd may send the exit status while output it could not
                    # yet send (window full) is still on its way; stopping at the status alone
                    # cut large snapshots at 32 KiB now and then
                    if (
                        chan.eof_received
                        and chan.exit_status_ready()
                        and not chan.recv_ready()
                        and not chan.recv_stderr_ready()
                    ):
                        break
                    if busy:
                        continue
                    if not transport.is_active() and not timed_out.is_set():
                        # the host side went away: paramiko closes the channel without EOF or
                        # an exit status, so waiting on would only end at the timeout
                        raise EOFError("the connection closed before the command's answer")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or timed_out.is_set():
                        raise TimeoutError
                    readable([chan.fileno()], min(remaining, 0.25))
                status = chan.recv_exit_status()
            except (TimeoutError, paramiko.SSHException, EOFError, OSError) as exc:
                stdout, stderr = _text(out), _text(err)
                if (
                    timed_out.is_set()
                    or isinstance(exc, (TimeoutError, socket.timeout))
                    or "timeout" in str(exc).lower()
                ):
                    raise _Failure(
                        "timeout", f"command did not finish within {limit:g}s", stdout, stderr, sent=sent
                    ) from exc
                if sent:
                    raise unknown(exc) from exc
                raise _Failure(
                    "unreachable", f"connection lost before the command was sent: {exc}", stdout, stderr
                ) from exc
        finally:
            watchdog.cancel()
            if chan is not None:
                chan.close()
        if timed_out.is_set():
            raise _Failure(
                "timeout", f"command did not finish within {limit:g}s", _text(out), _text(err), sent=True
            )
        if status == -1:
            if not transport.is_active():
                raise unknown("closed without an exit status")
            raise _Failure(
                "command",
                "the command ended without an exit status (killed by a signal?)",
                _text(out),
                _text(err),
                sent=True,
            )
        return status, _text(out), _text(err)

    def run_local(
        self, host: Any, command: Sequence[str], env: dict[str, str] | None, timeout: float | None = None
    ) -> Result:
        limit = self.command_timeout if timeout is None else float(timeout)
        started = time.monotonic()
        name = str(host.name)
        argv = [str(a) for a in command]
        full_env = dict(os.environ, **{str(k): str(v) for k, v in (env or {}).items()})
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                timeout=limit,
                env=full_env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except FileNotFoundError:
            msg = f"{argv[0]}: command not found"
            return Result(
                name, False, 127, "", msg + "\n", "command", f"exit status 127: {msg}", _since(started)
            )
        except subprocess.TimeoutExpired as exc:
            return Result(
                name,
                False,
                None,
                _text(exc.stdout or b""),
                _text(exc.stderr or b""),
                "timeout",
                f"command did not finish within {limit:g}s",
                _since(started),
            )
        except OSError as exc:
            return Result(name, False, None, "", "", "local", f"cannot run {argv[0]}: {exc}", _since(started))
        return _finish(name, done.returncode, _text(done.stdout), _text(done.stderr), started)

    def run_once(
        self,
        host: Any,
        command: Sequence[str],
        env: dict[str, str] | None,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> Result:
        """Connect, run, disconnect; sent once (a new connection has no stale state to retry)."""
        if getattr(host, "connection", "ssh") == "local":
            return self.run_local(host, command, env, timeout)
        started = time.monotonic()
        try:
            target = self.target(host)
            line = command_line(command, env, target.become)
            client = self.connect_target(target)
            try:
                status, stdout, stderr = self.execute(client, line, str(host.name), timeout)
            finally:
                client.close()
            refused = become_refused(target.become, status, stderr)
            if refused:
                raise _Failure("auth", refused, stdout, stderr, status)
        except _Failure as f:
            return _failed(str(host.name), _as_read(f) if idempotent else f, started)
        except Exception as exc:  # one host's surprise must not take the whole run down  # noqa: BLE001
            return Result(
                str(host.name), False, None, "", "", "local", f"{type(exc).__name__}: {exc}", _since(started)
            )
        return _finish(str(host.name), status, stdout, stderr, started)


def readable(fds: Sequence[int], timeout_s: float) -> set[int]:
    """The file descriptors of ``fds`` that can be read (or have ended) within ``timeout_s``.
    ``poll``, not ``select``: a controller with a thousand streams open holds descriptors past
    ``select``'s limit of 1024, where ``select`` raises."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLPRI)
    events = poller.poll(max(0, int(timeout_s * 1000)))
    return {fd for fd, mask in events if mask}


def _text(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _since(started: float) -> float:
    return round(time.monotonic() - started, 4)


def _as_read(f: _Failure) -> _Failure:
    """For a command that only reads, a lost answer is just a lost connection."""
    if f.kind != OUTCOME_UNKNOWN:
        return f
    return _Failure("unreachable", "connection lost during the command", f.stdout, f.stderr, sent=True)


def _failed(host: str, f: _Failure, started: float) -> Result:
    return Result(host, False, f.exit_status, f.stdout, f.stderr, f.kind, f.message, _since(started))


def _finish(host: str, status: int, stdout: str, stderr: str, started: float) -> Result:
    if status == 0:
        return Result(host, True, 0, stdout, stderr, None, None, _since(started))
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    message = f"exit status {status}" + (f": {last[:300]}" if last else "")
    return Result(host, False, status, stdout, stderr, "command", message, _since(started))


def _callback(
    on_result: Callable[[Result], None] | None, errors: list[BaseException]
) -> Callable[[Result], Result]:
    def deliver(result: Result) -> Result:
        if on_result is not None:
            try:
                on_result(result)
            except BaseException as exc:  # raised again once every host is done  # noqa: BLE001
                errors.append(exc)
        return result

    return deliver


def run_all(
    hosts: Iterable[Any],
    command: Sequence[str],
    forks: int = 50,
    connect_timeout: float = 5.0,
    command_timeout: float = 20.0,
    known_hosts: str | None = None,
    accept_new_hostkeys: bool = False,
    env: dict[str, str] | None = None,
    on_result: Callable[[Result], None] | None = None,
    idempotent: bool = False,
    ssh_config: str | None = None,
    global_known_hosts: str | None = None,
) -> dict[str, Result]:
    """Run ``command`` on every host, ``forks`` at a time; host name -> Result, in the hosts' order.

    ``hosts`` are ``fleetops.fleet.inventory.Host`` (or anything with name, address, port, user,
    key_file, connection, vars). ``on_result`` is called from the worker thread as each host
    finishes. Each host gets the command at most once; ``idempotent=True`` (a command that only
    reads) reports a connection lost mid-command as ``unreachable`` instead of ``outcome-unknown``.
    ``ssh_config``: the file ``-F`` names (``None``: the process default, else ``~/.ssh/config``);
    ``global_known_hosts``: replaces ``/etc/ssh/ssh_known_hosts`` and GlobalKnownHostsFile (``""``: none)."""
    hosts = list(hosts)
    command_line(command, env)  # bad command or env: fail now, not once per host
    if not hosts:
        return {}
    runner = _Runner(
        connect_timeout, command_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
    )
    errors: list[BaseException] = []
    deliver = _callback(on_result, errors)
    workers = max(1, min(int(forks), len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetops-ssh") as pool:

        def one(host: Any) -> Result:
            return deliver(runner.run_once(host, command, env, idempotent=idempotent))

        futures = [pool.submit(one, h) for h in hosts]
        results = {h.name: fut.result() for h, fut in zip(hosts, futures, strict=True)}
    if errors:
        raise errors[0]
    return results


class SessionPool:
    """One persistent SSH connection per host; ``run`` re-runs a command on all (or some) of them.

    A connection that broke is reopened on the next run. A reused one found dead before the
    command went out is reopened within the same run and the command sent on the new one; a
    connection lost after the command went out gives ``outcome-unknown`` and the command is not
    sent again, unless the caller passed ``idempotent=True`` (reads such as collect: sent again
    once). A host whose previous command is still running answers ``timeout`` at once instead of
    queueing. Use as a context manager, or call ``close``."""

    def __init__(
        self,
        hosts: Iterable[Any],
        forks: int = 50,
        connect_timeout: float = 5.0,
        command_timeout: float = 20.0,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        keepalive_s: float = 15.0,
        ssh_config: str | None = None,
        global_known_hosts: str | None = None,
    ) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.keepalive_s = keepalive_s
        self._runner = _Runner(
            connect_timeout, command_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
        )
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._locks = {name: threading.Lock() for name in self.hosts}
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(int(forks), len(self.hosts) or 1)), thread_name_prefix="fleetops-pool"
        )
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ssh_settings(self) -> dict[str, Any]:
        """How this pool reaches hosts, for a one-off connection elsewhere that should be made
        the same way (a Slurm host): connect_timeout, known_hosts, accept_new_hostkeys."""
        return {
            "connect_timeout": self._runner.connect_timeout,
            "known_hosts": self._runner.known_hosts,
            "accept_new_hostkeys": self._runner.accept_new,
        }

    def connected(self) -> list[str]:
        """Hosts with an open connection now."""
        out = []
        for name, client in list(self._clients.items()):
            transport = client.get_transport()
            if transport is not None and transport.is_active():
                out.append(name)
        return sorted(out)

    def drop(self, name: str) -> None:
        client = self._clients.pop(name, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        for name in list(self._clients):
            self.drop(name)

    def run_one(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> Result:
        """Run ``command`` on ``name``'s session. ``timeout`` (seconds) replaces the pool's
        command timeout for this call: an action brings its own budget. ``idempotent`` only for
        commands that change nothing: they may be sent a second time."""
        if self._closed:
            raise RuntimeError("SessionPool is closed")
        host = self.hosts[name]
        if getattr(host, "connection", "ssh") == "local":
            return self._runner.run_local(host, command, env, timeout)
        started = time.monotonic()
        lock = self._locks[name]
        if not lock.acquire(blocking=False):
            return Result(
                name,
                False,
                None,
                "",
                "",
                "timeout",
                "the previous command on this host has not finished",
                0.0,
            )
        try:
            target = self._runner.target(host)
            line = command_line(command, env, target.become)
            for attempt in (1, 2):
                client = self._clients.get(name)
                transport = client.get_transport() if client is not None else None
                reused = transport is not None and transport.is_active()
                try:
                    if not reused:
                        self.drop(name)
                        client = self._runner.connect_target(target)
                        client.get_transport().set_keepalive(int(self.keepalive_s))  # type: ignore[union-attr]
                        for jump in getattr(client, "jumps", ()):  # a bastion idle behind a NAT drops too
                            jump_transport = jump.get_transport()
                            if jump_transport is not None:
                                jump_transport.set_keepalive(int(self.keepalive_s))
                        self._clients[name] = client
                    assert client is not None
                    status, stdout, stderr = self._runner.execute(client, line, name, timeout)
                    refused = become_refused(target.become, status, stderr)
                    if refused:
                        raise _Failure("auth", refused, stdout, stderr, status, sent=True)
                except _Failure as f:
                    if f.kind in ("timeout", "unreachable", OUTCOME_UNKNOWN):
                        self.drop(name)
                    stale = reused and f.kind == "unreachable" and not f.sent
                    lost_read = reused and idempotent and f.kind == OUTCOME_UNKNOWN
                    if attempt == 1 and (stale or lost_read):
                        continue  # nothing ran (or it only read): once more on a new connection
                    return _failed(name, _as_read(f) if idempotent else f, started)
                return _finish(name, status, stdout, stderr, started)
            raise AssertionError("unreachable")
        except Exception as exc:  # as in run_once: a Result, never an exception  # noqa: BLE001
            self.drop(name)
            return Result(name, False, None, "", "", "local", f"{type(exc).__name__}: {exc}", _since(started))
        finally:
            lock.release()

    def run(
        self,
        command: Sequence[str],
        hosts: Iterable[str] | None = None,
        env: dict[str, str] | None = None,
        on_result: Callable[[Result], None] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> dict[str, Result]:
        """Run ``command`` on ``hosts`` (names; default all) in parallel; name -> Result.
        ``timeout`` and ``idempotent`` as in ``run_one``."""
        command_line(command, env)
        names = list(self.hosts) if hosts is None else list(hosts)
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            raise KeyError(f"not in this pool: {', '.join(unknown[:5])}")
        errors: list[BaseException] = []
        deliver = _callback(on_result, errors)

        def one(name: str) -> Result:
            return deliver(self.run_one(name, command, env, timeout=timeout, idempotent=idempotent))

        futures = [self._pool.submit(one, n) for n in names]
        results = {n: fut.result() for n, fut in zip(names, futures, strict=True)}
        if errors:
            raise errors[0]
        return results


# --- long-lived streams ---------------------------------------------------------------------


class StreamFailure(Exception):
    """Opening a stream failed; ``kind`` is one of ``ERROR_KINDS`` (never ``outcome-unknown``:
    a stream is a read, nothing it starts changes the host)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class Stream:
    """One long-lived command on its own SSH connection (``StreamOpener.open``): the channel's
    output is read as it comes, for as long as the command runs. ``fileno`` makes it usable
    with ``selectors``, so one thread can read a thousand of them."""

    def __init__(self, host: str, client: paramiko.SSHClient, channel: paramiko.Channel) -> None:
        self.host = host
        self._client = client
        self._channel = channel
        self._stderr = bytearray()
        self._closed_here = False

    def fileno(self) -> int:
        return self._channel.fileno()

    def send(self, data: bytes) -> None:
        """Write to the command's stdin (OSError once closed here, or when the connection
        broke). A command that already ended (the host closed its channel: a relay that found
        no daemon socket exits at once) is not an error, as with ``ProcessStream``: why it ended
        (its exit status, its stderr) is what the caller learns from the stream's end."""
        if self._closed_here:
            raise OSError(f"{self.host}: stream closed")
        try:
            self._channel.sendall(data)
        except OSError:
            carrier = self._channel.get_transport()
            if self._channel.closed and carrier is not None and carrier.is_active():
                return  # the command ended, the connection did not
            raise
        except (paramiko.SSHException, EOFError) as exc:
            raise OSError(f"{self.host}: stream closed: {exc}") from exc

    def read(self) -> bytes | None:
        """What stdout has now: bytes, ``b""`` at the end of the stream, None when nothing is
        waiting (the stream is open and silent)."""
        while self._channel.recv_stderr_ready():
            self._stderr += self._channel.recv_stderr(_READ_CHUNK)
        if not self._channel.recv_ready():
            if self._channel.eof_received or self._channel.closed:
                return b""
            transport = self._channel.get_transport()
            return None if transport is not None and transport.is_active() else b""
        try:
            return self._channel.recv(_READ_CHUNK)
        except TimeoutError:
            return None
        except (paramiko.SSHException, OSError, EOFError):
            return b""

    def stderr(self) -> str:
        """stderr so far (a relay's or the agent's complaint when the stream ends)."""
        while self._channel.recv_stderr_ready():
            self._stderr += self._channel.recv_stderr(_READ_CHUNK)
        return _text(self._stderr)

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The command's exit status once it ended (None: none came within ``wait_s``, or the
        connection went first)."""
        deadline = time.monotonic() + wait_s
        while not self._channel.exit_status_ready():
            transport = self._channel.get_transport()
            if time.monotonic() > deadline or transport is None or not transport.is_active():
                return None
            time.sleep(0.02)
        status = self._channel.recv_exit_status()
        return None if status == -1 else status

    @property
    def active(self) -> bool:
        transport = self._client.get_transport()
        return transport is not None and transport.is_active() and not self._channel.closed

    def close(self) -> None:
        self._closed_here = True
        try:
            self._channel.close()
        finally:
            self._client.close()


class StreamOpener:
    """Opens streams: a connection per stream (own host key checks, jump hosts, become, as the
    other entry points), one exec on it, and nothing sent again by the transport: a caller that
    wants the stream back opens a new one. A failure before the command runs is a
    ``StreamFailure`` with the same kinds as a ``Result``'s ``error_kind``."""

    def __init__(
        self,
        connect_timeout: float = 5.0,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        keepalive_s: float = 15.0,
        ssh_config: str | None = None,
        global_known_hosts: str | None = None,
        idle_wakeup_s: float = 2.0,
    ) -> None:
        self.keepalive_s = keepalive_s
        self.idle_wakeup_s = idle_wakeup_s
        self._runner = _Runner(
            connect_timeout, connect_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
        )

    def open(self, host: Any, command: Sequence[str], env: dict[str, str] | None = None) -> Stream:
        """Connect to ``host`` and start ``command`` there; its output is the stream. Raises
        ``StreamFailure`` (connecting, authenticating or starting failed) and ``ValueError`` for
        a bad command or env; a host whose ``connection`` is local has no stream (``local``)."""
        name = str(host.name)
        if getattr(host, "connection", "ssh") == "local":
            raise StreamFailure("local", f"{name}: a local connection has no SSH stream")
        try:
            target = self._runner.target(host)
            line = command_line(command, env, target.become)
            client = self._runner.connect_target(target)
        except _Failure as f:
            raise StreamFailure(f.kind, f.message) from None
        except OSError as exc:
            raise StreamFailure("local", f"{name}: {exc}") from exc
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise _Failure("unreachable", f"{target.where}: connection lost before the command was sent")
            transport.set_keepalive(int(self.keepalive_s))
            self._quiet(transport)
            timeout = target.connect_timeout or self._runner.connect_timeout
            try:
                channel = transport.open_session(timeout=timeout)
                channel.exec_command(line)
                channel.settimeout(0.0)  # reads never block: the caller selects on fileno()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                text = str(exc) or type(exc).__name__
                kind = "timeout" if "timeout" in text.lower() or isinstance(exc, TimeoutError) else "unreachable"
                raise _Failure(kind, f"{target.where}: could not start the command: {text}") from exc
        except _Failure as f:
            client.close()
            raise StreamFailure(f.kind, f.message) from None
        except BaseException:
            client.close()
            raise
        return Stream(name, client, channel)

    def _quiet(self, transport: paramiko.Transport) -> None:
        """paramiko's transport thread reads its socket with a 0.1 s timeout, to look at its own
        state between packets: a thousand idle streams are then ten thousand wake-ups a second
        fighting for one interpreter lock, which took the TUI's controller past a core at 1000
        nodes. A stream's transport has nothing to do between packets but keepalives (seconds
        apart), and a packet or the socket's end wakes the read at once, so the read's timeout is
        raised to ``idle_wakeup_s``. ``Transport.sock`` is the socket (or the jump host's channel)
        the thread reads; both take ``settimeout``."""
        sock = getattr(transport, "sock", None)
        settimeout = getattr(sock, "settimeout", None)
        if callable(settimeout) and self.idle_wakeup_s > 0:
            settimeout(self.idle_wakeup_s)


# --- streams over OpenSSH client processes --------------------------------------------------

# The line a stream's command prints first, before anything else (the TUI's relay does): it says
# the remote command started, so an opener can tell "connected" from "still connecting".
STREAM_STARTED = b"fleetops-relay: started"
STREAM_TRANSPORTS = ("auto", "openssh", "paramiko")
_STDERR_KEEP = 65536
# ssh's own failures before the remote command ran, in the order they are looked for (the first
# kind found wins: through a jump host the last line is often a consequence of an earlier one)
_SSH_FAILURES = (
    ("hostkey", ("host key verification failed", "remote host identification has changed",
                 "host key is known", "revoked", "host key for")),
    ("auth", ("permission denied", "too many authentication failures", "no more authentication methods")),
    ("timeout", ("timed out", "timeout")),
    ("unreachable", ("connection refused", "no route to host", "could not resolve", "network is unreachable",
                     "name or service not known", "connection closed", "connection reset")),
)  # fmt: skip


def openssh_client() -> str | None:
    """The ``ssh`` program on PATH, or None."""
    import shutil

    return shutil.which("ssh")


def classify_ssh_exit(stderr: str, where: str) -> StreamFailure:
    """What ``ssh`` exiting 255 before the remote command started means, from its stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("@@@")]
    for kind, needles in _SSH_FAILURES:
        hit = next((line for line in lines if any(n in line.lower() for n in needles)), None)
        if hit is None:
            continue
        if kind == "hostkey" and "identification has changed" in stderr.lower():
            offending = next((line for line in lines if line.lower().startswith("offending")), "")
            return StreamFailure(
                kind,
                f"host key of {where} CHANGED (ssh: {offending or hit}); if the host was reinstalled, "
                "verify and replace its known_hosts entry",
            )
        return StreamFailure(kind, f"{where}: {hit}")
    return StreamFailure("unreachable", f"{where}: {lines[-1] if lines else 'ssh exited 255, nothing on stderr'}")


def _pct(text: str) -> str:
    """A value for an ssh option that expands %-tokens (HostName, IdentityFile, known hosts files)."""
    return text.replace("%", "%%")


def _file_list(paths: Sequence[str], expands: bool) -> str:
    """Files as one ssh option value: whitespace separates them, so each one is double-quoted."""
    if not paths:
        return "none"
    out = []
    for p in paths:
        value = _pct(p) if expands else p
        out.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return " ".join(out)


def ssh_argv(ssh: str, target: sshconfig.Target, key_files: Sequence[str], connect_timeout: float,
             keepalive_s: float, remote: str) -> list[str]:  # fmt: skip
    """``ssh`` run so that what it connects to and how it judges the host key are the Target's,
    as the paramiko path does: ``-F none`` (the Target is already resolved from ssh_config, so
    nothing is read again), every setting on the command line, no shell. StrictHostKeyChecking
    ``no`` is passed as ``accept-new``: OpenSSH's ``no`` connects to a host whose key CHANGED
    (with password logins off), fleetops refuses that whatever the setting; with no user known
    hosts file to record a new key in, nothing is accepted (``yes``), as on the paramiko path.
    Authentication is public keys only (the Target's files; with none, ssh's default keys and
    the agent, as paramiko's look_for_keys). ConnectTimeout is whole seconds in OpenSSH: a
    fraction is rounded up. A Target's values are passed as they are: %-tokens are escaped where
    ssh expands them, but a ``${VAR}`` in a known hosts path would still be expanded by ssh."""
    strict = target.strict if target.known_hosts else "yes"
    if strict == "no":
        strict = "accept-new"
    timeout = max(1, math.ceil(target.connect_timeout or connect_timeout))
    argv = [ssh, "-F", "none", "-T", "-e", "none",
            "-o", "BatchMode=yes",
            "-o", f"HostName={_pct(target.hostname)}",
            "-o", f"Port={target.port}",
            "-o", f"User={target.user}"]  # fmt: skip
    for key in key_files:
        argv += ["-o", f"IdentityFile={_file_list([key], expands=True)}"]
    if key_files:
        argv += ["-o", "IdentitiesOnly=yes"]
    argv += [
        "-o", f"UserKnownHostsFile={_file_list(target.known_hosts, expands=True)}",
        "-o", f"GlobalKnownHostsFile={_file_list(target.global_known_hosts, expands=False)}",
        "-o", f"StrictHostKeyChecking={strict}",
        "-o", "HashKnownHosts=no",  # recorded as the paramiko path records them: plain [addr]:port
        "-o", "CheckHostIP=no",
        "-o", "UpdateHostKeys=no",  # only the key the operator accepted is ever written
        "-o", "VerifyHostKeyDNS=no",
        "-o", "PreferredAuthentications=publickey",
        "-o", "PasswordAuthentication=no",
        "-o", "KbdInteractiveAuthentication=no",
        "-o", f"ConnectTimeout={timeout}",
        "-o", f"ServerAliveInterval={max(1, int(keepalive_s))}",
        "-o", "ServerAliveCountMax=3",
        "-o", "ControlMaster=no",
        "-o", "ControlPath=none",
        "-o", "LogLevel=ERROR",
        "--", target.hostname, remote,
    ]  # fmt: skip
    return argv


class ProcessStream:
    """A stream read from an ``ssh`` client process (``OpenSSHStreamOpener.open``): the same
    interface as ``Stream``. stdout is a pipe (what ``fileno`` gives the selector), stdin a pipe
    (``send``); stderr is drained on every ``read`` into a bounded buffer, so ssh never blocks
    on a full stderr pipe. The process leads its own process group: ``close`` kills the group
    (ssh and anything it started) and reaps it."""

    def __init__(self, host: str, proc: subprocess.Popen[bytes], stderr: bytes = b"") -> None:
        self.host = host
        self._proc = proc
        assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
        self._out, self._in, self._err = proc.stdout.fileno(), proc.stdin, proc.stderr.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)
        self._stderr = bytearray(stderr)
        self._closed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fileno(self) -> int:
        return self._out

    def send(self, data: bytes) -> None:
        """Write to the command's stdin (OSError once closed here). A broken pipe is not an
        error: ssh ended, and why (its exit status, its stderr) is what the caller learns from
        the stream's end, as from any other end: a remote command that ended at once (sudo
        refusing) must read as that, not as a lost connection."""
        if self._closed:
            raise OSError(f"{self.host}: stream closed")
        try:
            self._in.write(data)
            self._in.flush()
        except BrokenPipeError:
            pass
        except ValueError as exc:  # the pipe was closed on our side
            raise OSError(f"{self.host}: stream closed: {exc}") from exc

    def _drain_stderr(self) -> None:
        if self._closed:
            return
        while True:
            try:
                got = os.read(self._err, _READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not got:
                return
            self._stderr += got
            if len(self._stderr) > _STDERR_KEEP:
                del self._stderr[: len(self._stderr) - _STDERR_KEEP]

    def read(self) -> bytes | None:
        """What stdout has now: bytes, ``b""`` at the end, None when nothing is waiting."""
        self._drain_stderr()
        if self._closed:
            return b""
        try:
            return os.read(self._out, _READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def stderr(self) -> str:
        self._drain_stderr()
        return _text(self._stderr)

    def exit_status(self, wait_s: float = 1.0) -> int | None:
        """The remote command's exit status once ssh ended; None when none came within
        ``wait_s`` or ssh ended on its own failure (255: the connection went, as a paramiko
        stream's lost transport) or by a signal."""
        try:
            status = self._proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        return None if status < 0 or status == 255 else status

    @property
    def active(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def close(self) -> None:
        if self._closed:
            return
        self._drain_stderr()
        self._closed = True
        _kill_group(self._proc)
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads (its own session) while it runs, then reap it.
    Once ssh has ended (and been reaped) its group is left alone: without a ProxyCommand ssh
    starts nothing of its own, and the group's id may belong to someone else by then."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class OpenSSHStreamOpener:
    """Opens streams as ``ssh`` client processes: the handshake runs in C in its own process,
    and the controller reads one pipe per stream from one selector thread (no Python transport
    thread per connection). Same ``open`` contract as ``StreamOpener``.

    The host is resolved by the same ``sshconfig`` as every other entry point and passed to
    ``ssh -F none`` as options (``ssh_argv``). Targets with jump hosts (ProxyJump) go through the
    paramiko opener instead (``StreamOpener``, same settings): its jump path verifies each hop
    with that hop's own known hosts, and the streams through a bastion are few.

    ``open`` returns once the remote command has started, which it says by printing
    ``STREAM_STARTED`` first (the TUI's relay does): until then the stream is "connecting", so a
    caller that bounds its concurrent opens bounds handshakes in flight. ssh exiting 255 before
    that line is a ``StreamFailure`` classified from its stderr; another exit status before it
    (sudo refusing the become) is a stream that started and ended, returned as such; no line
    within the connect timeout plus ``start_margin_s``: the process group is killed and the
    failure is ``timeout``. Lines before the marker (a login script's chatter) are dropped."""

    def __init__(
        self,
        connect_timeout: float = 5.0,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        keepalive_s: float = 15.0,
        ssh_config: str | None = None,
        global_known_hosts: str | None = None,
        start_margin_s: float = 5.0,
        ssh: str | None = None,
        idle_wakeup_s: float = 2.0,
    ) -> None:
        self.keepalive_s = keepalive_s
        self.start_margin_s = float(start_margin_s)
        found = ssh or openssh_client()
        if found is None:
            raise FileNotFoundError("ssh (the OpenSSH client) is not on PATH")
        self.ssh = found
        self._runner = _Runner(
            connect_timeout, connect_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
        )
        self.fallback = StreamOpener(
            connect_timeout, known_hosts, accept_new_hostkeys, keepalive_s, ssh_config, global_known_hosts,
            idle_wakeup_s,
        )  # fmt: skip

    def argv(self, host: Any, command: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        """The ssh command line ``open`` runs for ``host`` (a _Failure when it cannot be made)."""
        target = self._runner.target(host)
        return self._argv(target, command, env)

    def _argv(self, target: sshconfig.Target, command: Sequence[str], env: dict[str, str] | None) -> list[str]:
        if "@" in target.hostname or target.hostname.startswith("-") or not target.hostname.strip():
            raise _Failure("local", f"host {target.name}: {target.hostname!r} is not a host name ssh can take")
        # as the paramiko path: missing IdentityFile entries are passed over, none present is an
        # error, and an unreadable or encrypted key is "local" (not an auth failure)
        present = [f for f in target.key_files if os.path.exists(os.path.expanduser(f))]
        if target.key_files and not present:
            raise _Failure("local", f"cannot read key file {target.key_files[0]}: no such file")
        for path in present:
            self._runner._pkey(path)
        line = command_line(command, env, target.become)
        return ssh_argv(self.ssh, target, present, self._runner.connect_timeout, self.keepalive_s, line)

    def open(self, host: Any, command: Sequence[str], env: dict[str, str] | None = None) -> AnyStream:
        """Start ``ssh`` for ``host`` and wait until the remote command has started."""
        name = str(host.name)
        if getattr(host, "connection", "ssh") == "local":
            raise StreamFailure("local", f"{name}: a local connection has no SSH stream")
        try:
            target = self._runner.target(host)
            if target.jumps:
                return self.fallback.open(host, command, env)
            argv = self._argv(target, command, env)
        except _Failure as f:
            raise StreamFailure(f.kind, f.message) from None
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise StreamFailure("local", f"{name}: cannot start {self.ssh}: {exc}") from exc
        try:
            return self._started(name, target, proc)
        except BaseException:
            _kill_group(proc)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise

    def _started(self, name: str, target: sshconfig.Target, proc: subprocess.Popen[bytes]) -> ProcessStream:
        """Read stdout up to the marker line, never past it (what follows is the stream's)."""
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        limit = (target.connect_timeout or self._runner.connect_timeout) + self.start_margin_s
        deadline = time.monotonic() + limit
        marker = STREAM_STARTED + b"\n"
        line = b""  # the current line of stdout, read so far
        stderr = bytearray()
        stderr_open = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                last = _text(stderr).strip().splitlines()
                raise StreamFailure(
                    "timeout",
                    f"{target.where}: the command had not started {limit:g}s after ssh began "
                    "(connect, authentication or the remote start too slow)" + (f": {last[-1]}" if last else ""),
                )
            ready = readable([out, err] if stderr_open else [out], min(left, 0.5))
            if err in ready:
                got = os.read(err, _READ_CHUNK)
                stderr += got[: max(0, _STDERR_KEEP - len(stderr))]
                stderr_open = bool(got)
            if out in ready:
                # at most what completes the marker: a marker started on this line ends by then,
                # one not started yet ends later; nothing of the stream proper is read here
                want = len(marker) - len(line) if marker.startswith(line) else len(marker)
                got = os.read(out, want)
                if not got:
                    break
                line += got
                while b"\n" in line:
                    first, _, line = line.partition(b"\n")
                    if first + b"\n" == marker:
                        return ProcessStream(name, proc, bytes(stderr))
        # stdout ended before the marker: ssh is exiting
        try:
            status = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise StreamFailure("timeout", f"{target.where}: ssh closed its output but did not exit") from None
        os.set_blocking(err, False)
        try:
            stderr += os.read(err, _STDERR_KEEP)
        except OSError:
            pass
        if status == 255:
            raise classify_ssh_exit(_text(stderr), target.where)
        # the remote side ran something that ended before the marker (sudo refused, no sh):
        # a stream that started and ended; its stderr and status tell the caller the rest
        return ProcessStream(name, proc, bytes(stderr))


AnyStream = Stream | ProcessStream


# descriptors one stream holds in this process: a paramiko socket and its channel's pipe, or an
# ssh process's three pipes; and what the rest of the process may hold beside them
FDS_PER_STREAM = 4
FDS_SPARE = 256


def raise_open_files(streams: int) -> tuple[int, int]:
    """Raise this process's soft limit on open files towards its hard limit, so that
    ``streams`` streams fit (a login's default soft limit is often 1024, a thousand ssh
    processes' pipes are three thousand descriptors). Never lowers it. Returns (soft, needed):
    a soft limit under ``needed`` means the hard limit stops it, and the caller says so."""
    import resource

    needed = streams * FDS_PER_STREAM + FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft, needed


def stream_opener(transport: str = "auto", **settings: Any) -> StreamOpener | OpenSSHStreamOpener:
    """The opener for ``transport``: ``openssh`` (``ssh`` client processes), ``paramiko``, or
    ``auto``: openssh where ``ssh`` is on PATH, else paramiko. ``settings`` as both openers take
    (connect_timeout, known_hosts, accept_new_hostkeys, keepalive_s, ssh_config, global_known_hosts)."""
    if transport not in STREAM_TRANSPORTS:
        raise ValueError(f"stream transport {transport!r} is not one of {', '.join(STREAM_TRANSPORTS)}")
    if transport == "openssh" or (transport == "auto" and openssh_client() is not None):
        return OpenSSHStreamOpener(**settings)
    return StreamOpener(**settings)
