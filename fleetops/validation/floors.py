"""Per-model floors for ``fleetops validate``.

A floor is the figure below which a healthy GPU of that model does not fall: about 0.8 x a
healthy reference run measured the way fleetops measures (STREAM-style kernel counting read +
write, warm-up discarded, median of repeats, clocks recorded and never locked).
"""

from __future__ import annotations

from dataclasses import dataclass

# metric            | unit    | meaning
# ------------------|---------|--------------------------------------------------------------
# hbm_copy_gbps     | GB/s    | STREAM copy a[i] = b[i], bytes = read + write, arrays >= 4 GiB
# hbm_triad_gbps    | GB/s    | STREAM triad a[i] = b[i] + s * c[i], bytes = 2 reads + 1 write
# gemm_bf16_tflops  | TFLOP/s | dense bf16 GEMM, 8192^3, 2*n^3 flops per call
# gemm_fp8_tflops   | TFLOP/s | dense fp8 (e4m3) GEMM, 8192^3, through torch._scaled_mm
# h2d_gbps          | GB/s    | pinned host -> device copy, 1 GiB buffer
# d2h_gbps          | GB/s    | pinned device -> host copy, 1 GiB buffer
# p2p_gbps          | GB/s    | device -> device copy between two GPUs of one node (NVLink)
# allreduce_busbw   | GB/s    | NCCL all_reduce bus bandwidth at the named GPU count,
#                   |         | message size and algorithm (busbw = algbw * 2 (n-1) / n)
#
# Healthy references the floors derive from (8-GPU HGX published runs, and one H200 measured):
# model     | triad (copy) TB/s | bf16 TFLOP/s | fp8 8192^3 TFLOP/s | H2D/D2H GB/s | P2P GB/s | all_reduce 8 GPUs
# H100 SXM  | 2.97 (2.90)       | ~650-750     | 1290               | 51 / 52      | ~420     | 466 at 1 GiB, NVLS
# H200 SXM  | 4.15 (4.01)       | ~650-790     | 1301               | 52 / 52      | ~420     | 468 at 1 GiB, NVLS
#
# Floor = about 0.8 x reference (bandwidth to the host: the 48 GB/s commonly used in production
# health checks; all_reduce: 0.8 x the figure at that GPU count, algorithm and message size).

ALLREDUCE_MESSAGE_BYTES = 1 << 30  # 1 GiB: smaller messages do not reach the peak bus bandwidth


@dataclass(frozen=True)
class AllReduceFloor:
    gpus: int
    algorithm: str  # NCCL_ALGO the figure was measured with; "default" lets NCCL choose
    message_bytes: int
    busbw_gbps: float


@dataclass(frozen=True)
class ModelFloors:
    model: str
    hbm_copy_gbps: float
    hbm_triad_gbps: float
    gemm_bf16_tflops: float
    gemm_fp8_tflops: float
    h2d_gbps: float
    d2h_gbps: float
    p2p_gbps: float
    allreduce: tuple[AllReduceFloor, ...]
    theoretical_hbm_gbps: float

    def metric(self, name: str) -> float | None:
        value = getattr(self, name, None)
        return float(value) if isinstance(value, (int, float)) else None

    def allreduce_floor(self, gpus: int) -> AllReduceFloor | None:
        for floor in self.allreduce:
            if floor.gpus == gpus:
                return floor
        return None


PER_GPU_METRICS = (
    "hbm_copy_gbps",
    "hbm_triad_gbps",
    "gemm_bf16_tflops",
    "gemm_fp8_tflops",
    "h2d_gbps",
    "d2h_gbps",
)

SHIPPED: dict[str, ModelFloors] = {
    "H100 SXM": ModelFloors(
        model="H100 SXM",
        hbm_copy_gbps=2320.0,
        hbm_triad_gbps=2380.0,
        gemm_bf16_tflops=520.0,
        gemm_fp8_tflops=1030.0,
        h2d_gbps=48.0,
        d2h_gbps=48.0,
        p2p_gbps=335.0,
        allreduce=(
            AllReduceFloor(2, "default", ALLREDUCE_MESSAGE_BYTES, 208.0),
            AllReduceFloor(4, "default", ALLREDUCE_MESSAGE_BYTES, 296.0),
            AllReduceFloor(8, "default", ALLREDUCE_MESSAGE_BYTES, 373.0),
        ),
        theoretical_hbm_gbps=3350.0,
    ),
    "H200 SXM": ModelFloors(
        model="H200 SXM",
        hbm_copy_gbps=3200.0,
        hbm_triad_gbps=3320.0,
        gemm_bf16_tflops=520.0,
        gemm_fp8_tflops=1040.0,
        h2d_gbps=48.0,
        d2h_gbps=48.0,
        p2p_gbps=335.0,
        allreduce=(
            AllReduceFloor(2, "default", ALLREDUCE_MESSAGE_BYTES, 208.0),
            AllReduceFloor(4, "default", ALLREDUCE_MESSAGE_BYTES, 296.0),
            AllReduceFloor(8, "default", ALLREDUCE_MESSAGE_BYTES, 374.0),
        ),
        theoretical_hbm_gbps=4800.0,
    ),
}


def model_key(name: str | None) -> str | None:
    """Map an NVML product name ("NVIDIA H200", "NVIDIA H100 80GB HBM3") to a shipped key;
    PCIe and NVL parts have other figures and get none."""
    if not name:
        return None
    upper = name.upper()
    if "PCIE" in upper or "NVL" in upper:
        return None
    if "H200" in upper:
        return "H200 SXM"
    if "H100" in upper:
        return "H100 SXM"
    return None


def floors_for(name: str | None, overrides: dict[str, dict[str, float]] | None = None) -> ModelFloors | None:
    """Shipped floors with the baseline's ``validation:`` overrides applied per metric."""
    key = model_key(name)
    base = SHIPPED.get(key) if key else None
    over = (overrides or {}).get(key or "", {}) or (overrides or {}).get(name or "", {})
    if base is None:
        return None
    if not over:
        return base
    fields = {m: float(over[m]) if m in over else getattr(base, m) for m in (*PER_GPU_METRICS, "p2p_gbps")}
    return ModelFloors(
        model=base.model,
        allreduce=base.allreduce,
        theoretical_hbm_gbps=base.theoretical_hbm_gbps,
        **fields,
    )
