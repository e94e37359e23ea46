"""The simulated validation backend: healthy H200 figures with seeded noise and the
degradations injected into the simulator state."""

from __future__ import annotations

import random
from typing import Any

from fleetops.validation.node import telemetry

# Healthy figures of one H200 SXM measured the agent's way (median of repeats).
HEALTHY: dict[str, float] = {
    "hbm_copy_gbps": 4010.0,
    "hbm_triad_gbps": 4150.0,
    "gemm_bf16_tflops": 700.0,
    "gemm_fp8_tflops": 1300.0,
    "h2d_gbps": 52.0,
    "d2h_gbps": 52.0,
}
DEGRADED_FACTOR = 0.85  # a degraded GPU runs at 85 %: a straggler above its HBM and GEMM floors,
# under the 48 GB/s floor of bandwidth to the host (44.2 of 52 GB/s)
# A slow link runs at 90 %: the P2P floor (335 of 390 GB/s) is at 86 % and the straggler line at
# 95 %, so 85 % sat 1 % under the floor, inside the noise of one run, and the verdict on the same
# slow link flipped between crit and warn from run to run; at 90 % it is a straggler every time.
SLOW_LINK_FACTOR = 0.90
# A noisy GPU's repeats spread over +-30 % of its figure, whatever the fleet's noise: twice the
# judge's 15 % steady-state limit, so a test of it shows no steady state but about 3 times in
# 100 000. At ten times the fleet's noise (the earlier rule) the spread sat at the limit at 2 %
# (one test in four looked steady) and under it at 1 % (a noisy GPU was never seen as noisy).
NOISY_HALF_WIDTH = 0.30
REPEATS = 10
DEFAULT_NOISE = 0.02  # relative noise of a run where neither the command line nor the state names one


# What a simulated GPU "went through" during each test, in the shape the CUDA backends give
# (telemetry.Window's summary per test, one reading after): a healthy GPU's readings.
_SIM_READING = {"clocks_event_reasons": [], "temperature_c": 35, "power_w": 120.0, "sm_clock_mhz": 1980}


def _telemetry(tests: dict[str, Any]) -> dict[str, Any]:
    reading = _SIM_READING
    during = {test: telemetry.summarize([reading, reading], 0.0) for test in tests}
    return {"during": during, "after": dict(reading)}


def lost_error(state: dict[str, Any], index: int) -> str | None:
    """What a workload on a lost GPU gets: the CUDA context cannot be made on a GPU that fell off
    the bus, so every test errors (a result without a figure, never a pass)."""
    from fleetops.sim.gpu import lost_reason

    why = lost_reason(state, index)
    if why is None:
        return None
    gpu = state["gpus"][index]
    return (f"GPU {index} ({gpu['bus_id']}) is lost ({why}): CUDA cannot create a context on it "
            "(cudaErrorDevicesUnavailable); reboot the node")


def run(state: dict[str, Any], noise: float, seed: int | None, gpus: list[int]) -> list[dict[str, Any]]:
    from fleetops.sim.gpu import VALIDATION_FAULTS, validation_faults

    rng = random.Random(seed)
    out = []
    for index in gpus:
        gpu = state["gpus"][index]
        lost = lost_error(state, index)
        if lost is not None:
            failed = {metric: {"error": lost} for metric in HEALTHY}
            out.append({"index": index, "uuid": gpu["uuid"], "bus_id": gpu["bus_id"], "name": gpu["name"],
                        "samples": failed, "telemetry": {"during": {}, "after": {"error": lost}}})
            continue
        faults = validation_faults(state, index)
        half = NOISY_HALF_WIDTH if "noisy" in faults else noise / 2
        tests: dict[str, Any] = {}
        for metric, value in HEALTHY.items():
            if any(metric in VALIDATION_FAULTS[f] for f in faults):
                value *= DEGRADED_FACTOR
            node_level = value * (1 + rng.gauss(0.0, noise / 2))
            samples = [node_level * (1 + rng.uniform(-half, half)) for _ in range(REPEATS)]
            tests[metric] = samples
        out.append({"index": index, "uuid": gpu["uuid"], "bus_id": gpu["bus_id"], "name": gpu["name"],
                    "samples": tests, "telemetry": _telemetry(tests)})
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
    from fleetops.sim.gpu import validation_faults

    gpus = state["gpus"]
    n = len(gpus)
    if n < 2:
        return {"p2p": {"not_applicable": f"{n} GPU"}, "allreduce": {"not_applicable": f"{n} GPU"}}
    lost = [why for why in (lost_error(state, i) for i in range(n)) if why is not None]
    if lost:  # every peer copy to it and the collective over all GPUs fail to start
        return {"p2p": {"error": "; ".join(lost)}, "allreduce": {"error": "; ".join(lost)}}
    rng = random.Random(f"{seed}-node") if seed is not None else random.Random()
    slow_gpus, slow_links = _slow_links(state)
    noisy = {i for i in range(n) if "noisy" in validation_faults(state, i)}
    reps = NODE_REPEATS[level]

    def slow(i: int, j: int) -> bool:
        return bool({i, j} & slow_gpus) or frozenset((i, j)) in slow_links

    def samples(value: float, degraded: bool, noisy_here: bool) -> list[float]:
        if degraded:
            value *= SLOW_LINK_FACTOR
        half = NOISY_HALF_WIDTH if noisy_here else noise / 2
        level_value = value * (1 + rng.gauss(0.0, noise / 2))
        return [level_value * (1 + rng.uniform(-half, half)) for _ in range(reps)]

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
