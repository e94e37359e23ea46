"""Per-GPU ring buffers: the last hour at the sampling interval, in ``array`` storage.

A field is kept as runs (the sample it changed at, its new value) while it changes seldom, and
as a dense ``array('f')`` (4 bytes a sample, NaN where the backend gave no value) once runs
would cost more. Most of a GPU's fields are counters that hardly ever move (ECC, PCIe replays,
three error counters on each of 18 NVLinks): as runs they cost nearly nothing, so 8 GPUs keep
an hour at 2 s in well under a MiB where a dense column for every field took 5.9 MiB. A field
that changes on every sample costs what a dense column costs (plus its runs until it switched).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
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

_RUN_BYTES = 16  # one run: an int64 sample number and a float64 value


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN repeats NaN


class Column:
    """One field's values by sample number (the ring's running count), runs or dense."""

    __slots__ = ("starts", "values", "dense")

    def __init__(self) -> None:
        self.starts = array("q")
        self.values = array("d")
        self.dense: array[float] | None = None

    def put(self, seq: int, value: float, capacity: int) -> None:
        dense = self.dense
        if dense is not None:
            dense[seq % capacity] = value
            return
        if not self.values or not _same(self.values[-1], value):
            self.starts.append(seq)
            self.values.append(value)
        oldest = seq + 1 - capacity  # the oldest sample the ring still holds after this one
        drop = 0
        while drop + 1 < len(self.starts) and self.starts[drop + 1] <= oldest:
            drop += 1
        if drop:
            del self.starts[:drop]
            del self.values[:drop]
        if len(self.starts) * _RUN_BYTES > capacity * 4:  # runs now cost more than a dense column
            dense = array("f", [math.nan]) * capacity
            for s in range(max(0, oldest), seq + 1):
                dense[s % capacity] = self.at(s, capacity)
            self.dense = dense
            self.starts = array("q")
            self.values = array("d")

    def at(self, seq: int, capacity: int) -> float:
        if self.dense is not None:
            return self.dense[seq % capacity]
        i = bisect_right(self.starts, seq) - 1
        return self.values[i] if i >= 0 else math.nan

    def nbytes(self) -> int:
        if self.dense is not None:
            return self.dense.itemsize * len(self.dense)
        return self.starts.itemsize * len(self.starts) + self.values.itemsize * len(self.values)


class Ring:
    """Fixed-size ring of samples: a time column plus one ``Column`` per field."""

    def __init__(self, capacity: int, fields: Iterable[str]) -> None:
        self.capacity = max(2, capacity)
        self.times = array("d", [math.nan]) * self.capacity
        self.columns: dict[str, Column] = {}
        for name in fields:
            self.columns[name] = Column()
        self.total = 0  # samples appended since the start: the next sample's number
        self.count = 0
        # The last sample's values, while every column is a single run: the same values again
        # change nothing but the time column (an idle GPU's sample, most of a fleet's).
        self._settled: dict[str, float | None] | None = None
        self._steady_from = 0

    def add_field(self, name: str) -> None:
        """A field first seen now (a GPU's NVLinks): NaN in the samples before."""
        if name not in self.columns:
            self.columns[name] = Column()
            self._settled = None

    def append(self, t: float, values: dict[str, float | None]) -> None:
        seq, capacity = self.total, self.capacity
        self.times[seq % capacity] = t
        if self._settled is None or values != self._settled:
            single = True
            for name, column in self.columns.items():
                value = values.get(name)
                column.put(seq, math.nan if value is None else float(value), capacity)
                single = single and column.dense is None and len(column.starts) == 1
            self._settled = dict(values) if single else None
            # from this sample on, every field holds the value it has now
            self._steady_from = max((c.starts[0] for c in self.columns.values()), default=0) if single else 0
        self.total = seq + 1
        self.count = min(self.count + 1, capacity)

    def _order(self) -> range:
        return range(self.total - self.count, self.total)

    def samples(self, name: str, since: float) -> list[tuple[float, float | None]]:
        """(time, value) pairs newer than ``since``, oldest first; None where not read."""
        column = self.columns.get(name)
        if column is None:
            raise KeyError(name)
        out: list[tuple[float, float | None]] = []
        for seq in self._order():
            t = self.times[seq % self.capacity]
            if t >= since:
                v = column.at(seq, self.capacity)
                out.append((t, None if math.isnan(v) else v))
        return out

    def oldest_within(self, since: float) -> tuple[float, dict[str, float | None]] | None:
        """The oldest sample not older than ``since``: the base for rates over a window."""
        for seq in self._order():
            t = self.times[seq % self.capacity]
            if t >= since:
                values: dict[str, float | None] = {}
                for n, c in self.columns.items():
                    v = c.at(seq, self.capacity)
                    values[n] = None if math.isnan(v) else v
                return t, values
        return None

    def _at_or_before(self, t: float) -> int | None:
        """The number of the newest sample not newer than ``t`` (times only grow), or None."""
        lo, hi = self.total - self.count, self.total  # search [lo, hi)
        if not self.count or self.times[lo % self.capacity] > t:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.times[mid % self.capacity] <= t:
                lo = mid
            else:
                hi = mid
        return lo

    def base_time(self, since: float) -> float:
        """The time of the rate base for a window starting at ``since``: the newest sample at or
        before it, so the window is at least that long; the oldest sample when the ring is
        younger than the window. The ring must hold a sample."""
        seq = self._at_or_before(since)
        if seq is None:
            seq = self.total - self.count
        return self.times[seq % self.capacity]

    def same_as_now(self, t: float) -> bool:
        """Whether the ring has a sample taken at exactly ``t`` and every field has kept that
        sample's value since (what ``sample_at(t)`` returns equals the newest sample)."""
        if self._settled is None:
            return False
        seq = self._at_or_before(t)
        return seq is not None and seq >= self._steady_from and self.times[seq % self.capacity] == t

    def sample_at(self, t: float) -> dict[str, float | None] | None:
        """Every field of the sample taken at exactly ``t``, or None when this ring has none."""
        seq = self._at_or_before(t)
        if seq is None or self.times[seq % self.capacity] != t:
            return None
        out: dict[str, float | None] = {}
        for n, c in self.columns.items():
            v = c.at(seq, self.capacity)
            out[n] = None if math.isnan(v) else v
        return out

    def nbytes(self) -> int:
        return self.times.itemsize * self.capacity + sum(c.nbytes() for c in self.columns.values())
