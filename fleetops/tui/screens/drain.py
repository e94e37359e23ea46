"""The drain dialogs: the reason prompt of one node's drain (``d``) and the drain of the nodes a
filter shows (ctrl+d), with what the capacity guard says before anything is sent.

The reason typed here is the PURPOSE of Slurm's Reason, ``[fleetops] operator/RUN: PURPOSE``:
what the technician or the next shift reads in ``sinfo -R``. It starts as the node's worst
finding and can be edited; the Reason as Slurm will show it is drawn under the input as it is
typed. An empty reason, or one too long for the Reason (``ops.slurm.purpose_refusal``), is
refused here with the rule's words and nothing is sent. Focus starts in the input: Enter
confirms a valid reason (the operator has just typed why), Esc cancels.

The set's dialog opens at once and asks Slurm in the background (``FleetApp.plan_drain_set``);
until the guard's answer is shown, and when it allows no node, it cannot be confirmed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from fleetops.ops import results

LISTED = 12  # nodes named per group in the set's dialog; the rest are counted


@dataclass(frozen=True)
class Plan:
    """The capacity guard's answer for a set of nodes, grouped as the dialog shows it."""

    allowed: tuple[str, ...]  # would be drained, each once
    refused: tuple[tuple[str, str], ...]  # (node, why): Slurm or the guard said no
    not_slurm: tuple[tuple[str, str], ...]  # (node, why): no Slurm node here, not asked
    already: tuple[tuple[str, str], ...]  # (node, why): drained by this operator: nothing to send

    @classmethod
    def of(cls, planned: Sequence[results.ActionResult]) -> Plan:
        allowed: list[str] = []
        refused: list[tuple[str, str]] = []
        not_slurm: list[tuple[str, str]] = []
        already: list[tuple[str, str]] = []
        for r in planned:
            if r.outcome == results.DRY_RUN:
                allowed.append(r.node)
            elif r.outcome == results.DONE:
                already.append((r.node, r.message))
            elif r.detail.get("slurm") is False or r.detail.get("slurm_managed") is False:
                not_slurm.append((r.node, r.message))
            else:
                refused.append((r.node, r.message))
        return cls(tuple(allowed), tuple(refused), tuple(not_slurm), tuple(already))

    def lines(self) -> list[str]:
        def names(nodes: Sequence[str]) -> str:
            shown = ", ".join(nodes[:LISTED])
            return shown + (f" and {len(nodes) - LISTED} more" if len(nodes) > LISTED else "")

        out = [f"Will drain ({len(self.allowed)}): {names(self.allowed) if self.allowed else 'none'}"]
        for title, group in (
            ("Refused, not sent", self.refused),
            ("Not Slurm nodes, not sent", self.not_slurm),
            ("Already drained by you, nothing to send", self.already),
        ):
            if not group:
                continue
            out.append(f"{title} ({len(group)}):")
            for node, why in group[:LISTED]:
                out.append(f"  {why if why.startswith(node) else f'{node}: {why}'}")
            if len(group) > LISTED:
                out.append(f"  and {len(group) - LISTED} more")
        return out


class DrainScreen(ModalScreen[str | None]):
    """Asks for the drain's reason; dismissed with the purpose typed (confirmed) or None (Esc,
    Cancel). ``check(purpose)`` says why a purpose cannot be sent; ``preview(purpose)`` is the
    Reason Slurm will show. ``waiting``: the body is a placeholder until ``show_plan``."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        title: str,
        lines: list[str],
        purpose: str,
        check: Callable[[str], str | None],
        preview: Callable[[str], str],
        *,
        confirm_label: str = "Drain",
        waiting: str | None = None,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.lines = lines
        self.purpose = purpose
        self.check = check
        self.preview = preview
        self.confirm_label = confirm_label
        self.waiting = waiting  # why it cannot be confirmed yet (the guard not answered)
        self.for_set = waiting is not None  # a set: the guard's answer is shown
        self.plan: Plan | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.title_text, style="bold"), id="dialog-title")
            yield Static(Text("\n".join(self.lines)), id="dialog-body")
            with VerticalScroll(id="drain-plan-box"):  # a long answer scrolls; the prompt stays in view
                yield Static(Text(self.waiting or "", style="dim"), id="drain-plan")
            yield Static(Text("Reason (what sinfo -R shows the next person; Enter drains, Esc cancels):"), id="drain-label")
            yield Input(value=self.purpose, id="drain-reason")
            yield Static(id="drain-preview")
            yield Static(id="drain-error")
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button(self.confirm_label, id="confirm", variant="error")

    def on_mount(self) -> None:
        self.query_one("#drain-plan-box", VerticalScroll).display = self.for_set
        if self.plan is not None:  # answered before the dialog was drawn
            self._draw_plan(self.plan)
        self._show_preview(self.purpose)
        self.query_one("#drain-reason", Input).focus()

    def _show_preview(self, purpose: str) -> None:
        shown = self.preview(" ".join(purpose.split())) if purpose.strip() else "(none yet: type why)"
        self.query_one("#drain-preview", Static).update(Text(f"Slurm's Reason: {shown}", style="dim"))

    def on_input_changed(self, event: Input.Changed) -> None:
        self._show_preview(event.value)
        self.query_one("#drain-error", Static).update("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "confirm":
            self.confirm()
        else:
            self.action_cancel()

    def show_plan(self, plan: Plan) -> None:
        """The capacity guard's answer, in place of the placeholder."""
        self.plan = plan
        self.waiting = None if plan.allowed else "no node of this set may be drained (see above): nothing to send"
        if self.is_mounted:
            self._draw_plan(plan)

    def _draw_plan(self, plan: Plan) -> None:
        self.query_one("#drain-plan", Static).update(Text("\n".join(plan.lines())))

    def show_error(self, text: str) -> None:
        self.query_one("#drain-error", Static).update(Text(text, style="bold yellow"))

    def confirm(self) -> None:
        purpose = " ".join(self.query_one("#drain-reason", Input).value.split())
        problem = self.check(purpose) or self.waiting
        if problem:
            self.show_error(f"not sent: {problem}")
            self.app.bell()
            return
        self.dismiss(purpose)

    def action_cancel(self) -> None:
        self.dismiss(None)


def plan_placeholder(count: int) -> str:
    return f"Asking Slurm what the capacity guard allows for these {count} nodes ..."
