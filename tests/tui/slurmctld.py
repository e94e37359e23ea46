"""A real slurmctld, with its own munged, on loopback, for the TUI's Slurm tests: the node
screen reads State and Reason through ops.slurm as it would from a cluster's controller, and a
drain or resume from the TUI goes to this slurmctld, which refuses what Slurm refuses.

No slurmd runs, so its nodes never register: they start ``DOWN`` (without a Reason), a drain
makes them ``DOWN+DRAIN`` and a resume ``IDLE+NOT_RESPONDING``, as slurmctld has it. (A node left
``UNKNOWN`` would refuse the resume: ``Invalid node state specified``.) Each node is the only one
of its partition, so the capacity guard has no other node to count. Needs root (munged and slurmctld run as root here) and the Debian packages
slurmctld, slurm-client and munge; ``skip_reason`` says what is missing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PING_TIMEOUT_S = 30.0
NODE_STATE = "DOWN"  # what slurm.conf says of every node at start (see the docstring)


def skip_reason() -> str | None:
    missing = [t for t in ("slurmctld", "scontrol", "munged") if _which(t) is None]
    if missing:
        return f"no {', '.join(missing)} here (apt-get install -y slurmctld slurm-client munge)"
    if os.geteuid() != 0:
        return "slurmctld and munged run as root here"
    return None


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next(
        (p for p in (f"/usr/sbin/{tool}", f"/usr/bin/{tool}") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Slurm:
    directory: Path
    conf: Path
    scontrol: Path  # scontrol pointed at this cluster (SLURM_CONF set)
    ctld: subprocess.Popen[bytes]
    munged_pid: int

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.scontrol), *args], capture_output=True, text=True, check=check, timeout=30
        )

    def show(self, node: str) -> tuple[str, str | None]:
        """(State, Reason without slurmctld's stamp) as scontrol prints them."""
        out = self.run("show", "node", "-o", node).stdout
        state = next((w[6:] for w in out.split() if w.startswith("State=")), "")
        reason = out.split(" Reason=", 1)[1].rsplit(" [", 1)[0].strip() if " Reason=" in out else None
        return state, reason


def start(directory: Path, nodes: list[str]) -> Slurm:
    """munged with a key of its own and slurmctld knowing ``nodes`` (127.0.0.1 each, one
    partition per node), both on loopback; returns once ``scontrol ping`` says UP."""
    for sub in ("run", "state", "log", "etc"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    key = directory / "etc" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    sock = directory / "run" / "munge.sock"
    pidfile = directory / "run" / "munged.pid"
    subprocess.run(
        [
            _which("munged") or "munged", "--force", f"--socket={sock}", f"--key-file={key}",
            f"--log-file={directory / 'log' / 'munged.log'}", f"--pid-file={pidfile}",
            f"--seed-file={directory / 'run' / 'munged.seed'}",
        ],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    munged_pid = int(pidfile.read_text().strip())
    lines = [
        "ClusterName=fleetopstui",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={sock}",
        "SlurmUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SlurmdTimeout=3600",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmctldPidFile={directory / 'run' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={directory / 'log' / 'slurmctld.log'}",
    ]
    for name in nodes:
        lines.append(f"NodeName={name} NodeAddr=127.0.0.1 CPUs=1 State={NODE_STATE}")
        lines.append(f"PartitionName=p-{name} Nodes={name} State=UP")
    conf = directory / "etc" / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    wrapper = directory / "scontrol"
    wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={conf} exec {_which("scontrol")} "$@"\n')
    wrapper.chmod(0o755)
    log = open(directory / "log" / "slurmctld.out", "ab")
    ctld = subprocess.Popen(
        [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(conf)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "SLURM_CONF": str(conf)},
    )  # fmt: skip
    log.close()
    slurm = Slurm(directory, conf, wrapper, ctld, munged_pid)
    deadline = time.monotonic() + PING_TIMEOUT_S
    while time.monotonic() < deadline:
        done = slurm.run("ping", check=False)
        if done.returncode == 0 and "UP" in done.stdout:
            return slurm
        if ctld.poll() is not None:
            break
        time.sleep(0.3)
    stop(slurm)
    tail = (directory / "log" / "slurmctld.out").read_text(errors="replace")[-1500:]
    raise RuntimeError(f"slurmctld did not come up: {tail}")


def stop(slurm: Slurm) -> None:
    if slurm.ctld.poll() is None:
        slurm.ctld.terminate()
        try:
            slurm.ctld.wait(timeout=15)
        except subprocess.TimeoutExpired:
            slurm.ctld.kill()
            slurm.ctld.wait(timeout=5)
    try:
        os.kill(slurm.munged_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
