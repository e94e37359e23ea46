"""The simulated validation backend: healthy H200 figures with seeded noise and the
degradations injected into the simulator state."""

from __future__ import annotations

import random
from typing import Any

# Healthy figures of one H200 SXM measured the agent's way (median of repeats).
HEALTHY: dict[str, float] = {
    "hbm_copy_gbps": 4010.0,
    "hbm_triad_gbps": 4150.0,
    "gemm_bf16_tflops": 700.0,
    "gemm_fp8_tflops": 1300.0,
    "h2d_gbps": 52.0,
    "d2h_gbps": 52.0,
}
DEGRADED_FACTOR = 0.85  # a degraded GPU runs at 85 %: above the floor, a straggler in the fleet
REPEATS = 10
DEFAULT_NOISE = 0.02  # relative noise of a run where neither the command line nor the state names one


def run(state: dict[str, Any], noise: float, seed: int | None, gpus: list[int]) -> list[dict[str, Any]]:
    from fleetops.gpu.sim import VALIDATION_FAULTS, validation_faults

    rng = random.Random(seed)
    out = []
    for index in gpus:
        gpu = state["gpus"][index]
        faults = validation_faults(state, index)
        gnoise = noise * 10 if "noisy" in faults else noise
        tests: dict[str, Any] = {}
        for metric, value in HEALTHY.items():
            if any(metric in VALIDATION_FAULTS[f] for f in faults):
                value *= DEGRADED_FACTOR
            node_level = value * (1 + rng.gauss(0.0, noise / 2))
            samples = [node_level * (1 + rng.uniform(-gnoise, gnoise) / 2) for _ in range(REPEATS)]
            tests[metric] = samples
        out.append({"index": index, "uuid": gpu["uuid"], "bus_id": gpu["bus_id"], "name": gpu["name"],
                    "samples": tests, "telemetry": {"clocks_event_reasons": [], "temperature_c": [35],
                                                     "power_w": [120.0], "sm_clock_mhz": [1980]}})
    return out


# Node-level figures of a healthy simulated 8-GPU H200 HGX node. These are the simulator's,
# not measurements: P2P is set at 87 % of NVLink 4's 450 GB/s per direction (copy-engine peer
# copies reach about that; production checks fail below 335 GB/s), both directions at 1.9x one;
# all_reduce follows the published ND H200 v5 busbw with NVLS (432 GB/s at 256 MB, 480 at 8 GB
# and above) and, below eight GPUs, the ~370 GB/s NCCL's maintainers give for RING.
P2P_GBPS = 390.0
P2P_BIDIR_GBPS = 740.0
P2P_BYTES = {"quick": 256 << 20, "full": 1 << 30}
ALLREDUCE_BYTES = {"quick": 256 << 20, "full": 16 << 30}
ALLREDUCE_NVLS_GBPS = {"quick": 432.0, "full": 480.0}
ALLREDUCE_RING_GBPS = 370.0
NODE_REPEATS = {"quick": 10, "full": 30}


def _slow_links(state: dict[str, Any]) -> tuple[set[int], set[frozenset[int]]]:
    """GPUs whose every link is slow, and single slow links, from the injected slow-nvlink."""
    gpus: set[int] = set()
    links: set[frozenset[int]] = set()
    for entry in state.get("validation_faults") or []:
        if entry.get("fault") != "slow-nvlink":
            continue
        if entry.get("peer") is None:
            gpus.add(int(entry["gpu"]))
        else:
            links.add(frozenset((int(entry["gpu"]), int(entry["peer"]))))
    return gpus, links


def run_node(state: dict[str, Any], noise: float, seed: int | None, level: str) -> dict[str, dict[str, Any]]:
    """The P2P matrix and all_reduce of one simulated node, as raw samples per pair."""
    from fleetops.gpu.sim import validation_faults

    gpus = state["gpus"]
    n = len(gpus)
    if n < 2:
        return {"p2p": {"not_applicable": f"{n} GPU"}, "allreduce": {"not_applicable": f"{n} GPU"}}
    rng = random.Random(f"{seed}-node") if seed is not None else random.Random()
    slow_gpus, slow_links = _slow_links(state)
    noisy = {i for i in range(n) if "noisy" in validation_faults(state, i)}
    reps = NODE_REPEATS[level]

    def slow(i: int, j: int) -> bool:
        return bool({i, j} & slow_gpus) or frozenset((i, j)) in slow_links

    def samples(value: float, degraded: bool, noisy_here: bool) -> list[float]:
        if degraded:
            value *= DEGRADED_FACTOR
        gnoise = noise * 10 if noisy_here else noise
        level_value = value * (1 + rng.gauss(0.0, noise / 2))
        return [level_value * (1 + rng.uniform(-gnoise, gnoise) / 2) for _ in range(reps)]

    pairs = [{"src": i, "dst": j, "src_uuid": gpus[i]["uuid"], "dst_uuid": gpus[j]["uuid"], "peer_access": True,
              "p2p_gbps": samples(P2P_GBPS, slow(i, j), bool({i, j} & noisy))}
             for i in range(n) for j in range(n) if i != j]
    bidir = [{"a": i, "b": j, "a_uuid": gpus[i]["uuid"], "b_uuid": gpus[j]["uuid"],
              "p2p_bidir_gbps": samples(P2P_BIDIR_GBPS, slow(i, j), bool({i, j} & noisy))}
             for i in range(n) for j in range(i + 1, n)]
    if n == 8:
        algorithm, busbw = "NVLS", ALLREDUCE_NVLS_GBPS[level]
    else:
        algorithm, busbw = "RING", ALLREDUCE_RING_GBPS
    # The collective runs at the pace of its slowest link.
    ar = samples(busbw, bool(slow_gpus or slow_links), bool(noisy))
    factor = 2 * (n - 1) / n
    return {
        "p2p": {"bytes": P2P_BYTES[level], "method": "copy engine, memcpy peer (simulated)",
                "gpus": [g["uuid"] for g in gpus], "pairs": pairs, "bidirectional": bidir},
        "allreduce": {"gpus": n, "message_bytes": ALLREDUCE_BYTES[level], "algorithm": algorithm,
                      "dtype": "float32", "nccl_version": "sim",
                      "allreduce_busbw_gbps": ar, "algbw_gbps": [x / factor for x in ar]},
    }
