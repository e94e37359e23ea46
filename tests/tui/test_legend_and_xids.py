"""The node screen's XIDs as an engineer reads them (bus id, GPU index also for a lost GPU, UTC
time and age, the kernel's own line, count, escalation), the node's GPU table's bus id column,
the tables' widths on wide and narrow terminals, and the legend (``?``) that explains every
column of every table."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from fleetops import model
from fleetops.tui import data, simfeed
from fleetops.tui.screens import help as help_screen
from fleetops.tui.screens.help import HelpScreen
from fleetops.tui.widgets.fleet_table import PADDING, FleetTable, layout

from .conftest import NAMES, drive, fed_app, fed_entries, screen_lines

ENTRIES = fed_entries()


def _lost_after_79() -> list[data.NodeEntry]:
    """node011 after XID 79: GPU 5 gone from the snapshot and its XID line not mapped to a GPU
    (the collector cannot map the bus id of a GPU NVML no longer lists)."""
    entries = list(ENTRIES)
    i = NAMES.index("node011")
    before = entries[i]
    snap = copy.deepcopy(before.snapshot)
    assert snap is not None
    snap.gpus = [g for g in snap.gpus if g.index != 5]
    snap.xids = [replace(x, gpu_index=None, gpu_uuid=None) for x in snap.xids]
    entries[i] = data.summarize("node011", snap, before.findings, simfeed.T0, previous=before)
    return entries


def _cells(table: FleetTable) -> list[dict[str, str]]:
    return [dict(zip((c.key for c in table.spec), table.row(k).cells, strict=True)) for k in table.keys]  # type: ignore[union-attr]


def test_node_xids_show_gpu_index_and_bus_of_a_lost_gpu_utc_time_age_and_the_kernel_line() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node011")
        await pilot.press("enter", "3")
        await pilot.pause()
        (row,) = _cells(app.screen.query_one("#node-xids", FleetTable))
        assert row["gpu"] == "5" and row["bus"] == "0000:ab:00.0"
        assert row["when"] == "2027-01-15 07:58:00" and row["age"] == "2m05s"
        assert row["kernel"] == "NVRM: Xid (PCI:0000:ab:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        assert (row["code"], row["count"], row["severity"], row["escalated"]) == ("79", "1", "CRIT", "-")

    drive(app, body, _lost_after_79(), size=(200, 45))


def test_xid_count_and_escalation_come_from_the_events_and_the_xid_finding() -> None:
    entry = ENTRIES[NAMES.index("node003")]
    snap = copy.deepcopy(entry.snapshot)
    assert snap is not None
    snap.xids = snap.xids * 3
    fired = {"peak": 3, "count": 3, "within_s": 3600, "fired": True}
    findings = [
        replace(f, observed=[{**f.observed[0], "count": 3, "escalated": fired}]) if f.check == "xid.recent" else f
        for f in entry.findings
    ]
    e = data.summarize("node003", snap, findings, simfeed.T0)
    cells = [data.xid_cells(x, simfeed.T0 + 5) for x in e.xids]
    assert {(c["count"][0], c["escalated"][0], c["gpu"][0], c["bus"][0]) for c in cells} == {("3", "yes", "3", "0000:5d:00.0")}


def test_kernel_line_is_built_from_the_event_where_no_raw_line_came() -> None:
    ev = model.XidEvent(code=79, bus_id="0000:ab:00.0", message="GPU has fallen off the bus.")
    x = data.XidView("k", ev, 79, "GPU has fallen off the bus", "crit", "reboot_node", False, bus_id=ev.bus_id)
    assert data.kernel_line(x) == "NVRM: Xid (PCI:0000:ab:00.0): 79, GPU has fallen off the bus."
    raw = replace(ev, raw="Jan 15 07:58:00 node011 kernel: NVRM: Xid (PCI:0000:ab:00): 79, GPU has fallen off the bus.")
    assert data.kernel_line(replace(x, event=raw)) == "NVRM: Xid (PCI:0000:ab:00): 79, GPU has fallen off the bus."


def test_the_node_gpu_table_has_a_bus_id_column() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node008")
        await pilot.press("enter")
        await pilot.pause()
        rows = _cells(app.screen.query_one("#node-gpus", FleetTable))
        assert [r["bus"] for r in rows] == [g.bus_id for g in ENTRIES[NAMES.index("node008")].gpus]
        assert rows[0]["bus"] == "0000:18:00.0"
        assert any(line.lstrip("│ ").startswith("GPU  BUS ID ") for line in screen_lines(app))

    drive(app, body, ENTRIES, size=(200, 45))


def test_layout_gives_the_spare_width_to_the_text_columns_and_keeps_narrow_terminals_as_they_were() -> None:
    spec = data.COLUMNS["findings"]
    longest = {4: 110, 5: 261}
    assert layout(spec, longest, 78) == tuple(c.width for c in spec)  # 80 columns: scrolls sideways
    at_120 = layout(spec, longest, 118)
    assert at_120[:4] == (7, 12, 3, 28) and sum(at_120) + 2 * PADDING * len(spec) == 118
    assert at_120[5] >= 30
    at_200 = layout(spec, longest, 198)
    assert sum(at_200) + 2 * PADDING * len(spec) == 198  # no blank columns while text is cut
    assert at_200[4] > 62 and at_200[5] > 50
    assert layout(spec, {4: 40, 5: 20}, 198)[4:] == (40, 20)  # short texts: no wider than they are


def test_findings_view_at_200_columns_shows_far_more_of_message_and_action() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("3")
        await pilot.pause()
        widths = dict(zip((c.key for c in app.screen.table().spec), app.screen.table().widths, strict=True))
        assert widths["message"] > 62 and widths["action"] > 50
        node008 = next(r for r in _cells(app.screen.table()) if r["check"] == "nvlink.links_down")
        assert any(node008["action"][:55] in line for line in screen_lines(app))

    drive(app, body, ENTRIES, size=(200, 45))


def test_legend_explains_every_column_of_every_table_state_and_abbreviation() -> None:
    text = help_screen.help_text(readonly=False).plain
    tables = help_screen.legend_tables()
    assert {title for title, _ in tables} >= {"nodes view", "gpus view", "findings view", "xids view"}
    for title, cols in tables:
        assert f"  {title}\n" in text
        for c in cols:
            assert c.doc, f"{title}: column {c.label} has no legend text"
            assert f"    {c.label:<14}{c.doc}\n" in text
    words = {w for w, _ in data.STATE_WORDS}
    assert {v for v in data.STATUS_LABEL.values() if v} <= words
    assert {s.upper() for s in model.SEVERITY_RANK} <= words
    assert {"LOST", "STALE", "UNREACH", "HUNG"} <= words
    for word, what in data.STATE_WORDS:
        assert f"  {word:<14}{what}\n" in text
    for short, reason in data.THROTTLE_WORDS:
        assert f"  {short:<14}{reason}\n" in text
    assert "c corrected (single-bit) / u uncorrected (double-bit)" in text
    assert "PEND a remap waits for a GPU reset" in text


def test_question_mark_opens_the_legend() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "Columns" in "\n".join(screen_lines(app))

    drive(app, body, ENTRIES)
