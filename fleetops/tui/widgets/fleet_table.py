"""A DataTable that is updated in place: stable row keys, fixed widths, changed cells only.

``apply(rows)`` compares the new rows with what is on screen and touches only the difference:
``update_cell`` for changed cells (lit for a moment so the eye finds them), ``add_row`` and
``remove_row`` for rows that came or went, and a reorder when the order changed. It never
``clear()``s on a refresh, and the cursor stays on the row it was on (by key), wherever that
row moved. Only an operator action that removes most rows at once (a narrow filter) rebuilds
the table, and even then the cursor goes back to its row if it survived.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.widgets import DataTable
from textual.widgets.data_table import RowKey

from fleetops.tui.data import Column, Row

# Style of each style name a Row carries; severities as in the terminal report.
STYLES: dict[str, Style] = {
    "": Style(),
    "ok": Style(color="green"),
    "info": Style(color="cyan"),
    "unknown": Style(color="magenta"),
    "warn": Style(color="yellow"),
    "crit": Style(color="red", bold=True),
    "unreach": Style(color="white", bgcolor="dark_red", bold=True),
    "pending": Style(dim=True),
    "dim": Style(dim=True),
    "stale": Style(color="yellow"),
}
CHANGED = Style(bgcolor="#4d4d00", bold=True)  # k9s' "modified" delta colour, darkened
REBUILD_MIN_REMOVED = 64
CELL_CACHE_SIZE = 8192  # removing more rows than this at once (and most of them) rebuilds


def cell(text: str, style: str, changed: bool = False) -> Text:
    """Always a Text: a plain str would be parsed as console markup ("[0]" in a message)."""
    st = STYLES.get(style, STYLES[""])
    if changed:
        st = st + CHANGED
    return Text(text, style=st, no_wrap=True, overflow="ellipsis")


class FleetTable(DataTable[Text]):
    """Rows from ``fleetops.tui.data``; see the module docstring."""

    def __init__(
        self,
        columns: Iterable[Column],
        *,
        highlight_s: float = 1.5,
        monotonic: Callable[[], float] = time.monotonic,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=False)
        self.spec = tuple(columns)
        self.highlight_s = highlight_s
        self.monotonic = monotonic
        self._shown: dict[str, Row] = {}
        self._order: list[str] = []
        self._lit: dict[tuple[str, int], float] = {}  # (row key, column index) -> until
        self._columns_added = False
        self.last_changed_cells = 0
        self._cells_cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self._lines_cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self._strips_cache: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def _ensure_columns(self) -> None:
        if not self._columns_added:
            for c in self.spec:
                self.add_column(c.label, width=c.width, key=c.key)
            self._columns_added = True

    def on_mount(self) -> None:
        self._ensure_columns()
        self.set_interval(0.25, self.fade)

    # --- queries -----------------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    def row(self, key: str) -> Row | None:
        return self._shown.get(key)

    @property
    def cursor_key(self) -> str | None:
        if not self._order or not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]

    # --- updating ----------------------------------------------------------------------

    def apply(self, rows: list[Row], highlight: bool = True) -> int:
        """Make the table show ``rows`` in this order; returns how many cells changed."""
        self._ensure_columns()
        keep = self.cursor_key
        new = {r.key: r for r in rows}
        order = list(new)
        removed = [k for k in self._order if k not in new]
        if len(removed) > REBUILD_MIN_REMOVED and len(removed) * 2 > len(self._order):
            self._rebuild(rows, keep)
            return 0
        for key in removed:
            self.remove_row(key)
            del self._shown[key]
        if removed:
            gone = set(removed)
            self._order = [k for k in self._order if k not in gone]
            self._lit = {k: v for k, v in self._lit.items() if k[0] not in gone}
        changed = 0
        until = self.monotonic() + self.highlight_s
        for r in rows:
            old = self._shown.get(r.key)
            if old is r:
                continue
            if old is None:
                self.add_row(*(cell(t, s) for t, s in zip(r.cells, r.styles, strict=True)), key=r.key)
                self._order.append(r.key)
            elif old.cells != r.cells or old.styles != r.styles:
                for i, col in enumerate(self.spec):
                    text, style = r.cells[i], r.styles[i]
                    if text == old.cells[i] and style == old.styles[i]:
                        continue
                    lit = highlight and text != old.cells[i] and not col.clock and not old.placeholder
                    self.update_cell(r.key, col.key, cell(text, style, lit))
                    if lit:
                        self._lit[(r.key, i)] = until
                    changed += 1
            self._shown[r.key] = r
        if self._order != order:
            self._reorder(order)
        self._restore_cursor(keep)
        self.last_changed_cells = changed
        return changed

    def _reorder(self, order: list[str]) -> None:
        # What DataTable.sort() does once it has the new order; sort() itself only sees cell
        # values, and our order comes from the data side's sort values.
        from textual._two_way_dict import TwoWayDict

        self._row_locations = TwoWayDict({RowKey(k): i for i, k in enumerate(order)})
        self._update_count += 1
        self._order = order
        self.refresh()

    def _rebuild(self, rows: list[Row], keep: str | None) -> None:
        self.clear()
        self._shown = {r.key: r for r in rows}
        self._order = [r.key for r in rows]
        self._lit.clear()
        for r in rows:
            self.add_row(*(cell(t, s) for t, s in zip(r.cells, r.styles, strict=True)), key=r.key)
        self._restore_cursor(keep)

    def _restore_cursor(self, key: str | None) -> None:
        if key is None or key not in self._shown:
            return
        index = self._order.index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False)

    def select_key(self, key: str) -> bool:
        if key not in self._shown:
            return False
        self.move_cursor(row=self._order.index(key), animate=False)
        return True

    def fade(self) -> None:
        """Changed cells go back to their normal look once their moment is over."""
        if not self._lit:
            return
        now = self.monotonic()
        done = [k for k, until in self._lit.items() if until <= now]
        for key, i in done:
            del self._lit[(key, i)]
            row = self._shown.get(key)
            if row is not None:
                self.update_cell(key, self.spec[i].key, cell(row.cells[i], row.styles[i]))

    # --- rendering ---------------------------------------------------------------------

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> Any:
        """DataTable keys its render caches on a counter that every ``update_cell`` bumps, so
        one changed cell re-renders every visible cell. Here a data cell's rendering is kept
        for as long as the cell holds the same value object (``apply`` puts a new one in
        when, and only when, its text or style changes), at the same place and width, with
        the same cursor, hover and focus state."""
        if row_index < 0 or column_index < 0:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        value = self._data[row_key][column_key]
        key = (
            row_key,
            column_key,
            row_index,
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        hit = self._cells_cache.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if len(self._cells_cache) >= CELL_CACHE_SIZE:
            self._cells_cache.clear()  # a screenful is a few hundred cells: plenty of room
        self._cells_cache[key] = (value, lines)
        return lines

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Any,
        hover_location: Any,
    ) -> Any:
        """The same idea one level up: a row's line is kept while its cells hold the same value
        objects, it sits at the same index, and the cursor and hover are on it or not as
        before (row cursor only)."""
        row_index = self._row_locations.get(row_key)
        if row_index is None or self.cursor_type != "row":
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        values = tuple(self._data[row_key].values())
        key = (
            row_key,
            line_no,
            row_index,
            base_style,
            cursor_location.row == row_index,
            hover_location.row == row_index,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        hit = self._lines_cache.get(key)
        if hit is not None and len(hit[0]) == len(values) and all(a is b for a, b in zip(hit[0], values, strict=True)):
            return hit[1]
        lines = super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        if len(self._lines_cache) >= CELL_CACHE_SIZE:
            self._lines_cache.clear()
        self._lines_cache[key] = (values, lines)
        return lines

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Any:
        """And one more level up: a whole screen line (the row's cells joined, cropped to the
        scroll position) is kept on the same terms."""
        try:
            row_key, _ = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        row_index = self._row_locations.get(row_key)
        if row_index is None or self.cursor_type != "row" or self.fixed_columns:
            return super()._render_line(y, x1, x2, base_style)
        values = tuple(self._data[row_key].values())
        key = (
            y,
            x1,
            x2,
            self.size.width,
            row_key,
            row_index,
            base_style,
            self.cursor_coordinate.row == row_index,
            self.hover_coordinate.row == row_index,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        hit = self._strips_cache.get(key)
        if hit is not None and len(hit[0]) == len(values) and all(a is b for a, b in zip(hit[0], values, strict=True)):
            return hit[1]
        strip = super()._render_line(y, x1, x2, base_style)
        if len(self._strips_cache) >= CELL_CACHE_SIZE:
            self._strips_cache.clear()
        self._strips_cache[key] = (values, strip)
        return strip

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """DataTable measures every cell of every new row to size auto-width columns and
        auto-height rows (7000 measurements for 1000 nodes). Here every column has a fixed
        width and every row one line, so only the scrollable size needs setting."""
        width = sum(column.get_render_width(self) for column in self.columns.values())
        header = self.header_height if self.show_header else 0
        self.virtual_size = Size(width, len(self.rows) + header)

    def notify_style_update(self) -> None:
        self._cells_cache.clear()
        self._lines_cache.clear()
        self._strips_cache.clear()
        super().notify_style_update()

    @property
    def lit_cells(self) -> set[tuple[str, str]]:
        return {(k, self.spec[i].key) for k, i in self._lit}
