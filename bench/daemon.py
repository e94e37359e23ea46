"""RSS and CPU of ``fleetops-agent serve`` with 8 simulated GPUs at the default interval, and
``fleetops-agent collect`` answered by the daemon vs a cold collect (whole-process medians).

    python bench/daemon.py [--minutes 10] [--runs 30] [--backend nvml] [--load bf16] [--metrics-out FILE]

``--backend nvml`` (read-only) measures the daemon on this machine's GPUs and adds
``nvidia-smi -q -x`` to the same interleaved runs. ``--load bf16`` keeps a PyTorch bf16 matmul
loop running on every GPU while the daemon is measured (a workload only: no setting changed);
``--metrics-out`` saves the daemon's Prometheus page at the end (for ``promtool check metrics``).
Without a ``fleetops-agent`` script next to the interpreter the agent runs as ``python -c`` of its
entry point (a checkout on PYTHONPATH); with one, the answered collect is also timed that way.
``python_floor_ms_median`` is ``python -c pass`` in the same interleaved runs. Measure the agent
as deployed: compiled bytecode (``python -m compileall fleetops``; with PYTHONDONTWRITEBYTECODE
set and no ``__pycache__``, every run compiles the modules it imports and the figures mean little).
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

_SCRIPT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
AGENT_C = [sys.executable, "-c", "from fleetops.agent.main import entry; entry()"]
AGENT = [_SCRIPT] if os.path.exists(_SCRIPT) else AGENT_C


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


def _median_ms(cmds: dict[str, list[str]], env: dict[str, str], runs: int) -> dict[str, float]:
    """Interleaved whole-process runs; an agent run must say whether the daemon answered it."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            start = time.perf_counter()
            out = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
            times[name].append((time.perf_counter() - start) * 1000.0)
            # a cold NVML snapshot carries "daemon": null; one the daemon answered, its block
            if name in ("nvidia_smi_q_x", "python_floor"):
                continue
            if (json.loads(out).get("daemon") is not None) != name.startswith("collect_from_daemon"):
                raise SystemExit(f"{cmd}: the daemon {'did not answer' if name == 'collect_from_daemon' else 'answered'}")
    return {f"{k}_ms_median": round(statistics.median(v), 1) for k, v in times.items()}


# A bf16 matmul on every GPU until terminated: the load under which the daemon must stay quiet.
LOAD = """
import torch
n = 8192
mats = [(torch.randn(n, n, device=f"cuda:{i}", dtype=torch.bfloat16),
         torch.randn(n, n, device=f"cuda:{i}", dtype=torch.bfloat16)) for i in range(torch.cuda.device_count())]
while True:
    for a, b in mats:
        a @ b
    torch.cuda.synchronize()
"""


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--backend", choices=["sim", "nvml"], default="sim")
    ap.add_argument("--load", choices=["none", "bf16"], default="none")
    ap.add_argument("--metrics-out", help="write the daemon's /metrics page here at the end")
    ap.add_argument("--load-python", default=sys.executable, help="the interpreter with PyTorch for --load")
    ap.add_argument("--address", default="127.0.0.1", help="loopback address of the daemon's endpoint")
    args = ap.parse_args()
    host = args.address
    port = _free_port(host)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ)
        if args.backend == "sim":
            from fleetops.sim import gpu as sim

            state = os.path.join(d, "bench.json")
            sim.init_state(state, "bench")
            env["FLEETOPS_SIM_STATE"] = state
            sock = os.path.join(d, "bench.agent", "agent.sock")
            serve = [*AGENT, "serve", "--backend", "sim", "--states", state, "--metrics-address", f"{host}:{port}"]
            collect = [*AGENT, "collect"]
        else:
            env.pop("FLEETOPS_SIM_STATE", None)
            env["FLEETOPS_AGENT_STATE_DIR"] = os.path.join(d, "lib")
            sock = os.path.join(d, "run", "agent.sock")
            serve = [*AGENT, "serve", "--backend", "nvml", "--socket", sock, "--metrics-address", f"{host}:{port}"]
            collect = [*AGENT, "collect", "--backend", "nvml", "--socket", sock]
        proc = subprocess.Popen(serve, env=env)
        load = subprocess.Popen([args.load_python, "-c", LOAD]) if args.load == "bf16" else None
        try:
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
            # said at once: the collect comparison below may still fail
            print(json.dumps({"rss_mib_max": round(max(rss) / 1024, 1), "cpu_pct_of_one_core": round(cpu_pct, 3)}),
                  file=sys.stderr, flush=True)
            # the floor: the interpreter's start and nothing else (what no answer can go below)
            cmds = {"python_floor": [sys.executable, "-c", "pass"], "collect_from_daemon": collect,
                    "collect_cold": [*collect, "--fresh"]}
            if AGENT[0] == _SCRIPT:  # pip's console script imports re (~8 ms here); the same without it
                cmds["collect_from_daemon_python_c"] = [*AGENT_C, *collect[len(AGENT):]]
            if args.backend == "nvml":
                cmds["nvidia_smi_q_x"] = ["nvidia-smi", "-q", "-x"]
            medians = _median_ms(cmds, env, args.runs)
            final = json.loads(subprocess.run(collect, env=env, capture_output=True, check=True).stdout)
            if args.metrics_out:
                import urllib.request

                with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:  # loopback
                    with open(args.metrics_out, "wb") as fh:
                        fh.write(resp.read())
        finally:
            if load is not None:
                load.terminate()
                load.wait(timeout=30)
            proc.terminate()
            proc.wait(timeout=30)
    daemon = final["daemon"]
    print(json.dumps({
        "backend": args.backend,
        "load": args.load,
        "gpus": len(final["gpus"]),
        "interval_s": 2.0,
        "minutes": args.minutes,
        "rss_mib_max": round(max(rss) / 1024, 1),
        "rss_mib_median": round(statistics.median(rss) / 1024, 1),
        "cpu_pct_of_one_core": round(cpu_pct, 3),
        **medians,
        "runs": args.runs,
        "degraded": daemon["degraded"],
        "reason": daemon["reason"],
        "findings": [(f["severity"], f["check"]) for f in daemon["findings"]],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
