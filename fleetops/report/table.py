"""The terminal report: one summary line per node, then findings grouped by severity.

Written for a person at a terminal during maintenance or an incident: worst first, every
finding with the action it calls for. Piped (to ``less -S``, ``grep``, a file), the same report
keeps each row and each finding on one line, however wide: a node wrapped over eight lines at
80 columns cannot be grepped for, and ``less`` and the reader's terminal can wrap if they like.
"""

from __future__ import annotations

import time
from typing import Any

from fleetops import model
from fleetops.report import values

STYLE = {"ok": "green", "info": "cyan", "unknown": "magenta", "warn": "yellow", "crit": "bold red"}
HEAD = {"crit": "CRITICAL", "warn": "WARNING", "unknown": "UNKNOWN (could not tell)", "info": "INFO"}


def render(result: Any, exit_code: int, console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    piped = not console.is_terminal

    sev = result.node_severity()
    by_node: dict[str, list[model.Finding]] = {}
    for f in result.findings:
        by_node.setdefault(f.node, []).append(f)
    title = "fleetops audit"
    table = Table(title=None if piped else title, title_justify="left", expand=False, pad_edge=False)
    for col in ("node", "health", "GPUs", "driver", "CUDA", "source", "worst finding"):
        table.add_column(col, no_wrap=col != "worst finding", overflow="fold")
    for node in result.nodes:
        s = sev[node.name]
        snap = node.snapshot
        worst_f = next(
            (f for f in sorted(by_node.get(node.name, []), key=lambda f: -model.SEVERITY_RANK[f.severity])), None
        )
        worst_text = f"{worst_f.check}: {worst_f.message}" if worst_f and worst_f.severity != "ok" else ""
        if snap is None:
            gpus, driver, cuda = "-", "-", "-"
        else:
            ok, total = model.gpu_tally(snap, by_node.get(node.name, []))
            gpus = f"{ok}/{total}"
            driver, cuda = snap.driver_version or "?", snap.cuda_driver_version or "?"
        table.add_row(node.name, Text(s.upper(), style=STYLE[s]), gpus, driver, cuda, source_text(node), worst_text)
    if piped:
        console.print(Text(title, style="table.title"), soft_wrap=True)
        _print_unwrapped(console, table)
    else:
        console.print(table)
    at = {node.name: node.snapshot.collected_at for node in result.nodes if node.snapshot is not None}
    for level in ("crit", "warn", "unknown", "info"):
        group = [f for f in result.findings if f.severity == level]
        if not group:
            continue
        console.print(Text(f"\n{HEAD[level]} ({len(group)})", style=STYLE[level]), soft_wrap=piped)
        for f in group:
            where = f.node
            if f.gpu:
                where += f" GPU{f.gpu['index']} {f.gpu['uuid']} ({f.gpu['bus_id']})"
            line = Text("  ")
            line.append(f"{where}", style="bold")
            line.append(f"  [{f.check}] {f.message}")
            jobs = values.jobs_text(f)
            if jobs:
                line.append(f"  ({jobs})", style="bold")
            console.print(line, soft_wrap=piped)
            shown = values.values_text(f, at.get(f.node) or getattr(result, "started_at", None))
            if shown is not None:
                console.print(f"      {shown}", style="dim", markup=False, soft_wrap=piped)
            if f.action:
                console.print(Text(f"      -> {f.action}", style="italic"), soft_wrap=piped)
    s = result.summary()
    n = s["nodes_by_severity"]
    console.print(
        f"\n{s['nodes']} nodes ({n['ok'] + n['info']} ok, {n['warn']} warn, {n['crit']} crit, "
        f"{n['unknown']} unknown; {s['unreachable']} unreachable), {s['gpus']} GPUs "
        f"({s['gpus_with_faults']} with faults; {s['from_daemon']} from daemons, {s['from_collect']} cold collects) "
        f"in {s['duration_s']:.1f} s "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s['started_at']))}; exit {exit_code}",
        markup=False,
        highlight=False,
        soft_wrap=piped,
    )


def _print_unwrapped(console: Any, table: Any) -> None:
    """``table`` at its natural width, whatever the console's: each row on one line."""
    from rich.measure import Measurement
    from rich.segment import Segment, Segments

    width = Measurement.get(console, console.options.update_width(_UNBOUNDED), table).maximum
    segments: list[Any] = []
    for line in console.render_lines(table, console.options.update_width(width), pad=False):
        segments += [*line, Segment.line()]
    console.print(Segments(segments), soft_wrap=True, end="")


_UNBOUNDED = 1_000_000


def source_text(node: Any) -> str:
    """Which answer the node gave: its daemon's snapshot with its age, or a collect made now
    (where the rate checks took their earlier counters is in the JSON and JUnit reports)."""
    if node.source is None:
        return "-"
    if node.source == "daemon":
        return f"daemon {node.age_s:.1f}s" if node.age_s is not None else "daemon (age ?)"
    return "collect"
