"""Per-GPU ring buffers: the last hour at the sampling interval, in ``array`` storage.

A field is kept as runs (the sample it changed at, its new value) while it changes seldom, and
as a dense column once runs would cost more. Most of a GPU's fields are counters that hardly
ever move (ECC, PCIe replays, three error counters on each of 18 NVLinks): as runs they cost
nearly nothing, so 8 GPUs keep an hour at 2 s in well under a MiB (0.18 MiB for idle GPUs)
where a dense column for every field took 5.9 MiB. A field that changes on every sample costs
what a dense column costs (plus its runs until it switched).

Integers stay integers. The counters (``COUNTER_FIELDS``, every NVLink field) and the
clocks-event bitmask are NVML's unsigned 64-bit integers and are kept exactly, as unsigned 64-bit
runs (``NO_VALUE`` where the backend gave none) and, once dense, as a 64-bit base per block of
``BLOCK`` samples plus a 32-bit difference a sample (``Column``), and read back as ``int``: a link
at 8.7e12 KiB reads the very value NVML gave, so the difference of two samples is the exact
growth. A busy link's counter costs 4 bytes a sample, as float32 did: measured for 8 GPUs with 18
links, an hour at 2 s, 0.18 MiB idle and 2.50 MiB with every link moving (float32 took 2.37 MiB
and was wrong past 2**24; plain int64 took 4.35 MiB). A counter that went down within a block
(a reset) makes its column plain ``array('Q')`` until the reset has left the ring (the column is
compact again at the next lap), and a value that does not fit that (negative,
not whole, or ``NO_VALUE`` itself) a list of Python numbers: exact still. Gauges (temperatures,
power, clocks, utilisation, PCIe throughput) stay ``array('f')``, 4 bytes a sample, read back as
``float``, or None where not read.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

# The light sample's fields are the GPU access layer's vocabulary (both access kinds fill them);
# the ring stores them, and its importers read them here too.
from fleetops.gpu.backend import COUNTER_FIELDS as COUNTER_FIELDS
from fleetops.gpu.backend import GPU_FIELDS as GPU_FIELDS
from fleetops.gpu.backend import INTEGER_FIELDS as INTEGER_FIELDS
from fleetops.gpu.backend import LINK_FIELDS as LINK_FIELDS
from fleetops.gpu.backend import Value as Value

# "No value" in an integer column: the one unsigned 64-bit value it cannot hold (a counter that
# reaches it makes its column a list instead, so nothing is lost).
NO_VALUE = (1 << 64) - 1


_RUN_BYTES = 16  # one run: an int64 sample number and an 8-byte value
BLOCK = 32  # samples per base in a compact integer column: a 2 s link moving 50 GB/s fits 32 bits
_LOW_NONE = 0xFFFFFFFF  # "not read" in a compact integer column's 32-bit part
_MISS = object()  # a value an integer column's array('Q') cannot hold


def is_integer_field(name: str) -> bool:
    """Whether the ring keeps ``name`` as exact integers: the counters, the clocks-event
    bitmask and every per-link NVLink field (``nvlink<N>_<LINK_FIELDS>``)."""
    if name in INTEGER_FIELDS:
        return True
    head, _, field = name.partition("_")
    return head.startswith("nvlink") and head[6:].isdigit() and field in LINK_FIELDS


class Column:
    """One field's values by sample number (the ring's running count), runs or dense.

    ``kind`` is the storage: ``"f"`` a gauge (runs in float64, dense float32, NaN: not read),
    ``"Q"`` exact unsigned 64-bit integers (``NO_VALUE``: not read), ``"o"`` Python numbers
    (None: not read), what an integer column becomes when a value does not fit ``"Q"``.

    A dense ``"Q"`` column is compact while it can be: a base per block of ``BLOCK`` samples
    (``keys``, 8 bytes) and each sample's difference from its block's base in 32 bits, so a
    busy link's counter costs 4 bytes a sample, as float32 did, and reads back exact. A sample
    that does not fit (the counter went down, or moved 4 GiB-units within a block) makes the
    column plain ``array('Q')``, 8 bytes a sample."""

    __slots__ = ("starts", "values", "dense", "keys", "kind")

    def __init__(self, integer: bool = False) -> None:
        self.kind = "Q" if integer else "f"
        self.starts = array("q")
        self.values: Any = array("Q") if integer else array("d")
        self.dense: Any = None
        self.keys: Any = None  # a compact dense column's block bases, else None

    def _item(self, value: Value) -> Any:
        """``value`` as this column stores it; ``_MISS`` where an integer column cannot."""
        kind = self.kind
        if kind == "f":
            return math.nan if value is None else float(value)
        if type(value) is int and kind == "Q" and 0 <= value < NO_VALUE:
            return value  # a counter, the usual case
        if value is None or value != value:  # NaN: not read, in an integer column as in a gauge
            return NO_VALUE if kind == "Q" else None
        if kind == "o":
            return value
        if isinstance(value, int) and 0 <= value < NO_VALUE:
            return int(value)  # a bool as 0 / 1
        if isinstance(value, float) and value.is_integer() and 0 <= value < NO_VALUE:
            return int(value)
        return _MISS

    def _value(self, item: Any) -> Value:
        kind = self.kind
        if kind == "f":
            return None if item != item else float(item)
        if kind == "Q":
            return None if item == NO_VALUE else int(item)
        return item  # type: ignore[no-any-return]

    def _retained(self, seq: int, capacity: int) -> list[tuple[int, Any]]:
        """(sample number, stored item) of the samples before ``seq`` the ring still holds."""
        return [(s, self._item_at(s, capacity)) for s in range(max(0, seq + 1 - capacity), seq)]

    def _widen(self, seq: int, capacity: int) -> None:
        """An integer column that met a value ``array('Q')`` cannot hold: Python numbers from now."""
        if self.dense is not None:
            dense: list[Value] = [None] * capacity
            for s, item in self._retained(seq, capacity):
                dense[s % capacity] = self._value(item)
            self.dense, self.keys = dense, None
        self.values = [self._value(v) for v in self.values]
        self.kind = "o"

    def put(self, seq: int, value: Value, capacity: int) -> None:
        item = self._item(value)
        if item is _MISS:
            self._widen(seq, capacity)
            item = self._item(value)
        if self.dense is not None:
            self._store(seq, item, capacity)
            return
        values = self.values
        if not values or not (values[-1] == item or (item != item and values[-1] != values[-1])):  # NaN repeats NaN
            self.starts.append(seq)
            values.append(item)
        oldest = seq + 1 - capacity  # the oldest sample the ring still holds after this one
        drop = 0
        while drop + 1 < len(self.starts) and self.starts[drop + 1] <= oldest:
            drop += 1
        if drop:
            del self.starts[:drop]
            del self.values[:drop]
        # runs now cost more than dense (4 bytes a sample; 8 for Python numbers)
        if len(self.starts) * _RUN_BYTES > capacity * (8 if self.kind == "o" else 4):
            held = [*self._retained(seq, capacity), (seq, item)]
            if self.kind == "Q":  # compact, 4 bytes a sample, where the samples fit it; else plain, 8
                self.dense = array("Q", [NO_VALUE]) * capacity
                for s, held_item in held:
                    self.dense[s % capacity] = held_item
                self.starts, self.values = array("q"), array("Q")
                self._compact(seq, item, capacity)
                return
            self.dense = array("f", [math.nan]) * capacity if self.kind == "f" else [None] * capacity
            self.starts = array("q")
            self.values = [] if self.kind == "o" else array(self.values.typecode)
            for s, held_item in held:
                self._store(s, held_item, capacity)

    def _store(self, seq: int, item: Any, capacity: int) -> None:
        if self.keys is not None:
            if self._store_compact(seq, item, capacity):
                return
            plain = array("Q", [NO_VALUE]) * capacity  # the compact form cannot hold it: 8 bytes a sample
            for s, held_item in self._retained(seq, capacity):
                plain[s % capacity] = held_item
            self.dense, self.keys = plain, None
        elif self.kind == "Q" and seq % capacity == 0 and self._compact(seq, item, capacity):
            return  # once a lap, a plain column whose samples fit again (a reset aged out) is compact again
        self.dense[seq % capacity] = item

    def _compact(self, seq: int, item: Any, capacity: int) -> bool:
        """Hold the samples the ring keeps, and ``item`` as sample ``seq``, in the compact form;
        False, nothing changed, when one of them does not fit it."""
        held = [*self._retained(seq, capacity), (seq, item)]
        dense, keys = self.dense, self.keys
        self.dense = array("I", [_LOW_NONE]) * capacity
        self.keys = array("Q", [NO_VALUE]) * (capacity // BLOCK + 2)
        for s, held_item in held:
            if not self._store_compact(s, held_item, capacity):
                self.dense, self.keys = dense, keys
                return False
        return True

    def _store_compact(self, seq: int, item: int, capacity: int) -> bool:
        keys = self.keys
        k = (seq // BLOCK) % len(keys)
        if seq % BLOCK == 0:
            keys[k] = NO_VALUE  # a new block: its base is its first value read
        if item == NO_VALUE:
            self.dense[seq % capacity] = _LOW_NONE
            return True
        base = keys[k]
        if base == NO_VALUE:
            keys[k] = base = item
        low = item - base
        if 0 <= low < _LOW_NONE:
            self.dense[seq % capacity] = low
            return True
        return False

    def _item_at(self, seq: int, capacity: int) -> Any:
        if self.dense is not None:
            item = self.dense[seq % capacity]
            if self.keys is None:
                return item
            if item == _LOW_NONE:
                return NO_VALUE
            return self.keys[(seq // BLOCK) % len(self.keys)] + item
        i = bisect_right(self.starts, seq) - 1
        return self.values[i] if i >= 0 else self._item(None)

    def at(self, seq: int, capacity: int) -> Value:
        """The value of sample ``seq``: int for an integer field, float for a gauge, None
        where the backend gave none."""
        return self._value(self._item_at(seq, capacity))

    def nbytes(self) -> int:
        if self.dense is not None:
            keys = 8 * len(self.keys) if self.keys is not None else 0
            return (8 if self.kind == "o" else self.dense.itemsize) * len(self.dense) + keys
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
