#!/usr/bin/env python3
"""The controller's judgement of a whole fleet's validation results, at fleet size.

    python3 bench/validate_judge.py --nodes 1000

Builds the results ``fleetops validate`` gathers (the simulated backend's figures, 8 GPUs a node:
six per-GPU metrics each, 56 one-way and 28 two-way P2P pairs and one all_reduce a node, 2 %
noise), then times ``judge`` (per GPU) and ``judge_nodes`` (per node) as ``fleetops validate``
calls them, and prints what each flagged, so a faster judge is seen to give the same answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetops.sim import gpu as sim
from fleetops.validation.judge import judge, judge_nodes
from fleetops.validation.node import simbackend
from fleetops.validation.node.run import _summaries, _summarize_node

# node number -> a simulated degradation (fault, GPU[, peer GPU]), so the figures say the judge
# still finds them
DEGRADED = {7: ("slow-hbm", 3), 11: ("slow-gemm", 6), 20: ("slow-pcie", 0), 29: ("slow-nvlink", 2, 5)}


def results(nodes: int, noise: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    gpus: list[dict[str, Any]] = []
    docs: list[dict[str, Any]] = []
    template = sim.build_state("n0000")
    for n in range(nodes):
        host = f"n{n:04d}"
        if n in DEGRADED:  # a state of its own: the faults are written into it
            state = sim.build_state(host)
            fault, gpu, *peer = DEGRADED[n]
            sim.inject_validation_fault(state, fault, gpu, *peer)
        else:
            state = dict(template, node={**template["node"], "hostname": host})
        per = []
        for r in simbackend.run(state, noise, n, list(range(8))):
            g = {"host": host, "uuid": f"{host}/{r['index']}", "name": r["name"], "tests": _summaries(r["samples"])}
            gpus.append(g)
            per.append(g)
        node = _summarize_node(simbackend.run_node(state, noise, n, "quick"))
        docs.append({"host": host, "gpus": per, "node": node})
    return gpus, docs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.02)
    args = ap.parse_args()
    t0 = time.perf_counter()
    gpus, docs = results(args.nodes, args.noise)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_gpu = judge(gpus)
    t_gpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_node = judge_nodes(docs)
    t_node = time.perf_counter() - t0
    flagged_gpus = sorted((v.gpu, v.status) for v in per_gpu if v.status != "ok")
    flagged_nodes = sorted((v.host, v.status) for v in per_node if v.status != "ok")
    pairs = sum(len(v.verdicts) for v in per_node)
    print(f"{args.nodes} nodes, {len(gpus)} GPUs, {pairs} node-test figures (results built in {built:.1f} s)")
    print(f"judge (per GPU): {t_gpu:.2f} s; judge_nodes: {t_node:.2f} s")
    print(f"flagged GPUs: {flagged_gpus}")
    print(f"flagged nodes: {flagged_nodes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
