"""The fleet screen: one table per view (nodes, gpus, findings, xids), k9s keys.

``:`` switches view, ``/`` filters (regex, ``!`` inverts; Enter applies, Esc clears), ``j``
filters the fleet to one Slurm job (its nodes; the GPUs view then lists exactly its GPUs side by
side, under a line naming the job), ``f`` or ctrl+z shows faults only, a shift-letter sorts by a
column (again: reverse), Enter drills down. Each view keeps its own table, so switching back
finds the cursor where it was.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.suggester import SuggestFromList
from textual.widgets import ContentSwitcher, Footer, Input, Static

from fleetops.tui import data
from fleetops.tui.screens.gates import GatedScreen, note_widget
from fleetops.tui.widgets.fleet_table import FleetTable
from fleetops.tui.widgets.summary import SummaryBar

VIEW_ALIASES = {
    "nodes": "nodes", "node": "nodes", "no": "nodes", "n": "nodes",
    "gpus": "gpus", "gpu": "gpus", "g": "gpus",
    "findings": "findings", "finding": "findings", "f": "findings", "fi": "findings",
    "xids": "xids", "xid": "xids", "x": "xids",
}  # fmt: skip


class FleetScreen(GatedScreen):
    # ``:`` and ``/`` are priority bindings: the app runs them as it takes the key from its queue,
    # so the prompt is open before it looks at the next key (``prompt_key``). As ordinary
    # bindings they ran only after the keys typed behind them had gone to the table: letters
    # were lost, Enter opened the node under the cursor. Inside the prompt they are text
    # (``check_action``).
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("colon", "command", "View", key_display=":", priority=True),
        Binding("slash", "filter", "Filter", key_display="/", priority=True),
        Binding("j", "job", "Job", show=False, priority=True),  # in the help; the footer is full
        Binding("f", "faults", "Faults"),
        Binding("ctrl+z", "faults", "Faults", show=False),
        Binding("escape", "escape", "Clear", show=False),
        Binding("a", "reaudit", "Re-audit"),
        Binding("r", "reset", "Reset GPU"),
        Binding("d", "drain", "Drain"),
        Binding("u", "resume", "Resume"),
        # D sorts by DRIVER (shift-letter sorts); the filtered drain is ctrl+d
        Binding("ctrl+d", "drain_set", "Drain filtered"),
        Binding("c", "copy_command", "Copy cmd"),
        Binding("1", "view('nodes')", "Nodes", show=False),
        Binding("2", "view('gpus')", "GPUs", show=False),
        Binding("3", "view('findings')", "Findings", show=False),
        Binding("4", "view('xids')", "XIDs", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.prompt_mode: str | None = None  # "command" | "filter" while the prompt is open
        self.stale = False
        self.ready = False  # set once mounted: data may arrive between push and mount

    @property
    def fleet(self) -> Any:
        return self.app

    @property
    def state(self) -> data.FleetState:
        return self.app.state  # type: ignore[attr-defined, no-any-return]

    def compose(self) -> ComposeResult:
        yield SummaryBar(id="summary")
        yield Static(id="job-header")
        with ContentSwitcher(id="views", initial="view-nodes"):
            for view in (*data.VIEWS, "job"):  # "job": the GPUs view under a job filter
                yield FleetTable(data.COLUMNS[view], id=f"view-{view}", highlight_s=self.app.highlight_s)  # type: ignore[attr-defined]
        yield Input(id="prompt", suggester=SuggestFromList(list(data.VIEWS) + ["quit"]))
        yield note_widget()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#prompt", Input).display = False
        self.query_one("#job-header", Static).display = False
        self.ready = True
        self.refresh_data(None)
        self.table().focus()

    def on_screen_resume(self) -> None:
        if self.stale:
            self.stale = False
            self.refresh_data(None)
        self.table().focus()

    # --- drawing -----------------------------------------------------------------------

    def table(self, view: str | None = None) -> FleetTable:
        return self.query_one(f"#view-{view or self.state.table_view}", FleetTable)

    def refresh_data(self, changed: list[str] | None) -> None:
        if not self.ready:
            return
        state = self.state
        table = self.table()
        # JOBS only once some node reports jobs: a fleet without job records looks as it did
        table.set_hidden(() if state.jobs_known else ("jobs",))
        rows = state.rows()
        table.apply(rows)
        self.update_titles(len(rows))
        self.show_job()
        self.query_one(SummaryBar).show(state, self.app)
        self.update_gates()

    def show_job(self) -> None:
        """The job filter's line above the table: the job, its user, start, GPUs and end."""
        header = self.query_one("#job-header", Static)
        job_id = self.state.job_id
        header.display = job_id is not None
        if job_id is None:
            return
        now = self.state.clock()
        job = self.state.job()
        if job is None:
            phrases = [f"job {job_id}: on no node now (its records are gone from every snapshot)"]
        else:
            phrases = job.header_phrases(now)
        phrases.append("Esc clears")
        style = "yellow" if job is None else "bold yellow" if job.ended else "bold"
        # wrapped between phrases, never inside one, to the screen's width
        width = max(20, self.size.width or self.app.size.width)
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" JOB ", style="bold reverse")
        t.append(" ")
        used = 6
        for i, phrase in enumerate(phrases):
            last = i == len(phrases) - 1
            gap = "" if i == 0 else "   " if last else "  "
            if i and used + len(gap) + len(phrase) > width:
                t.append("\n      ")
                used, gap = 6, ""
            t.append(gap + phrase, style="dim" if last else style)
            used += len(gap) + len(phrase)
        header.update(t)

    def on_resize(self, event: events.Resize) -> None:
        if self.ready:
            self.show_job()

    def update_titles(self, shown: int) -> None:
        state = self.state
        view = state.table_view
        table = self.table()
        title = f" {state.view}{' of job ' + state.job_id if view == 'job' and state.job_id else ''} [{shown}/{state.last_total}] "
        table.border_title = title
        sort = state.sorts[view]
        label = next(c.label for c in data.COLUMNS[view] if c.key == sort.sort_column)
        bits = [f"sort {label} {'▼' if sort.reverse else '▲'}"]
        if state.job_id is not None and view != "job":
            bits.append(f"job {state.job_id}")
        if state.filter.active:
            bits.append(f"filter /{state.filter.text}/")
        if state.faults_only:
            bits.append("faults only")
        table.border_subtitle = "  ".join(bits)

    # --- view, filter, sort ------------------------------------------------------------

    def action_view(self, view: str) -> None:
        if view not in data.VIEWS:
            self.notify(f"no view {view!r}; views: {', '.join(data.VIEWS)}", severity="warning")
            return
        self.state.view = view
        self.query_one(ContentSwitcher).current = f"view-{self.state.table_view}"
        self.refresh_data(None)
        self.table().focus()
        self.refresh_bindings()

    def action_command(self) -> None:
        self._open_prompt("command", "")

    def action_filter(self) -> None:
        self._open_prompt("filter", self.state.filter.text)

    def action_job(self) -> None:
        """``j``: ask for a job id, prefilled with the job under the cursor (Enter applies)."""
        self._open_prompt("job", self.cursor_job() or "")

    def cursor_job(self) -> str | None:
        """The job under the cursor: the job view's own, else the lowest running job on the row's
        GPU (a GPU row), or on its node."""
        if self.state.job_id is not None and self.state.table_view == "job":
            return self.state.job_id
        row = self.current_row()
        if row is None or not row.node:
            return None
        entry = self.state.entries.get(row.node)
        if entry is None:
            return None
        jobs = entry.gpu_jobs(row.gpu) if row.gpu else None
        if not jobs:
            jobs = entry.running_jobs
        return jobs[0].job_id if jobs else None

    def set_job(self, job_id: str | None) -> None:
        """Filter the fleet to ``job_id`` (None: no job filter); a job no node's records name is
        said, and the filter stays as it was."""
        state = self.state
        if job_id is not None:
            if state.job(job_id) is None:
                why = "" if state.jobs_known else " (no node reports jobs: they come from the nodes' fleetops-agent daemons)"
                self.notify(f"job {job_id} is on no node{why}", severity="warning")
                return
        state.job_id = job_id
        self.query_one(ContentSwitcher).current = f"view-{state.table_view}"
        self.refresh_data(None)
        self.table().focus()
        self.refresh_bindings()

    def _open_prompt(self, mode: str, value: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self.prompt_mode = mode
        prompt.placeholder = {
            "command": "view: nodes | gpus | findings | xids",
            "filter": "regex over names and findings; !regex inverts",
            "job": "job id (Slurm): the fleet filtered to that job's nodes and GPUs",
        }[mode]
        prompt.border_title = {"command": ":", "filter": "/", "job": "job"}[mode]
        prompt.value = value
        prompt.display = True
        # focused now, not at the next turn of the message loop (``focus()``): keys already
        # queued behind the ``/`` went to the table (``a``, ``d`` and Enter act there)
        self.set_focus(prompt)

    def _close_prompt(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.display = False
        self.prompt_mode = None
        self.set_focus(self.table())  # at once, as the prompt was focused

    def prompt_key(self, event: events.Key) -> bool:
        """While the prompt is open, the app hands every key here as it takes it from its queue
        (``FleetApp.on_event``), before any widget sees it: text, Backspace, Enter and Escape act
        on the prompt at once, in the order typed, so a filter typed at any speed is applied
        before the next key (an Enter right after it opens the filtered node). Other keys
        (arrows, Home, a suggestion's Right) go on to the prompt as usual. True: taken."""
        if self.prompt_mode is None or not self.ready:
            return False
        prompt = self.query_one("#prompt", Input)
        if event.key == "enter":
            self.submit_prompt(prompt.value)
        elif event.key == "escape":
            self.action_escape()
        elif event.key == "backspace":
            prompt.action_delete_left()
        elif event.is_printable and event.character:
            prompt.insert_text_at_cursor(event.character)
        else:
            return False
        return True

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.prompt_mode is not None:
            self.submit_prompt(event.value)

    def submit_prompt(self, value: str) -> None:
        """The prompt's text, entered."""
        mode, text = self.prompt_mode, value.strip()
        self._close_prompt()
        if mode == "command":
            word = text.lstrip(":").lower()
            if word in ("q", "quit", "q!"):
                self.app.exit()
            elif word in VIEW_ALIASES:
                self.action_view(VIEW_ALIASES[word])
            elif word:
                self.notify(f"unknown view {word!r}; views: {', '.join(data.VIEWS)}", severity="warning")
        elif mode == "filter":
            self.set_filter(text)
        elif mode == "job":
            self.set_job(text or None)

    def set_filter(self, text: str) -> None:
        flt = data.Filter.parse(text)
        if flt.error:
            self.notify(flt.error, severity="warning")
        self.state.filter = flt
        self.refresh_data(None)

    def action_escape(self) -> None:
        if self.prompt_mode is not None:
            mode = self.prompt_mode
            self._close_prompt()
            if mode == "filter":
                self.set_filter("")
            return
        if self.state.filter.active:
            self.set_filter("")
        if self.state.job_id is not None:
            self.set_job(None)

    def action_faults(self) -> None:
        self.state.faults_only = not self.state.faults_only
        self.refresh_data(None)

    def on_key(self, event: events.Key) -> None:
        """Shift-letter sorts by the column whose letter it is (see the help screen)."""
        if self.prompt_mode is not None or self.press_disabled(event):
            return
        ch = event.character
        if ch and len(ch) == 1 and "A" <= ch <= "Z" and self.state.sort_letter(self.state.table_view, ch):
            event.stop()
            self.refresh_data(None)

    def on_fleet_table_header_selected(self, event: FleetTable.HeaderSelected) -> None:
        self.state.sort_by(self.state.table_view, event.column_key)
        self.refresh_data(None)

    # --- drill down and actions --------------------------------------------------------

    def current_row(self) -> data.Row | None:
        table = self.table()
        key = table.cursor_key
        return table.row(key) if key else None

    def on_fleet_table_row_selected(self, event: FleetTable.RowSelected) -> None:
        # the row Enter was pressed on, not where the cursor is when the message is handled
        row = event.table.row(event.key)
        if row is None or not row.node:
            return
        from fleetops.tui.screens.node import NodeScreen

        self.app.push_screen(NodeScreen(row.node, select_gpu=row.gpu))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("command", "filter", "job") and self.prompt_mode is not None:
            return False  # typed into the open prompt
        if action == "reset" and self.state.view not in ("gpus",):
            return None  # shown dimmed: reset works on a GPU row (gpus view, or a node's detail)
        return self.gate(action)  # None (dimmed, the reason above the footer): read-only, a precondition

    def selection(self) -> tuple[str | None, str | None]:
        row = self.current_row() if self.ready else None
        return (row.node or None, row.gpu or None) if row is not None else (None, None)

    def on_fleet_table_row_highlighted(self, event: FleetTable.RowHighlighted) -> None:
        if event.table is self.table():
            self.selection_moved()

    def action_drain_set(self) -> None:
        """Drain every node the filter shows (any view: the nodes of its rows), through the
        capacity guard; without a filter the app refuses (filter first)."""
        names = list(dict.fromkeys(r.node for r in self.state.rows() if r.node))
        text = self.state.filter.text if self.state.filter.active else ""
        self.app.request_drain_set(names, text, job=self.state.job_id)  # type: ignore[attr-defined]

    def _node(self) -> str | None:
        row = self.current_row()
        if row is None:
            self.notify("no row selected", severity="warning")
            return None
        return row.node

    def action_reaudit(self) -> None:
        name = self._node()
        if name:
            self.app.request_reaudit(name)  # type: ignore[attr-defined]

    def action_reset(self) -> None:
        row = self.current_row()
        if row is None or not row.gpu:
            self.notify("select a GPU first (gpus view, or Enter on a node)", severity="warning")
            return
        self.app.request_reset(row.node, row.gpu)  # type: ignore[attr-defined]

    def action_drain(self) -> None:
        name = self._node()
        if name:
            self.app.request_drain(name)  # type: ignore[attr-defined]

    def action_resume(self) -> None:
        name = self._node()
        if name:
            self.app.request_resume(name)  # type: ignore[attr-defined]

    def action_copy_command(self) -> None:
        """``c``: the command for the row: a GPU's reset (gpus view, or a finding or XID about a
        GPU), else the node's drain."""
        from fleetops.tui import commands

        row = self.current_row()
        if row is None or not row.node:
            self.notify("no row selected", severity="warning")
            return
        entry = self.state.entries.get(row.node) or data.pending_entry(row.node)
        inventory = getattr(self.app, "inventory", None)
        self.app.copy_command(*commands.for_selection(entry, row.gpu, inventory))  # type: ignore[attr-defined]
