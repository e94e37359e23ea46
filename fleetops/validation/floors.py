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
# p2p_gbps          | GB/s    | copy-engine memcpy peer, one ordered GPU pair, one direction
# p2p_bidir_gbps    | GB/s    | both directions of a pair at once, bytes of both counted
#                   |         | (no published floor: judged against the fleet's pairs only)
# allreduce_busbw_gbps | GB/s | NCCL all_reduce bus bandwidth at the named GPU count,
#                   |         | message size and algorithm (busbw = algbw * 2 (n-1) / n)
# ib_write_bw_gbps  | Gb/s    | RDMA write bandwidth of one rail between two nodes (perftest's
#                   |         | ib_write_bw, GPUDirect where possible), the floor of a 400 Gb/s
#                   |         | rail: a rail of another rate is held to floor x rate / 400
#
# Healthy references the floors derive from (8-GPU HGX published runs, and one H200 measured):
# model     | triad (copy) TB/s | bf16 TFLOP/s | fp8 8192^3 TFLOP/s | H2D/D2H GB/s
# H100 SXM  | 2.97 (2.90)       | ~650-790     | 1290               | 51 / 52
# H200 SXM  | 4.15 (4.01)       | ~650-790     | 1301               | 52 / 52
#
# Floor = about 0.8 x reference (bandwidth to the host: the 48 GB/s commonly used in production
# health checks). The P2P and all_reduce floors and their sources are beside each entry below.

GIB = 1 << 30
MIB = 1 << 20
ANY = "any"  # an all_reduce floor that holds whatever algorithm NCCL used


@dataclass(frozen=True)
class AllReduceFloor:
    """A bus-bandwidth floor that holds from ``message_bytes`` up, at ``gpus`` GPUs (0: any
    count) and with ``algorithm`` (an NCCL_ALGO name, or ``any``). A result whose message is
    smaller, or whose algorithm is not the one named, is not held to it: NCCL's bus bandwidth
    depends on both, so a floor without them fails healthy nodes."""

    gpus: int
    algorithm: str
    message_bytes: int
    busbw_gbps: float

    def applies(self, gpus: int, algorithm: str, message_bytes: int) -> bool:
        return ((self.gpus in (0, gpus)) and message_bytes >= self.message_bytes
                and self.algorithm in (ANY, algorithm.upper()))


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
    # AzNHC's check_ib_bw_gdr 360 on NDR 400 (90 % of the rate); the floor of a 400 Gb/s rail.
    ib_write_bw_gbps: float = 360.0

    def metric(self, name: str) -> float | None:
        value = getattr(self, name, None)
        return float(value) if isinstance(value, (int, float)) else None

    def allreduce_floor(self, gpus: int, algorithm: str = "default", message_bytes: int = GIB) -> AllReduceFloor | None:
        """The strictest shipped floor that applies to a run of this shape, or None (then the
        run is judged against its fleet peers only)."""
        fits = [f for f in self.allreduce if f.applies(gpus, algorithm, message_bytes)]
        return max(fits, key=lambda f: f.busbw_gbps) if fits else None


NODE_METRICS = ("p2p_gbps", "p2p_bidir_gbps", "allreduce_busbw_gbps")

# The node-pair RDMA test: its floor is set for a rail of this rate and scaled to the rail's.
IB_WRITE_BW = "ib_write_bw_gbps"
IB_REFERENCE_RATE_GBPS = 400.0
IB_FLOOR_GBPS = 360.0  # AzNHC check_ib_bw_gdr 360 on ND96isr H100/H200 v5 (NDR 400)


def rail_floor(floor_at_reference: float, rate_gbps: float) -> float:
    """The floor of a rail whose ports should train at ``rate_gbps``: the floor of a 400 Gb/s rail
    in proportion (360 -> 180 at HDR 200, 720 at XDR 800); the same fraction of the rate holds."""
    return floor_at_reference * rate_gbps / IB_REFERENCE_RATE_GBPS

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
        # Azure AzNHC's P2P floor for ND96isr H100 v5 (nvbandwidth copy-engine peer copies).
        p2p_gbps=335.0,
        allreduce=(
            # 0.8 x the ND H100 v5 all_reduce busbw with NVLS, 8 GPUs: 423 GB/s at 256 MB.
            AllReduceFloor(8, "NVLS", 256 * MIB, 338.0),
            # 0.8 x the same run's 479 GB/s at 8 GB.
            AllReduceFloor(8, "NVLS", 8 * GIB, 383.0),
            # 0.8 x the ~370 GB/s NCCL's maintainers give for RING on 2-8 NVLink GPUs, the
            # slowest algorithm NCCL picks there: holds whatever it picked, from 1 GiB.
            AllReduceFloor(2, ANY, GIB, 296.0),
            AllReduceFloor(4, ANY, GIB, 296.0),
            AllReduceFloor(8, ANY, GIB, 296.0),
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
        # Azure AzNHC's P2P floor for ND96isr H200 v5 (nvbandwidth copy-engine peer copies).
        p2p_gbps=335.0,
        allreduce=(
            # 0.8 x the ND H200 v5 all_reduce busbw with NVLS, 8 GPUs: 432 GB/s at 256 MB.
            AllReduceFloor(8, "NVLS", 256 * MIB, 345.0),
            # 0.8 x the same run's 480 GB/s at 8 GB (AzNHC's README gives 480 at 16 GB too).
            AllReduceFloor(8, "NVLS", 8 * GIB, 384.0),
            # 0.8 x the ~370 GB/s NCCL's maintainers give for RING on 2-8 NVLink GPUs, the
            # slowest algorithm NCCL picks there: holds whatever it picked, from 1 GiB.
            AllReduceFloor(2, ANY, GIB, 296.0),
            AllReduceFloor(4, ANY, GIB, 296.0),
            AllReduceFloor(8, ANY, GIB, 296.0),
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
    fields = {m: float(over[m]) if m in over else getattr(base, m)
              for m in (*PER_GPU_METRICS, "p2p_gbps", IB_WRITE_BW)}
    allreduce = base.allreduce
    if "allreduce_busbw_gbps" in over:
        # One figure from the baseline holds for every GPU count, algorithm and message size.
        allreduce = (AllReduceFloor(0, ANY, 0, float(over["allreduce_busbw_gbps"])),)
    return ModelFloors(
        model=base.model,
        allreduce=allreduce,
        theoretical_hbm_gbps=base.theoretical_hbm_gbps,
        **fields,
    )
