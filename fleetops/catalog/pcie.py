"""PCIe link arithmetic: transfer rate per lane by generation, and what a link carries per direction
in the unit NVML's throughput counters speak (``nvmlDeviceGetPcieThroughput``: KB/s).

Shared by the replay-rate check (its limit scales with the link), the simulator (a workload that
reads from the host at 93 % of the link) and the job diagnosis (PCIe RX as a share of the link).
"""

from __future__ import annotations

# Transfer rate per lane, GT/s, by generation.
LANE_GTS: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# Line-code efficiency: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT mode (242 of 256 bytes
# carry data after FEC and CRC) for Gen6.
_ENCODING: dict[int, float] = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def link_kbps(gen: int | None, width: int | None) -> float | None:
    """What the link can carry per direction, KB/s (1 KB = 1000 bytes): Gen5 x16 is 63.0e6
    (63 GB/s). Transaction-layer overhead (TLP headers, flow control) takes another 10-20 % in
    practice, so a workload that saturates its link reads 80-95 % of this. None where the
    generation or width is not known."""
    if gen not in LANE_GTS or not width or width <= 0:
        return None
    gbit_per_lane = LANE_GTS[gen] * _ENCODING[gen]  # data Gbit/s per lane
    return gbit_per_lane * width / 8.0 * 1e6  # GB/s -> KB/s
