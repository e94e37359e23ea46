"""fleetops audit of N simulated hosts against Ansible doing the same collection.

Both run against the same loopback fleet of real sshd processes in one run:
  - fleetops audit -i INV --forks F --format json --no-history
  - ansible all -i INV -m ansible.builtin.command -a "fleetops-agent collect" -f F
and the ratio is printed. Needs root (it starts sshd). Usage:
  python bench/audit_fanout.py [--nodes 100] [--forks 50] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetops.sim import fleet


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    return time.perf_counter() - t0, proc.returncode, proc.stdout[-300:] + proc.stderr[-300:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--forks", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    bindir = os.path.dirname(sys.executable)
    fleetops_bin = shutil.which("fleetops", path=bindir) or shutil.which("fleetops")
    ansible_bin = shutil.which("ansible", path=bindir) or shutil.which("ansible")
    if not fleetops_bin or not ansible_bin:
        print("needs fleetops and ansible on PATH (run scripts/setup.sh; use .venv/bin/python)")
        return 1
    tmp = tempfile.mkdtemp(prefix="fleetops-bench-")
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_PIPELINING="True", ANSIBLE_FORKS=str(args.forks))
    try:
        t0 = time.perf_counter()
        fleet.up(args.nodes, tmp)
        print(f"fleet up: {args.nodes} sshd hosts in {time.perf_counter() - t0:.2f} s")
        inv = os.path.join(tmp, "inventory.yml")
        ours, theirs = [], []
        for i in range(args.runs):
            dt, rc, tail = timed([fleetops_bin, "audit", "-i", inv, "--forks", str(args.forks), "--format", "json",
                                  "--no-history", "-q", "-o", os.path.join(tmp, "audit.json")], env)
            if rc not in (0, 1, 2):
                print(f"fleetops audit failed rc={rc}: {tail}")
                return 1
            ours.append(dt)
            dt2, rc2, tail2 = timed([ansible_bin, "all", "-i", inv, "-m", "ansible.builtin.command",
                                     "-a", "fleetops-agent collect", "-f", str(args.forks), "-o"], env)
            if rc2 != 0:
                print(f"ansible failed rc={rc2}: {tail2}")
                return 1
            theirs.append(dt2)
            print(f"run {i + 1}: fleetops audit {dt:.2f} s   ansible ad-hoc {dt2:.2f} s")
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"\n{args.nodes} hosts, forks {args.forks}, median of {args.runs}:")
        print(f"  fleetops audit (collect + checks + report): {a:.2f} s")
        print(f"  ansible -m command 'fleetops-agent collect': {b:.2f} s")
        print(f"  ratio: fleetops is {b / a:.1f}x faster (target >= 5x, and < 10 s for 100 hosts)")
        return 0
    finally:
        fleet.down(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
