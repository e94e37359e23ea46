"""Snapshot tests of the main views (pytest-textual-snapshot): fixed terminal size, fed
snapshots at a frozen clock, so no age or time in them depends on when they run.

Update after an intended change with ``pytest tests/tui/test_snapshots.py --snapshot-update``
and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from textual.widgets import Input

from fleetops import model
from fleetops.tui import data
from fleetops.tui.app import FleetApp
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, SIZE, fed_app, fed_entries, wait_for

ENTRIES = fed_entries()
_i = NAMES.index("node010")
ENTRIES[_i] = data.mark_failed(
    "node010",
    "timeout",
    model.Finding(
        "transport.timeout", "unknown", "node010", "timeout: 127.0.10.10:22: no SSH banner within 5s"
    ),
    ENTRIES[_i],
)


def fed(readonly: bool = False) -> FleetApp:
    app = fed_app(readonly=readonly)
    app.call_later(app.feed, ENTRIES)  # once mounted
    return app


def test_snapshot_nodes_view(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=SIZE, press=["_"])


def test_snapshot_gpus_view_faults_only(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=SIZE, press=["_", "2", "f"])


def test_snapshot_findings_view(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=SIZE, press=["_", "3"])


def test_snapshot_xids_view(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=SIZE, press=["_", "4"])


def test_snapshot_node_detail(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=SIZE, press=["_", *["down"] * 7, "enter", "_"])


def test_snapshot_reset_dialog(snap_compare: Any) -> None:
    gpu6 = ENTRIES[NAMES.index("node008")].gpus[6].uuid

    async def open_dialog(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key("node008")
        await pilot.press("enter")
        pilot.app.screen.query_one("#node-gpus", FleetTable).select_key(gpu6)
        await pilot.press("r")
        await pilot.pause()

    assert snap_compare(fed(), terminal_size=SIZE, run_before=open_dialog)


def test_snapshot_readonly_with_filter_prompt(snap_compare: Any) -> None:
    async def type_filter(pilot: Any) -> None:
        await pilot.pause()
        await pilot.press("slash")
        prompt = pilot.app.screen.query_one("#prompt", Input)
        prompt.cursor_blink = False
        await pilot.press(*"ecc")

    assert snap_compare(fed(readonly=True), terminal_size=SIZE, run_before=type_filter)


def test_snapshot_node_charts(snap_compare: Any) -> None:
    from .test_charts import HistorySource, chart_label

    app = fed_app(source=HistorySource(NAMES))
    app.call_later(app.feed, ENTRIES)
    gpu2 = ENTRIES[NAMES.index("node005")].gpus[2].uuid

    async def open_charts(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key("node005")
        await pilot.press("enter")
        pilot.app.screen.query_one("#node-gpus", FleetTable).select_key(gpu2)
        await pilot.press("5")
        # the history is fetched in a worker thread; a chart still blank would be a wrong picture
        await wait_for(
            pilot,
            lambda: "last" in chart_label(pilot.app, "power_draw_w"),
            what="node005 GPU 2's charts",
        )
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=open_charts)


def test_snapshot_stale_versus_unreachable(snap_compare: Any) -> None:
    """node002's stream is silent (STALE, its last data aged 40 s, yellow); node007 could not be
    connected to (UNREACH, red); the header counts them apart."""
    entries = list(ENTRIES)
    i, j = NAMES.index("node002"), NAMES.index("node007")
    entries[i] = data.mark_failed(
        "node002",
        data.STATUS_STALE,
        model.Finding(
            "transport.stale", "warn", "node002",
            "no news from the daemon for 40s (over 30s): its stream is silent; showing its last data",
        ),  # fmt: skip
        replace(entries[i], seen_at=entries[i].seen_at - 40),  # type: ignore[operator]
    )
    entries[j] = data.mark_failed(
        "node007",
        "unreachable",
        model.Finding("transport.unreachable", "crit", "node007", "unreachable: 127.0.10.7:22: connection refused"),
        entries[j],
    )
    app = fed_app()
    app.call_later(app.feed, entries)
    assert snap_compare(app, terminal_size=SIZE, press=["_"])


# The findings view and the node screen at 80, 120 and 200 columns: the text columns (MESSAGE,
# ACTION, LOG MESSAGE, KERNEL LINE) take the width the terminal has; at 80 the table keeps its
# columns' own widths and scrolls sideways as before.
def _at(width: int) -> tuple[int, int]:
    return (width, SIZE[1])


def test_snapshot_findings_view_80(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(80), press=["_", "3"])


def test_snapshot_findings_view_120(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(120), press=["_", "3"])


def test_snapshot_findings_view_200(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(200), press=["_", "3"])


def _node011_xids(pilot_keys: list[str]) -> Any:
    async def open_node(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key("node011")
        await pilot.press("enter", *pilot_keys)
        await pilot.pause()

    return open_node


def test_snapshot_node_xids_80(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(80), run_before=_node011_xids(["3"]))


def test_snapshot_node_xids_120(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(120), run_before=_node011_xids(["3"]))


def test_snapshot_node_xids_200(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(200), run_before=_node011_xids(["3"]))


def test_snapshot_node_findings_200(snap_compare: Any) -> None:
    assert snap_compare(fed(), terminal_size=_at(200), run_before=_node011_xids([]))
