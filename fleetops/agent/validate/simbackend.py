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
