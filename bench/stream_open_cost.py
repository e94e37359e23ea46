#!/usr/bin/env python3
"""What opening the TUI's daemon streams costs the whole machine, per transport.

    python3 bench/stream_open_cost.py --transport openssh --nodes 300
    python3 bench/stream_open_cost.py --transport paramiko --nodes 300

Starts a simulated fleet with its daemon (``sim up --daemon``), then opens one ``watch``
stream per node through ``transport.stream_opener`` from ``--concurrency`` threads (the
TUI's ``max_connecting``), as ``StreamSource`` does, and reports the wall time until every
stream is open, the ``open()`` times (median, p90, max), and the CPU the machine spent per
stream opened (``/proc/stat``: the controller, the ssh clients, sshd, the relays and the
fleet's daemon, which runs throughout) beside this process's own share. Needs root (sshd).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetops.fleet import inventory, transport
from fleetops.sim import fleet
from fleetops.tui.stream import relay_command


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", choices=transport.STREAM_TRANSPORTS, default="auto")
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--first-address", default=os.environ.get("FLEETOPS_BENCH_ADDRESS", "127.78.1.1"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fleetops-open-")
    try:
        with socket.socket() as sock:
            sock.bind((args.first_address, 0))
            port = int(sock.getsockname()[1])
        fleet.up(args.nodes, tmp, first_address=args.first_address, port=port, daemon=True)
        time.sleep(20)  # the daemon's first snapshots
        transport.raise_open_files(args.nodes)
        hosts = inventory.load(os.path.join(tmp, "inventory.yml"))
        opener = transport.stream_opener(args.transport, connect_timeout=10)
        times: list[float] = []
        streams: list[Any] = []
        lock = threading.Lock()

        def one(host: Any) -> None:
            t = time.monotonic()
            stream = opener.open(host, relay_command("fleetops-agent"))
            took = time.monotonic() - t
            stream.send(b"watch\n")
            with lock:
                times.append(took)
                streams.append(stream)

        c0, o0, t0 = machine_cpu_s(), own_cpu_s(), time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, hosts))
        wall, c1, o1 = time.monotonic() - t0, machine_cpu_s(), own_cpu_s()
        times.sort()
        print(f"{type(opener).__name__}, {args.nodes} streams, {args.concurrency} at once: all open in {wall:.1f} s; "
              f"open() median {statistics.median(times):.2f} s, p90 {times[int(0.9 * len(times))]:.2f} s, "
              f"max {times[-1]:.2f} s; machine CPU {(c1 - c0) / args.nodes * 1000:.1f} ms per stream, "
              f"this process {(o1 - o0) / args.nodes * 1000:.1f} ms")
        for stream in streams:
            stream.close()
        return 0
    finally:
        fleet.down(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
