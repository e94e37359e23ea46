"""Confirmation dialogs for dangerous actions. Focus starts on Cancel, so Enter, Esc or a
stray keypress never confirms; only moving to the action button (Tab, arrow) and pressing it
does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from fleetops.tui import data


@dataclass
class Question:
    title: str
    lines: list[str] = field(default_factory=list)
    warning: str | None = None
    # a reset's processes as the dialog shows them: exactly these may be ended (None: unknown)
    pids: tuple[int, ...] | None = None
    # the Slurm jobs the dialog names on the GPU: a reset under processes goes under exactly these
    # (None: no job records to name them)
    jobs: tuple[str, ...] | None = None


def reset_question(entry: data.NodeEntry, uuid: str, now: float, fleet_jobs: bool = False) -> Question:
    """What a GPU reset will do, named exactly: node, GPU (UUID, index, bus id), the jobs on it
    (where the node's snapshot has job records, or ``fleet_jobs``: some node's has, so their
    absence here is said) and every process the last snapshot saw on it. Those PIDs travel with
    the answer (``pids``): the reset ends exactly them and is refused if the GPU's processes
    differ by then."""
    gv = entry.gpu(uuid)
    assert gv is not None
    age = data.format_age(now - entry.seen_at) if entry.seen_at is not None else "never"
    lines = [
        f"Node:     {entry.name}",
        f"GPU:      {uuid}",
        f"          index {gv.index}, bus {gv.bus_id}"
        + ("  (LOST: NVML answers GpuIsLost; fallen off the bus)" if gv.lost else ""),
    ]
    jobs = entry.gpu_jobs(uuid)
    if jobs:
        lines.append(f"Jobs it would hit ({len(jobs)}):")
        lines += [f"  {data.jobs.job_line(j, now, gv.gpu)}" for j in jobs]
    elif jobs is not None:
        lines.append(f"Jobs:     none running on it (as of the snapshot {age} ago)")
    elif fleet_jobs:
        lines.append("Jobs:     unknown (the node's snapshot has no job records: no daemon, or an older agent)")
    procs = (gv.gpu.processes or []) if gv.gpu is not None and not gv.lost else None
    if procs is None:
        lines.append("Processes: unknown (no current data for this GPU)")
    elif not procs:
        lines.append(f"Processes: none (as of the snapshot {age} ago)")
    else:
        lines.append(f"Processes that will be KILLED (as of the snapshot {age} ago):")
        for p in procs:
            mem = f"{p.used_memory_mib} MiB" if p.used_memory_mib is not None else "? MiB"
            lines.append(f"  pid {p.pid:<8} {p.name or '?':<24} {mem}")
    pids = tuple(p.pid for p in procs) if procs is not None else None
    faults = [f for f in gv.findings if f.severity in data.FAULT_SEVERITIES]
    if faults:
        lines.append("Why:      " + data.fmt_finding(faults[0]))
    warning = None
    if entry.status != data.STATUS_OK:
        warning = f"{entry.name} is {entry.mark} right now: the reset will probably fail."
    return Question(title=f"Reset GPU {gv.index} on {entry.name}?", lines=lines, warning=warning, pids=pids,
                    jobs=None if jobs is None else tuple(j.job_id for j in jobs))


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("left", "app.focus_previous", show=False),
        Binding("right", "app.focus_next", show=False),
    ]

    def __init__(self, question: Question, confirm_label: str = "Confirm") -> None:
        super().__init__()
        self.question = question
        self.confirm_label = confirm_label

    def compose(self) -> ComposeResult:
        q = self.question
        with Vertical(id="dialog"):
            yield Static(Text(q.title, style="bold"), id="dialog-title")
            yield Static(Text("\n".join(q.lines)), id="dialog-body")
            if q.warning:
                yield Static(Text(q.warning, style="bold yellow"), id="dialog-warning")
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.confirm_label, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_cancel(self) -> None:
        self.dismiss(False)
