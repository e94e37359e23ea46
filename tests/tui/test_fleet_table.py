"""FleetTable on its own: 1000 rows, cursor and selection, lit cells, and no private Textual."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult

from fleetops.tui import data
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import screen_lines

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (
    data.Column("node", "NODE", 10),
    data.Column("health", "HEALTH", 8),
    data.Column("seen", "SEEN", 6, clock=True),
)
PRIVATE_IMPORT = re.compile(r"^\s*(from\s+textual(\.\w+)*\._\w*|import\s+textual(\.\w+)*\._\w*)", re.M)
PRIVATE_FROM = re.compile(r"^\s*from\s+textual[\w.]*\s+import\s+[^#\n]*\b_\w+", re.M)
# Overrides of DataTable's (and other widgets') private rendering hooks.
PRIVATE_OVERRIDE = re.compile(r"^\s+def\s+(_render\w*|_update_dimensions|_get_offsets)\s*\(", re.M)


def private_textual_uses(source: str) -> list[str]:
    return [m.group(0).strip() for rx in (PRIVATE_IMPORT, PRIVATE_FROM, PRIVATE_OVERRIDE) for m in rx.finditer(source)]


def test_the_private_name_check_catches_the_old_datatable_subclass() -> None:
    old = (
        "class FleetTable(DataTable[Text]):\n"
        "    def _render_cell(self, row_index, column_index, base_style, width):\n"
        "        from textual._two_way_dict import TwoWayDict\n"
        "    def _update_dimensions(self, new_rows):\n"
        "        pass\n"
    )
    assert private_textual_uses(old) == [
        "from textual._two_way_dict",
        "def _render_cell(",
        "def _update_dimensions(",
    ]
    assert private_textual_uses("from textual.widgets import _data_table\n") != []
    assert private_textual_uses("from textual.strip import Strip\n    def render_line(self, y):\n") == []


def test_no_private_textual_name_in_fleetops() -> None:
    found = {
        str(path.relative_to(ROOT)): uses
        for path in sorted((ROOT / "fleetops").rglob("*.py"))
        if (uses := private_textual_uses(path.read_text()))
    }
    assert found == {}


def make_rows(n: int, health: dict[int, str] | None = None, seen: str = "1s") -> list[data.Row]:
    health = health or {}
    rows = []
    for i in range(n):
        h = health.get(i, "OK")
        rows.append(
            data.Row(
                f"n{i:04d}",
                (f"n{i:04d}", h, seen),
                ("", "crit" if h == "CRIT" else "ok", "dim"),
                (i, h, seen),
                h != "OK",
                f"n{i:04d}",
                f"n{i:04d}",
            )
        )
    return rows


class TableApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.selected: list[str] = []
        self.highlighted: list[str | None] = []
        self.now = 100.0

    def compose(self) -> ComposeResult:
        yield FleetTable(COLUMNS, id="t", highlight_s=1.5, monotonic=lambda: self.now)

    def on_fleet_table_row_selected(self, event: FleetTable.RowSelected) -> None:
        self.selected.append(event.key)

    def on_fleet_table_row_highlighted(self, event: FleetTable.RowHighlighted) -> None:
        self.highlighted.append(event.key)


def run(body: Any, size: tuple[int, int] = (60, 20)) -> None:
    async def main() -> None:
        app = TableApp()
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(app, app.query_one(FleetTable), pilot)

    asyncio.run(main())


def test_thousand_rows_apply_and_the_cursor_pages_and_selects() -> None:
    async def body(app: TableApp, tbl: FleetTable, pilot: Any) -> None:
        assert tbl.apply(make_rows(1000)) == 0  # new rows are not "changes"
        tbl.focus()
        await pilot.pause()
        assert len(tbl.keys) == 1000 and tbl.cursor_key == "n0000"
        assert tbl.virtual_size.height == 1001  # header + one line a row
        await pilot.press("down", "down")
        assert tbl.cursor_key == "n0002"
        await pilot.press("end")
        assert tbl.cursor_key == "n0999"
        await pilot.pause()
        lines = screen_lines(app)
        assert any("n0999" in line for line in lines) and not any("n0000" in line for line in lines)
        assert "NODE" in lines[0]  # the header stays while scrolled
        await pilot.press("home", "pagedown")
        assert tbl.cursor_key == f"n{tbl.scrollable_content_region.height - 1:04d}"
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == [tbl.cursor_key]
        assert app.highlighted[-1] == tbl.cursor_key

    run(body)


def test_reorder_and_removal_keep_the_cursor_on_its_row() -> None:
    async def body(app: TableApp, tbl: FleetTable, pilot: Any) -> None:
        rows = make_rows(1000)
        tbl.apply(rows)
        assert tbl.select_key("n0500")
        tbl.apply(list(reversed(rows)))
        assert tbl.cursor_key == "n0500" and tbl.keys[0] == "n0999"
        await pilot.pause()
        assert any("n0500" in line for line in screen_lines(app))  # scrolled to where it went
        tbl.apply([r for r in rows if r.key != "n0001"][::7])
        assert tbl.cursor_key is not None and tbl.cursor_key == tbl.keys[tbl.cursor_row]
        assert "n0001" not in tbl.keys and tbl.row("n0001") is None
        assert not tbl.select_key("n0001")

    run(body)


def test_changed_cells_are_lit_then_fade_and_clock_cells_are_not_lit() -> None:
    async def body(app: TableApp, tbl: FleetTable, pilot: Any) -> None:
        tbl.apply(make_rows(1000))
        unlit = [s for s in tbl.render_line(1 + 3) if "OK" in s.text]
        assert unlit and unlit[0].style is not None and unlit[0].style.bgcolor is not None
        row_bg = unlit[0].style.bgcolor  # the HEALTH cell's background before anything lit it
        assert row_bg.name != "#4d4d00"
        changed = tbl.apply(make_rows(1000, {3: "CRIT", 998: "CRIT"}, seen="2s"))
        assert changed == 2 * 2 + 998  # HEALTH of two rows (text and style), SEEN of all
        assert tbl.lit_cells == {("n0003", "health"), ("n0998", "health")}
        await pilot.pause()
        lit_line = tbl.render_line(1 + 3)
        segs = [s for s in lit_line if "CRIT" in s.text]
        assert segs and segs[0].style is not None and segs[0].style.bgcolor is not None
        assert segs[0].style.bgcolor.name == "#4d4d00"
        app.now += 1.0
        tbl.fade()
        assert len(tbl.lit_cells) == 2
        app.now += 1.0
        tbl.fade()
        assert tbl.lit_cells == set()
        segs = [s for s in tbl.render_line(1 + 3) if "CRIT" in s.text]
        # faded: the row's own background again, as before it lit, with the severity's colour kept
        assert segs and segs[0].style is not None
        assert segs[0].style.bgcolor == row_bg
        assert segs[0].style.color is not None and segs[0].style.color.name == "red" and segs[0].style.bold

    run(body)
