"""The fleet's tables on Textual's Line API: a ScrollView that draws only the lines on screen.

``apply(rows)`` compares the new rows with what is shown and keeps the difference: changed
cells are lit for a moment so the eye finds them, and the cursor stays on the row it was on
(by key), wherever that row moved. Every row is one line; a column has a fixed width, except
the text columns marked ``grow`` (messages, actions, log lines), which share the terminal's
spare width by ``layout``: at 200 columns a message or an action is read, not cut at its
80-column width beside blank space. Their longest text is the only per-cell measure, and a
row's line is kept until the row, its lit cells, the cursor or the widths change, so a refresh
of 5000 rows costs a dict comparison and a length per row and a redraw of the visible lines only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

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
PADDING = 1  # blank cells either side of a column's text
LINE_CACHE_SIZE = 4096  # a screenful is a few dozen lines: plenty of room


def cell(text: str, style: str, changed: bool = False) -> Text:
    """Always a Text: a plain str would be parsed as console markup ("[0]" in a message)."""
    st = STYLES.get(style, STYLES[""])
    if changed:
        st = st + CHANGED
    return Text(text, style=st, no_wrap=True, overflow="ellipsis")


def layout(spec: tuple[Column, ...], longest: dict[int, int], available: int) -> tuple[int, ...]:
    """Column widths for a table ``available`` cells wide. Fixed columns keep their width. The
    ``grow`` columns start at their own width (less where their longest text is shorter) and
    share what is left by their ``grow`` weights, each up to its longest text; on a narrower
    terminal they give width back down to ``min_width``; narrower still, every column keeps its
    own width and the table scrolls sideways."""
    widths = [c.width for c in spec]
    growing = [i for i, c in enumerate(spec) if c.grow]
    if not growing:
        return tuple(widths)
    budget = available - sum(w for i, w in enumerate(widths) if i not in growing) - 2 * PADDING * len(spec)
    want = {i: max(cell_len(spec[i].label), longest.get(i, 0)) for i in growing}
    base = {i: min(spec[i].width, want[i]) for i in growing}
    floor = {i: min(spec[i].min_width or spec[i].width, want[i]) for i in growing}
    if budget >= sum(base.values()):
        got, caps = dict(base), want
    elif budget >= sum(floor.values()):
        got, caps = dict(floor), base
    else:
        return tuple(widths)
    extra = budget - sum(got.values())
    while extra > 0:
        open_ = sorted((i for i in growing if got[i] < caps[i]), key=lambda i: -spec[i].grow)
        if not open_:
            break  # every text fits in full: the rest stays blank
        weights = sum(spec[i].grow for i in open_)
        given = 0
        for i in open_:
            add = min(max(1, extra * spec[i].grow // weights), caps[i] - got[i], extra - given)
            got[i] += add
            given += add
        extra -= given
    for i in growing:
        widths[i] = got[i]
    return tuple(widths)


def fit(text: str, width: int) -> str:
    """``text`` in exactly ``width`` cells: padded, or cut with an ellipsis."""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, max(0, width - 1)) + "…" if width > 0 else ""


class FleetTable(ScrollView, can_focus=True):
    """Rows from ``fleetops.tui.data``; see the module docstring."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fleet-table--header",
        "fleet-table--cursor",
    }
    DEFAULT_CSS = """
    FleetTable {
        background: $surface;
        color: $foreground;
        & > .fleet-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .fleet-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus {
            background-tint: $foreground 5%;
            & > .fleet-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
    }
    """

    class RowHighlighted(Message):
        """The cursor is on another row (key None: the table is empty)."""

        def __init__(self, table: FleetTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> FleetTable:
            return self.table

    class RowSelected(Message):
        """Enter (or a click) on a row."""

        def __init__(self, table: FleetTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> FleetTable:
            return self.table

    class HeaderSelected(Message):
        """A click on a column's header: the fleet screen sorts by it."""

        def __init__(self, table: FleetTable, column_key: str) -> None:
            super().__init__()
            self.table = table
            self.column_key = column_key

        @property
        def control(self) -> FleetTable:
            return self.table

    def __init__(
        self,
        columns: Iterable[Column],
        *,
        highlight_s: float = 1.5,
        monotonic: Callable[[], float] = time.monotonic,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.spec = tuple(columns)
        self.highlight_s = highlight_s
        self.monotonic = monotonic
        self._shown: dict[str, Row] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._lit: dict[tuple[str, int], float] = {}  # (row key, column index) -> until
        self.cursor_row = 0
        self._announced: str | None = None
        self.last_changed_cells = 0
        self._line_cache: dict[str, tuple[tuple[object, ...], Strip]] = {}
        self._header_cache: tuple[tuple[object, ...], Strip] | None = None
        self._longest: dict[int, int] = {}  # grow column -> its longest cell text
        self._hidden: frozenset[int] = frozenset()  # columns not drawn now (``set_hidden``)
        self._widths = tuple(c.width for c in self.spec)
        self._width = sum(w + 2 * PADDING for w in self._widths)
        self.virtual_size = Size(self._width, 1)

    def on_mount(self) -> None:
        self.set_interval(0.25, self.fade)

    def on_resize(self, event: events.Resize) -> None:
        self._relayout()

    @property
    def widths(self) -> tuple[int, ...]:
        """Each column's width now (``layout`` for this terminal and these rows)."""
        return self._widths

    def set_hidden(self, keys: Iterable[str]) -> None:
        """Columns (by key) not drawn, and given no width, until shown again: a column whose data
        no node reports yet (JOBS) leaves the table as it was."""
        hidden = frozenset(i for i, c in enumerate(self.spec) if c.key in set(keys))
        if hidden != self._hidden:
            self._hidden = hidden
            self._relayout()

    @property
    def shown_columns(self) -> list[str]:
        return [c.key for i, c in enumerate(self.spec) if i not in self._hidden]

    def _relayout(self) -> None:
        shown = [i for i in range(len(self.spec)) if i not in self._hidden]
        sub = layout(
            tuple(self.spec[i] for i in shown),
            {j: self._longest[i] for j, i in enumerate(shown) if i in self._longest},
            self.scrollable_content_region.width,
        )
        widths_list = [0] * len(self.spec)
        for j, i in enumerate(shown):
            widths_list[i] = sub[j]
        widths = tuple(widths_list)
        if widths == self._widths:
            return
        self._widths = widths
        self._width = sum(widths[i] + 2 * PADDING for i in shown)
        self._line_cache.clear()
        self._header_cache = None
        self.virtual_size = Size(self._width, len(self._order) + 1)
        self.refresh()

    # --- queries -----------------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        return list(self._order)

    @property
    def row_count(self) -> int:
        return len(self._order)

    def row(self, key: str) -> Row | None:
        return self._shown.get(key)

    @property
    def cursor_key(self) -> str | None:
        if not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]

    @property
    def lit_cells(self) -> set[tuple[str, str]]:
        return {(k, self.spec[i].key) for k, i in self._lit}

    # --- updating ----------------------------------------------------------------------

    def apply(self, rows: list[Row], highlight: bool = True) -> int:
        """Make the table show ``rows`` in this order; returns how many cells changed."""
        keep = self.cursor_key
        new = {r.key: r for r in rows}
        if len(self._lit) and len(new) < len(self._shown):
            self._lit = {k: v for k, v in self._lit.items() if k[0] in new}
        changed = 0
        until = self.monotonic() + self.highlight_s
        for r in rows:
            old = self._shown.get(r.key)
            if old is None or old is r or (old.cells == r.cells and old.styles == r.styles):
                continue
            for i, col in enumerate(self.spec):
                text = r.cells[i]
                if text == old.cells[i] and r.styles[i] == old.styles[i]:
                    continue
                changed += 1
                if highlight and text != old.cells[i] and not col.clock and not old.placeholder:
                    self._lit[(r.key, i)] = until
        order = list(new)
        self._shown = new
        if order != self._order:
            self._order = order
            self._index = {k: i for i, k in enumerate(order)}
            for gone in [k for k in self._line_cache if k not in new]:
                del self._line_cache[gone]
        # len, not cell_len: cheap over thousands of rows; a wide character only moves the cut
        longest = {i: max((len(r.cells[i]) for r in rows), default=0) for i, c in enumerate(self.spec) if c.grow}
        if longest != self._longest:
            self._longest = longest
            self._relayout()
        self.virtual_size = Size(self._width, len(order) + 1)
        if keep is not None and keep in self._index:
            self._set_cursor(self._index[keep], scroll=self._index[keep] != self.cursor_row)
        else:
            self._set_cursor(self.cursor_row)
        self.last_changed_cells = changed
        self.refresh()
        return changed

    def select_key(self, key: str) -> bool:
        index = self._index.get(key)
        if index is None:
            return False
        self._set_cursor(index)
        return True

    def move_cursor(self, row: int) -> None:
        self._set_cursor(row)

    def fade(self) -> None:
        """Changed cells go back to their normal look once their moment is over."""
        if not self._lit:
            return
        now = self.monotonic()
        done = [k for k, until in self._lit.items() if until <= now]
        for k in done:
            del self._lit[k]
        if done:
            self.refresh()

    def _set_cursor(self, index: int, scroll: bool = True) -> None:
        index = max(0, min(index, len(self._order) - 1)) if self._order else 0
        if index != self.cursor_row:
            self.cursor_row = index
            self.refresh()
        if scroll and self._order:
            self._scroll_to_cursor()
        key = self.cursor_key
        if key != self._announced:
            self._announced = key
            self.post_message(self.RowHighlighted(self, key))

    def _scroll_to_cursor(self) -> None:
        rows_on_screen = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True, force=True)
        elif self.cursor_row >= top + rows_on_screen:
            self.scroll_to(y=self.cursor_row - rows_on_screen + 1, animate=False, immediate=True, force=True)

    # --- keys and mouse ----------------------------------------------------------------

    def _page(self) -> int:
        return max(1, self.scrollable_content_region.height - 1)

    def action_cursor_up(self) -> None:
        self._set_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._set_cursor(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self._set_cursor(self.cursor_row - self._page())

    def action_page_down(self) -> None:
        self._set_cursor(self.cursor_row + self._page())

    def action_first(self) -> None:
        self._set_cursor(0)

    def action_last(self) -> None:
        self._set_cursor(len(self._order) - 1)

    def action_select_cursor(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            x = offset.x + int(self.scroll_x)
            for i, (col, width) in enumerate(zip(self.spec, self._widths, strict=True)):
                if i in self._hidden:
                    continue
                x -= width + 2 * PADDING
                if x < 0:
                    self.post_message(self.HeaderSelected(self, col.key))
                    return
            return
        index = int(self.scroll_y) + offset.y - 1
        if 0 <= index < len(self._order):
            self._set_cursor(index, scroll=False)
            self.action_select_cursor()

    # --- rendering ---------------------------------------------------------------------

    def notify_style_update(self) -> None:
        self._line_cache.clear()
        self._header_cache = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        scroll_x = int(self.scroll_x)
        base = self.rich_style
        if y == 0:
            return self._header(base).crop_extend(scroll_x, scroll_x + width, base)
        index = int(self.scroll_y) + y - 1
        if not 0 <= index < len(self._order):
            return Strip.blank(width, base)
        key = self._order[index]
        return self._line(key, base, index == self.cursor_row).crop_extend(scroll_x, scroll_x + width, base)

    def _header(self, base: Style) -> Strip:
        style = base + self.get_component_rich_style("fleet-table--header")
        stamp: tuple[object, ...] = (style, self._widths)
        if self._header_cache is not None and self._header_cache[0] == stamp:
            return self._header_cache[1]
        pad = " " * PADDING
        strip = Strip(
            [
                Segment(pad + fit(c.label, w) + pad, style)
                for i, (c, w) in enumerate(zip(self.spec, self._widths, strict=True))
                if i not in self._hidden
            ],
            self._width,
        )
        self._header_cache = (stamp, strip)
        return strip

    def _line(self, key: str, base: Style, cursor: bool) -> Strip:
        row = self._shown[key]
        lit = tuple(i for i in range(len(self.spec)) if (key, i) in self._lit) if self._lit else ()
        stamp: tuple[object, ...] = (row, lit, cursor, base, self.has_focus)
        hit = self._line_cache.get(key)
        if hit is not None and hit[0][0] is row and hit[0][1:] == stamp[1:]:
            return hit[1]
        if cursor:
            base = base + self.get_component_rich_style("fleet-table--cursor")
        pad = " " * PADDING
        segments = []
        for i, width in enumerate(self._widths):
            if i in self._hidden:
                continue
            style = base + STYLES.get(row.styles[i], STYLES[""])
            if i in lit:
                style = style + CHANGED
            segments.append(Segment(pad + fit(row.cells[i], width) + pad, style))
        strip = Strip(segments, self._width)
        if len(self._line_cache) >= LINE_CACHE_SIZE:
            self._line_cache.clear()
        self._line_cache[key] = (stamp, strip)
        return strip
