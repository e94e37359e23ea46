"""Choose a backend, run the workloads per GPU, summarise and attach provenance."""

from __future__ import annotations

import os
import time
from typing import Any

from fleetops.validation.judge import summarize

EXPIRY_S = {"quick": 7 * 86400, "full": 30 * 86400}


class ValidateError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _select(gpus: list[dict[str, Any]], sel: str) -> list[int]:
    if sel == "all":
        return [int(g["index"]) for g in gpus]
    for g in gpus:
        if sel in (str(g.get("uuid")), str(g.get("index"))) or str(g.get("bus_id", "")).lower().endswith(sel.lower()):
            return [int(g["index"])]
    raise ValidateError("usage", f"--gpu {sel}: no such GPU (give all, a UUID, an index or a bus id)")


def _summaries(samples: dict[str, Any]) -> dict[str, Any]:
    return {m: summarize(v) if isinstance(v, list) else v for m, v in samples.items()}


def _nvml_sampler() -> tuple[Any, Any]:
    """Read-only NVML telemetry per test: clocks-event reasons, temperature, power, SM clock."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - telemetry is optional; the result says it is missing
        return None, None
    return pynvml, pynvml


def validate(level: str, gpu: str, backend: str, state_path: str | None, noise: float, seed: int | None) -> dict[str, Any]:
    started = time.time()
    if backend == "auto" and (state_path or os.environ.get("FLEETOPS_SIM_STATE")):
        backend = "sim"
    if backend == "sim":
        from fleetops.gpu import sim

        path = state_path or os.environ.get("FLEETOPS_SIM_STATE")
        if not path:
            raise ValidateError("usage", "--backend sim needs --state or $FLEETOPS_SIM_STATE")
        try:
            state = sim.read_state(path)
        except sim.SimError as exc:
            raise ValidateError("usage", str(exc)) from exc
        from fleetops.agent.validate import simbackend

        picked = _select(state["gpus"], gpu)
        raw = simbackend.run(state, noise, seed, picked)
        results = [{**{k: v for k, v in r.items() if k != "samples"}, "tests": _summaries(r["samples"])} for r in raw]
        prov = {"backend": "sim", "versions": {"fleetops-sim": "1"}, "driver": state["node"].get("driver_version"),
                "noise": noise, "seed": seed}
    elif backend in ("auto", "torch"):
        from fleetops.agent.validate import torchbackend

        why = torchbackend.available()
        if why is not None:
            raise ValidateError("backend", f"no validation backend: {why}; install PyTorch with CUDA "
                                           "(pip install torch) or CuPy (pip install cupy-cuda12x)")
        results, prov = _run_torch(level, gpu)
    else:
        raise ValidateError("usage", f"--backend {backend}: expected auto, torch or sim")
    return {
        "kind": "validate",
        "level": level,
        "started": started,
        "duration_s": round(time.time() - started, 3),
        "expires": started + EXPIRY_S[level],
        "provenance": prov,
        "gpus": results,
    }


def _run_torch(level: str, gpu: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    from fleetops.agent.validate import torchbackend

    nv, _ = _nvml_sampler()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": props.name, "uuid": str(getattr(props, "uuid", i)), "bus_id": ""})
    driver = None
    if nv is not None:
        driver = nv.nvmlSystemGetDriverVersion()
        for g in gpus:
            h = nv.nvmlDeviceGetHandleByIndex(g["index"])
            g["uuid"] = nv.nvmlDeviceGetUUID(h)
            g["bus_id"] = nv.nvmlDeviceGetPciInfo(h).busId
            g["power_limit_w"] = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
    results = []
    for index in _select(gpus, gpu):
        telemetry: dict[str, Any] = {}

        def sample(test: str, index: int = index, telemetry: dict[str, Any] = telemetry) -> None:
            telemetry[test] = _read_nvml(nv, index)

        tests = torchbackend.run_gpu(index, level, sample)
        after = _read_nvml(nv, index)
        results.append({**gpus[index], "tests": _summaries(tests), "telemetry": {"before": telemetry, "after": after}})
    prov = {"backend": "torch", "versions": torchbackend.versions(), "driver": driver}
    return results, prov


def _read_nvml(nv: Any, index: int) -> dict[str, Any]:
    if nv is None:
        return {"error": "pynvml not available"}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mask = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        names = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown"}
        return {
            "clocks_event_reasons": [n for bit, n in names.items() if mask & bit],
            "temperature_c": nv.nvmlDeviceGetTemperature(h, 0),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, 1),
        }
    except Exception as exc:  # noqa: BLE001 - a missing reading is recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
