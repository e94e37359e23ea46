"""The header line: fleet totals by health, GPUs ok/total, XIDs in the last hour, refresh
interval, where the fleet comes from, and READ-ONLY when actions are off."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from fleetops.tui import data
from fleetops.tui.widgets.fleet_table import STYLES


def summary_text(
    totals: data.Totals,
    *,
    where: str,
    interval: float,
    readonly: bool,
    live: bool,
    streaming: tuple[int, int] | None = None,
    note: str = "",
) -> Text:
    """``streaming``: (nodes streaming, nodes polled with a cold collect) for a streaming source;
    ``note``: the latest action's verdict and the snapshot it comes from."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" fleetops ", style="bold reverse")
    if readonly:
        t.append(" ")
        t.append(" READ-ONLY ", style="bold white on dark_red")
    t.append(f"  nodes {totals.nodes}:", style="bold")
    for label, count, style in (
        ("ok", totals.ok, "ok"),
        ("warn", totals.warn, "warn"),
        ("crit", totals.crit, "crit"),
        ("unknown", totals.unknown, "unknown"),
        ("unreach", totals.unreachable, "unreach"),
    ):
        t.append(" ")
        t.append(f"{label} {count}", style=STYLES[style] if count else STYLES["dim"])
    if totals.hung:  # of the unreach count: hosts that take connections but answer nothing
        t.append(f" (hung {totals.hung})", style=STYLES["unreach"])
    if totals.stale:  # only when there is one: a fleet whose streams all flow reads as before
        t.append(" ")
        t.append(f"stale {totals.stale}", style=STYLES["stale"])
    if totals.pending:
        t.append(f" waiting {totals.pending}", style=STYLES["dim"])
    if note:  # early in the line: it is cut at the terminal's width
        t.append(f"   {note}", style="bold")
    t.append("   GPUs ok ", style="bold")
    gpu_style = "warn" if totals.gpus_ok < totals.gpus else "ok"
    t.append(f"{totals.gpus_ok}/{totals.gpus}", style=STYLES[gpu_style])
    t.append("   XIDs/1h ", style="bold")
    t.append(str(totals.xids_1h), style=STYLES["warn" if totals.xids_1h else "dim"])
    if streaming is not None and streaming[1] and not streaming[0] and streaming[1] >= totals.nodes:
        # the one place that says the fleet runs no daemon (its nodes' rows stay OK)
        t.append(f"   no daemons: every node polled every {format(interval, 'g')}s", style=STYLES["warn"])
    elif streaming is not None:
        t.append(f"   streaming {streaming[0]}", style=STYLES["dim"])
        if streaming[1]:
            t.append(f", no daemon (polled every {format(interval, 'g')}s) {streaming[1]}", style=STYLES["dim"])
    else:
        t.append(f"   {'every ' + format(interval, 'g') + 's' if live else 'static'}", style=STYLES["dim"])
    if where:
        t.append(f"   {where}", style=STYLES["dim"])
    return t


class SummaryBar(Static):
    def show(self, state: data.FleetState, app: Any) -> None:
        self.update(
            summary_text(
                state.totals(),
                where=getattr(app, "where", ""),
                interval=getattr(app, "interval", 0.0),
                readonly=getattr(app, "readonly", False),
                live=getattr(app, "source", None) is not None,
                streaming=getattr(getattr(app, "source", None), "stream_counts", lambda: None)(),
                note=getattr(app, "action_note", ""),
            )
        )
