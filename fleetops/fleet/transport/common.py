"""What every transport shares: the ``Result`` a host answers with, the classified
``Failure`` it is built from, the remote command line (``command_line``, ``become_refused``),
and the helpers that turn a failure or an exit status into a ``Result``."""

from __future__ import annotations

import logging
import re
import select
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetops.fleet import hostkeys, sshconfig

OUTCOME_UNKNOWN = "outcome-unknown"
# the host's session still runs the previous command: this one was not sent at all
BUSY = "busy"
ERROR_KINDS = ("unreachable", "timeout", "auth", "hostkey", "command", "local", OUTCOME_UNKNOWN, BUSY)
DEFAULT_KNOWN_HOSTS = hostkeys.DEFAULT_USER_KNOWN_HOSTS
GLOBAL_KNOWN_HOSTS = hostkeys.GLOBAL_KNOWN_HOSTS
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
READ_CHUNK = 65536

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


class Failure(Exception):
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


_SUDO_REFUSED = ("a password is required", "a terminal is required", "is not in the sudoers", "not allowed to")


def readable(fds: Sequence[int], timeout_s: float) -> set[int]:
    """The file descriptors of ``fds`` that can be read (or have ended) within ``timeout_s``.
    ``poll``, not ``select``: a controller with a thousand streams open holds descriptors past
    ``select``'s limit of 1024, where ``select`` raises."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLPRI)
    events = poller.poll(max(0, int(timeout_s * 1000)))
    return {fd for fd, mask in events if mask}


def decoded(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def since(started: float) -> float:
    return round(time.monotonic() - started, 4)


def as_read(f: Failure) -> Failure:
    """For a command that only reads, a lost answer is just a lost connection."""
    if f.kind != OUTCOME_UNKNOWN:
        return f
    return Failure("unreachable", "connection lost during the command", f.stdout, f.stderr, sent=True)


def failed(host: str, f: Failure, started: float) -> Result:
    return Result(host, False, f.exit_status, f.stdout, f.stderr, f.kind, f.message, since(started))


def finish(host: str, status: int, stdout: str, stderr: str, started: float) -> Result:
    if status == 0:
        return Result(host, True, 0, stdout, stderr, None, None, since(started))
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    message = f"exit status {status}" + (f": {last[:300]}" if last else "")
    return Result(host, False, status, stdout, stderr, "command", message, since(started))


def callback(
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
