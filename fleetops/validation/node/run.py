"""Choose a backend, run the workloads per GPU, summarise and attach provenance."""

from __future__ import annotations

import os
import time
from typing import Any

from fleetops.validation.judge import summarize
from fleetops.validation.node import telemetry
from fleetops.validation.node.telemetry import nvml_gpus as _nvml_gpus
from fleetops.validation.node.telemetry import nvml_sampler as _nvml_sampler

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


BACKENDS = ("auto", "torch", "cupy", "dcgm", "sim")
NO_BACKEND = "no validation backend: install PyTorch with CUDA, or CuPy, or DCGM"


def _summarize_node(node: dict[str, Any]) -> dict[str, Any]:
    """Sample lists of the node tests become median/spread summaries, like the per-GPU ones."""
    out: dict[str, Any] = {}
    for part, section in node.items():
        sec = dict(section)
        for key in ("pairs", "bidirectional"):
            if key in sec:
                sec[key] = [{k: summarize(v) if isinstance(v, list) else v for k, v in pair.items()}
                            for pair in sec[key]]
        for key in ("allreduce_busbw_gbps", "algbw_gbps"):
            if isinstance(sec.get(key), list):
                sec[key] = summarize(sec[key])
        if part == "p2p" and "pairs" in sec:
            n = len(sec.get("gpus") or [])
            matrix: list[list[float | None]] = [[None] * n for _ in range(n)]
            for pair in sec["pairs"]:
                stat = pair.get("p2p_gbps")
                if isinstance(stat, dict) and "median" in stat and pair["src"] < n and pair["dst"] < n:
                    matrix[pair["src"]][pair["dst"]] = round(float(stat["median"]), 1)
            sec["matrix_gbps"] = matrix
        out[part] = sec
    return out


def _why_not(backend: str) -> str | None:
    if backend == "torch":
        from fleetops.validation.node import torchbackend

        return torchbackend.available()
    if backend == "cupy":
        from fleetops.validation.node import cupybackend

        return cupybackend.available()
    from fleetops.validation.node import dcgmbackend

    return dcgmbackend.available()


def pick_backend(backend: str, state_path: str | None) -> str:
    """The backend to run: the one asked for if it works here, else (auto) the first of torch,
    CuPy and DCGM that does. Nothing is installed: a node without any is refused, saying what
    to install."""
    if backend not in BACKENDS:
        raise ValidateError("usage", f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    if backend in ("sim", "auto"):
        from fleetops.gpu import backend_choice

        try:  # auto is never the simulator on a node with an NVIDIA driver
            chosen = backend_choice.choose(backend, bool(state_path or os.environ.get(backend_choice.SIM_STATE_ENV)))
        except backend_choice.BackendRefused as exc:
            raise ValidateError("usage", str(exc)) from exc
        if chosen == "sim":
            return "sim"
    if backend != "auto":
        why = _why_not(backend)
        if why is not None:
            raise ValidateError("backend", f"--backend {backend}: {why}")
        return backend
    reasons = []
    for name in ("torch", "cupy", "dcgm"):
        why = _why_not(name)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    raise ValidateError("backend", f"{NO_BACKEND} ({'; '.join(reasons)})")


def validate(level: str, gpu: str, backend: str, state_path: str | None, noise: float | None,
             seed: int | None) -> dict[str, Any]:
    """``noise`` and ``seed`` (sim backend only): None takes the state's ``validation_noise``
    setting, else the backend's default noise and fresh draws."""
    started = time.time()
    backend = pick_backend(backend, state_path)
    node: dict[str, Any]
    if backend == "sim":
        from fleetops.sim import gpu as sim

        path = state_path or os.environ.get("FLEETOPS_SIM_STATE")
        if not path:
            raise ValidateError("usage", "--backend sim needs --state or $FLEETOPS_SIM_STATE")
        try:
            state = sim.read_state(path)
        except sim.SimError as exc:
            raise ValidateError("usage", str(exc)) from exc
        from fleetops.validation.node import simbackend

        setting = state.get("validation_noise") or {}
        if noise is None:
            noise = float(setting.get("noise", simbackend.DEFAULT_NOISE))
        if seed is None and setting.get("seed") is not None:
            seed = int(setting["seed"])
        picked = _select(state["gpus"], gpu)
        raw = simbackend.run(state, noise, seed, picked)
        results = [{**{k: v for k, v in r.items() if k != "samples"}, "tests": _summaries(r["samples"])} for r in raw]
        node = _node_for_selection(gpu, lambda: simbackend.run_node(state, noise, seed, level))
        prov = {"backend": "sim", "versions": {"fleetops-sim": "1"}, "driver": state["node"].get("driver_version"),
                "noise": noise, "seed": seed}
    elif backend == "dcgm":
        from fleetops.validation.node import dcgmbackend

        gpus = _nvml_gpus()
        index = _select(gpus, gpu)[0] if gpu != "all" and gpus else None
        results, node, prov = dcgmbackend.run(level, gpus, index)
    else:
        results, node, prov = _run_cuda(backend, level, gpu)
    doc = {
        "kind": "validate",
        "level": level,
        "started": started,
        "duration_s": round(time.time() - started, 3),
        "expires": started + EXPIRY_S[level],
        "provenance": prov,
        "gpus": results,
        "node": _summarize_node(node),
    }
    if level == "full":  # what the controller pairs the nodes by for the RDMA bandwidth test
        doc["rdma"] = _rdma(backend, state_path)
    return doc


def _rdma(backend: str, state_path: str | None) -> dict[str, Any]:
    from fleetops.validation.node import ibbw

    try:
        return ibbw.rdma_section("sim" if backend == "sim" else "nvml", state_path)
    except Exception as exc:  # noqa: BLE001 - the GPU results stand; the pair test says why it cannot run
        return {"error": f"{type(exc).__name__}: {exc}"}


def _node_for_selection(gpu: str, run: Any) -> dict[str, Any]:
    if gpu != "all":
        why = "--gpu selects one GPU; the node tests need all of them"
        return {"p2p": {"skipped": why}, "allreduce": {"skipped": why}}
    result: dict[str, Any] = run()
    return result


def _run_cuda(backend: str, level: str, gpu: str) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """torch or CuPy: the same tests, the same telemetry per test, the same result shape."""
    from fleetops.validation.node import cupybackend, torchbackend

    mod: Any = torchbackend if backend == "torch" else cupybackend
    nv, _ = _nvml_sampler()
    gpus = mod.devices()
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
        window = telemetry.Window(nv, index)
        tests = mod.run_gpu(index, level, window)
        after = telemetry.read(nv, index)
        results.append({**gpus[index], "tests": _summaries(tests), "telemetry": {"during": window.during, "after": after}})

    def node_tests() -> dict[str, Any]:
        if len(gpus) < 2:
            return {"p2p": {"not_applicable": f"{len(gpus)} GPU"}, "allreduce": {"not_applicable": f"{len(gpus)} GPU"}}
        seen: dict[str, Any] = {}

        def sample(test: str) -> None:
            seen[test] = [telemetry.read(nv, g["index"]) for g in gpus]

        p2p = mod.run_p2p(gpus, level, sample)
        allreduce = mod.run_allreduce(gpus, level, sample)
        return {"p2p": {**p2p, "telemetry": seen.get("p2p_gbps")},
                "allreduce": {**allreduce, "telemetry": seen.get("allreduce_busbw_gbps")}}

    node = _node_for_selection(gpu, node_tests)
    prov = {"backend": backend, "versions": mod.versions(), "driver": driver}
    return results, node, prov
