"""The simulated fleet's processes: each node's sshd and the fleet's one daemon, started,
waited for, recognised (never another program's process) and stopped with their trees."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any

from fleetops.sim.fleet.base import (
    CHILDREN,
    METRICS_PORT,
    STOP_TIMEOUT_S,
    SimFleetError,
)

# --- processes -----------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of ``pid``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    return rest[0], int(rest[1])


def _reap(pid: int) -> None:
    child = CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        CHILDREN.pop(pid, None)


def alive(pid: int | None) -> bool:
    """True while ``pid`` runs (a zombie counts as gone; our own children are reaped here)."""
    if not pid:
        return False
    _reap(pid)
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def is_our_sshd(pid: int | None, config: str) -> bool:
    """``pid`` is alive and is the sshd started with ``config`` (guards against pid reuse)."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except OSError:
        return False
    # sshd rewrites its title: "sshd: /usr/sbin/sshd -D -f CONFIG -E LOG [listener] ..."
    return b" -f " + config.encode() + b" " in cmdline.replace(b"\0", b" ") + b" "


def stopped(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] in ("T", "t")


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None:
            kids.setdefault(stat[1], []).append(int(entry))
    return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = _children_map() if kids is None else kids
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if alive(p)]
    return left


def kill_trees(listeners: list[int]) -> None:
    """Stop each listener and every process under it (sessions, agents), hung or not."""
    if not listeners:
        return
    kids = _children_map()
    everyone = []
    for pid in listeners:
        everyone.append(pid)
        everyone.extend(descendants(pid, kids))
    signal_all(everyone, signal.SIGTERM)
    signal_all(everyone, signal.SIGCONT)  # a stopped (host-hang) process only acts on SIGTERM once continued
    left = _wait_gone(everyone, STOP_TIMEOUT_S)
    if left:
        signal_all(left, signal.SIGKILL)
        left = _wait_gone(left, STOP_TIMEOUT_S)
    for pid in everyone:
        child = CHILDREN.pop(pid, None)
        if child is not None:
            try:
                child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
    if left:
        raise SimFleetError(f"processes {left} did not exit after SIGKILL")


def listening_sockets() -> dict[tuple[str, int], str]:
    """(address, port) -> socket inode of every IPv4 TCP socket in LISTEN, from /proc/net/tcp.

    Reading it makes no connection (a test connect would fork an sshd child per node)."""
    out = {}
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if fields[3] != "0A":
                continue
            hex_addr, hex_port = fields[1].split(":")
            addr = socket.inet_ntoa(bytes.fromhex(hex_addr)[::-1])
            out[(addr, int(hex_port, 16))] = fields[9]
    return out


def accepts(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: str, lines: int = 4) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return " / ".join(line.strip() for line in fh.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


_NO_REEXEC: dict[str, bool] = {}


def _no_reexec_flag(sshd: str) -> list[str]:
    """``["-r"]`` where this sshd takes it (asked once per binary: an sshd that does not know
    the flag refuses the test run)."""
    if sshd not in _NO_REEXEC:
        probe = subprocess.run(
            [sshd, "-t", "-r", "-f", os.devnull], stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False
        )
        _NO_REEXEC[sshd] = probe.returncode == 0
    return ["-r"] if _NO_REEXEC[sshd] else []


def spawn(sshd: str, node: dict[str, Any]) -> int:
    flags = _no_reexec_flag(sshd)
    with open(node["log"], "ab") as log:
        proc = subprocess.Popen(
            [sshd, "-D", *flags, "-f", node["config"], "-E", node["log"]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            close_fds=True,
            start_new_session=True,
            cwd="/",
        )
    CHILDREN[proc.pid] = proc
    return proc.pid


def metrics_addresses(fleet: dict[str, Any]) -> list[str]:
    """Each node's metrics endpoint, ``ADDRESS:PORT`` on the node's own address and the port the
    inventory names (``fleetops_agent_metrics_port``): where ``fleetops prometheus targets``
    points. In the order the daemon serves the nodes: ``--states DIR`` takes the state files
    sorted by name, ``<node>.json``."""
    nodes = fleet["nodes"]
    port = int(fleet.get("metrics_port") or METRICS_PORT)
    return [f"{nodes[name]['address']}:{port}" for name in sorted(nodes, key=lambda n: f"{n}.json")]


def spawn_daemon(fleet: dict[str, Any]) -> dict[str, Any]:
    """One resident agent for the whole simulated fleet (``sim up --daemon``), serving every
    node's metrics endpoint on that node's address (``metrics_addresses``)."""
    states = os.path.join(fleet["directory"], "state")
    log = os.path.join(fleet["directory"], "log", "agent-serve.log")
    # --sim-on-gpu-node: the fleet is simulated also on a machine with a GPU driver (backend_choice)
    cmd = [os.path.join(fleet["agent_bin"], "fleetops-agent"), "serve", "--backend", "sim", "--sim-on-gpu-node",
           "--states", states,
           "--metrics-address", ",".join(metrics_addresses(fleet))]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, close_fds=True, start_new_session=True, cwd="/"
        )
    CHILDREN[proc.pid] = proc
    return {"pid": proc.pid, "log": log, "states": states}


def _is_our_daemon(entry: dict[str, Any] | None) -> bool:
    """The recorded daemon still runs and is the one serving this fleet (guards against pid reuse)."""
    if not entry or not alive(entry.get("pid")):
        return False
    try:
        with open(f"/proc/{entry['pid']}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"serve" in argv and os.fsencode(entry["states"]) in argv


def stop_daemon(fleet: dict[str, Any]) -> None:
    entry = fleet.get("daemon")
    if _is_our_daemon(entry):
        assert entry is not None
        kill_trees([entry["pid"]])
    if entry:
        entry["pid"] = None


def wait_listening(nodes: dict[str, dict[str, Any]], timeout: float) -> None:
    """Wait until every node's sshd listens; raise naming the ones that died or never did."""
    pending = dict(nodes)
    deadline = time.monotonic() + timeout
    use_proc = os.path.exists("/proc/net/tcp")
    while pending:
        listening = listening_sockets() if use_proc else {}
        dead = []
        for name, node in list(pending.items()):
            up = (
                (node["address"], node["port"]) in listening
                if use_proc
                else accepts(node["address"], node["port"])
            )
            if up:
                del pending[name]
            elif not alive(node["pid"]):
                dead.append(name)
        if dead:
            name = dead[0]
            raise SimFleetError(
                f"sshd of {name} ({pending[name]['address']}:{pending[name]['port']}) exited at start"
                f"{f' (and {len(dead) - 1} more)' if len(dead) > 1 else ''}: {log_tail(pending[name]['log'])}"
            )
        if not pending:
            break
        if time.monotonic() > deadline:
            names = sorted(pending)
            raise SimFleetError(
                f"{len(names)} sshd did not listen within {timeout:.0f}s: {', '.join(names[:5])}"
            )
        time.sleep(0.02)


def wait_metrics(fleet: dict[str, Any], timeout: float) -> None:
    """Wait until the daemon listens on every node's metrics address; raise naming the first
    that does not, with the daemon's log, when it exits or the time runs out."""
    pending = set(metrics_addresses(fleet))
    entry = fleet["daemon"]
    deadline = time.monotonic() + timeout
    while pending:
        listening = listening_sockets()
        pending = {a for a in pending if (a.rpartition(":")[0], int(a.rpartition(":")[2])) not in listening}
        if not pending:
            return
        if not alive(entry["pid"]) or time.monotonic() > deadline:
            why = "exited" if not alive(entry["pid"]) else f"did not listen within {timeout:.0f}s"
            raise SimFleetError(f"the fleet's agent daemon {why}: metrics endpoint {sorted(pending)[0]} "
                                f"(and {len(pending) - 1} more) not served: {log_tail(entry['log'])}")
        time.sleep(0.05)
