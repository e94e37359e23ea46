"""The real app driven through ``App.run_test()`` and its Pilot, with fed simulated snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Button, ContentSwitcher, Input, Static

from fleetops.tui import data, simfeed
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.fleet import FleetScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.widgets.fleet_table import FleetTable
from fleetops.tui.widgets.summary import SummaryBar

from .conftest import FAULTS, FAULTY, NAMES, FakeSource, drive, fed_app, fed_entries, screen_lines, wait_for

ENTRIES = fed_entries()


def table(app: Any) -> FleetTable:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    return screen.table()


def cells(tbl: FleetTable, key: str) -> dict[str, str]:
    row = tbl.row(key)
    assert row is not None, key
    return dict(zip((c.key for c in tbl.spec), row.cells, strict=True))


def summary(app: Any) -> str:
    return str(app.screen.query_one(SummaryBar).render())


def test_every_node_is_listed() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        assert table(app).keys == NAMES
        assert cells(table(app), "node003")["health"] == "CRIT"
        assert "nodes 12:" in summary(app) and "GPUs ok 90/96" in summary(app)  # node011's lost GPU: counted, never ok

    drive(app, body, ENTRIES)


@pytest.mark.parametrize("key", ["f", "ctrl+z"])
def test_faults_only_toggle_leaves_exactly_the_unhealthy_nodes(key: str) -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press(key)
        assert table(app).keys == FAULTY
        assert "faults only" in str(table(app).border_subtitle)
        await pilot.press(key)
        assert table(app).keys == NAMES

    drive(app, body, ENTRIES)


def test_filter_applies_on_enter_inverts_with_bang_and_esc_clears() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("slash", *"nvlink")
        assert app.screen.query_one("#prompt", Input).has_focus
        assert table(app).keys == NAMES  # typing alone does not filter
        await pilot.press("enter")
        assert table(app).keys == ["node008"]  # matched in its findings, not its name
        await pilot.press("slash")
        app.screen.query_one("#prompt", Input).value = "!node00[1-9]"
        await pilot.press("enter")
        assert table(app).keys == ["node010", "node011", "node012"]
        assert "filter /!node00[1-9]/" in str(table(app).border_subtitle)
        await pilot.press("escape")
        assert table(app).keys == NAMES

    drive(app, body, ENTRIES)


def test_colon_switches_views_and_each_view_keeps_its_place() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("down", "down")
        await pilot.press("colon", *"gpus", "enter")
        assert app.screen.query_one(ContentSwitcher).current == "view-gpus"
        assert len(table(app).keys) == 96  # node011's lost GPU keeps its row (its index, as NVML)
        await pilot.press("colon", *"xid", "enter")
        assert {table(app).row(k).node for k in table(app).keys} == {"node003", "node011"}  # type: ignore[union-attr]
        await pilot.press("colon", *"findings", "enter")
        assert table(app).keys[0].startswith("node003|")  # crit first
        await pilot.press("1")
        assert table(app).cursor_key == "node003"

    drive(app, body, ENTRIES)


# Two warn-only nodes beside the four crit ones, so that the sort has three ranks to order.
SORT_FAULTS = {**FAULTS, "node006": ["pcie-downgrade@1"], "node012": ["row-remap-pending@2"]}
HEALTHY = ["node001", "node002", "node004", "node007", "node009", "node010"]


def test_shift_letter_sort_moves_rows_but_keeps_the_cursor_on_its_node() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        tbl = table(app)
        assert [cells(tbl, k)["health"] for k in ("node006", "node012", "node003")] == ["WARN", "WARN", "CRIT"]
        tbl.select_key("node008")
        await pilot.press("H")  # health ascending: worst last, ties in inventory order
        assert tbl.keys == [*HEALTHY, "node006", "node012", "node003", "node005", "node008", "node011"]
        assert tbl.cursor_key == "node008"
        await pilot.press("H")  # again: reversed, ties still in inventory order (a stable sort)
        assert tbl.keys == ["node003", "node005", "node008", "node011", "node006", "node012", *HEALTHY]
        assert tbl.cursor_key == "node008"
        assert "sort HEALTH ▼" in str(tbl.border_subtitle)

    drive(app, body, fed_entries(SORT_FAULTS))


def test_a_refresh_updates_only_changed_cells_lights_them_and_never_clears() -> None:
    app = fed_app()
    later = list(ENTRIES)
    i = NAMES.index("node006")
    later[i] = simfeed.entry("node006", ["ecc-dbe@2"], now=simfeed.T0 + 2, previous=ENTRIES[i])

    async def body(pilot: Any) -> None:
        tbl = table(app)
        tbl.select_key("node010")

        def no_clear(*a: Any, **k: Any) -> None:
            raise AssertionError("clear() on refresh")

        tbl.clear = no_clear  # type: ignore[method-assign]
        app.feed(later)
        await pilot.pause()
        assert tbl.keys == NAMES and tbl.cursor_key == "node010"
        assert cells(tbl, "node006")["health"] == "CRIT"
        lit = tbl.lit_cells
        assert ("node006", "health") in lit and ("node006", "worst") in lit
        assert {k for k, _ in lit} == {"node006"}, sorted(lit)  # nothing else changed
        assert lit == {("node006", c) for c in ("health", "gpus", "xids", "worst")}
        # and SEEN and BAD SINCE (from the XID 48 the DBE wrote at T0-120), which move with the
        # clock: not lit
        assert cells(tbl, "node006")["bad"] == "07:58 2m"
        assert tbl.last_changed_cells == 6
        drawn = next(line for line in screen_lines(app) if "node006" in line)
        assert "CRIT" in drawn and "7/8" in drawn and "memory.ecc_dbe_volatile" in drawn
        await pilot.press("down")  # the cursor moves off node010: both rows are drawn anew
        assert tbl.cursor_key == "node011"

    drive(app, body, ENTRIES)


def test_unreachable_node_shows_its_mark_and_its_last_state() -> None:
    app = fed_app()
    i = NAMES.index("node003")
    from fleetops import model

    problem = model.Finding(
        "transport.unreachable", "unknown", "node003", "unreachable: 127.0.0.3:22: connection refused"
    )
    gone = data.mark_failed("node003", "unreachable", problem, ENTRIES[i])

    async def body(pilot: Any) -> None:
        app.feed([gone])
        await pilot.pause()
        row = cells(table(app), "node003")
        assert row["health"] == "UNREACH"
        assert (row["gpus"], row["driver"], row["seen"]) == ("7/8", "580.159.04", "5s")
        assert "connection refused" in row["worst"] and "ecc" in row["worst"]
        assert "unreach 1" in summary(app)

    drive(app, body, ENTRIES)


def test_enter_drills_down_to_the_injected_fault_on_the_right_gpu_and_esc_goes_back() -> None:
    app = fed_app()
    bad = ENTRIES[NAMES.index("node003")].gpus[3].uuid

    async def body(pilot: Any) -> None:
        table(app).select_key("node003")
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen) and screen.node == "node003"
        gpus = screen.query_one("#node-gpus", FleetTable)
        assert len(gpus.keys) == 8
        for key in gpus.keys:
            row = cells(gpus, key)
            assert row["health"] == ("CRIT" if key == bad else "OK"), key
        assert cells(gpus, bad)["ecc"] == "0/2"
        findings = str(screen.query_one("#node-findings", Static).render())
        assert "memory.ecc_dbe_volatile" in findings and "GPU 3 (0000:5d:00.0)" in findings
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen) and table(app).cursor_key == "node003"

    drive(app, body, ENTRIES)


def test_data_arriving_while_a_node_screen_opens_does_not_break_it() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node003"))
        app.feed(fed_entries({"node003": ["ecc-dbe@1"]}, now=simfeed.T0 + 1))  # before it mounted
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        await pilot.press("4")
        assert "no history database" in str(app.screen.query_one("#node-history", FleetTable).row("note"))

    drive(app, body, ENTRIES)


def test_drill_down_from_a_gpu_row_selects_that_gpu() -> None:
    app = fed_app()
    e = ENTRIES[NAMES.index("node005")]

    async def body(pilot: Any) -> None:
        await pilot.press("2")
        table(app).select_key(f"node005:{e.gpus[2].uuid}")
        await pilot.press("enter")
        gpus = app.screen.query_one("#node-gpus", FleetTable)
        assert gpus.cursor_key == e.gpus[2].uuid
        assert "thermal_power.temperature" in str(app.screen.query_one("#node-gpu-detail", Static).render())

    drive(app, body, ENTRIES)


def test_readonly_shows_the_indicator_and_blocks_reset() -> None:
    source = FakeSource(NAMES)
    app = fed_app(readonly=True, source=source)

    async def body(pilot: Any) -> None:
        assert "READ-ONLY" in summary(app)
        table(app).select_key("node003")
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        screen.query_one("#node-gpus", FleetTable).select_key(ENTRIES[2].gpus[3].uuid)
        await pilot.press("r", "d", "a")
        assert isinstance(app.screen, NodeScreen)  # no dialog opened
        assert screen.check_action("reset", ()) is None  # shown disabled, the reason above the footer
        app.request_reset("node003", ENTRIES[2].gpus[3].uuid)  # called directly: still refused
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        assert source.resets == [] and source.drains == []
        assert "READ-ONLY" in summary(app)

    drive(app, body, ENTRIES)


def test_reset_dialog_names_node_gpu_and_processes_and_defaults_to_cancel() -> None:
    source = FakeSource(NAMES)
    app = fed_app(source=source)
    e = ENTRIES[NAMES.index("node008")]
    gpu6 = e.gpus[6]

    async def body(pilot: Any) -> None:
        table(app).select_key("node008")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(gpu6.uuid)
        await pilot.press("r")
        dialog = app.screen
        assert isinstance(dialog, ConfirmScreen)
        text = str(dialog.query_one("#dialog-body", Static).render())
        assert "node008" in text and gpu6.uuid in text and gpu6.bus_id in text
        assert "pid 48213" in text and "python3 train.py" in text and "KILLED" in text
        focused = app.focused
        assert isinstance(focused, Button) and focused.id == "cancel"
        await pilot.press("enter")  # Enter on the default button cancels
        assert isinstance(app.screen, NodeScreen) and source.resets == []
        await pilot.press("r", "tab", "enter")  # move to "Reset GPU" and press it
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the reset")
        # exactly the PIDs the dialog showed travel with the reset
        assert source.resets == [("node008", gpu6.uuid, gpu6.bus_id, (48213,))]

    drive(app, body, ENTRIES)


def test_reset_of_a_gpu_the_dialog_showed_idle_passes_no_pids() -> None:
    source = FakeSource(NAMES)
    app = fed_app(source=source)
    e = ENTRIES[NAMES.index("node003")]
    gpu3 = e.gpus[3]

    async def body(pilot: Any) -> None:
        table(app).select_key("node003")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(gpu3.uuid)
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Processes: none" in str(app.screen.query_one("#dialog-body", Static).render())
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the reset")
        assert source.resets == [("node003", gpu3.uuid, gpu3.bus_id, ())]
        # the verdict after it comes from a snapshot asked for after the action, not the last poll's
        await wait_for(pilot, lambda: source.collects, 30, "the collect after the reset")
        assert source.collects == [("node003", True)]

    drive(app, body, ENTRIES)


def test_help_lists_the_keys_and_sort_letters() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("question_mark")
        text = str(app.screen.query_one(Static).render())
        assert "faults only" in text and "H=HEALTH" in text
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)

    drive(app, body, ENTRIES)
