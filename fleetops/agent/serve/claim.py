"""One resident agent per node: ``serve`` claims each node it serves before any loop starts.

A claim is two things. The node's XID state directory is locked (``flock`` on ``serve.lock``
in it, held for the process's life, with the holder's pid written in it), so two daemons never
both write the XID cursor and counters. And the node's socket must not answer: a socket file
that a live daemon accepts on is that daemon's, and a second ``serve`` refuses, naming the
socket and the pid the kernel gives for its peer (``client.daemon_pid``), instead of unlinking
it from under the first. A socket file that nobody accepts on (a daemon killed with SIGKILL
leaves one) is stale: ``server.listen`` replaces it.

The lock is released by the kernel when the process ends, however it ends, so a crashed daemon
never blocks the next one.
"""

from __future__ import annotations

import errno
import fcntl
import os

LOCK_NAME = "serve.lock"


class Taken(Exception):
    """Another daemon serves this node (its socket answers, or it holds the state lock)."""


def _holder(fd: int) -> int | None:
    """The pid the lock's holder wrote in the lock file, when it reads as one."""
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def answering(socket_path: str) -> int | None:
    """The pid of another process accepting on ``socket_path``; None when nobody (or this
    process) answers there, or the path is not there."""
    from fleetops.agent.serve import client

    if not os.path.exists(socket_path):
        return None
    pid = client.daemon_pid(socket_path)
    return pid if pid is not None and pid != os.getpid() else None


def claim(socket_path: str, state_dir: str) -> int:
    """Lock ``state_dir`` for this process and check that nobody answers on ``socket_path``.
    Returns the lock's descriptor (keep it open while serving; closing it releases the claim).
    Raises ``Taken`` naming the socket, the directory and the other daemon's pid."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    path = os.path.join(state_dir, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise Taken(f"cannot lock {path}: {exc.strerror or exc}") from exc
            holder = _holder(fd)
            peer = answering(socket_path)
            who = f"pid {holder}" if holder is not None else "another process"
            also = f"; pid {peer} answers on {socket_path}" if peer is not None else ""
            raise Taken(f"another fleetops-agent serve ({who}) holds {path}: it serves this node and writes "
                        f"its XID state in {state_dir}{also}; stop it first") from exc
        peer = answering(socket_path)
        if peer is not None:
            raise Taken(f"another fleetops-agent serve (pid {peer}) answers on {socket_path}; stop it first "
                        "(a socket file nobody answers on is replaced)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
