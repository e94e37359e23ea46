"""Snapshot tests of the node screen's Charts tab (pytest-textual-snapshot) at 80, 120 and 200
columns: fed snapshots and a fixed history at a frozen clock, so no time in them depends on when
they run.

The GPU: node005's GPU 2, whose slowdown fault began at 07:50 UTC (ten minutes before the
clock) with an XID 13 at the same moment; its history, as the daemon's ``history`` gives it,
runs hot (91 C, over the 89 C slowdown) and throttled (thermal) from then. And node011's GPU 5,
lost after XID 79: no thresholds in its snapshot, which the titles say.

Update after an intended change with ``pytest tests/tui/test_snapshots_charts.py
--snapshot-update`` and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from typing import Any

from fleetops.tui import simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.widgets.charts import FIELDS
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, fed_app, fed_entries, wait_for
from .test_charts import HistorySource, chart_label

T0 = simfeed.T0
HEAT_SINCE = T0 - 600  # 07:50 UTC
HOT = {"temp_gpu_c": 91.0, "temp_memory_c": 88.0, "clock_sm_mhz": 1110.0, "clocks_event_mask": float(0x8 | 0x20 | 0x40)}
LOST_SINCE = T0 - 120  # node011's GPU 5 fell off the bus at 07:58 (conftest's faults)
HEIGHT = 52  # the whole tab under the node's header and GPU table

ENTRIES = fed_entries()
ENTRIES[NAMES.index("node005")] = simfeed.entry(
    "node005",
    state=simfeed.sim_state("node005", ["pcie-downgrade@1", "thermal-slowdown@2", "xid:13@2"], since=HEAT_SINCE),
)
HOT_GPU = ENTRIES[NAMES.index("node005")].gpus[2].uuid
LOST_GPU = ENTRIES[NAMES.index("node011")].gpus[5].uuid


class FixedHistorySource(HistorySource):
    """The simulated feed's history sampled every 2 s as the daemon does (no column of a
    200-column chart without a sample), with the heat and the lost GPU as the daemon records
    them."""

    def gpu_history(self, name: str, uuid: str) -> dict[str, list[tuple[float, float | None]]]:
        self.asked.append((name, uuid))
        history = simfeed.gpu_history(name, uuid, interval_s=2.0)  # the daemon's sampling interval
        assert set(history) == set(FIELDS)  # the real gpu_history's shape: every charted field
        if uuid == HOT_GPU:
            for field, value in HOT.items():
                history[field] = [(t, value if t >= HEAT_SINCE else v) for t, v in history[field]]
        if uuid == LOST_GPU:  # NVML answers GpuIsLost: the ring keeps no value from then
            history = {f: [(t, None if t >= LOST_SINCE else v) for t, v in s] for f, s in history.items()}
        return history


def _app() -> FleetApp:
    app = fed_app(source=FixedHistorySource(NAMES))
    app.call_later(app.feed, ENTRIES)
    return app


def _open_charts(node: str, uuid: str) -> Any:
    async def go(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key(node)
        await pilot.press("enter")
        pilot.app.screen.query_one("#node-gpus", FleetTable).select_key(uuid)
        await pilot.press("5")
        # fetched in a worker thread: a blank chart would be a wrong picture
        await wait_for(pilot, lambda: "min" in chart_label(pilot.app, "clock_sm_mhz"), what=f"{node} {uuid}'s charts")
        await pilot.pause()

    return go


def test_snapshot_charts_80(snap_compare: Any) -> None:
    assert snap_compare(_app(), terminal_size=(80, HEIGHT), run_before=_open_charts("node005", HOT_GPU))


def test_snapshot_charts_120(snap_compare: Any) -> None:
    assert snap_compare(_app(), terminal_size=(120, HEIGHT), run_before=_open_charts("node005", HOT_GPU))


def test_snapshot_charts_200(snap_compare: Any) -> None:
    assert snap_compare(_app(), terminal_size=(200, HEIGHT), run_before=_open_charts("node005", HOT_GPU))


def test_snapshot_charts_lost_gpu_120(snap_compare: Any) -> None:
    assert snap_compare(_app(), terminal_size=(120, HEIGHT), run_before=_open_charts("node011", LOST_GPU))
