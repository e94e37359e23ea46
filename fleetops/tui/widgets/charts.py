"""Small history charts for one GPU: a labelled sparkline per field over the daemon's last hour.

The daemon keeps a ring of samples per GPU; a chart shows as much of it as there is (from its
first to its last sample), bucketed to the widget's width, with the last, lowest and highest
values written out so that a number can be read without guessing from bar heights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

BARS = "▁▂▃▄▅▆▇█"
Samples = Sequence[tuple[float, float | None]]


@dataclass(frozen=True)
class ChartSpec:
    field: str
    title: str
    unit: str
    style: str


CHARTS = (
    ChartSpec("temp_gpu_c", "GPU temp", "C", "red"),
    ChartSpec("temp_memory_c", "HBM temp", "C", "magenta"),
    ChartSpec("power_draw_w", "power", "W", "yellow"),
    ChartSpec("clock_sm_mhz", "SM clock", "MHz", "cyan"),
)
FIELDS = tuple(c.field for c in CHARTS)


def fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.1f}"


def span_label(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}min"


def buckets(samples: Samples, width: int) -> list[float | None]:
    """The mean of the samples falling in each of ``width`` equal time slices (None: no value)."""
    points = [(t, v) for t, v in samples if v is not None]
    if width <= 0 or not samples:
        return []
    t0, t1 = samples[0][0], samples[-1][0]
    sums = [0.0] * width
    counts = [0] * width
    for t, v in points:
        i = int((t - t0) / (t1 - t0) * (width - 1) + 0.5) if t1 > t0 else width - 1
        sums[i] += v
        counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def sparkline(values: Sequence[float | None], low: float, high: float) -> str:
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif high <= low:
            out.append(BARS[len(BARS) // 2])
        else:
            out.append(BARS[min(len(BARS) - 1, int((v - low) / (high - low) * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def chart_text(spec: ChartSpec, samples: Samples, width: int) -> Text:
    """Two lines: the title with last/min/max, then the sparkline."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{spec.title:9}", style="bold")
    values = [v for _, v in samples if v is not None]
    if not values:
        t.append(" no samples" if not samples else f" not reported ({len(samples)} samples)", style="dim")
        return t
    last = next(v for _, v in reversed(samples) if v is not None)
    low, high = min(values), max(values)
    t.append(f" last {fmt(last)} {spec.unit}", style=Style(color=spec.style, bold=True))
    t.append(f"  min {fmt(low)}  max {fmt(high)}  over {span_label(samples[-1][0] - samples[0][0])}", style="dim")
    t.append("\n")
    t.append(sparkline(buckets(samples, width), low, high), style=spec.style)
    return t


class Chart(Static):
    """One field's chart; redrawn at its own width whenever its samples or its size change."""

    DEFAULT_CSS = """
    Chart {
        height: 2;
        margin-bottom: 1;
    }
    """

    def __init__(self, spec: ChartSpec, id: str | None = None) -> None:
        super().__init__(id=id)
        self.spec = spec
        self.samples: list[tuple[float, float | None]] = []

    def show(self, samples: Samples) -> None:
        self.samples = list(samples)
        self.update(chart_text(self.spec, self.samples, self.content_size.width))

    def on_resize(self) -> None:
        self.update(chart_text(self.spec, self.samples, self.content_size.width))


class GpuCharts(Vertical):
    """The four charts of one GPU, or one line saying why there are none."""

    DEFAULT_CSS = """
    GpuCharts {
        height: auto;
        padding: 0 1;
    }
    GpuCharts > #charts-note {
        height: auto;
        margin-bottom: 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="charts-note")
        for spec in CHARTS:
            yield Chart(spec, id=f"chart-{spec.field}")

    def charts(self) -> list[Chart]:
        return list(self.query(Chart))

    def show(self, title: str, history: dict[str, list[tuple[float, float | None]]]) -> None:
        self.query_one("#charts-note", Static).update(Text(title, style="bold"))
        for chart in self.charts():
            chart.display = True
            chart.show(history.get(chart.spec.field, []))

    def show_message(self, message: str, style: str = "yellow") -> None:
        self.query_one("#charts-note", Static).update(Text(message, style=style))
        for chart in self.charts():
            chart.display = False
            chart.samples = []

