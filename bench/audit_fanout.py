"""fleetops audit of N simulated hosts against Ansible doing the same collection, with and
without the resident agent answering.

One loopback fleet of real sshd processes (``sim up --daemon``: one ``fleetops-agent serve``
for every node), then one run each of:
  - fleetops audit -i INV --forks F --format json --no-history       (nodes answer from their daemon)
  - fleetops audit -i INV --forks F --format json --no-history --fresh (cold collects on every node)
  - ansible all -i INV -m ansible.builtin.command -a "fleetops-agent collect" -f F
    (the node's collect answers from its daemon here too: Ansible's own cost is what remains)
Every audit's JSON is read back to check which source answered, so a figure labelled "daemons"
is one where every node did answer from its daemon. Needs root (it starts sshd). Usage:
  python bench/audit_fanout.py [--nodes 100] [--forks 50] [--runs 1] [--first-address 127.0.60.1]
  python bench/audit_fanout.py --no-daemon ...   (the earlier comparison: cold collects against Ansible)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetops.agent.serve import client
from fleetops.sim import fleet

CPU: dict[str, list[float]] = {}  # label -> the controller's CPU seconds (user + system) per run


def timed(cmd: list[str], env: dict[str, str], label: str = "") -> tuple[float, int, str]:
    """Wall seconds, exit status and output tail of ``cmd``; its CPU (user + system of it and
    the processes it waited for: the controller, with Ansible's forks) goes to ``CPU[label]``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(label, []).append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return dt, proc.returncode, proc.stdout[-300:] + proc.stderr[-300:]


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def wait_daemons(directory: str, names: list[str], timeout: float) -> float:
    """Seconds until every node's daemon serves a snapshot (its first full one)."""
    t0 = time.perf_counter()
    pending = list(names)
    while pending:
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"daemon snapshots missing after {timeout:.0f} s: {pending[:5]} ...")
        pending = [n for n in pending if client.fetch_snapshot(
            client.socket_for("sim", os.path.join(directory, "state", f"{n}.json"), None), 3600) is None]
        if pending:
            time.sleep(1.0)
    return time.perf_counter() - t0


def sources(path: str) -> dict[str, int]:
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    out: dict[str, int] = {}
    for n in doc["nodes"]:
        out[str(n.get("source"))] = out.get(str(n.get("source")), 0) + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--forks", type=int, default=50)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--first-address", default=os.environ.get("FLEETOPS_BENCH_ADDRESS", "127.0.60.1"))
    ap.add_argument("--no-daemon", action="store_true", help="no resident agent: cold collects against Ansible only")
    args = ap.parse_args()
    bindir = os.path.dirname(sys.executable)
    fleetops_bin = shutil.which("fleetops", path=bindir) or shutil.which("fleetops")
    ansible_bin = shutil.which("ansible", path=bindir) or shutil.which("ansible")
    if not fleetops_bin or not ansible_bin:
        print("needs fleetops and ansible on PATH (run scripts/setup.sh; use .venv/bin/python)")
        return 1
    tmp = tempfile.mkdtemp(prefix="fleetops-bench-")
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_PIPELINING="True", ANSIBLE_FORKS=str(args.forks))
    daemon = not args.no_daemon
    try:
        t0 = time.perf_counter()
        info = fleet.up(args.nodes, tmp, first_address=args.first_address,
                        port=free_port(args.first_address), daemon=daemon)
        print(f"fleet up: {args.nodes} sshd hosts{' and their daemon' if daemon else ''} in "
              f"{time.perf_counter() - t0:.2f} s")
        if daemon:
            waited = wait_daemons(tmp, sorted(info["nodes"]), timeout=max(120.0, args.nodes * 0.5))
            print(f"every daemon snapshot served after {waited:.1f} s more")
        inv = os.path.join(tmp, "inventory.yml")
        out = os.path.join(tmp, "audit.json")
        modes = [("daemons", [])] if daemon else []
        modes.append(("cold collects" + (" (--fresh)" if daemon else ""), ["--fresh"] if daemon else []))
        times: dict[str, list[float]] = {label: [] for label, _ in modes}
        times["ansible"] = []
        for i in range(args.runs):
            line = []
            for label, extra in modes:
                dt, rc, tail = timed([fleetops_bin, "audit", "-i", inv, "--forks", str(args.forks), "--format", "json",
                                      "--no-history", "-q", "-o", out, *extra], env, label)
                if rc not in (0, 1, 2):
                    print(f"fleetops audit ({label}) failed rc={rc}: {tail}")
                    return 1
                got = sources(out)
                want = "daemon" if label == "daemons" else "collect"
                if got != {want: args.nodes}:
                    print(f"fleetops audit ({label}): nodes answered by {got}, not all by {want}")
                    return 1
                times[label].append(dt)
                line.append(f"fleetops audit, {label} {dt:.2f} s")
            dt2, rc2, tail2 = timed([ansible_bin, "all", "-i", inv, "-m", "ansible.builtin.command",
                                     "-a", "fleetops-agent collect", "-f", str(args.forks), "-o"], env, "ansible")
            if rc2 != 0:
                print(f"ansible failed rc={rc2}: {tail2}")
                return 1
            times["ansible"].append(dt2)
            line.append(f"ansible ad-hoc {dt2:.2f} s")
            print(f"run {i + 1}: " + "   ".join(line))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\n{args.nodes} hosts, forks {args.forks}, median of {args.runs}:")
        cpu = {k: statistics.median(v) for k, v in CPU.items()}
        for label, _ in modes:
            print(f"  fleetops audit, {label}: {med[label]:.2f} s (controller CPU {cpu[label]:.1f} s, "
                  f"{cpu[label] / args.nodes * 1000:.1f} ms per node)")
        print(f"  ansible -m command 'fleetops-agent collect': {med['ansible']:.2f} s "
              f"(controller CPU {cpu['ansible']:.1f} s)")
        for label, _ in modes:
            print(f"  ansible / fleetops audit ({label}): {med['ansible'] / med[label]:.1f}x")
        if daemon:
            cold = modes[1][0]
            print(f"  cold / daemons: {med[cold] / med['daemons']:.1f}x")
        return 0
    finally:
        fleet.down(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
