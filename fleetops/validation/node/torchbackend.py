"""The PyTorch/CUDA validation backend. torch is imported here only, so the agent's other
commands stay light."""

from __future__ import annotations

from typing import Any

from fleetops.validation.node import levels, telemetry

REPEATS = {"quick": 10, "full": 30}
HBM_BYTES = {"quick": 4 << 30, "full": 8 << 30}
GEMM_N = 8192
HOST_BYTES = 1 << 30


def available() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    return None


def versions() -> dict[str, str]:
    import torch

    return {"torch": str(torch.__version__), "cuda": str(torch.version.cuda)}


def _time(
    fn: Any, repeats: int, inner: int = 1, window: Any = None, test: str = "",
    timing: levels.Timing = levels.UNTIMED_WARMUP,
) -> list[float]:
    """Seconds per call of ``fn``: one first call, then ``fn`` untimed for ``timing.warmup_s``
    seconds (``levels``: the clocks settle under the power cap), then ``repeats`` timed, each of
    ``inner`` calls or as many as last ``timing.repeat_s``. ``window`` (a ``telemetry.Window``) samples
    the GPU from before the first call until the last repeat ended, as ``test``."""
    import torch

    def elapsed(calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0

    def first() -> None:
        fn()
        torch.cuda.synchronize()

    return levels.time_repeats(elapsed, first, repeats, inner, window, test, timing)


def run_gpu(index: int, level: str, window: telemetry.Window | None) -> dict[str, Any]:
    """The per-GPU tests on GPU ``index``; ``window`` samples the GPU during each (None: not sampled)."""
    import torch

    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    reps = REPEATS[level]
    tests: dict[str, Any] = {}

    n = HBM_BYTES[level] // 3 // 4
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.rand(n, dtype=torch.float32, device=dev)
    c = torch.rand(n, dtype=torch.float32, device=dev)
    t = _time(lambda: a.copy_(b), reps, window=window, test="hbm_copy_gbps", timing=levels.timing(level, "hbm"))
    tests["hbm_copy_gbps"] = [2 * n * 4 / s / 1e9 for s in t]
    t = _time(lambda: torch.add(b, c, alpha=3.0, out=a), reps, window=window, test="hbm_triad_gbps", timing=levels.timing(level, "hbm"))
    tests["hbm_triad_gbps"] = [3 * n * 4 / s / 1e9 for s in t]

    x = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    y = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    t = _time(lambda: torch.mm(x, y), reps, inner=5, window=window, test="gemm_bf16_tflops", timing=levels.timing(level, "gemm"))
    tests["gemm_bf16_tflops"] = [2 * GEMM_N**3 / s / 1e12 for s in t]
    scaled_mm = getattr(torch, "_scaled_mm", None)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    major, _ = torch.cuda.get_device_capability(dev)
    if scaled_mm is None or fp8 is None:
        tests["gemm_fp8_tflops"] = {"skipped": "this torch has no torch._scaled_mm / float8_e4m3fn"}
    elif major < 9:
        tests["gemm_fp8_tflops"] = {"skipped": f"compute capability {major}.x has no fp8 tensor cores"}
    else:
        xf = x.to(fp8)
        yf = y.t().contiguous().t().to(fp8)
        one = torch.tensor(1.0, device=dev)
        try:
            t = _time(lambda: scaled_mm(xf, yf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps, inner=5, window=window, test="gemm_fp8_tflops", timing=levels.timing(level, "gemm"))
            tests["gemm_fp8_tflops"] = [2 * GEMM_N**3 / s / 1e12 for s in t]
        except (RuntimeError, TypeError) as exc:
            tests["gemm_fp8_tflops"] = {"skipped": f"torch._scaled_mm failed: {exc}"[:200]}

    host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    devbuf = torch.empty(HOST_BYTES, dtype=torch.uint8, device=dev)
    t = _time(lambda: devbuf.copy_(host, non_blocking=True), reps, window=window, test="h2d_gbps", timing=levels.timing(level, "copy"))
    tests["h2d_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
    t = _time(lambda: host.copy_(devbuf, non_blocking=True), reps, window=window, test="d2h_gbps", timing=levels.timing(level, "copy"))
    tests["d2h_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
    torch.cuda.empty_cache()
    return tests


def devices() -> list[dict[str, Any]]:
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": props.name, "uuid": str(getattr(props, "uuid", i)), "bus_id": ""})
    return out


P2P_BYTES = {"quick": 256 << 20, "full": 1 << 30}
P2P_INNER = 5
ALLREDUCE_BYTES = {"quick": 256 << 20, "full": 16 << 30}
ALLREDUCE_TIMEOUT_S = {"quick": 120.0, "full": 480.0}


def _wall(fn: Any, sync: Any, repeats: int, inner: int) -> list[float]:
    """Seconds per call on the host clock, synchronising the devices involved: a peer copy
    spans two devices, so one device's events do not bound it. ``inner`` calls per repeat keep
    the synchronisation cost under 1 % of a repeat."""
    import time

    fn()
    sync()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        out.append((time.perf_counter() - start) / inner)
    return out


def run_p2p(gpus: list[dict[str, Any]], level: str, sample: Any) -> dict[str, Any]:
    """Every ordered pair one direction at a time (copy engine: ``Tensor.copy_`` between two
    devices is a cudaMemcpyPeer where peer access is on), then every unordered pair in both
    directions at once on two streams."""
    import torch

    size = P2P_BYTES[level]
    reps = REPEATS[level]
    idx = [int(g["index"]) for g in gpus]
    bufs = {i: (torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}"),
                torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}")) for i in idx}
    pairs, bidir = [], []
    sampled = False
    for i in idx:
        for j in idx:
            if i == j:
                continue
            src, dst = bufs[i][0], bufs[j][1]

            def sync(i: int = i, j: int = j) -> None:
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)

            t = _wall(lambda src=src, dst=dst: dst.copy_(src, non_blocking=True), sync, reps, P2P_INNER)
            if not sampled:
                sample("p2p_gbps")
                sampled = True
            pairs.append({"src": i, "dst": j, "src_uuid": gpus[idx.index(i)]["uuid"], "dst_uuid": gpus[idx.index(j)]["uuid"],
                          "peer_access": bool(torch.cuda.can_device_access_peer(i, j)),
                          "p2p_gbps": [size / s / 1e9 for s in t]})
    for a in idx:
        for b in idx:
            if b <= a:
                continue
            sa, sb = torch.cuda.Stream(device=a), torch.cuda.Stream(device=b)

            def both(a: int = a, b: int = b, sa: Any = sa, sb: Any = sb) -> None:
                with torch.cuda.stream(sa):
                    bufs[b][1].copy_(bufs[a][0], non_blocking=True)
                with torch.cuda.stream(sb):
                    bufs[a][1].copy_(bufs[b][0], non_blocking=True)

            def sync2(a: int = a, b: int = b) -> None:
                torch.cuda.synchronize(a)
                torch.cuda.synchronize(b)

            t = _wall(both, sync2, reps, P2P_INNER)
            bidir.append({"a": a, "b": b, "a_uuid": gpus[idx.index(a)]["uuid"], "b_uuid": gpus[idx.index(b)]["uuid"],
                          "p2p_bidir_gbps": [2 * size / s / 1e9 for s in t]})
    bufs.clear()
    torch.cuda.empty_cache()
    return {"bytes": size, "method": "copy engine, memcpy peer (torch Tensor.copy_)", "gpus": [g["uuid"] for g in gpus],
            "pairs": pairs, "bidirectional": bidir}


def run_allreduce(gpus: list[dict[str, Any]], level: str, sample: Any) -> dict[str, Any]:
    """NCCL all_reduce over every GPU of the node, one process per GPU (torch.multiprocessing,
    rendezvous on 127.0.0.1 only), the figures from the ranks' timings."""
    import torch

    from fleetops.validation.node import torchnccl

    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return {"skipped": "this torch build has no NCCL backend"}
    try:
        out = torchnccl.run(len(gpus), ALLREDUCE_BYTES[level], REPEATS[level], ALLREDUCE_TIMEOUT_S[level], sample)
    except torchnccl.NcclRunError as exc:
        return {"error": str(exc)}
    try:
        out["nccl_version"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - the version is provenance, not the result
        out["nccl_version"] = None
    return out
