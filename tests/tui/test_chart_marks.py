"""The charts' marks as pure functions over constructed samples: the UTC axis and the columns its
labels name, the threshold's line and the columns at or over it, the throttle strip, the XID
row (a lost GPU's XIDs by bus id), and the threshold a snapshot lacks, said in the title."""

from __future__ import annotations

import calendar
import copy
import time
from dataclasses import replace

from fleetops import model
from fleetops.checks.thermal_power import FAULT_REASONS
from fleetops.tui import data, simfeed
from fleetops.tui.screens import help as help_screen
from fleetops.tui.widgets import charts
from fleetops.tui.widgets.charts import (
    CHARTS,
    GUTTER,
    Threshold,
    axis_lines,
    axis_ticks,
    bucket_masks,
    buckets,
    chart_text,
    column,
    column_time,
    events_text,
    gpu_xids,
    span_text,
    threshold_for,
    throttle_strip,
    xid_row,
)

from .conftest import NAMES, fed_entries

T0 = simfeed.T0  # 2027-01-15 08:00:00 UTC
HOUR = (T0 - 3600, T0)
TEMP = next(c for c in CHARTS if c.field == "temp_gpu_c")
POWER = next(c for c in CHARTS if c.field == "power_draw_w")
HBM = next(c for c in CHARTS if c.field == "temp_memory_c")
UTIL = next(c for c in CHARTS if c.field == "utilization_gpu_pct")


def test_axis_labels_the_ends_and_every_ten_minutes_each_over_its_own_column() -> None:
    # 61 columns over 07:00-08:00: a column a minute, labels (5 wide) need 8 columns: 10 min
    ticks = axis_ticks(HOUR, 61)
    assert ticks == [
        (0, "07:00"), (10, "07:10"), (20, "07:20"), (30, "07:30"), (40, "07:40"), (50, "07:50"), (60, "08:00"),
    ]  # fmt: skip
    for c, label in ticks:
        assert time.strftime("%H:%M", time.gmtime(column_time(c, HOUR, 61))) == label
    labels, axis = axis_lines(HOUR, 61)
    assert labels == "07:00   07:10     07:20     07:30     07:40     07:50   08:00"
    assert axis == "┴─────────┴─────────┴─────────┴─────────┴─────────┴─────────┴"
    # each interior label is centred on its tick, the ends flush with the axis's ends
    for c, label in ticks[1:-1]:
        assert labels[c - 2 : c + 3] == label and axis[c] == "┴"
    assert labels.startswith("07:00") and labels.endswith("08:00")


def test_axis_ticks_sit_on_round_moments_and_where_they_fall_in_an_uneven_window() -> None:
    window = (T0 - 3580, T0)  # the daemon's ring: first sample 07:00:20
    ticks = axis_ticks(window, 113)  # 32 s a column: 5 min is the first step 8 columns wide
    assert [label for _, label in ticks] == ["07:00", *(f"07:{m:02d}" for m in range(5, 60, 5)), "08:00"]
    for c, label in ticks[1:-1]:
        h, m = map(int, label.split(":"))
        moment = calendar.timegm((2027, 1, 15, h, m, 0))
        assert column(moment, window, 113) == c
        # the moment lies within its column's half-widths
        assert abs(column_time(c, window, 113) - moment) <= (window[1] - window[0]) / 112 / 2


def test_axis_narrows_to_its_ends_and_a_short_window_has_seconds() -> None:
    assert axis_ticks(HOUR, 12) == [(0, "07:00"), (11, "08:00")]
    assert axis_lines(HOUR, 12) == ("07:00  08:00", "┴──────────┴")
    assert axis_ticks(HOUR, 11) == [(0, "07:00")]  # no room for both: the start only
    assert axis_ticks(HOUR, 4) == []
    short = (T0 - 90, T0)  # the daemon just started: HH:MM:SS
    assert axis_ticks(short, 19) == [(0, "07:58:30"), (18, "08:00:00")]
    # 2 s a column, labels 8 wide: every 30 s
    assert axis_ticks(short, 46) == [(0, "07:58:30"), (15, "07:59:00"), (30, "07:59:30"), (45, "08:00:00")]


def test_buckets_share_one_window_and_place_samples_in_their_columns() -> None:
    samples = [(T0 - 3600.0, 1.0), (T0 - 1800.0, 3.0), (T0, 5.0)]
    assert buckets(samples, 5, HOUR) == [1.0, None, 3.0, None, 5.0]
    later = [(T0 - 1800.0, 3.0), (T0, 5.0)]  # a field whose ring starts later keeps its columns
    assert buckets(later, 5, HOUR) == [None, None, 3.0, None, 5.0]
    assert buckets(later, 5) == [3.0, None, None, None, 5.0]  # its own window
    masks = [(T0 - 3600.0, 0x1), (T0 - 3599.0, 0x8), (T0, 0x0)]
    assert bucket_masks(masks, 3, HOUR) == [0x9, None, 0x0]


def _ten(values: list[float | None]) -> list[tuple[float, float | None]]:
    return [(float(i), v) for i, v in enumerate(values)]


def test_threshold_line_and_marks_at_exactly_the_columns_at_or_over_it() -> None:
    samples = _ten([80.0, 85.0, 88.0, 89.0, 90.0, 91.0, 89.5, 88.9, 70.0, None])
    text = chart_text(TEMP, samples, GUTTER + 10, (0.0, 9.0), Threshold("slowdown", 89.0, "C")).plain
    assert text.splitlines() == [
        "GPU temp  last 70 C  min 70  max 91  slowdown 89 C: ▲ 4 at or over",
        "   89 ┤╌╌╌▁▅█▃╌╌╌",  # the threshold's row: 89 to 91; dashed where no bar reaches it
        "      │▁▅▇█████  ",  # 70 to 89 over the two rows under it
        "   70 ┤████████▁ ",
        "  ≥89 │   ▲▲▲▲   ",  # 89, 90, 91, 89.5: not 88.9, not the gap
    ]


def test_a_bar_reaches_the_thresholds_row_exactly_when_at_or_over_it() -> None:
    # three rows of eighths; the threshold's row is the top one (17th to 24th eighth)
    assert charts.bar_height(88.99, 30.0, 95.0, 3, 89.0) == 16
    assert charts.bar_height(89.0, 30.0, 95.0, 3, 89.0) == 17
    assert charts.bar_height(95.0, 30.0, 95.0, 3, 89.0) == 24
    assert charts.bar_height(30.0, 30.0, 95.0, 3, 89.0) == 1
    assert charts.bar_height(89.0, 30.0, 89.0, 3, 89.0) == 17  # the highest is the threshold
    # every value over it: its row is the bottom one, the scale from the threshold to the highest
    assert charts.bar_height(650.0, 650.0, 700.0, 3, 600.0) == 13  # half way from the threshold up
    assert charts.bar_height(700.0, 650.0, 700.0, 3, 600.0) == 24


def test_a_peak_over_the_threshold_is_marked_though_its_columns_mean_is_under() -> None:
    samples = [(0.0, 80.0), (1.0, 86.0), (1.2, 90.0), (2.0, 80.0)]  # column 1: mean 88, peak 90
    assert buckets(samples, 3) == [80.0, 88.0, 80.0]
    lines = chart_text(TEMP, samples, GUTTER + 3, None, Threshold("slowdown", 89.0, "C")).plain.splitlines()
    assert lines[0].endswith("slowdown 89 C: ▲ 1 at or over")
    assert lines[-1] == "  ≥89 │ ▲ "


def test_threshold_below_every_value_marks_every_column_and_scales_down_to_it() -> None:
    samples = _ten([700.0] * 10)
    text = chart_text(POWER, samples, GUTTER + 10, (0.0, 9.0), Threshold("enforced cap", 650.0, "W")).plain
    lines = text.splitlines()
    assert "enforced cap 650 W: ▲ 10 at or over" in lines[0]
    assert lines[-1] == " ≥650 │▲▲▲▲▲▲▲▲▲▲"
    assert lines[1] == "  700 ┤██████████"  # the threshold's row is the bottom one: all reach it
    assert lines[3] == "  650 ┤██████████"


def test_threshold_never_reached_says_none_and_draws_its_line_over_the_bars() -> None:
    samples = _ten([40.0, 50.0] * 5)
    lines = chart_text(TEMP, samples, GUTTER + 10, (0.0, 9.0), Threshold("slowdown", 89.0, "C")).plain.splitlines()
    assert lines[0].endswith("slowdown 89 C: none at or over")
    assert lines[1] == "   89 ┤╌╌╌╌╌╌╌╌╌╌"
    assert lines[-1] == "  ≥89 │          "


def test_missing_threshold_is_said_in_the_title_not_left_out() -> None:
    lost = model.Gpu(index=5, uuid="GPU-x", bus_id="0000:ab:00.0", unavailable={"temp_slowdown_c": "GpuIsLost"})
    th = threshold_for(TEMP, lost)
    assert th == Threshold("slowdown", None, "C", "slowdown n/a (GpuIsLost)")
    lines = chart_text(TEMP, _ten([40.0] * 10), GUTTER + 10, (0.0, 9.0), th).plain.splitlines()
    assert lines[0] == "GPU temp  last 40 C  min 40  max 40  slowdown n/a (GpuIsLost)"
    assert len(lines) == 1 + TEMP.rows and "╌" not in "".join(lines) and "≥" not in "".join(lines)
    assert threshold_for(TEMP, None) == Threshold("slowdown", None, "C", "slowdown unknown (no snapshot of this GPU)")
    # no samples at all: the threshold is still said
    assert chart_text(TEMP, [], GUTTER + 10, None, th).plain == "GPU temp  no samples  slowdown n/a (GpuIsLost)"
    # the power chart falls back to the set limit, and says the enforced cap is missing
    g = model.Gpu(index=0, uuid="GPU-y", bus_id="0000:18:00.0", power_limit_w=700.0)
    assert threshold_for(POWER, g) == Threshold("power limit", 700.0, "W", "enforced cap n/a: not reported")
    g.power_enforced_limit_w = 650.0
    assert threshold_for(POWER, g) == Threshold("enforced cap", 650.0, "W")
    assert threshold_for(HBM, g) == Threshold("HBM max", None, "C", "HBM max n/a (not reported)")
    assert threshold_for(UTIL, g) is None  # utilisation has no threshold


def test_throttle_strip_marks_the_checks_fault_reasons_by_the_catalogs_bits() -> None:
    assert {name for name, _, _ in charts.THROTTLE_MARKS} == set(FAULT_REASONS)
    masks: list[int | None] = [None, 0x1, 0x0, 0x8, 0x8 | 0x20 | 0x40, 0x8 | 0x80, 0x4, 0x20]
    # not sampled, idle, none, hw slowdown, thermal, power brake, sw power cap (no fault), sw thermal
    assert throttle_strip(masks) == " ··STP·T"


def _xid(code: int, ts: float | None, uuid: str | None = "GPU-a", bus: str | None = "0000:18:00.0") -> data.XidView:
    ev = model.XidEvent(code=code, bus_id=bus, gpu_uuid=uuid, timestamp=ts)
    return data.XidView(f"k{code}{ts}", ev, code, f"name {code}", "crit", "", False, bus_id=bus)


def test_xid_row_marks_each_xid_at_its_column_and_counts_the_unplaced() -> None:
    xids = [
        _xid(13, T0 - 600),  # 07:50: column 50 of 61
        _xid(31, T0 - 590),  # the same column: 2
        _xid(79, T0 - 3600),  # the first column
        _xid(48, T0 - 4000),  # before the window
        _xid(94, T0 + 200),  # after the last sample
        _xid(43, None),  # no wall-clock time
    ]
    place = xid_row(xids, HOUR, 61)
    assert place.row == "X" + " " * 49 + "2" + " " * 10
    assert [(c, x.code) for c, x in place.placed] == [(0, 79), (50, 13), (50, 31)]
    assert (place.earlier, place.later, place.untimed) == (1, 1, 1)


def test_events_text_names_each_xid_in_utc_under_its_mark() -> None:
    masks = [(T0 - 3600.0 + 60 * i, float(0x8 | 0x40) if i >= 50 else 0.0) for i in range(61)]
    text = events_text(HOUR, GUTTER + 61, masks, [_xid(13, T0 - 600)]).plain.splitlines()
    assert text[0] == "  UTC  07:00   07:10     07:20     07:30     07:40     07:50   08:00"
    assert text[1] == " " * GUTTER + axis_lines(HOUR, 61)[1]
    assert text[2] == "  XID │" + " " * 50 + "X" + " " * 10
    assert text[3] == "thrtl │" + "·" * 50 + "T" * 11
    assert text[4] == "X XID 13   07:50:00 UTC  name 13  CRIT"
    assert text[5] == "throttle  T thermal  S hardware slowdown: 11 columns (hw_slowdown, hw_thermal_slowdown)"
    assert text[2][GUTTER:].index("X") == 50


def test_events_text_says_what_it_could_not_place() -> None:
    lines = events_text(HOUR, GUTTER + 61, [], [_xid(48, T0 - 4000), _xid(43, None)]).plain.splitlines()
    assert lines[3] == "thrtl │" + " " * 61
    assert lines[4] == "XIDs     none of this GPU in this window"
    assert lines[5] == "         not marked: 1 before the window, 1 without a time (the XIDs tab lists all)"
    assert lines[6] == "throttle  not reported (no clocks-event samples)"


def test_a_lost_gpus_xid_is_its_by_bus_id_and_another_gpus_is_not() -> None:
    entries = fed_entries()
    before = entries[NAMES.index("node011")]
    snap = copy.deepcopy(before.snapshot)
    assert snap is not None
    lost = next(g for g in snap.gpus if g.index == 5)
    snap.gpus = [g for g in snap.gpus if g.index != 5]  # gone from NVML's list after XID 79
    snap.xids = [replace(x, gpu_index=None, gpu_uuid=None) for x in snap.xids]
    entry = data.summarize("node011", snap, before.findings, T0, previous=before)
    gv = entry.gpu(lost.uuid)
    assert gv is not None and gv.lost
    (x,) = gpu_xids(entry.xids, gv.uuid, gv.bus_id)
    assert x.code == 79 and x.event.gpu_uuid is None
    other = entry.gpus[0]
    assert gpu_xids(entry.xids, other.uuid, other.bus_id) == []


def test_span_says_last_n_minutes_or_how_long_ago_the_samples_stopped() -> None:
    assert span_text((T0 - 3580, T0), T0 + 5) == "last 60 min (07:00-08:00 UTC)"
    assert span_text((T0 - 3580, T0), T0 + 600) == "60 min (07:00-08:00 UTC), last sample 10m00s ago"
    assert span_text((T0 - 45, T0), T0) == "last 45s (07:59-08:00 UTC)"
    assert span_text((T0, T0), T0) == "1 sample, 08:00:00 UTC"


def test_legend_explains_every_chart_and_mark() -> None:
    text = help_screen.help_text(readonly=False).plain
    for spec in CHARTS:
        assert f"  {spec.title:<14}{charts.spec_doc(spec)}\n" in text
    for mark, what in charts.LEGEND:
        assert f"  {mark:<14}{what}\n" in text
    marks = "".join(m for m, _ in charts.LEGEND)
    for m in (charts.THRESHOLD_LINE, charts.OVER_MARK, charts.XID_MARK, charts.NOT_THROTTLED, "P", "T", "S"):
        assert m in marks
