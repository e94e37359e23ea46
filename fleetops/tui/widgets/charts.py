"""History charts of one GPU over the daemon's last hour, on one time axis.

The daemon keeps a ring of samples per GPU; the charts show as much of it as there is (from the
first to the last sample of any field), bucketed to the widget's width. Every row starts with
the same gutter, so a column is the same moment in every chart, in the throttle strip, in the
XID row and on the axis. Values are written out (last, lowest, highest, the threshold) so that a
number never has to be guessed from a bar's height, and every mark is a character, readable
without colour.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Static

from fleetops import model
from fleetops.catalog import throttle
from fleetops.checks.thermal_power import FAULT_REASONS
from fleetops.tui.data import XidView, format_age

BARS = "▁▂▃▄▅▆▇█"
LEVELS = len(BARS)  # eighths of a row
LABEL_W = 5  # the gutter's words and values
GUTTER = LABEL_W + 2  # label, a space, the gutter's line: the bars start at this column
THRESHOLD_LINE = "╌"  # the threshold's row, where no bar reaches it
OVER_MARK = "▲"  # under a bucket whose value is at or over the threshold
XID_MARK = "X"  # one XID in the column; 2-9 several, + ten or more
NOT_THROTTLED = "·"  # a sampled bucket without a throttle reason of the checks' fault set
# The throttle reasons the checks call faults (checks.thermal_power.FAULT_REASONS), one letter
# each, strongest first: a bucket shows the first that any of its samples had. The bits and
# their names are the catalog's (catalog.throttle); only the letters are the chart's.
THROTTLE_MARKS: tuple[tuple[str, str, str], ...] = (
    ("hw_power_brake_slowdown", "P", "power brake"),
    ("hw_thermal_slowdown", "T", "thermal"),
    ("sw_thermal_slowdown", "T", "thermal"),
    ("hw_slowdown", "S", "hardware slowdown"),
)
XID_LEGEND_MAX = 6  # XIDs listed under the row; the XIDs tab has the rest
RECENT_S = 60.0  # a window ending this close to now is "the last N min"

Samples = Sequence[tuple[float, float | None]]
History = dict[str, list[tuple[float, float | None]]]
Window = tuple[float, float]


@dataclass(frozen=True)
class ChartSpec:
    field: str
    title: str
    unit: str
    style: str
    rows: int = 3  # bar rows: eight levels each
    scale: tuple[float, float] | None = None  # a fixed scale; None: the samples' lowest to highest
    # the threshold from the GPU's snapshot: (name, model.Gpu field), the first the snapshot has
    limits: tuple[tuple[str, str], ...] = ()


CHARTS = (
    ChartSpec("temp_gpu_c", "GPU temp", "C", "dark_orange", limits=(("slowdown", "temp_slowdown_c"),)),
    ChartSpec("temp_memory_c", "HBM temp", "C", "magenta", limits=(("HBM max", "temp_memory_max_c"),)),
    ChartSpec(
        "power_draw_w", "power", "W", "yellow",
        limits=(("enforced cap", "power_enforced_limit_w"), ("power limit", "power_limit_w")),
    ),  # fmt: skip
    ChartSpec("utilization_gpu_pct", "GPU util", "%", "green", rows=2, scale=(0.0, 100.0)),
    ChartSpec("clock_sm_mhz", "SM clock", "MHz", "cyan", rows=2),
)
MASK_FIELD = "clocks_event_mask"
FIELDS = (*(c.field for c in CHARTS), MASK_FIELD)  # what gpu_history asks the daemon for


@dataclass(frozen=True)
class Threshold:
    """A chart's threshold from the GPU's snapshot; ``value`` None: the snapshot lacks it, and
    ``missing`` says which value and why."""

    name: str
    value: float | None
    unit: str
    missing: str = ""


def fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.1f}"


def span_label(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}min"


def utc(t: float, seconds: bool = False) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.gmtime(t))


# --- columns of the window ------------------------------------------------------------------


def window_of(history: History) -> Window | None:
    """From the first to the last sample of any field: the one window every row is drawn on."""
    times = [t for samples in history.values() for t, _ in samples]
    return (min(times), max(times)) if times else None


def column(t: float, window: Window, width: int) -> int | None:
    """The bucket column of time ``t``: column i holds the times nearest to the i-th of
    ``width`` evenly spaced moments from the window's start to its end; None outside."""
    t0, t1 = window
    if width <= 0:
        return None
    if t1 <= t0:
        return width - 1 if t == t1 else None
    i = math.floor((t - t0) / (t1 - t0) * (width - 1) + 0.5)
    return i if 0 <= i < width else None


def column_time(i: int, window: Window, width: int) -> float:
    """The moment column ``i`` is centred on."""
    t0, t1 = window
    return t1 if width <= 1 else t0 + (t1 - t0) * i / (width - 1)


def buckets(samples: Samples, width: int, window: Window | None = None) -> list[float | None]:
    """The mean of the samples falling in each of ``width`` columns (None: no value). The
    window is the samples' own unless given (the charts share theirs)."""
    if width <= 0 or not samples:
        return []
    win = window or (samples[0][0], samples[-1][0])
    sums = [0.0] * width
    counts = [0] * width
    for t, v in samples:
        i = column(t, win, width)
        if v is not None and i is not None:
            sums[i] += v
            counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def bucket_peaks(samples: Samples, width: int, window: Window | None = None) -> list[float | None]:
    """The highest sample in each column: a threshold crossing shorter than a column, which its
    mean hides, is still marked."""
    if width <= 0 or not samples:
        return []
    win = window or (samples[0][0], samples[-1][0])
    out: list[float | None] = [None] * width
    for t, v in samples:
        i = column(t, win, width)
        if v is not None and i is not None:
            prev = out[i]
            out[i] = v if prev is None else max(prev, v)
    return out


def bucket_masks(samples: Samples, width: int, window: Window) -> list[int | None]:
    """The clocks-event bits seen in each column (a bitwise or: a throttle of one sample shows)."""
    out: list[int | None] = [None] * max(width, 0)
    for t, v in samples:
        i = column(t, window, width)
        if v is not None and i is not None:
            out[i] = (out[i] or 0) | int(v)
    return out


# --- value charts ---------------------------------------------------------------------------


def threshold_for(spec: ChartSpec, gpu: model.Gpu | None) -> Threshold | None:
    """The chart's threshold from the GPU's current snapshot (None: the chart has none)."""
    if not spec.limits:
        return None
    name = spec.limits[0][0]
    if gpu is None:
        return Threshold(name, None, spec.unit, f"{name} unknown (no snapshot of this GPU)")
    for i, (label, field) in enumerate(spec.limits):
        value = getattr(gpu, field)
        if value is not None:
            missing = ""
            if i:  # a fallback: say which one the snapshot lacked
                first = spec.limits[0][1]
                missing = f"{spec.limits[0][0]} n/a: {gpu.unavailable.get(first, 'not reported')}"
            return Threshold(label, float(value), spec.unit, missing)
    why = gpu.unavailable.get(spec.limits[0][1], "not reported")
    return Threshold(name, None, spec.unit, f"{name} n/a ({why})")


def _level(v: float, low: float, high: float, levels: int) -> int:
    """Bar height in eighths, 1 (the lowest value) to ``levels`` (the highest)."""
    if high <= low:  # one value throughout: half way up
        return levels // 2 + 1
    return max(1, min(levels, 1 + math.floor((v - low) / (high - low) * (levels - 1) + 0.5)))


def sparkline(values: Sequence[float | None], low: float, high: float) -> str:
    """One row of bars (the single-row form of ``chart_rows``)."""
    return chart_rows(values, low, high, 1, None)[0]


def chart_rows(
    values: Sequence[float | None], low: float, high: float, rows: int, threshold: float | None
) -> list[str]:
    """The bar rows, top first. With a threshold the scale is split at it: its row (the top
    one, or the bottom one where every value is at or over it) holds exactly the values at or
    over it, from the threshold up to the highest, and the rows under it the values below, so a
    bar reaches the threshold's row if and only if its column's mean is at or over it. The
    threshold's row shows ``THRESHOLD_LINE`` wherever no bar reaches it."""
    heights = [None if v is None else bar_height(v, low, high, rows, threshold) for v in values]
    mark_row = None if threshold is None else threshold_row(threshold, low, rows)
    out = []
    for r in reversed(range(rows)):
        line = []
        for h in heights:
            fill = 0 if h is None else max(0, min(LEVELS, h - r * LEVELS))
            line.append(BARS[fill - 1] if fill else (THRESHOLD_LINE if r == mark_row else " "))
        out.append("".join(line))
    return out


def threshold_row(threshold: float, low: float, rows: int) -> int:
    """The bar row (0: the bottom one) whose bottom is the threshold: the top row, or the
    bottom one where even the lowest value is at or over it."""
    return rows - 1 if low < threshold else 0


def bar_height(v: float, low: float, high: float, rows: int, threshold: float | None) -> int:
    """A bar's height in eighths: ``low`` to ``high`` over the rows, or, with a threshold, the
    values below it under its row and those at or over it in its row and above."""
    levels = rows * LEVELS
    if threshold is None:
        return _level(v, low, high, levels)
    base = threshold_row(threshold, low, rows) * LEVELS  # the eighths under the threshold's row
    if v < threshold:
        return _level(v, low, threshold, base) if base else 1
    if high <= threshold:
        return base + 1
    return base + _level(v, threshold, high, levels - base)


def over_marks(peaks: Sequence[float | None], threshold: float) -> str:
    """``OVER_MARK`` under each column with a sample at or over the threshold."""
    return "".join(OVER_MARK if v is not None and v >= threshold else " " for v in peaks)


def _gutter(label: str, line: str = "│") -> str:
    return f"{label[:LABEL_W]:>{LABEL_W}} {line}"


def chart_text(
    spec: ChartSpec,
    samples: Samples,
    width: int,
    window: Window | None = None,
    threshold: Threshold | None = None,
) -> Text:
    """The title (last, lowest and highest value, the threshold and how many columns reach it),
    the bar rows (each column's mean) behind the gutter, and under a chart with a threshold the
    row marking each column with a sample at or over it. ``width`` is the whole line's, gutter
    included."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{spec.title:9}", style="bold")
    values = [v for _, v in samples if v is not None]
    n = max(0, width - GUTTER)
    thr = threshold.value if threshold is not None else None
    if not values:
        t.append(" no samples" if not samples else f" not reported ({len(samples)} samples)", style="dim")
        _threshold_title(t, threshold, None)
        return t
    last = next(v for _, v in reversed(samples) if v is not None)
    low, high = spec.scale or (min(values), max(values))
    t.append(f" last {fmt(last)} {spec.unit}", style=Style(color=spec.style, bold=True))
    t.append(f"  min {fmt(min(values))}  max {fmt(max(values))}", style="dim")
    cols = buckets(samples, n, window)
    peaks = bucket_peaks(samples, n, window)
    over = [thr is not None and p is not None and p >= thr for p in peaks]
    _threshold_title(t, threshold, None if thr is None else sum(over))
    if n <= 0:
        return t
    rows = chart_rows(cols, low, high, spec.rows, thr)
    mark_row = None if thr is None else spec.rows - 1 - threshold_row(thr, low, spec.rows)  # from the top
    for r, line in enumerate(rows):
        label = fmt(thr) if r == mark_row and thr is not None else fmt(high) if r == 0 else fmt(low) if r == spec.rows - 1 else ""
        t.append("\n")
        t.append(_gutter(label, "┤" if label else "│"), style="dim")
        for ch, hot in zip(line, over, strict=True):
            if ch == THRESHOLD_LINE:
                t.append(ch, style="red")
            else:
                t.append(ch, style="bold red" if hot and ch != " " else spec.style)
    if thr is not None:
        t.append("\n")
        t.append(_gutter("≥" + fmt(thr)), style="dim")
        t.append(over_marks(peaks, thr), style="bold red")
    return t


def _threshold_title(t: Text, threshold: Threshold | None, over: int | None) -> None:
    if threshold is None:
        return
    if threshold.value is None:
        t.append(f"  {threshold.missing}", style="yellow")
        return
    t.append(f"  {threshold.name} {fmt(threshold.value)} {threshold.unit}", style="bold")
    if over is not None:
        t.append(
            f": {OVER_MARK} {over} at or over" if over else ": none at or over",
            style="bold red" if over else "dim",
        )
    if threshold.missing:
        t.append(f" ({threshold.missing})", style="yellow")


# --- the time axis, throttle strip and XID row ---------------------------------------------

TICK_STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def axis_ticks(window: Window, width: int) -> list[tuple[int, str]]:
    """(column, UTC label) of the axis: both ends, and between them the moments on the smallest
    round step (10 s to a day) whose labels keep two columns apart. A label names the column its
    moment falls in: HH:MM (HH:MM:SS for a window under ten minutes) of the column's time for
    the ends, the round moment itself between them."""
    t0, t1 = window
    seconds = t1 - t0 < 600
    w = 8 if seconds else 5
    if width < w:
        return []
    ends = [(0, utc(t0, seconds))]
    if width >= 2 * w + 2 and t1 > t0:
        ends.append((width - 1, utc(t1, seconds)))
    if len(ends) < 2:
        return ends
    per_col = (t1 - t0) / (width - 1)
    step = next((s for s in TICK_STEPS_S if s >= per_col * (w + 3) and (seconds or s % 60 == 0)), None)
    ticks = []
    if step is not None:
        k = math.floor(t0 / step) + 1
        while k * step < t1:
            c = column(k * step, window, width)
            # clear of the end labels (left-aligned at 0, right-aligned at the end) by two
            if c is not None and c - w // 2 >= w + 2 and c + w - w // 2 <= width - w - 2:
                ticks.append((c, utc(k * step, seconds)))
            k += 1
    return [ends[0], *ticks, ends[1]]


def axis_lines(window: Window, width: int) -> tuple[str, str]:
    """(labels, axis) for ``width`` columns: the end labels flush with the ends, the others
    centred on their column; the axis line has a ``┴`` under each label's column."""
    ticks = axis_ticks(window, width)
    labels = [" "] * width
    axis = ["─"] * width
    for i, (c, label) in enumerate(ticks):
        start = 0 if i == 0 else width - len(label) if c == width - 1 else c - len(label) // 2
        labels[start : start + len(label)] = label
        axis[c] = "┴"
    return "".join(labels), "".join(axis)


def throttle_strip(masks: Sequence[int | None]) -> str:
    marks = {name: mark for name, mark, _ in THROTTLE_MARKS}
    out = []
    for m in masks:
        if m is None:
            out.append(" ")
            continue
        names = [r for r in throttle.decode(m) if r in FAULT_REASONS]
        found = [marks[name] for name, _, _ in THROTTLE_MARKS if name in names]
        out.append(found[0] if found else NOT_THROTTLED)
    return "".join(out)


def gpu_xids(xids: Iterable[XidView], uuid: str, bus_id: str | None) -> list[XidView]:
    """The XIDs of one GPU: by its UUID, or by its bus id (the entry puts the GPU's own bus id
    on an XID it matched, so a lost GPU's XID, whose UUID the collector could no longer map,
    is still its); an NVSwitch's SXids are no GPU's."""
    return [
        x for x in xids
        if not x.sxid and (x.event.gpu_uuid == uuid or (bus_id is not None and x.bus_id == bus_id))
    ]  # fmt: skip


@dataclass(frozen=True)
class XidPlacement:
    row: str
    placed: tuple[tuple[int, XidView], ...]  # (column, XID), oldest first
    earlier: int = 0  # before the window
    later: int = 0  # after its last sample
    untimed: int = 0  # no wall-clock time: cannot be placed


def xid_row(xids: Sequence[XidView], window: Window, width: int) -> XidPlacement:
    counts = [0] * width
    placed = []
    earlier = later = untimed = 0
    for x in sorted(xids, key=lambda x: x.event.timestamp or 0.0):
        ts = x.event.timestamp
        if ts is None:
            untimed += 1
            continue
        c = column(ts, window, width)
        if c is None:
            if ts < window[0]:
                earlier += 1
            else:
                later += 1
            continue
        counts[c] += 1
        placed.append((c, x))
    row = "".join(" " if k == 0 else XID_MARK if k == 1 else str(k) if k < 10 else "+" for k in counts)
    return XidPlacement(row, tuple(placed), earlier, later, untimed)


def span_text(window: Window, now: float | None) -> str:
    """How long the window is and when it ends: "last 60 min (07:00-08:00 UTC)", or, where the
    samples stopped a while ago, when and how long ago."""
    t0, t1 = window
    if t1 <= t0:
        return f"1 sample, {utc(t1, True)} UTC"
    span = span_label(t1 - t0).replace("min", " min")
    ends = f"{utc(t0)}-{utc(t1)} UTC"
    if now is None or now - t1 <= RECENT_S:
        return f"last {span} ({ends})"
    return f"{span} ({ends}), last sample {format_age(now - t1)} ago"


def events_text(
    window: Window, width: int, masks: Samples, xids: Sequence[XidView]
) -> Text:
    """The axis (UTC labels over their columns), the XID row and the throttle strip on the
    charts' columns, then the XIDs named and the throttle reasons seen."""
    n = max(0, width - GUTTER)
    t = Text(no_wrap=True, overflow="ellipsis")
    labels, axis = axis_lines(window, n)
    t.append(_gutter("UTC", " "), style="dim")
    t.append(labels, style="bold")
    t.append("\n")
    t.append(" " * GUTTER)
    t.append(axis, style="dim")
    place = xid_row(xids, window, n)
    t.append("\n")
    t.append(_gutter("XID"), style="dim")
    t.append(place.row, style="bold red")
    cols = bucket_masks(masks, n, window)
    strip = throttle_strip(cols)
    t.append("\n")
    t.append(_gutter("thrtl"), style="dim")
    for ch in strip:
        t.append(ch, style="dim" if ch == NOT_THROTTLED else "bold yellow")
    t.append("\n")
    _xid_legend(t, place)
    t.append("\n")
    _throttle_legend(t, cols, strip)
    return t


def _xid_legend(t: Text, place: XidPlacement) -> None:
    if not place.placed:
        t.append("XIDs     none of this GPU in this window", style="dim")
    for i, (_, x) in enumerate(place.placed[:XID_LEGEND_MAX]):
        if i:
            t.append("\n")
        ts = x.event.timestamp or 0.0
        t.append(f"{XID_MARK} XID {x.code:<4}", style="bold red")
        t.append(f" {utc(ts, True)} UTC  ")
        t.append(x.name, style="bold")
        t.append(f"  {x.severity.upper()}", style="dim")
    notes = []
    if len(place.placed) > XID_LEGEND_MAX:
        notes.append(f"{len(place.placed) - XID_LEGEND_MAX} more in the window")
    if place.earlier:
        notes.append(f"{place.earlier} before the window")
    if place.later:
        notes.append(f"{place.later} after its last sample")
    if place.untimed:
        notes.append(f"{place.untimed} without a time")
    if notes:
        t.append("\n")
        t.append(f"         not marked: {', '.join(notes)} (the XIDs tab lists all)", style="yellow")


def _throttle_legend(t: Text, masks: Sequence[int | None], strip: str) -> None:
    t.append("throttle ", style="bold")
    if all(m is None for m in masks):
        t.append(" not reported (no clocks-event samples)", style="yellow")
        return
    hit = sorted({r for m in masks if m is not None for r in throttle.decode(m) if r in FAULT_REASONS})
    if not hit:
        t.append(f" {NOT_THROTTLED} not throttled", style="dim")
        return
    throttled = sum(1 for ch in strip if ch not in (" ", NOT_THROTTLED))
    used = dict.fromkeys((mark, what) for name, mark, what in THROTTLE_MARKS if name in hit)
    t.append(" " + "  ".join(f"{mark} {what}" for mark, what in used), style="bold yellow")
    t.append(f": {throttled} columns ({', '.join(hit)})", style="yellow")


def spec_doc(spec: ChartSpec) -> str:
    """What a chart plots, for the legend (``?``)."""
    if spec.scale:
        scale = f"fixed scale {fmt(spec.scale[0])}-{fmt(spec.scale[1])} {spec.unit}"
    elif spec.limits:
        scale = "the rows under the threshold its min to the threshold, the threshold's row on up to its max"
    else:
        scale = "scale: its min to max"
    doc = f"the daemon's {spec.field} ({spec.unit}), {spec.rows} rows, {scale}"
    if spec.limits:
        doc += "; threshold: " + ", else ".join(f"{name} ({field})" for name, field in spec.limits)
        doc += " from the GPU's snapshot, or n/a said in the title"
    return doc


# The chart marks, for the legend (``?``).
LEGEND: tuple[tuple[str, str], ...] = (
    (BARS, "a column's mean value, lowest to highest on the chart's scale (min to max, or 0-100 %); blank: no sample"),
    (THRESHOLD_LINE * 3, "the threshold from the GPU's snapshot (slowdown temp, HBM max, enforced power cap), its value in the gutter and title: a bar reaches its row only if the column's mean is at or over it (the scale is split there)"),
    (OVER_MARK, "under each column with a sample at or over the threshold (the bar is the mean: a short peak shows here)"),
    (XID_MARK, "an XID of this GPU in that column (2-9 several, + more), listed below the row in UTC"),
    (NOT_THROTTLED, "throttle strip: sampled, no hardware slowdown / thermal / power-brake reason"),
    *(
        (mark, f"throttle strip: {what} ({', '.join(n for n, m, _ in THROTTLE_MARKS if m == mark)})")
        for mark, what in dict.fromkeys((m, w) for _, m, w in THROTTLE_MARKS)
    ),
    ("HH:MM", "UTC time of the column under it (ends flush, others centred); every row shares the columns"),
)


# --- widgets ---------------------------------------------------------------------------------


class _Drawn(Widget):
    """A widget drawn at its own width each time it is painted (Textual clears its render cache
    on a size change), one line per line of its text: none is wrapped, so the columns of every
    row stay the charts' columns."""

    DEFAULT_CSS = """
    _Drawn {
        height: auto;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def text(self, width: int) -> Text:
        raise NotImplementedError

    def render(self) -> Text:
        return self.text(self.content_size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        plain = self.text(width).plain
        return plain.count("\n") + 1 if plain else 0


class Chart(_Drawn):
    """One field's chart: blank until its history comes ("no samples" would be a wrong word)."""

    def __init__(self, spec: ChartSpec, id: str | None = None) -> None:
        super().__init__(id=id)
        self.spec = spec
        self.samples: list[tuple[float, float | None]] = []
        self.window: Window | None = None
        self.threshold: Threshold | None = None
        self.shown = False

    def show(self, samples: Samples, window: Window | None = None, threshold: Threshold | None = None) -> None:
        self.samples = list(samples)
        self.window = window
        self.threshold = threshold
        self.shown = True
        self.refresh(layout=True)

    def text(self, width: int) -> Text:
        if not self.shown:
            return Text()
        return chart_text(self.spec, self.samples, width, self.window, self.threshold)


class ChartEvents(_Drawn):
    """The axis, XID row and throttle strip on the charts' columns, with their legend lines."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.window: Window | None = None
        self.masks: list[tuple[float, float | None]] = []
        self.xids: list[XidView] = []

    def show(self, window: Window, masks: Samples, xids: Sequence[XidView]) -> None:
        self.window, self.masks, self.xids = window, list(masks), list(xids)
        self.refresh(layout=True)

    def text(self, width: int) -> Text:
        if self.window is None:
            return Text()
        return events_text(self.window, width, self.masks, self.xids)


class GpuCharts(Vertical):
    """One GPU's charts on one time axis, or one line saying why there are none."""

    DEFAULT_CSS = """
    GpuCharts {
        height: auto;
        padding: 0 1;
    }
    GpuCharts > #charts-note {
        height: auto;
    }
    GpuCharts > #charts-events {
        height: auto;
        margin-bottom: 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="charts-note")
        yield ChartEvents(id="charts-events")
        for spec in CHARTS:
            yield Chart(spec, id=f"chart-{spec.field}")

    def charts(self) -> list[Chart]:
        return list(self.query(Chart))

    def show(
        self,
        title: str,
        history: History,
        gpu: model.Gpu | None = None,
        xids: Sequence[XidView] = (),
        now: float | None = None,
    ) -> None:
        """``gpu``: the GPU's current snapshot (its thresholds); ``xids``: its XIDs."""
        window = window_of(history)
        note = self.query_one("#charts-note", Static)
        events = self.query_one("#charts-events", ChartEvents)
        if window is None:
            note.update(Text(f"{title}: no samples yet", style="yellow"))
            events.display = False
        else:
            note.update(Text(f"{title}, {span_text(window, now)}", style="bold"))
            events.display = True
            events.show(window, history.get(MASK_FIELD, []), xids)
        for chart in self.charts():
            chart.display = True
            chart.show(history.get(chart.spec.field, []), window, threshold_for(chart.spec, gpu))

    def show_message(self, message: str, style: str = "yellow") -> None:
        self.query_one("#charts-note", Static).update(Text(message, style=style))
        self.query_one("#charts-events", ChartEvents).display = False
        for chart in self.charts():
            chart.display = False
            chart.samples = []
            chart.shown = False
            chart.refresh(layout=True)
