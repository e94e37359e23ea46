"""Actions shown disabled before any confirmation, and read-only mode: the part of ``FleetApp``
that says why an action on the selected node (and GPU) would be refused, known now (read-only
mode, a lost GPU's reset, a node that is no Slurm node here, another owner's drain), and keeps
what is known of each node's Slurm side, asked in a worker once the selection rests. The
screens ask it (``disabled_reason``) and are told when it changes (``update_gates``);
``screens/gates.py`` draws it.

A mixin of ``FleetApp`` (``tui/app.py``), which sets the state it reads in its ``__init__``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work

from fleetops.tui import data

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[None]
else:
    _AppBase = object

DANGEROUS_ACTIONS = frozenset({"reaudit", "reset", "drain", "resume", "drain_set"})
# how long what is known of a node's Slurm side holds before it is asked again: whether it is
# a Slurm node here (no network) and whether a resume from here would be refused (scontrol)
SLURM_STATE_S = 5.0
RESUME_STATE_S = 30.0
RESUME_ASK_AFTER_S = 0.3  # the selection rests this long before its node's drain is asked


class ActionGates(_AppBase):
    """Read-only mode and the actions shown disabled, as part of ``FleetApp``."""

    # FleetApp's state (set in its __init__) and methods, which this part reads
    source: Any
    state: data.FleetState
    readonly: bool
    resume_refusals: dict[str, tuple[float, str | None]]
    _slurm_refusals: dict[tuple[str, str], tuple[float, str | None]]
    _slurm_asks: dict[str, int]
    _resume_timer: Any
    _resume_timer_node: str | None

    if TYPE_CHECKING:

        @property
        def exiting(self) -> bool: ...

        def from_worker(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...

    def allowed(self, action: str) -> bool:
        return not (self.readonly and action in DANGEROUS_ACTIONS)

    def refuse_readonly(self, what: str) -> bool:
        if self.readonly:
            self.notify(f"read-only mode: {what} is disabled", severity="warning")
            return True
        return False

    # --- actions shown disabled, with the reason, before any confirmation ----------------

    def disabled_reason(self, action: str, node: str | None, gpu: str | None = None) -> str | None:
        """Why ``action`` on the selected node (and GPU) would be refused, known now: read-only
        mode, a lost GPU's reset (``refusals.reset_refusal``), a drain or resume of a node that
        is no Slurm node here (the source's ``slurm_refusal``), a resume of a drain that is not
        this operator's (the source's answer, kept per node). None: enabled."""
        if self.readonly and action in DANGEROUS_ACTIONS:
            return "read-only mode (fleetops tui --readonly): actions are off"
        if node is None:
            return None
        if action == "reset" and gpu:
            from fleetops.tui.refusals import reset_refusal

            entry = self.state.entries.get(node)
            return reset_refusal(entry, gpu) if entry is not None and entry.gpu(gpu) is not None else None
        if action in ("drain", "resume") and self.source is not None:
            slurm = self._slurm_state(node, "drain or resume")  # one reason for both keys
            if slurm:
                return slurm
            if action == "resume":
                known = self.resume_refusals.get(node)
                return known[1] if known is not None else None
        return None

    def _slurm_state(self, node: str, verb: str) -> str | None:
        """``source.slurm_refusal`` (no network), kept a few seconds: the footer asks often."""
        cache = self._slurm_refusals
        now = time.monotonic()
        known = cache.get((node, verb))
        if known is None or now - known[0] > SLURM_STATE_S:
            ask = getattr(self.source, "slurm_refusal", None)
            known = (now, ask(node, verb) if ask is not None else None)
            cache[(node, verb)] = known
        return known[1]

    def want_resume_state(self, node: str | None) -> None:
        """The selection moved to ``node``: ask (in a worker) whether a resume would be refused,
        unless known within ``SLURM_STATE_S`` or not askable (no Slurm node, read-only)."""
        if node is None or self.readonly or self.source is None or not hasattr(self.source, "resume_refusal"):
            return
        known = self.resume_refusals.get(node)
        if known is not None and time.monotonic() - known[0] <= RESUME_STATE_S:
            return
        if self._slurm_state(node, "drain or resume"):
            return
        # asked once the selection rests: a cursor run down the table asks for its last row only
        if self._resume_timer is not None:
            if self._resume_timer_node == node:
                return  # already to be asked (a refresh of the same selection)
            self._resume_timer.stop()
        self._resume_timer_node = node
        self._resume_timer = self.set_timer(RESUME_ASK_AFTER_S, lambda: self._ask_resume_now(node))

    def _ask_resume_now(self, node: str) -> None:
        self._resume_timer = self._resume_timer_node = None
        known = self.resume_refusals.get(node)
        if self.exiting or (known is not None and time.monotonic() - known[0] <= RESUME_STATE_S):
            return
        self.resume_refusals[node] = (time.monotonic(), None)  # asked: not again while the answer comes
        self._ask_resume_state(node, self._slurm_asks.get(node, 0))

    @work(thread=True, group="slurm-state", exit_on_error=False)
    def _ask_resume_state(self, node: str, ask: int) -> None:
        try:
            refusal = self.source.resume_refusal(node)
        except Exception:  # noqa: BLE001 - unknown: shown enabled; the resume itself decides again
            refusal = None
        self.from_worker(self._resume_state_known, node, refusal, ask)

    def _resume_state_known(self, node: str, refusal: str | None, ask: int) -> None:
        if ask != self._slurm_asks.get(node, 0):
            return  # asked before an action on the node since: its answer is older than the action
        self.resume_refusals[node] = (time.monotonic(), refusal)
        self.update_gates()

    def forget_slurm_state(self, node: str) -> None:
        """After a drain or resume of ``node``: what was known of its drain is asked again."""
        self.resume_refusals.pop(node, None)
        self._slurm_asks[node] = self._slurm_asks.get(node, 0) + 1
        self.update_gates()
        if not self.exiting:
            want = getattr(self.screen, "selected_node", None)
            if want is not None and want() == node:
                self.want_resume_state(node)

    def update_gates(self) -> None:
        """The screen's disabled actions and their reason line, again."""
        if self.exiting:
            return
        update = getattr(self.screen, "update_gates", None)
        if update is not None:
            update()
