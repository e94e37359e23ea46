"""The action log pane (key ``l``): every action taken from the TUI, this session's and those of
earlier sessions read back from the history store, newest first, with its outcome and why."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from fleetops.tui import actionlog


class ActionLogScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,l", "close", "Close")]

    def __init__(self, log: actionlog.ActionLog) -> None:
        super().__init__()
        self.actions = log
        self._shown = -1

    def compose(self) -> ComposeResult:
        yield Static("", id="actions-title")
        table: DataTable[Any] = DataTable(id="actions-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(*actionlog.COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_rows()
        self.set_interval(0.25, self.refresh_rows)

    def refresh_rows(self) -> None:
        if self.actions.version == self._shown:
            return
        self._shown = self.actions.version
        rows = self.actions.rows
        where = self.actions.db_path or "this session only (no history store)"
        title = f"Action log: {len(rows)} actions, newest first ({where})"
        if self.actions.warning:
            title += f"  warning: {self.actions.warning}"
        self.query_one("#actions-title", Static).update(title)
        table = self.query_one("#actions-table", DataTable)
        table.clear()
        for row in rows:
            table.add_row(*actionlog.cells(row))

    def table_rows(self) -> list[tuple[str, ...]]:
        """The rows as drawn, top first (tests read it)."""
        table = self.query_one("#actions-table", DataTable)
        return [tuple(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]

    def action_close(self) -> None:
        self.dismiss(None)
