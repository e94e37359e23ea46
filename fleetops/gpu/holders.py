"""Which processes hold the GPU's device files open: ``/proc/*/fd`` read, nothing changed.

``nvidia-smi -r`` refuses a GPU that any other process uses, monitoring applications included,
and ``modprobe -r nvidia`` refuses while any process holds a device file of the driver. An
NVML or CUDA client holds ``/dev/nvidiactl`` and the ``/dev/nvidiaN`` of every GPU it opened
(``/dev/nvidia-uvm`` too for CUDA), so "who uses the GPU" is answered from the file
descriptors every process holds, as ``fuser`` and ``lsof`` answer it, and not from NVML's
process list, which shows only compute contexts (a monitoring daemon is not one).

``prefix`` is the device files' common start: ``/dev/nvidia`` on a node; the simulator gives
each simulated node its own folder of device files (``<state>.dev/nvidia*``), held open by the
same processes that would hold a real node's, so the same scan decides for both.

Stdlib only: the reset and the simulator run it on the node's cold path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEVICE_PREFIX = "/dev/nvidia"
PROC = "/proc"
_CMDLINE_MAX = 200  # characters of a holder's command line kept for the report


@dataclass(frozen=True)
class Holder:
    pid: int
    user: str
    command: str
    devices: tuple[str, ...]

    def describe(self) -> str:
        return f"pid {self.pid} ({self.user}: {self.command}) holds {', '.join(self.devices)}"

    def to_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "user": self.user, "command": self.command, "devices": list(self.devices)}


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def _uid(proc_dir: str) -> int | None:
    try:
        with open(os.path.join(proc_dir, "status"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])  # the real uid
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_user(pid: int, proc: str = PROC) -> str | None:
    """Who runs ``pid``: its real uid's name (the uid where it has none), or None when its
    ``/proc`` entry cannot be read (it ended since it was listed)."""
    uid = _uid(os.path.join(proc, str(int(pid))))
    return None if uid is None else _user(uid)


def _command(proc_dir: str) -> str:
    try:
        with open(os.path.join(proc_dir, "cmdline"), "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        raw = b""
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    if not text:  # a kernel thread, or a process that cleared its arguments
        try:
            with open(os.path.join(proc_dir, "comm"), encoding="utf-8", errors="replace") as fh:
                text = f"[{fh.read().strip()}]"
        except OSError:
            text = "?"
    return text if len(text) <= _CMDLINE_MAX else text[: _CMDLINE_MAX - 3] + "..."


def scan(prefix: str = DEVICE_PREFIX, proc: str = PROC) -> list[Holder]:
    """Every process with a file descriptor on a path that starts with ``prefix``, by pid.

    A process that ends while it is read, or whose descriptors this process may not read, is
    skipped: the reset runs as root, which reads every one; run as another user the scan
    sees only that user's processes, and the caller says so (``readable``)."""
    out: list[Holder] = []
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return out
    for pid in pids:
        proc_dir = os.path.join(proc, str(pid))
        fd_dir = os.path.join(proc_dir, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        devices: set[str] = set()
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                devices.add(target)
        if devices:
            uid = _uid(proc_dir)
            out.append(Holder(pid, _user(uid) if uid is not None else "?", _command(proc_dir), tuple(sorted(devices))))
    return out


def readable(proc: str = PROC) -> bool:
    """Whether this process can read other processes' descriptors (root, or CAP_SYS_PTRACE)."""
    return os.geteuid() == 0 or not os.path.isdir(proc)
