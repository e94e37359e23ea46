"""Long-lived streams over paramiko: ``StreamOpener`` opens a connection per stream and one
command on it; ``Stream`` reads its output as it comes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import paramiko

from fleetops.fleet.transport.common import READ_CHUNK, Failure, command_line, decoded
from fleetops.fleet.transport.runner import Runner


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
            self._stderr += self._channel.recv_stderr(READ_CHUNK)
        if not self._channel.recv_ready():
            if self._channel.eof_received or self._channel.closed:
                return b""
            transport = self._channel.get_transport()
            return None if transport is not None and transport.is_active() else b""
        try:
            return self._channel.recv(READ_CHUNK)
        except TimeoutError:
            return None
        except (paramiko.SSHException, OSError, EOFError):
            return b""

    def stderr(self) -> str:
        """stderr so far (a relay's or the agent's complaint when the stream ends)."""
        while self._channel.recv_stderr_ready():
            self._stderr += self._channel.recv_stderr(READ_CHUNK)
        return decoded(self._stderr)

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
        self._runner = Runner(
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
        except Failure as f:
            raise StreamFailure(f.kind, f.message) from None
        except OSError as exc:
            raise StreamFailure("local", f"{name}: {exc}") from exc
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise Failure("unreachable", f"{target.where}: connection lost before the command was sent")
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
                raise Failure(kind, f"{target.where}: could not start the command: {text}") from exc
        except Failure as f:
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
