"""RSS and CPU of ``fleetops-agent serve`` with 8 simulated GPUs at the default interval, and
``fleetops-agent collect`` answered by the daemon vs a cold collect (whole-process medians).

    python bench/daemon.py [--minutes 10] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from fleetops.gpu import sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _median_ms(cmd: list[str], env: dict[str, str], runs: int, want_daemon: bool) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
        times.append((time.perf_counter() - start) * 1000.0)
        if ("daemon" in json.loads(out)) != want_daemon:
            raise SystemExit(f"{cmd}: expected daemon={want_daemon}")
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        state = os.path.join(d, "bench.json")
        sim.init_state(state, "bench")
        env = {**os.environ, "FLEETOPS_SIM_STATE": state}
        proc = subprocess.Popen([AGENT, "serve", "--backend", "sim", "--states", state], env=env)
        try:
            sock = os.path.join(d, "bench.agent", "agent.sock")
            while not os.path.exists(sock):
                time.sleep(0.1)
            time.sleep(12.0)  # first full snapshot and checks done
            cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
            rss: list[int] = []
            end = t0 + args.minutes * 60.0
            while time.monotonic() < end:
                rss.append(_rss_kib(proc.pid))
                time.sleep(5.0)
            cpu_pct = (_cpu_s(proc.pid) - cpu0) / (time.monotonic() - t0) * 100.0
            served = _median_ms([AGENT, "collect"], env, args.runs, True)
            cold = _median_ms([AGENT, "collect", "--fresh"], env, args.runs, False)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps({
        "gpus": 8,
        "interval_s": 2.0,
        "minutes": args.minutes,
        "rss_mib_max": round(max(rss) / 1024, 1),
        "rss_mib_median": round(statistics.median(rss) / 1024, 1),
        "cpu_pct_of_one_core": round(cpu_pct, 3),
        "collect_from_daemon_ms_median": round(served, 1),
        "collect_cold_ms_median": round(cold, 1),
        "runs": args.runs,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
