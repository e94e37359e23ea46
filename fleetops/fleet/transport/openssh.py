"""Long-lived streams over OpenSSH client processes (``OpenSSHStreamOpener``, ``ProcessStream``),
the open-files limit a thousand of them need, and ``stream_opener``, which picks the paramiko or
the OpenSSH opener."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from fleetops.fleet import sshconfig
from fleetops.fleet.transport.common import READ_CHUNK, Failure, command_line, decoded, readable
from fleetops.fleet.transport.runner import Runner
from fleetops.fleet.transport.stream import Stream, StreamFailure, StreamOpener

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
                got = os.read(self._err, READ_CHUNK)
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
            return os.read(self._out, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def stderr(self) -> str:
        self._drain_stderr()
        return decoded(self._stderr)

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
        self._runner = Runner(
            connect_timeout, connect_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
        )
        self.fallback = StreamOpener(
            connect_timeout, known_hosts, accept_new_hostkeys, keepalive_s, ssh_config, global_known_hosts,
            idle_wakeup_s,
        )  # fmt: skip

    def argv(self, host: Any, command: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        """The ssh command line ``open`` runs for ``host`` (a Failure when it cannot be made)."""
        target = self._runner.target(host)
        return self._argv(target, command, env)

    def _argv(self, target: sshconfig.Target, command: Sequence[str], env: dict[str, str] | None) -> list[str]:
        if "@" in target.hostname or target.hostname.startswith("-") or not target.hostname.strip():
            raise Failure("local", f"host {target.name}: {target.hostname!r} is not a host name ssh can take")
        # as the paramiko path: missing IdentityFile entries are passed over, none present is an
        # error, and an unreadable or encrypted key is "local" (not an auth failure)
        present = [f for f in target.key_files if os.path.exists(os.path.expanduser(f))]
        if target.key_files and not present:
            raise Failure("local", f"cannot read key file {target.key_files[0]}: no such file")
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
        except Failure as f:
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
                last = decoded(stderr).strip().splitlines()
                raise StreamFailure(
                    "timeout",
                    f"{target.where}: the command had not started {limit:g}s after ssh began "
                    "(connect, authentication or the remote start too slow)" + (f": {last[-1]}" if last else ""),
                )
            ready = readable([out, err] if stderr_open else [out], min(left, 0.5))
            if err in ready:
                got = os.read(err, READ_CHUNK)
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
            raise classify_ssh_exit(decoded(stderr), target.where)
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
