"""One maintenance action per node: a lock file that says who holds it, since when, until when.

The lock is a file (default ``/run/fleetops/maintenance.lock``; tmpfs, so a reboot clears it)
that its holder keeps ``fcntl.flock``-ed for the whole action and in which it writes one JSON
record: ``pid``, ``pid_start`` (the process's start time in clock ticks, against pid reuse),
``started_at``, ``deadline``, ``phase``, ``action``, ``gpu``, ``host``. On release the holder
unlinks the file, so a node with no action in progress has no lock file.

The deadline is the holder's own worst case for what is left of its action (for a reset,
``catalog.actions.reset_remaining_s``), rewritten at each phase by ``Lock.heartbeat``. It tells an
operator when to start worrying; it never hands the node to somebody else. A lock is *stale*,
and the next action takes it over (saying so), only when its holder is dead: its process is gone
(killed, crashed: the kernel dropped its flock, the record stayed) or its pid now belongs to
another process (a different start time). A live holder past its deadline keeps the lock and is
reported as such: it may be a reset still waiting on ``nvidia-smi -r``, and taking the node from
it would run two actions on one GPU at once. Only an operator decides to kill it.

Acquirers lock the file they opened and then check it is still the file at the path, so an
unlink by a releaser or a stale-lock breaker never lets two holders in.

Only the standard library: this runs in the agent.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Self

DEFAULT_PATH = "/run/fleetops/maintenance.lock"
DEFAULT_DEADLINE_S = 300.0
_BUSY_RETRY_S = 2.0  # a lock held only for a moment (a dry run peeking, a record being written)


class LockError(Exception):
    """The lock cannot be used at all (unwritable folder); the message names the path."""


class LockHeld(Exception):
    """Another live action holds the lock; ``holder`` is its record."""

    def __init__(self, path: str, holder: dict[str, Any], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


def _proc_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        if fields[0] in ("Z", "X"):
            return None  # a zombie has ended; only its parent has not reaped it yet
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: Any, start: Any = None) -> bool:
    """True while ``pid`` runs and, when ``start`` is given, is the process that had that start time."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    now_start = _proc_start(pid)
    if now_start is None:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no /proc: fall back to signal 0
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if start is not None:
        try:
            return int(start) == now_start
        except (TypeError, ValueError):
            return True
    return True


def describe(record: dict[str, Any] | None, now: float | None = None) -> str:
    if not record:
        return "an unreadable or empty record"
    now = time.time() if now is None else now
    what = record.get("action") or "maintenance"
    gpu = f" of {record['gpu']}" if record.get("gpu") else ""
    since = record.get("started_at")
    deadline = record.get("deadline")
    parts = [f"{what}{gpu} by pid {record.get('pid')}"]
    if record.get("phase"):
        parts.append(f"phase {record['phase']}")
    if isinstance(since, (int, float)):
        parts.append(f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))} ({now - since:.0f}s ago)")
    if isinstance(deadline, (int, float)):
        left = deadline - now
        parts.append(f"deadline in {left:.0f}s" if left >= 0 else f"deadline passed {-left:.0f}s ago")
    return ", ".join(parts)


def staleness(record: dict[str, Any] | None, now: float | None = None) -> str | None:
    """Why ``record`` no longer holds the node (its process is gone or its pid was reused), or
    None while its holder lives. A passed deadline does not make a lock stale (see the module)."""
    if not record:
        return None
    if not pid_alive(record.get("pid"), record.get("pid_start")):
        return f"its process {record.get('pid')} is gone"
    return None


def overdue_s(record: dict[str, Any] | None, now: float | None = None) -> float | None:
    """Seconds a holder is past its deadline, or None when it is not (or has none)."""
    deadline = (record or {}).get("deadline")
    now = time.time() if now is None else now
    if isinstance(deadline, (int, float)) and now > deadline:
        return now - deadline
    return None


def held_message(record: dict[str, Any], now: float | None = None) -> str:
    """What to tell the operator about a live holder, past its deadline or not."""
    late = overdue_s(record, now)
    if late is None:
        return f"another maintenance action holds this node: {describe(record, now)}"
    return (
        f"held by live pid {record.get('pid')} past its deadline by {late:.0f}s ({describe(record, now)}): "
        "it is not taken over; find out what that process waits on, and end it by hand if it is hung"
    )


def _read_fd(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    if not data.strip():
        return None
    try:
        record = json.loads(data.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _same_file(fd: int, path: str) -> bool:
    try:
        cur = os.stat(path)
    except FileNotFoundError:
        return False
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (cur.st_dev, cur.st_ino)


@dataclass
class Status:
    """What a look at the lock (without taking it) found."""

    state: str  # "free" | "held" | "stale"
    record: dict[str, Any] | None = None
    reason: str | None = None  # why stale
    path: str = ""

    def detail(self) -> str:
        if self.state == "free":
            return f"no maintenance action in progress ({self.path} absent or empty)"
        if self.state == "stale":
            return f"stale lock ({describe(self.record)}): {self.reason}; it will be taken over"
        return held_message(self.record or {})


def peek(path: str, now: float | None = None) -> Status:
    """Look at the lock without creating, taking or changing anything (for dry runs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Status("free", path=path)
    except OSError as exc:
        raise LockError(f"{path}: cannot read the maintenance lock: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            locked_by_other = False
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            locked_by_other = True
        record = _read_fd(fd)
    finally:
        os.close(fd)
    if record is None:
        if locked_by_other:  # taken this instant, record not written yet
            return Status("held", {"action": "maintenance (starting)"}, path=path)
        return Status("free", path=path)
    why = staleness(record, now)
    if why:
        return Status("stale", record, why, path)
    return Status("held", record, path=path)


@dataclass
class Lock:
    """A held maintenance lock; ``recovered`` describes a stale lock this one took over."""

    path: str
    fd: int
    record: dict[str, Any]
    recovered: dict[str, Any] | None = None
    released: bool = field(default=False)

    def heartbeat(self, phase: str, remaining_s: float, now: float | None = None) -> None:
        """Say which phase the action is in and move the deadline to its worst case for the rest."""
        t = time.time() if now is None else now
        self.update(phase=phase, deadline=t + float(remaining_s), heartbeat_at=t)

    def update(self, **fields: Any) -> None:
        """Add ``fields`` to the record (e.g. the services stopped so far, so that whoever takes
        over a stale lock knows what to start again)."""
        if self.released:
            return
        self.record.update(fields)
        data = (json.dumps(self.record) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, data)
        os.fsync(self.fd)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        try:
            if _same_file(self.fd, self.path):
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(
    path: str,
    action: str,
    gpu: str | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    now: float | None = None,
    phase: str = "starting",
) -> Lock:
    """Take the node's maintenance lock or raise LockHeld naming its live holder. ``deadline_s``
    is the action's own worst case (``catalog.actions``), not a fixed figure."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise LockError(f"{folder}: cannot create the lock's folder: {exc.strerror}") from exc
    recovered: dict[str, Any] | None = None
    busy_until = time.monotonic() + _BUSY_RETRY_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise LockError(f"{path}: cannot open the maintenance lock: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
            # somebody holds it right now: a live action, a hung one, or a brief look
            record = _read_fd(fd)
            os.close(fd)
            t = time.time() if now is None else now
            if record is not None and pid_alive(record.get("pid"), record.get("pid_start")):
                # a live holder keeps the node, past its deadline or not
                raise LockHeld(path, record, held_message(record, t)) from None
            if time.monotonic() > busy_until:
                raise LockHeld(path, record or {}, f"{path} stays locked by a process that wrote no record") from None
            time.sleep(0.05)
            continue
        if not _same_file(fd, path):  # unlinked between our open and our flock: start again
            os.close(fd)
            continue
        t = time.time() if now is None else now
        old = _read_fd(fd)
        if old is not None and old.get("pid") != os.getpid():
            why = staleness(old, t)
            if why is None:
                # alive, yet not holding the flock: a record written by hand, or a holder that
                # closed the file; its process lives, so respect it
                os.close(fd)
                raise LockHeld(path, old, held_message(old, t))
            recovered = {**old, "stale_because": why}
        record = {
            "pid": os.getpid(),
            "pid_start": _proc_start(os.getpid()),
            "host": socket.gethostname(),
            "action": action,
            "gpu": gpu,
            "started_at": t,
            "deadline": t + float(deadline_s),
            "phase": phase,
        }
        data = (json.dumps(record) + "\n").encode()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, data)
        os.fsync(fd)
        return Lock(path, fd, record, recovered)
