"""The node screen's GPU charts: fed from the simulated feed, and live over real SSH from a
simulated fleet's daemon (and from one without a daemon, which must say so)."""

from __future__ import annotations

import copy
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from textual.widgets import Static

from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import data, simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.source import SshSource, resolve_hosts
from fleetops.tui.widgets.charts import (
    CHARTS,
    FIELDS,
    GUTTER,
    Chart,
    ChartEvents,
    GpuCharts,
    buckets,
    chart_text,
    column_time,
    sparkline,
)
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, FakeSource, drive, fed_app, fed_entries, screen_lines, wait_for

ENTRIES = fed_entries()


class HistorySource(FakeSource):
    """The fed app's source, with the simulated feed's GPU history."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.asked: list[tuple[str, str]] = []

    def gpu_history(self, name: str, uuid: str) -> dict[str, list[tuple[float, float | None]]]:
        self.asked.append((name, uuid))
        history = simfeed.gpu_history(name, uuid)
        assert set(history) == set(FIELDS)  # what SshSource.gpu_history returns: every charted field
        return history


def last_value(samples: list[tuple[float, float | None]]) -> float:
    return next(v for _, v in reversed(samples) if v is not None)


def chart_label(app: Any, field: str) -> str:
    """The chart's first line; "" while the chart is still blank (its history not loaded yet)."""
    lines = str(app.screen.query_one(f"#chart-{field}", Chart).render()).splitlines()
    return lines[0] if lines else ""


def test_sparkline_scales_between_min_and_max_and_leaves_gaps() -> None:
    assert sparkline([0.0, 5.0, 10.0, None], 0.0, 10.0) == "▁▅█ "
    assert sparkline([3.0, 3.0], 3.0, 3.0) == "▅▅"
    samples = [(0.0, 1.0), (10.0, None), (20.0, 3.0), (30.0, 5.0)]
    assert buckets(samples, 4) == [1.0, None, 3.0, 5.0]
    assert buckets(samples, 2) == [1.0, 4.0]
    text = chart_text(CHARTS[0], samples, GUTTER + 4).plain  # three rows of eighths, behind the gutter
    assert text.splitlines() == ["GPU temp  last 5 C  min 1  max 5", "    5 ┤   █", "      │  ▅█", "    1 ┤▁ ██"]


def test_node_screen_charts_the_selected_gpu_with_its_last_values() -> None:
    source = HistorySource(NAMES)
    app = fed_app(source=source)
    node = "node005"
    gpus = ENTRIES[NAMES.index(node)].gpus

    async def body(pilot: Any) -> None:
        app.screen.table().select_key(node)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        screen.query_one("#node-gpus", FleetTable).select_key(gpus[2].uuid)
        await pilot.press("5")
        want = simfeed.gpu_history(node, gpus[2].uuid)
        await wait_for(pilot, lambda: f"last {last_value(want['power_draw_w']):.0f} W" in chart_label(app, "power_draw_w"), what="GPU 2's chart")
        assert source.asked[-1] == (node, gpus[2].uuid)
        charts = screen.query_one(GpuCharts).charts()
        assert [c.spec.field for c in charts if c.display] == [
            "temp_gpu_c", "temp_memory_c", "power_draw_w", "utilization_gpu_pct", "clock_sm_mhz",
        ]  # fmt: skip
        for spec in CHARTS:
            label = chart_label(app, spec.field)
            values = [v for _, v in want[spec.field] if v is not None]
            assert f"last {last_value(want[spec.field]):.0f} {spec.unit}" in label, label
            assert f"min {min(values):.0f}" in label and f"max {max(values):.0f}" in label, label
        drawn = "\n".join(screen_lines(app))
        # at 45 rows the pane shows the axis, XIDs, throttle strip and the first chart; the rest scrolls
        assert "GPU 2 " + gpus[2].uuid in drawn and "GPU temp  last" in drawn
        # another GPU: the charts follow the cursor
        await pilot.press("up")
        want = simfeed.gpu_history(node, gpus[1].uuid)
        await wait_for(pilot, lambda: source.asked[-1] == (node, gpus[1].uuid), what="GPU 1's history asked")
        await wait_for(pilot, lambda: f"last {last_value(want['temp_gpu_c']):.0f} C" in chart_label(app, "temp_gpu_c"), what="GPU 1's chart")

    drive(app, body, ENTRIES)


def events_lines(app: Any) -> list[str]:
    """The axis labels, the axis, the XID row, the throttle strip and their legend lines."""
    return str(app.screen.query_one("#charts-events", ChartEvents).render()).splitlines()


def test_node_screen_charts_read_their_thresholds_from_the_nodes_snapshot_and_mark_its_xid() -> None:
    """Thresholds changed in node005's snapshot (slowdown 87 C, enforced cap 650 W) are what
    the titles say; node011's lost GPU has none (said), and its XID 79 is marked in its column."""
    entries = list(ENTRIES)
    i = NAMES.index("node005")
    snap = copy.deepcopy(entries[i].snapshot)
    assert snap is not None
    snap.gpus[2].temp_slowdown_c = 87.0
    snap.gpus[2].power_enforced_limit_w = 650.0
    entries[i] = data.summarize("node005", snap, entries[i].findings, simfeed.T0)
    source = HistorySource(NAMES)
    app = fed_app(source=source)
    gpu2 = entries[i].gpus[2].uuid
    lost = ENTRIES[NAMES.index("node011")].gpus[5]

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node005")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(gpu2)
        await pilot.press("5")
        await wait_for(pilot, lambda: "slowdown" in chart_label(app, "temp_gpu_c"), what="node005 GPU 2's charts")
        assert "slowdown 87 C: none at or over" in chart_label(app, "temp_gpu_c")
        assert "enforced cap 650 W: none at or over" in chart_label(app, "power_draw_w")
        assert "HBM max 95 C: none at or over" in chart_label(app, "temp_memory_c")
        assert events_lines(app)[4] == "XIDs     none of this GPU in this window"
        await pilot.press("escape")
        app.screen.table().select_key("node011")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(lost.uuid)
        await pilot.press("5")
        await wait_for(pilot, lambda: source.asked[-1] == ("node011", lost.uuid) and "XID 79" in "\n".join(events_lines(app)), what="node011 GPU 5's charts")
        assert "slowdown n/a (GpuIsLost)" in chart_label(app, "temp_gpu_c")
        assert "enforced cap n/a (GpuIsLost)" in chart_label(app, "power_draw_w")
        lines = events_lines(app)
        row = lines[2][GUTTER:]
        assert row.strip() == "X"
        events = app.screen.query_one("#charts-events", ChartEvents)
        assert events.window is not None
        width = events.content_size.width - GUTTER
        assert len(row) == width
        # 07:58:00 UTC, two minutes before the history's last sample at 08:00:00
        t0, t1 = events.window
        assert abs(column_time(row.index("X"), events.window, width) - (simfeed.T0 - 120)) <= (t1 - t0) / (width - 1) / 2
        assert lines[4] == "X XID 79   07:58:00 UTC  GPU has fallen off the bus  CRIT"
        assert "X XID 79   07:58:00 UTC  GPU has fallen off the bus" in "\n".join(screen_lines(app))

    drive(app, body, entries)


def test_no_source_says_so_instead_of_empty_charts() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node001")
        await pilot.press("enter", "5")
        await pilot.pause()
        note = str(app.screen.query_one("#charts-note", Static).render())
        assert "no live source" in note
        assert not any(c.display for c in app.screen.query_one(GpuCharts).charts())

    drive(app, body, ENTRIES)


# --- live: real SSH to a simulated fleet --------------------------------------------------

BASE = os.environ.get("FLEETOPS_TEST_CHARTS_ADDRESS", "127.0.32.1")


def _other_block(address: str) -> str:
    a, b, c, _ = address.split(".")
    return f"{a}.{b}.{int(c) + 1}.1"


def _start(directory: str, nodes: int, address: str, daemon: bool) -> None:
    with socket.socket() as sock:  # a port nobody listens on, so parallel runs do not collide
        sock.bind((address, 0))
        port = sock.getsockname()[1]
    with socket.socket() as sock:  # the daemon's metrics endpoints, on every node's address
        sock.bind((address, 0))
        metrics_port = sock.getsockname()[1]
    fleet.up(nodes, directory, first_address=address, port=port, daemon=daemon, metrics_port=metrics_port)


@pytest.fixture(scope="module")
def fleets() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated fleet runs real sshd processes")
    if fleet.find_sshd() is None:
        pytest.skip("needs sshd: apt-get install -y openssh-server")
    with_daemon = tempfile.mkdtemp(prefix="fleetops-charts-d-")
    without = tempfile.mkdtemp(prefix="fleetops-charts-n-")
    try:
        _start(with_daemon, 2, BASE, daemon=True)
        _start(without, 1, _other_block(BASE), daemon=False)
        yield with_daemon, without
    finally:
        for d in (with_daemon, without):
            fleet.down(d)
            shutil.rmtree(d, ignore_errors=True)


def live_app(directory: str) -> FleetApp:
    hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
    source = SshSource(hosts, baselines, interval=0.5, connect_timeout=2.0, command_timeout=5.0)
    return FleetApp(source, interval=0.5)


def _open_charts(app: FleetApp, node: str) -> Any:
    async def go(pilot: Any) -> None:
        await wait_for(pilot, lambda: node in app.state.entries and app.state.entries[node].snapshot is not None, what=f"{node} polled")
        app.screen.table().select_key(node)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("5")

    return go


@pytest.mark.root
def test_live_charts_show_the_daemons_last_values(fleets: tuple[str, str]) -> None:
    directory = fleets[0]
    app = live_app(directory)
    node = "node002"
    state_file = os.path.join(directory, "state", f"{node}.json")
    uuid = sim.read_state(state_file)["gpus"][0]["uuid"]
    sock = os.path.join(directory, "state", f"{node}.agent", "agent.sock")

    async def body(pilot: Any) -> None:
        await _open_charts(app, node)(pilot)
        assert isinstance(app.screen, NodeScreen)
        assert app.screen.query_one("#node-gpus", FleetTable).cursor_key == uuid
        await wait_for(pilot, lambda: "last" in chart_label(app, "power_draw_w"), timeout=60, what="the live charts")
        from fleetops.agent.serve.history_cli import history

        truth = history(sock, uuid, [s.field for s in CHARTS], 3600)  # the daemon's own answer, right after
        for spec in CHARTS:
            label = chart_label(app, spec.field)
            vals = [v for _, v in truth[spec.field] if v is not None]
            assert vals, spec.field
            # the sim's values are steady; the label's last is the daemon's last (to the shown digit)
            assert f"last {vals[-1]:.0f} {spec.unit}" in label, (label, vals[-3:])
        drawn = "\n".join(screen_lines(app))
        assert f"GPU 0 {uuid}: daemon history" in drawn

    drive(app, body)


@pytest.mark.root
def test_live_node_without_daemon_says_so(fleets: tuple[str, str]) -> None:
    app = live_app(fleets[1])

    async def body(pilot: Any) -> None:
        await _open_charts(app, "node001")(pilot)
        await wait_for(
            pilot,
            lambda: "no fleetops-agent daemon" in str(app.screen.query_one("#charts-note", Static).render()),
            timeout=60,
            what="the no-daemon note",
        )
        assert not any(c.display for c in app.screen.query_one(GpuCharts).charts())
        assert any("no fleetops-agent daemon on node001" in line for line in screen_lines(app))

    drive(app, body)


@pytest.mark.root
def test_live_charts_refresh_while_open_and_show_an_injected_heat(
    fleets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = fleets[0]
    monkeypatch.setattr(NodeScreen, "CHARTS_REFRESH_S", 0.5)
    app = live_app(directory)
    node = "node001"

    async def body(pilot: Any) -> None:
        await _open_charts(app, node)(pilot)
        await wait_for(pilot, lambda: "last" in chart_label(app, "temp_gpu_c"), timeout=60, what="the live charts")
        before = chart_label(app, "temp_gpu_c")
        assert " max 9" not in before  # a cool GPU: no 90-something yet
        try:
            assert fleet.inject(directory, node, "thermal-slowdown", 0)
            # no key pressed: the screen's own refresh brings the daemon's new samples
            await wait_for(pilot, lambda: "max 9" in chart_label(app, "temp_gpu_c"), timeout=60, what="the heat charted")
        finally:
            fleet.clear(directory, node, "all")
        label = chart_label(app, "temp_gpu_c")
        assert "last 9" in label, label

    drive(app, body)


@pytest.mark.root
def test_live_charts_show_the_snapshots_thresholds_and_an_injected_xid(
    fleets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real path: the daemon's history over SSH, the thresholds of the snapshot the app
    polled, and an XID the simulator logs on GPU 1, marked in the column of its time."""
    from fleetops.xid import catalog

    directory = fleets[0]
    monkeypatch.setattr(NodeScreen, "CHARTS_REFRESH_S", 0.5)
    app = live_app(directory)
    node = "node002"
    truth = sim.read_state(os.path.join(directory, "state", f"{node}.json"))["gpus"][1]
    uuid = truth["uuid"]

    async def body(pilot: Any) -> None:
        await _open_charts(app, node)(pilot)
        app.screen.query_one("#node-gpus", FleetTable).select_key(uuid)
        await wait_for(pilot, lambda: app.screen.charts_for == uuid and "slowdown" in chart_label(app, "temp_gpu_c"), timeout=60, what="GPU 1's charts")
        try:
            assert fleet.inject(directory, node, "xid:13", 1)
            await wait_for(pilot, lambda: any(line.startswith("X XID 13 ") for line in events_lines(app)), timeout=60, what="the XID marked")
        finally:
            fleet.clear(directory, node, "all")
        entry = app.state.entries[node]
        gv = entry.gpu(uuid)
        assert gv is not None and gv.gpu is not None
        g = gv.gpu
        assert (g.temp_slowdown_c, g.power_enforced_limit_w) == (truth["temp_slowdown_c"], truth["power_limit_w"])
        assert f"slowdown {g.temp_slowdown_c:g} C: none at or over" in chart_label(app, "temp_gpu_c")
        assert f"enforced cap {g.power_enforced_limit_w:g} W: none at or over" in chart_label(app, "power_draw_w")
        (x,) = [x for x in entry.xids if x.code == 13]
        assert x.event.gpu_uuid == uuid and x.event.timestamp is not None
        lines = events_lines(app)
        row = lines[2][GUTTER:]
        assert row.strip() == "X"
        events = app.screen.query_one("#charts-events", ChartEvents)
        assert events.window is not None
        t0, t1 = events.window
        width = len(row)
        assert t0 <= x.event.timestamp <= t1 + (t1 - t0) / (width - 1) / 2
        assert abs(column_time(row.index("X"), events.window, width) - x.event.timestamp) <= (t1 - t0) / (width - 1) / 2
        stamp = time.strftime("%H:%M:%S", time.gmtime(x.event.timestamp))
        assert f"X XID 13   {stamp} UTC  {catalog.info_for(x.event).name}  {x.severity.upper()}" in lines

    drive(app, body)
