"""Per-GPU ring buffers: the last hour at the sampling interval, in ``array`` storage.

A field is kept as runs (the sample it changed at, its new value) while it changes seldom, and
as a dense column once runs would cost more. Most of a GPU's fields are counters that hardly
ever move (ECC, PCIe replays, three error counters on each of 18 NVLinks): as runs they cost
nearly nothing, so 8 GPUs keep an hour at 2 s in well under a MiB (0.18 MiB for idle GPUs)
where a dense column for every field took 5.9 MiB. A field that changes on every sample costs
what a dense column costs (plus its runs until it switched).

Integers stay integers. The counters (``COUNTER_FIELDS``, every NVLink field) and the
clocks-event bitmask are NVML's unsigned 64-bit integers and are kept exactly, in ``array('Q')``
(8 bytes a sample, ``NO_VALUE`` where the backend gave none) and read back as ``int``: a link at
8.7e12 KiB reads the very value NVML gave, so the difference of two samples is the exact growth.
A value that does not fit (negative, not whole, or ``NO_VALUE`` itself) turns that column into a
list of Python numbers, exact still. Gauges (temperatures, power, clocks, utilisation, PCIe
throughput) stay compact: ``array('f')``, 4 bytes a sample, NaN where not read; they are read
back as ``float``, or None where not read.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

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
# The GPU fields kept as exact integers: cumulative counters, and a bitmask (its bits are names).
COUNTER_FIELDS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "pcie_replay_counter")
INTEGER_FIELDS = frozenset((*COUNTER_FIELDS, "clocks_event_mask"))

# "No value" in an integer column: the one unsigned 64-bit value it cannot hold (a counter that
# reaches it makes its column a list instead, so nothing is lost).
NO_VALUE = (1 << 64) - 1

Value = float | int | None  # what a column gives back: int from an integer field, None: not read

_RUN_BYTES = 16  # one run: an int64 sample number and an 8-byte value


def is_integer_field(name: str) -> bool:
    """Whether the ring keeps ``name`` as exact integers: the counters, the clocks-event
    bitmask and every per-link NVLink field (``nvlink<N>_<LINK_FIELDS>``)."""
    if name in INTEGER_FIELDS:
        return True
    head, _, field = name.partition("_")
    return head.startswith("nvlink") and head[6:].isdigit() and field in LINK_FIELDS


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) or (a != a and b != b)  # NaN repeats NaN


class Column:
    """One field's values by sample number (the ring's running count), runs or dense.

    ``kind`` is the storage: ``"f"`` a gauge (runs in float64, dense float32, NaN: not read),
    ``"Q"`` exact unsigned 64-bit integers (``NO_VALUE``: not read), ``"o"`` Python numbers
    (None: not read), what an integer column becomes when a value does not fit ``"Q"``."""

    __slots__ = ("starts", "values", "dense", "kind")

    def __init__(self, integer: bool = False) -> None:
        self.kind = "Q" if integer else "f"
        self.starts = array("q")
        self.values: Any = array("Q") if integer else array("d")
        self.dense: Any = None

    def _encode(self, value: Value) -> Any:
        kind = self.kind
        if kind == "f":
            return math.nan if value is None else float(value)
        if value is not None and value != value:
            value = None  # NaN: not read, in an integer column as in a gauge
        if kind == "Q":
            if value is None:
                return NO_VALUE
            if isinstance(value, int) and 0 <= value < NO_VALUE:
                return int(value)  # a bool as 0 / 1
            if isinstance(value, float) and value.is_integer() and 0 <= value < NO_VALUE:
                return int(value)
            self._widen()
        return value

    def _decode(self, item: Any) -> Value:
        kind = self.kind
        if kind == "f":
            return None if item != item else float(item)
        if kind == "Q":
            return None if item == NO_VALUE else int(item)
        return item  # type: ignore[no-any-return]

    def _widen(self) -> None:
        """An integer column that met a value ``array('Q')`` cannot hold: Python numbers from now."""
        values = [self._decode(v) for v in self.values]
        dense = [self._decode(v) for v in self.dense] if self.dense is not None else None
        self.kind, self.values, self.dense = "o", values, dense

    def _itemsize(self) -> int:
        return 4 if self.kind == "f" else 8

    def put(self, seq: int, value: Value, capacity: int) -> None:
        item = self._encode(value)
        dense = self.dense
        if dense is not None:
            dense[seq % capacity] = item
            return
        if not self.values or not _same(self.values[-1], item):
            self.starts.append(seq)
            self.values.append(item)
        oldest = seq + 1 - capacity  # the oldest sample the ring still holds after this one
        drop = 0
        while drop + 1 < len(self.starts) and self.starts[drop + 1] <= oldest:
            drop += 1
        if drop:
            del self.starts[:drop]
            del self.values[:drop]
        if len(self.starts) * _RUN_BYTES > capacity * self._itemsize():  # runs now cost more than dense
            empty = self._encode(None)
            if self.kind == "o":
                dense = [empty] * capacity
            else:
                dense = array("f" if self.kind == "f" else "Q", [empty]) * capacity
            for s in range(max(0, oldest), seq + 1):
                dense[s % capacity] = self._item_at(s, capacity)
            self.dense = dense
            self.starts = array("q")
            self.values = [] if self.kind == "o" else array(self.values.typecode)

    def _item_at(self, seq: int, capacity: int) -> Any:
        if self.dense is not None:
            return self.dense[seq % capacity]
        i = bisect_right(self.starts, seq) - 1
        return self.values[i] if i >= 0 else self._encode(None)

    def at(self, seq: int, capacity: int) -> Value:
        """The value of sample ``seq``: int for an integer field, float for a gauge, None
        where the backend gave none."""
        return self._decode(self._item_at(seq, capacity))

    def nbytes(self) -> int:
        if self.dense is not None:
            return self._itemsize() * len(self.dense)
        return self.starts.itemsize * len(self.starts) + 8 * len(self.values)


class Ring:
    """Fixed-size ring of samples: a time column plus one ``Column`` per field."""

    def __init__(self, capacity: int, fields: Iterable[str]) -> None:
        self.capacity = max(2, capacity)
        self.times = array("d", [math.nan]) * self.capacity
        self.columns: dict[str, Column] = {}
        for name in fields:
            self.columns[name] = Column(is_integer_field(name))
        self.total = 0  # samples appended since the start: the next sample's number
        self.count = 0
        # The last sample's values, while every column is a single run: the same values again
        # change nothing but the time column (an idle GPU's sample, most of a fleet's).
        self._settled: dict[str, Value] | None = None
        self._steady_from = 0

    def add_field(self, name: str) -> None:
        """A field first seen now (a GPU's NVLinks): NaN in the samples before."""
        if name not in self.columns:
            self.columns[name] = Column(is_integer_field(name))
            self._settled = None

    def append(self, t: float, values: dict[str, Value]) -> None:
        seq, capacity = self.total, self.capacity
        self.times[seq % capacity] = t
        if self._settled is None or values != self._settled:
            single = True
            for name, column in self.columns.items():
                value = values.get(name)
                column.put(seq, value, capacity)
                single = single and column.dense is None and len(column.starts) == 1
            self._settled = dict(values) if single else None
            # from this sample on, every field holds the value it has now
            self._steady_from = max((c.starts[0] for c in self.columns.values()), default=0) if single else 0
        self.total = seq + 1
        self.count = min(self.count + 1, capacity)

    def _order(self) -> range:
        return range(self.total - self.count, self.total)

    def samples(self, name: str, since: float) -> list[tuple[float, Value]]:
        """(time, value) pairs newer than ``since``, oldest first; None where not read."""
        column = self.columns.get(name)
        if column is None:
            raise KeyError(name)
        out: list[tuple[float, Value]] = []
        for seq in self._order():
            t = self.times[seq % self.capacity]
            if t >= since:
                out.append((t, column.at(seq, self.capacity)))
        return out

    def oldest_within(self, since: float) -> tuple[float, dict[str, Value]] | None:
        """The oldest sample not older than ``since``: the base for rates over a window."""
        for seq in self._order():
            t = self.times[seq % self.capacity]
            if t >= since:
                return t, {n: c.at(seq, self.capacity) for n, c in self.columns.items()}
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

    def sample_at(self, t: float) -> dict[str, Value] | None:
        """Every field of the sample taken at exactly ``t``, or None when this ring has none."""
        seq = self._at_or_before(t)
        if seq is None or self.times[seq % self.capacity] != t:
            return None
        return {n: c.at(seq, self.capacity) for n, c in self.columns.items()}

    def nbytes(self) -> int:
        return self.times.itemsize * self.capacity + sum(c.nbytes() for c in self.columns.values())
