"""The PyTorch/CUDA validation backend. torch is imported here only, so the agent's other
commands stay light."""

from __future__ import annotations

from typing import Any

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


def _time(fn: Any, repeats: int, inner: int = 1, during: Any = None) -> list[float]:
    """Seconds per call of ``fn``: one warm-up call discarded, then ``repeats`` timed. ``during``
    reads telemetry while the last repeat is still queued on the GPU, so it sees the load."""
    import torch

    fn()
    torch.cuda.synchronize()
    out: list[float] = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        if during is not None and len(out) == repeats - 1:
            during()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1000.0 / inner)
    return out


def run_gpu(index: int, level: str, sample: Any) -> dict[str, Any]:
    import torch

    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    reps = REPEATS[level]
    tests: dict[str, Any] = {}

    n = HBM_BYTES[level] // 3 // 4
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.rand(n, dtype=torch.float32, device=dev)
    c = torch.rand(n, dtype=torch.float32, device=dev)
    t = _time(lambda: a.copy_(b), reps, during=lambda: sample("hbm_copy_gbps"))
    tests["hbm_copy_gbps"] = [2 * n * 4 / s / 1e9 for s in t]
    t = _time(lambda: torch.add(b, c, alpha=3.0, out=a), reps, during=lambda: sample("hbm_triad_gbps"))
    tests["hbm_triad_gbps"] = [3 * n * 4 / s / 1e9 for s in t]

    x = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    y = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    t = _time(lambda: torch.mm(x, y), reps, inner=5, during=lambda: sample("gemm_bf16_tflops"))
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
            t = _time(lambda: scaled_mm(xf, yf, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps, inner=5, during=lambda: sample("gemm_fp8_tflops"))
            tests["gemm_fp8_tflops"] = [2 * GEMM_N**3 / s / 1e12 for s in t]
        except (RuntimeError, TypeError) as exc:
            tests["gemm_fp8_tflops"] = {"skipped": f"torch._scaled_mm failed: {exc}"[:200]}

    host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    devbuf = torch.empty(HOST_BYTES, dtype=torch.uint8, device=dev)
    t = _time(lambda: devbuf.copy_(host, non_blocking=True), reps, during=lambda: sample("h2d_gbps"))
    tests["h2d_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
    t = _time(lambda: host.copy_(devbuf, non_blocking=True), reps, during=lambda: sample("d2h_gbps"))
    tests["d2h_gbps"] = [HOST_BYTES / s / 1e9 for s in t]
    torch.cuda.empty_cache()
    return tests
