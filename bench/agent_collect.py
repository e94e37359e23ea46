#!/usr/bin/env python3
"""Whole-process time of ``fleetops-agent collect``, as a node runs it.

    # NVML: the agent under a given interpreter / virtual environment vs nvidia-smi -q -x,
    # N runs each, interleaved; prints both medians and their ratio (target <= 0.5)
    python3 bench/agent_collect.py --backend nvml --python /opt/fleetops/venv -n 21

    # simulator: an 8-GPU state from fleetops.sim.gpu.init_state; prints the median (target < 150 ms)
    python3 bench/agent_collect.py --backend sim -n 21

The agent is started the way its console script starts it (``from fleetops.agent.main import
main; sys.exit(main())``), by the interpreter given with ``--python`` (an executable, or a
virtual environment's folder). ``--pythonpath`` (default: this checkout) is put in front of
PYTHONPATH so an uninstalled checkout runs; pass ``--pythonpath ''`` to time an installed agent.
Each run's stdout must parse as a snapshot; a failing run stops the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "from fleetops.agent.main import entry; entry()"


def interpreter(given: str) -> str:
    path = Path(given)
    if path.is_dir():
        path = path / "bin" / "python3"
    if not path.exists():
        found = shutil.which(given)
        if not found:
            raise SystemExit(f"--python {given!r}: no such interpreter or virtual environment")
        return found
    return str(path)


def run_once(cmd: list[str], env: dict[str, str], check_json: bool) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=env, check=False)
    elapsed = (time.perf_counter() - start) * 1000.0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}"
        )
    if check_json:
        json.loads(proc.stdout)
    return elapsed


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "min_ms": round(ordered[0], 1),
        "max_ms": round(ordered[-1], 1),
        "n": len(ordered),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter or venv folder that runs the agent"
    )
    parser.add_argument("--pythonpath", default=str(ROOT), help="prepended to PYTHONPATH ('' for none)")
    parser.add_argument("-n", "--runs", type=int, default=21, help="runs of each command (default 21)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs of each command first")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs in the simulated node (sim)")
    parser.add_argument("--json", dest="json_out", help="also write the figures to this file")
    args = parser.parse_args(argv)

    python = interpreter(args.python)
    env = dict(os.environ)
    env.pop("FLEETOPS_NVML_TRACE", None)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, env.get("PYTHONPATH", "")) if p)
    agent = [python, "-c", ENTRY, "collect", "--backend", args.backend]
    result: dict[str, object] = {"python": python, "runs": args.runs, "backend": args.backend}

    if args.backend == "sim":
        sys.path.insert(0, str(ROOT))
        from fleetops.sim import gpu as sim

        with tempfile.TemporaryDirectory(prefix="fleetops-bench-") as tmp:
            state = os.path.join(tmp, "state.json")
            sim.init_state(state, socket.gethostname(), {"gpu_count": args.gpus})
            cmd = agent + ["--state", state]
            for _ in range(args.warmup):
                run_once(cmd, env, True)
            times = [run_once(cmd, env, True) for _ in range(args.runs)]
        result["agent"] = summary(times)
        result["gpus"] = args.gpus
        med = result["agent"]["median_ms"]  # type: ignore[index]
        print(
            f"fleetops-agent collect --backend sim ({args.gpus} GPUs): median {med} ms "
            f"(min {min(times):.1f}, max {max(times):.1f}, n={len(times)}); target < 150 ms: "
            f"{'met' if med < 150 else 'NOT met'}"
        )
    else:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise SystemExit("nvidia-smi is not on PATH")
        smi_cmd = [smi, "-q", "-x"]
        for _ in range(args.warmup):
            run_once(agent, env, True)
            run_once(smi_cmd, env, False)
        agent_times, smi_times = [], []
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            agent_times.append(run_once(agent, env, True))
            smi_times.append(run_once(smi_cmd, env, False))
        a, s = summary(agent_times), summary(smi_times)
        ratio = round(a["median_ms"] / s["median_ms"], 3)
        result.update({"agent": a, "nvidia_smi_q_x": s, "ratio": ratio})
        print(
            f"fleetops-agent collect --backend nvml: median {a['median_ms']} ms (min {a['min_ms']}, max {a['max_ms']})"
        )
        print(
            f"nvidia-smi -q -x:                      median {s['median_ms']} ms (min {s['min_ms']}, max {s['max_ms']})"
        )
        print(
            f"ratio agent / nvidia-smi -q -x: {ratio} (target <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'}), "
            f"n={args.runs} each, interleaved, python={python}"
        )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
