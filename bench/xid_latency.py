"""XID latency: from a kernel-log line written on a simulated node to the daemon's Prometheus
counter ``fleetops_gpu_xid_total{gpu,code}`` showing it, over N injected XIDs.

    python bench/xid_latency.py [--xids 100] [--interval 2] [--address 127.0.0.1]

A real ``fleetops-agent serve --backend sim`` runs with its endpoint on ``--address``; each XID is
injected as ``fleetops sim inject`` does (``fleetops.sim.gpu.inject``: the fault is recorded and
its line appended to ``<state>.kmsg`` as a ``/dev/kmsg`` record), cycling over the 8 GPUs and a
few codes, one at a time, each after a random pause (0-0.25 s, seeded) so the lines fall at
any phase of the follower's poll, as real XIDs do. The clock starts just before the inject call (so it includes the
simulator's state write: an upper bound) and stops when a scrape shows that GPU's counter for
that code one higher; the endpoint is polled tightly meanwhile. Every XID must be counted exactly
once: the final page's counters must equal the injected counts (no loss, no double count).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

_SCRIPT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
AGENT = [_SCRIPT] if os.path.exists(_SCRIPT) else [sys.executable, "-c", "from fleetops.agent.main import entry; entry()"]
CODES = (13, 31, 43, 45, 94)  # repeatable ones: none of them takes a GPU off the bus
_XID = re.compile(r'^fleetops_gpu_xid_total\{gpu="(\d+)",[^}]*code="(\d+)"\} (\d+)$', re.M)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
            return str(resp.read().decode())
    except OSError:
        return ""


def counters(page: str) -> dict[tuple[int, int], int]:
    """(gpu index, code) -> count, from the page's XID counters."""
    return {(int(g), int(c)): int(n) for g, c, n in _XID.findall(page)}


def run(xids: int, interval: float, host: str, timeout_s: float = 30.0) -> dict[str, object]:
    from fleetops.sim import gpu as sim

    port = _free_port(host)
    url = f"http://{host}:{port}/metrics"
    with tempfile.TemporaryDirectory() as d:
        state = os.path.join(d, "xid.json")
        sim.init_state(state, "xid")
        gpus = len(sim.read_state(state)["gpus"])
        cmd = [*AGENT, "serve", "--backend", "sim", "--interval", str(interval), "--states", state,
               "--metrics-address", f"{host}:{port}"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            end = time.monotonic() + 60.0
            while "fleetops_node_gpus" not in (page := scrape(url)) or len(counters(page)) < gpus:
                if proc.poll() is not None or time.monotonic() > end:
                    raise SystemExit(f"the daemon did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
                time.sleep(0.05)
            expected = counters(page)
            latencies: list[float] = []
            rng = random.Random(52)
            for i in range(xids):
                gpu, code = i % gpus, CODES[(i // gpus) % len(CODES)]
                sim.clear(state, f"xid:{code}", gpu)  # so a repeat writes a new record
                want = expected.get((gpu, code), 0) + 1
                time.sleep(rng.uniform(0.0, 0.25))
                start = time.perf_counter()
                if not sim.inject(state, f"xid:{code}", gpu):
                    raise SystemExit(f"xid:{code} on GPU {gpu} was not injected")
                while True:
                    seen = counters(scrape(url)).get((gpu, code), 0)
                    if seen >= want:
                        break
                    if time.perf_counter() - start > timeout_s:
                        raise SystemExit(f"XID {i} (code {code}, GPU {gpu}) not on the endpoint after {timeout_s} s")
                latencies.append(time.perf_counter() - start)
                if seen != want:
                    raise SystemExit(f"XID {i} (code {code}, GPU {gpu}) counted {seen - want + 1} times")
                expected[(gpu, code)] = want
            time.sleep(max(1.0, 2 * interval))  # a late double count would show by now
            final = counters(scrape(url))
            if final != expected:
                diff = {k: (expected.get(k), final.get(k)) for k in set(final) | set(expected) if final.get(k) != expected.get(k)}
                raise SystemExit(f"counters differ from the injected XIDs (expected, page): {diff}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    ms = sorted(x * 1000.0 for x in latencies)
    p99 = ms[min(len(ms) - 1, max(0, round(0.99 * len(ms)) - 1))]
    return {
        "xids": xids,
        "gpus": gpus,
        "interval_s": interval,
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(p99, 1),
        "max_ms": round(ms[-1], 1),
        "counted_exactly_once": True,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xids", type=int, default=100)
    ap.add_argument("--interval", type=float, default=2.0, help="the daemon's sampling interval (default 2)")
    ap.add_argument("--address", default="127.0.0.1", help="loopback address for the endpoint")
    args = ap.parse_args()
    print(json.dumps(run(args.xids, args.interval, args.address)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
