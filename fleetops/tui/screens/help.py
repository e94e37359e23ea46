"""Every key, including the shift-letter sorts of each view, and the legend: every column of
every table of the fleet and node screens, the state words, the abbreviations and the chart
marks, generated from the column and chart definitions the screens are drawn from, so a new
column or chart is in the legend too."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from fleetops.tui import data
from fleetops.tui.widgets import charts

KEYS = (
    (":", "switch view (nodes, gpus, findings, xids; prefixes work; :q quits); 1-4 also switch"),
    ("/", "filter: regex over node names, findings text and running jobs (job 1234, a user), !regex inverts; "
          "Enter applies"),
    ("Esc", "clear the filter and the job filter / close the prompt / back from a node"),
    ("j", "job filter: a Slurm job id (prefilled with the job under the cursor); the fleet shows that job's "
          "nodes, the GPUs view exactly its GPUs side by side, a line names the job; Esc clears"),
    ("f, ctrl+z", "faults only (unhealthy or unreachable nodes, faulty GPUs, warn/crit findings)"),
    ("Shift+letter", "sort by the column (again: reverse); clicking a header also sorts"),
    ("Enter", "open the node of the row: GPUs, findings, XIDs, history, charts, fabric (1-6 pick the tab there)"),
    ("a", "re-audit the node now"),
    ("r", "reset the selected GPU (asks first; gpus view or node screen)"),
    ("d / u", "drain (asks the reason Slurm keeps) / resume the node in Slurm (asks first)"),
    ("ctrl+d", "drain every node the filter (/ or j) shows, through the capacity guard (asks the reason; shows the "
               "jobs on them and what the guard allows first)"),
    ("l", "action log: every action from the TUI and its outcome, earlier sessions' too (Esc closes)"),
    ("c", "copy the command for the row or the selected GPU: fleetops reset -i INVENTORY NODE UUID, or the "
          "node's fleetops drain (a lost GPU, a node row); C on a node screen: its drain"),
    ("q", "quit"),
    ("dimmed key", "an action its preconditions refuse (a lost GPU's reset, another owner's drain, read-only): why is shown above the footer"),
)


def help_text(readonly: bool) -> Text:
    t = Text()
    t.append("fleetops tui keys\n\n", style="bold")
    for key, what in KEYS:
        t.append(f"  {key:<13}", style="bold cyan")
        t.append(f"{what}\n")
    if readonly:
        t.append("\n  READ-ONLY: a, r, d, u and ctrl+d are off.\n", style="bold white on dark_red")
    t.append("\nSort letters\n", style="bold")
    for view in (*data.VIEWS, "job"):
        letters = "  ".join(f"{c.sort_key}={c.label}" for c in data.COLUMNS[view] if c.sort_key)
        t.append(f"  {view:<10}", style="bold cyan")
        t.append(f"{letters}\n")
    legend_text(t)
    t.append("\nEsc or q closes this.", style="dim")
    return t


def legend_tables() -> tuple[tuple[str, tuple[data.Column, ...]], ...]:
    """Every table the two screens draw, with its title in the legend."""
    return (
        *((f"{view} view", data.COLUMNS[view]) for view in data.VIEWS),
        ("gpus view of one job (j)", data.COLUMNS["job"]),
        ("node screen: GPUs", data.DETAIL_GPU_COLUMNS),
        ("node screen: XIDs", data.DETAIL_XID_COLUMNS),
        ("node screen: Fabric", data.DETAIL_FABRIC_COLUMNS),
        ("node screen: History", data.HISTORY_COLUMNS),
    )


def legend_text(t: Text) -> None:
    t.append("\nColumns\n", style="bold")
    for title, cols in legend_tables():
        t.append(f"  {title}\n", style="bold cyan")
        for c in cols:
            t.append(f"    {c.label:<14}", style="bold")
            t.append(f"{c.doc}\n")
    t.append("\nStates (HEALTH, SEV)\n", style="bold")
    for word, what in data.STATE_WORDS:
        t.append(f"  {word:<14}", style="bold")
        t.append(f"{what}\n")
    t.append("\nAbbreviations (THROTTLE)\n", style="bold")
    for short, reason in data.THROTTLE_WORDS:
        t.append(f"  {short:<14}", style="bold")
        t.append(f"{reason}\n")
    t.append("\nCharts (node screen, tab 5: the selected GPU's last hour, one time axis)\n", style="bold")
    for spec in charts.CHARTS:
        t.append(f"  {spec.title:<14}", style="bold")
        t.append(f"{charts.spec_doc(spec)}\n")
    for mark, what in charts.LEGEND:
        t.append(f"  {mark:<14}", style="bold")
        t.append(f"{what}\n")


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(bool(getattr(self.app, "readonly", False))))

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
