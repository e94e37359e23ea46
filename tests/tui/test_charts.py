"""The node screen's GPU charts: fed from the simulated feed, and live over real SSH from a
simulated fleet's daemon (and from one without a daemon, which must say so)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from textual.widgets import Static

from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.source import SshSource, resolve_hosts
from fleetops.tui.widgets.charts import CHARTS, Chart, GpuCharts, buckets, chart_text, sparkline
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
        return simfeed.gpu_history(name, uuid)


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
    text = chart_text(CHARTS[0], samples, 4).plain
    assert text.splitlines() == ["GPU temp  last 5 C  min 1  max 5  over 30s", "▁ ▅█"]


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
        assert [c.spec.field for c in charts if c.display] == ["temp_gpu_c", "temp_memory_c", "power_draw_w", "clock_sm_mhz"]
        for spec in CHARTS:
            label = chart_label(app, spec.field)
            values = [v for _, v in want[spec.field] if v is not None]
            assert f"last {last_value(want[spec.field]):.0f} {spec.unit}" in label, label
            assert f"min {min(values):.0f}" in label and f"max {max(values):.0f}" in label, label
        drawn = "\n".join(screen_lines(app))
        assert "GPU 2 " + gpus[2].uuid in drawn and "SM clock" in drawn
        # another GPU: the charts follow the cursor
        await pilot.press("up")
        want = simfeed.gpu_history(node, gpus[1].uuid)
        await wait_for(pilot, lambda: source.asked[-1] == (node, gpus[1].uuid), what="GPU 1's history asked")
        await wait_for(pilot, lambda: f"last {last_value(want['temp_gpu_c']):.0f} C" in chart_label(app, "temp_gpu_c"), what="GPU 1's chart")

    drive(app, body, ENTRIES)


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
