"""The paramiko connection under every transport but the OpenSSH streams: host resolution
(``sshconfig``), host key policy, ProxyJump hops, connect-failure classification, and running
one command on an open connection or locally (``Runner``)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

import paramiko

from fleetops.fleet import hostkeys, sshconfig
from fleetops.fleet.transport.common import (
    OUTCOME_UNKNOWN,
    READ_CHUNK,
    Failure,
    Result,
    as_read,
    become_refused,
    command_line,
    decoded,
    failed,
    finish,
    readable,
    since,
)

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


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called by paramiko when the host's key is not among the usable ones we loaded for it."""

    def __init__(self, store: hostkeys.KnownHosts, target: sshconfig.Target, verdict: hostkeys.Verdict) -> None:
        self.store, self.target, self.verdict = store, target, verdict

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        revoked = self.verdict.revoked_entry(key)
        if revoked is not None:
            raise Failure("hostkey", hostkeys.revoked_message(hostname, key, revoked))
        files = list(self.target.known_hosts)
        if self.target.strict in ("accept-new", "no") and files:
            try:
                self.store.add(files[0], hostname, key)
            except OSError as exc:
                raise Failure("local", f"cannot record the host key in {files[0]}: {exc}") from exc
            return
        every = files + list(self.target.global_known_hosts)
        if self.verdict.authorities and not self.verdict.known:
            raise Failure("hostkey", hostkeys.ca_only_message(hostname, files or every, self.verdict.authorities))
        skipped = self.store.skipped(every)
        note = f" (lines skipped there: {'; '.join(skipped[:3])})" if skipped else ""
        raise Failure(
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


def classify_connect(exc: Exception, where: str, elapsed: float, t: float) -> Failure:
    """The error kind and message of a failed connection attempt (``t``: its timeout, seconds)."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return Failure(
            "hostkey",
            f"host key of {where} CHANGED: got {exc.key.get_name()} {exc.key.fingerprint}, known "
            f"{exc.expected_key.fingerprint}; if the host was reinstalled, verify and replace its known_hosts entry",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        if "timeout" in str(exc).lower():
            return Failure("timeout", f"authentication timed out after {t:g}s on {where}")
        return Failure("auth", f"authentication failed on {where}: {exc}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        reasons = {
            os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
            for e in exc.errors.values()
        }
        return Failure("unreachable", f"{where}: {'; '.join(sorted(reasons)).lower()}")
    if isinstance(exc, socket.gaierror):
        return Failure("unreachable", f"{where}: cannot resolve the name ({exc.strerror or exc})")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return Failure("timeout", f"{where}: TCP connect timed out after {t:g}s")
    if isinstance(exc, paramiko.SSHException):
        text = str(exc)
        low = text.lower()
        if "banner" in low or "timed out" in low or "timeout" in low or elapsed >= 0.9 * t:
            return Failure(
                "timeout",
                f"{where}: no SSH banner/handshake within {t:g}s (host accepts TCP but does not answer)",
            )
        return Failure("unreachable", f"{where}: SSH negotiation failed: {text}")
    if isinstance(exc, EOFError):
        return Failure("unreachable", f"{where}: connection closed by the host during the SSH handshake")
    if isinstance(exc, OSError):
        if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET):
            return Failure("unreachable", f"{where}: {os.strerror(exc.errno).lower()}")
        return Failure("unreachable", f"{where}: {exc}")
    return Failure("local", f"{where}: {type(exc).__name__}: {exc}")


class Runner:
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
                    raise Failure("local", f"key file {path} is encrypted; use an unencrypted key") from exc
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    raise Failure("local", f"cannot read key file {path}: {exc}") from exc
                self._keys[path] = key
            return key

    def target(self, host: Any) -> sshconfig.Target:
        """How to reach ``host``: inventory, then ssh_config (a Failure ``local`` if unusable)."""
        if self.config_error:
            raise Failure("local", self.config_error)
        try:
            return self.resolver.resolve(host)
        except sshconfig.ConfigError as exc:
            raise Failure("local", str(exc)) from exc

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
                except Failure as f:
                    if last and not target.jumps:
                        raise
                    via = f"jump host {hop.name} ({hop.where}): " if not last else ""
                    raise Failure(f.kind, f"via {_chain(target)}: {via}{f.message}") from None
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
            raise Failure(
                kind, f"via {_chain(target)}: the jump host could not open a channel to {nxt.where}: {text}"
            ) from exc

    def _open(self, client: paramiko.SSHClient, target: sshconfig.Target, sock: paramiko.Channel | None) -> None:
        name = hostkeys.hostkey_name(target.hostname, target.port)
        files = list(target.known_hosts) + list(target.global_known_hosts)
        try:
            verdict = self.store.verdict(files, name)
        except OSError as exc:
            raise Failure("local", str(exc)) from exc
        for keytype, key in verdict.known.items():
            client.get_host_keys().add(name, keytype, key)
        client.set_missing_host_key_policy(HostKeyPolicy(self.store, target, verdict))
        # as ssh: IdentityFile entries that do not exist are passed over; none at all is an error
        present = [f for f in target.key_files if os.path.exists(os.path.expanduser(f))]
        if target.key_files and not present:
            raise Failure("local", f"cannot read key file {target.key_files[0]}: no such file")
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
            if isinstance(exc, Failure):
                raise
            if isinstance(exc, paramiko.BadHostKeyException):
                revoked = verdict.revoked_entry(exc.key)
                if revoked is not None:
                    raise Failure("hostkey", hostkeys.revoked_message(name, exc.key, revoked)) from exc
            if isinstance(exc, Exception):
                raise self._classify_connect(exc, target.where, time.monotonic() - started, timeout) from exc
            raise

    def _classify_connect(
        self, exc: Exception, where: str, elapsed: float, timeout: float | None = None
    ) -> Failure:
        return classify_connect(exc, where, elapsed, self.connect_timeout if timeout is None else timeout)

    # -- run --------------------------------------------------------------------------------

    def execute(
        self, client: paramiko.SSHClient, line: str, host: str = "", timeout: float | None = None
    ) -> tuple[int, str, str]:
        """Run ``line`` on an open connection; (exit status, stdout, stderr) or a Failure.

        The failure's ``sent`` says whether the exec request had gone out: before that, nothing
        can have run and the caller may send it on a new connection; after it, a lost connection
        is ``outcome-unknown``, never a reason to send it again."""
        limit = self.command_timeout if timeout is None else float(timeout)
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise Failure("unreachable", "connection lost before the command was sent")
        timed_out = threading.Event()

        def expire() -> None:  # unblocks paramiko calls that have no timeout of their own
            timed_out.set()
            transport.close()

        def unknown(cause: object) -> Failure:
            where = f"on {host}" if host else "on the host"
            return Failure(
                OUTCOME_UNKNOWN,
                f"the command was sent {where} and no answer came (connection lost: {cause}); it may have "
                f"run in part or in full and was not sent again: check {host or 'the host'} before "
                f"retrying it: {line}",
                decoded(out),
                decoded(err),
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
                        raise Failure(
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
                        out += chan.recv(READ_CHUNK)
                        busy = True
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(READ_CHUNK)
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
                stdout, stderr = decoded(out), decoded(err)
                if (
                    timed_out.is_set()
                    or isinstance(exc, (TimeoutError, socket.timeout))
                    or "timeout" in str(exc).lower()
                ):
                    raise Failure(
                        "timeout", f"command did not finish within {limit:g}s", stdout, stderr, sent=sent
                    ) from exc
                if sent:
                    raise unknown(exc) from exc
                raise Failure(
                    "unreachable", f"connection lost before the command was sent: {exc}", stdout, stderr
                ) from exc
        finally:
            watchdog.cancel()
            if chan is not None:
                chan.close()
        if timed_out.is_set():
            raise Failure(
                "timeout", f"command did not finish within {limit:g}s", decoded(out), decoded(err), sent=True
            )
        if status == -1:
            if not transport.is_active():
                raise unknown("closed without an exit status")
            raise Failure(
                "command",
                "the command ended without an exit status (killed by a signal?)",
                decoded(out),
                decoded(err),
                sent=True,
            )
        return status, decoded(out), decoded(err)

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
                name, False, 127, "", msg + "\n", "command", f"exit status 127: {msg}", since(started)
            )
        except subprocess.TimeoutExpired as exc:
            return Result(
                name,
                False,
                None,
                decoded(exc.stdout or b""),
                decoded(exc.stderr or b""),
                "timeout",
                f"command did not finish within {limit:g}s",
                since(started),
            )
        except OSError as exc:
            return Result(name, False, None, "", "", "local", f"cannot run {argv[0]}: {exc}", since(started))
        return finish(name, done.returncode, decoded(done.stdout), decoded(done.stderr), started)

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
                raise Failure("auth", refused, stdout, stderr, status)
        except Failure as f:
            return failed(str(host.name), as_read(f) if idempotent else f, started)
        except Exception as exc:  # one host's surprise must not take the whole run down  # noqa: BLE001
            return Result(
                str(host.name), False, None, "", "", "local", f"{type(exc).__name__}: {exc}", since(started)
            )
        return finish(str(host.name), status, stdout, stderr, started)
