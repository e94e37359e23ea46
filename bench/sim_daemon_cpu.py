#!/usr/bin/env python3
"""The CPU of the one ``fleetops-agent serve --backend sim`` that ``fleetops sim up --daemon``
runs for a whole simulated fleet, at steady state, without sshd or a TUI.

    python3 bench/sim_daemon_cpu.py                      # 1000 nodes x 8 GPUs, 2 s interval
    python3 bench/sim_daemon_cpu.py --nodes 200 --agent /path/to/fleetops-agent

Writes N fresh simulator states (the simulated fleet's default node), starts the daemon on them
with its default intervals, lets it warm up (every node's first snapshots), then reads the
process's user and system time from /proc over a window: % of one core, its threads and RSS.
This is the simulator's cost, not the product's: a real node runs its own daemon for one node.
The machine is shared: figures are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetops.sim import gpu as sim


def _times(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--warmup", type=float, default=40.0, help="seconds before the window (default 40)")
    p.add_argument("--window", type=float, default=30.0, help="seconds measured (default 30)")
    p.add_argument("--agent", default=os.path.join(os.path.dirname(sys.executable), "fleetops-agent"))
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    directory = tempfile.mkdtemp(prefix="fleetops-sim-daemon-bench-")
    proc = None
    try:
        for i in range(args.nodes):
            sim.init_state(os.path.join(directory, f"node{i:04d}.json"), f"node{i:04d}")
        proc = subprocess.Popen([args.agent, "serve", "--backend", "sim", "--states", directory],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.warmup)
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}) during the warm-up")
        (u0, s0), t0 = _times(proc.pid), time.monotonic()
        time.sleep(args.window)
        (u1, s1), t1 = _times(proc.pid), time.monotonic()
        status = Path(f"/proc/{proc.pid}/status").read_text(encoding="ascii")
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        wall = t1 - t0
        result = {
            "nodes": args.nodes,
            "window_s": round(wall, 1),
            "steady_cpu_pct_of_core": round(100 * (u1 - u0 + s1 - s0) / wall, 1),
            "user_pct": round(100 * (u1 - u0) / wall, 1),
            "system_pct": round(100 * (s1 - s0) / wall, 1),
            "startup_cpu_s": round(u0 + s0, 1),
            "threads": len(os.listdir(f"/proc/{proc.pid}/task")),
            "rss_mib": round(rss / 1024, 1),
            "load_avg": os.getloadavg(),
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
