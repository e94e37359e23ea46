"""The state file and the node's side files: read, parse, written whole (temp file and rename),
locked with ``fcntl.flock``; the stand-in device files a reset's holder scan finds; the
simulated ``/dev/kmsg`` file with its drifting printk clock."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetops.sim.gpu.base import (
    STATE_VERSION,
    SimError,
)


def read_state(path: str) -> dict[str, Any]:
    return parse_state(path, read_state_text(path))


def read_state_text(path: str) -> str:
    """The state file's text, unparsed: a reader that keeps the state it parsed last (the
    daemon's sim backend, every tick) compares the text and parses only a changed file."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError as exc:
        raise SimError(f"{path}: simulator state file not found") from exc
    except OSError as exc:
        raise SimError(f"{path}: cannot read simulator state: {exc.strerror}") from exc


def parse_state(path: str, text: str) -> dict[str, Any]:
    """``text`` (read from ``path``) as a state, with the errors ``read_state`` gives."""
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimError(f"{path}: corrupt simulator state (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise SimError(f"{path}: not a fleetops simulator state (version {STATE_VERSION} expected)")
    for key in ("hostname", "node", "gpus", "faults"):
        if key not in state:
            raise SimError(f"{path}: corrupt simulator state: missing {key!r}")
    if not isinstance(state["gpus"], list) or not isinstance(state["faults"], list):
        raise SimError(f"{path}: corrupt simulator state: 'gpus' and 'faults' must be lists")
    return state


def write_state(path: str, state: dict[str, Any]) -> None:
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".state.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def locked_state(path: str) -> Iterator[dict[str, Any]]:
    """Read, let the caller change, and write back the state under an exclusive lock.

    If the body raises, nothing is written."""
    lock_path = os.path.abspath(path) + ".lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(path)
        yield state
        write_state(path, state)


def make_devices(path: str, count: int, minors: list[int] | None = None) -> None:
    """The simulated node's device files, as the driver makes a node's at load: ``nvidiactl``,
    ``nvidia-uvm`` and one ``nvidia<minor>`` per GPU (``minors``; default ``nvidia0`` ..
    ``nvidia<count-1>``), 0666 as on a node."""
    for name in ("ctl", "-uvm", *map(str, range(count) if minors is None else minors)):
        os.close(open_device(path, name))


def printk_uptime(node: dict[str, Any], now: float) -> float:
    """The simulated printk clock at wall time ``now``: seconds since boot as the kernel log
    stamps them. A real printk clock is never NTP-corrected and drifts from wall time; the node's
    ``printk_drift_ppm`` (a scenario's ``node: {printk_drift_ppm: 12}``; positive runs ahead)
    makes the simulated one drift alike: 12 ppm is about 30 s after a month of uptime."""
    up = now - float(node.get("boot_time", now))
    return up * (1.0 + float(node.get("printk_drift_ppm", 0.0)) / 1e6)


def device_prefix(state_path: str) -> str:
    """The start of the simulated node's device files (``<state>.dev/nvidia``): its
    ``/dev/nvidia*``. Whoever holds one open holds the simulated GPUs, as on a node
    (``gpu/holders.py`` scans for them): the simulated daemon while it has NVML, a collect while
    it runs, a test's process standing for a workload or another user's tool."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return os.path.join(base + ".dev", "nvidia")


def open_device(state_path: str, name: str = "ctl") -> int:
    """Open the simulated node's ``/dev/nvidia<name>`` (made on first use) and return the
    descriptor: what ``nvmlInit`` does to a node's ``/dev/nvidiactl``. The caller closes it."""
    path = device_prefix(state_path) + name
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        os.fchmod(fd, 0o666)  # as a node's /dev/nvidia*: every user may open it (and so hold the GPU)
        return fd


def in_use_message(bus_id: str, holders: list[Any]) -> str:
    """What ``nvidia-smi -r`` and ``modprobe -r`` answer, in substance, when processes hold the
    device files: the simulated reset and unload refuse with the holders named."""
    named = "; ".join(h.describe() for h in holders)
    return (f"GPU {bus_id}: in use by another client: {len(holders)} process(es) hold the device "
            f"files ({named}); stop every process using the GPU, monitoring ones included, and retry")


def run_dir(state_path: str) -> str:
    """The simulated node's ``/run/fleetops``: ``<state>.agent/``, where its daemon keeps its
    socket and XID state, and where the node's job records (``jobs/``), Slurm's view of its GPUs
    (``gres.conf``), the driver's ``mig-minors`` table and its jobs' cgroups (``cgroup/job_<id>/``)
    live (``fleetops.sim.gpu.slurm``)."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return base + ".agent"


def kmsg_path(state_path: str) -> str:
    """The node's simulated ``/dev/kmsg``: beside its state file, ``<state>.kmsg``."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return base + ".kmsg"


def append_kmsg(path: str, line: str, boot_time: float, drift_ppm: float = 0.0) -> int:
    """Append one kernel-log line as a ``/dev/kmsg`` record (``prio,seq,usec,flags;message``,
    seq counting from 0 in the file) so simulated XIDs reach the daemon's kernel-log follower as
    real ones do; returns the record's seq. The stamp is the printk clock's (``printk_uptime``,
    ``drift_ppm`` off wall time). The caller holds the state lock (one writer)."""
    message = line
    if message.startswith("["):
        message = message.split("]", 1)[1].lstrip()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            seq = sum(1 for _ in fh)
    except FileNotFoundError:
        seq = 0
    if boot_time:
        usec = max(0, int(printk_uptime({"boot_time": boot_time, "printk_drift_ppm": drift_ppm}, time.time()) * 1e6))
    else:
        usec = int(time.monotonic() * 1e6)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"3,{seq},{usec},-;{message}\n")
    return seq
