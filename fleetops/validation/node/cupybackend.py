"""The CuPy validation backend, for nodes with CuPy and no PyTorch. CuPy has no bf16 GEMM, so
the GEMM tests are fp16 and fp32 and say so by their names."""

from __future__ import annotations

from typing import Any

from fleetops.validation.node import levels, telemetry

REPEATS = {"quick": 10, "full": 30}
HBM_BYTES = {"quick": 4 << 30, "full": 8 << 30}
GEMM_N = 8192
HOST_BYTES = 1 << 30
P2P_BYTES = {"quick": 256 << 20, "full": 1 << 30}


def available() -> str | None:
    try:
        import cupy
    except ImportError:
        return "cupy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "cupy sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any CUDA runtime failure means no backend here
        return f"cupy has no CUDA device ({type(exc).__name__})"
    return None


def versions() -> dict[str, str]:
    import cupy

    return {"cupy": str(cupy.__version__), "cuda_runtime": str(cupy.cuda.runtime.runtimeGetVersion())}


def devices() -> list[dict[str, Any]]:
    import cupy

    out = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props["name"]
        out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name), "uuid": str(i), "bus_id": ""})
    return out


def _time(
    fn: Any, repeats: int, inner: int = 1, window: Any = None, test: str = "",
    timing: levels.Timing = levels.UNTIMED_WARMUP,
) -> list[float]:
    """Seconds per call from CUDA events on the current stream, as the torch backend's ``_time``:
    a first call, ``timing.warmup_s`` untimed, then ``repeats`` timed of ``inner`` calls or as
    many as last ``timing.repeat_s``; ``window`` samples the GPU throughout, as ``test``."""
    import cupy

    def elapsed(calls: int) -> float:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end)) / 1000.0

    def first() -> None:
        fn()
        cupy.cuda.Device().synchronize()

    return levels.time_repeats(elapsed, first, repeats, inner, window, test, timing)


_STREAM_SOURCE = r"""
extern "C" __global__ void fleetops_copy(const float4* __restrict__ x, float4* __restrict__ y, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i];
}
extern "C" __global__ void fleetops_triad(const float4* __restrict__ x, const float4* __restrict__ z,
                                          float4* __restrict__ y, float s, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 a = x[i], b = z[i];
        y[i] = make_float4(a.x + s * b.x, a.y + s * b.y, a.z + s * b.z, a.w + s * b.w);
    }
}
"""


def run_gpu(index: int, level: str, window: telemetry.Window | None) -> dict[str, Any]:
    """The per-GPU tests on GPU ``index``; ``window`` samples the GPU during each (None: not sampled)."""
    import cupy

    reps = REPEATS[level]
    tests: dict[str, Any] = {}
    with cupy.cuda.Device(index):
        n = HBM_BYTES[level] // 3 // 16 * 4  # a whole number of float4s per array
        a = cupy.empty(n, dtype=cupy.float32)
        b = cupy.random.rand(n, dtype=cupy.float32)
        c = cupy.random.rand(n, dtype=cupy.float32)
        # float4 loads and stores in a grid-stride loop: CuPy's generic elementwise kernels index
        # element by element and reach well under half of HBM's bandwidth (measured on an H200),
        # which would fail healthy GPUs against the floors.
        module = cupy.RawModule(code=_STREAM_SOURCE)
        copy, triad = module.get_function("fleetops_copy"), module.get_function("fleetops_triad")
        n4 = n // 4
        grid = (int(cupy.cuda.Device(index).attributes["MultiProcessorCount"]) * 8,)
        block = (256,)
        t = _time(lambda: copy(grid, block, (b, a, cupy.int64(n4))), reps, window=window, test="hbm_copy_gbps", timing=levels.timing(level, "hbm"))
        tests["hbm_copy_gbps"] = [2 * n * 4 / s / 1e9 for s in t]
        t = _time(lambda: triad(grid, block, (b, c, a, cupy.float32(3.0), cupy.int64(n4))), reps,
                  window=window, test="hbm_triad_gbps", timing=levels.timing(level, "hbm"))
        tests["hbm_triad_gbps"] = [3 * n * 4 / s / 1e9 for s in t]
        a = b = c = None  # free the STREAM arrays before the GEMM ones
        for dtype, name in ((cupy.float16, "gemm_fp16_tflops"), (cupy.float32, "gemm_fp32_tflops")):
            x = cupy.random.rand(GEMM_N, GEMM_N).astype(dtype)
            y = cupy.random.rand(GEMM_N, GEMM_N).astype(dtype)
            t = _time(lambda x=x, y=y: cupy.matmul(x, y), reps, inner=5, window=window, test=name, timing=levels.timing(level, "gemm"))
            tests[name] = [2 * GEMM_N**3 / s / 1e12 for s in t]
        tests["gemm_bf16_tflops"] = {"skipped": "CuPy has no bf16 GEMM: gemm_fp16_tflops and gemm_fp32_tflops instead"}
        tests["gemm_fp8_tflops"] = {"skipped": "CuPy has no fp8 GEMM"}
        pinned = cupy.cuda.alloc_pinned_memory(HOST_BYTES)
        devbuf = cupy.cuda.alloc(HOST_BYTES)
        stream = cupy.cuda.get_current_stream()
        t = _time(lambda: devbuf.copy_from_host_async(pinned.ptr, HOST_BYTES, stream), reps, window=window, test="h2d_gbps", timing=levels.timing(level, "copy"))
        tests["h2d_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
        t = _time(lambda: devbuf.copy_to_host_async(pinned.ptr, HOST_BYTES, stream), reps, window=window, test="d2h_gbps", timing=levels.timing(level, "copy"))
        tests["d2h_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
        cupy.get_default_memory_pool().free_all_blocks()
    return tests


def run_p2p(gpus: list[dict[str, Any]], level: str, sample: Any) -> dict[str, Any]:
    """Every ordered pair through cudaMemcpyPeerAsync (copy engine), timed with events on the
    source device's stream."""
    import cupy

    size = P2P_BYTES[level]
    reps = REPEATS[level]
    idx = [int(g["index"]) for g in gpus]
    bufs = {}
    for i in idx:
        with cupy.cuda.Device(i):
            for j in idx:
                if j != i and cupy.cuda.runtime.deviceCanAccessPeer(i, j):
                    try:
                        cupy.cuda.runtime.deviceEnablePeerAccess(j)
                    except cupy.cuda.runtime.CUDARuntimeError:
                        pass  # already enabled
            bufs[i] = (cupy.cuda.alloc(size), cupy.cuda.alloc(size))
    pairs: list[dict[str, Any]] = []
    for i in idx:
        for j in idx:
            if i == j:
                continue
            with cupy.cuda.Device(i):
                stream = cupy.cuda.get_current_stream()
                src, dst = bufs[i][0], bufs[j][1]
                t = _time(lambda src=src, dst=dst, i=i, j=j, stream=stream: cupy.cuda.runtime.memcpyPeerAsync(
                    dst.ptr, j, src.ptr, i, size, stream.ptr), reps, inner=5)
                cupy.cuda.Device(j).synchronize()
            if len(pairs) == 0:
                sample("p2p_gbps")
            pairs.append({"src": i, "dst": j, "src_uuid": gpus[idx.index(i)]["uuid"], "dst_uuid": gpus[idx.index(j)]["uuid"],
                          "peer_access": bool(cupy.cuda.runtime.deviceCanAccessPeer(i, j)),
                          "p2p_gbps": [size / s / 1e9 for s in t]})
    bufs.clear()
    return {"bytes": size, "method": "copy engine, cudaMemcpyPeerAsync (CuPy)", "gpus": [g["uuid"] for g in gpus],
            "pairs": pairs, "bidirectional": []}


def run_allreduce(gpus: list[dict[str, Any]], level: str, sample: Any) -> dict[str, Any]:
    return {"skipped": "the CuPy backend does not run NCCL; install PyTorch with CUDA for all_reduce"}
