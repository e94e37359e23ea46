"""Actions that preconditions already refuse, shown disabled with the reason before any key is
pressed: the fleet screen and the node screen ask the app (``FleetApp.disabled_reason``) for the
selected row, answer ``None`` from ``check_action`` (Textual's Footer draws such a binding
dimmed, and its key does not run it), and say why in a line above the footer. The line and the
footer follow the selection (``update_gates`` on every move and data refresh; the footer is
redrawn only when the reasons change).

A disabled key that is pressed all the same says its reason at once through the action's own
path (a toast, and the action log for a refused precondition), never a dialog."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widgets import Static

# the actions gated here, with the key and label the reason line names them by
GATED = {
    "reaudit": "a Re-audit",
    "reset": "r Reset GPU",
    "drain": "d Drain",
    "resume": "u Resume",
    "drain_set": "^d Drain filtered",
}


class GatedScreen(Screen[None]):
    """A screen whose actions act on a selected node (and GPU)."""

    gate_note: Text | None = None

    def selection(self) -> tuple[str | None, str | None]:
        """(node, GPU UUID) the actions would act on."""
        return None, None

    def selected_node(self) -> str | None:
        return self.selection()[0]

    def gate_actions(self) -> list[str]:
        """The gated actions this screen binds, in footer order."""
        actions = [getattr(b, "action", "") for b in self.BINDINGS]
        return [a for a in dict.fromkeys(actions) if a in GATED]

    def disabled_reason(self, action: str) -> str | None:
        node, gpu = self.selection()
        return self.app.disabled_reason(action, node, gpu)  # type: ignore[attr-defined, no-any-return]

    def gate_text(self) -> Text:
        """One line per disabled action and its reason; read-only mode in one line."""
        reasons = [(a, self.disabled_reason(a)) for a in self.gate_actions()]
        reasons = [(a, why) for a, why in reasons if why]
        t = Text(no_wrap=False)
        if getattr(self.app, "readonly", False):
            keys = ", ".join(GATED[a].split(" ", 1)[0] for a in self.gate_actions())
            t.append(f"disabled: {keys}: ", style="bold")
            t.append(str(reasons[0][1]) if reasons else "read-only mode")
            return t
        merged: dict[str, list[str]] = {}  # one line per reason, naming every key it disables
        for action, why in reasons:
            merged.setdefault(str(why), []).append(GATED[action])
        for i, (why, labels) in enumerate(merged.items()):
            if i:
                t.append("\n")
            t.append(f"disabled: {', '.join(labels)}: ", style="bold")
            t.append(why)
        return t

    def update_gates(self) -> None:
        """Redraw the reason line, and the footer's bindings when the reasons changed."""
        if not getattr(self, "ready", False):
            return
        text = self.gate_text()
        if self.gate_note is not None and text.plain == self.gate_note.plain:
            return
        self.gate_note = text
        note = self.query_one("#disabled-note", Static)
        note.update(text)
        note.display = bool(text.plain)
        self.refresh_bindings()

    def selection_moved(self) -> None:
        """The selected row changed: reasons again, and ask for what is not known yet."""
        self.update_gates()
        self.app.want_resume_state(self.selected_node())  # type: ignore[attr-defined]

    def gate(self, action: str) -> bool | None:
        """``check_action``'s answer for a gated action: None (shown disabled) with a reason."""
        return None if action in GATED and self.disabled_reason(action) else True

    def press_disabled(self, event: events.Key) -> bool:
        """A key of a disabled gated action: its action runs and refuses with the reason at once
        (toast, action log). True: the key was taken."""
        active = self.app.active_bindings.get(event.key)
        if active is None or active.enabled or active.node is not self:
            return False
        action = active.binding.action
        if action not in GATED:
            return False
        event.stop()
        method = getattr(self, f"action_{action}", None)
        if method is not None:
            method()
        return True


def note_widget() -> Static:
    note = Static(id="disabled-note", classes="disabled-note")
    note.display = False
    return note
