"""Per-GPU ring buffers: the last hour at the sampling interval, in ``array`` storage.

One ``array('f')`` per field (4 bytes a sample; NaN where the backend gave no value), so 8 GPUs
at 2 s with 18 NVLinks each stay within a few MiB whatever the uptime.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

# Scalar fields every GPU has; per-link NVLink fields are added as ``nvlink<N>_<name>``.
GPU_FIELDS = (  # model.Gpu's names, so a sample reads like the snapshot it came from
    "temp_gpu_c",
    "temp_memory_c",
    "power_draw_w",
    "clock_sm_mhz",
    "clocks_event_mask",
    "utilization_gpu_pct",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "pcie_replay_counter",
    "pcie_tx_kbps",  # NVML throughput counters; the simulator has none (NaN)
    "pcie_rx_kbps",
)
# Cumulative counters, as model.NvLink names them (tx_kib / rx_kib: KiB since the driver loaded).
LINK_FIELDS = ("crc_errors", "replay_errors", "recovery_errors", "tx_kib", "rx_kib")


class Ring:
    """Fixed-size ring of samples: a time column plus one float column per field."""

    def __init__(self, capacity: int, fields: Iterable[str]) -> None:
        self.capacity = max(2, capacity)
        self.times = array("d", [math.nan]) * self.capacity
        self.columns: dict[str, array[float]] = {}
        for name in fields:
            self.columns[name] = array("f", [math.nan]) * self.capacity
        self.next = 0
        self.count = 0

    def add_field(self, name: str) -> None:
        if name not in self.columns:
            self.columns[name] = array("f", [math.nan]) * self.capacity

    def append(self, t: float, values: dict[str, float | None]) -> None:
        i = self.next
        self.times[i] = t
        for name, column in self.columns.items():
            value = values.get(name)
            column[i] = math.nan if value is None else float(value)
        self.next = (i + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)

    def _order(self) -> range:
        start = (self.next - self.count) % self.capacity
        return range(start, start + self.count)

    def samples(self, name: str, since: float) -> list[tuple[float, float | None]]:
        """(time, value) pairs newer than ``since``, oldest first; None where not read."""
        column = self.columns.get(name)
        if column is None:
            raise KeyError(name)
        out: list[tuple[float, float | None]] = []
        for j in self._order():
            i = j % self.capacity
            t = self.times[i]
            if t >= since:
                v = column[i]
                out.append((t, None if math.isnan(v) else v))
        return out

    def oldest_within(self, since: float) -> tuple[float, dict[str, float | None]] | None:
        """The oldest sample not older than ``since``: the base for rates over a window."""
        for j in self._order():
            i = j % self.capacity
            if self.times[i] >= since:
                values = {n: (None if math.isnan(c[i]) else c[i]) for n, c in self.columns.items()}
                return self.times[i], values
        return None

    def nbytes(self) -> int:
        return self.times.itemsize * self.capacity + sum(c.itemsize * self.capacity for c in self.columns.values())
