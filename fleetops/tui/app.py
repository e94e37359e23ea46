"""``fleetops tui``: the fleet during an incident, modelled on k9s.

The app owns the ``FleetState`` (data side, no Textual) and the source. A background thread
worker runs ``source.run``; every node that answers becomes a ``NodeEntry`` in that thread
(parse, checks and row building included) and is handed over through one coalescing message,
so the main thread only swaps entries and updates the cells that changed. Tests and the
benchmark feed entries straight in with ``feed``.

Actions (re-audit, GPU reset, drain/resume) run in thread workers too and report with
``notify``; in read-only mode they are unbound (``check_action``) and refused if called.

Data keeps arriving while the app exits (the source stops only at unmount, and a shutdown that
does not go through ``exit`` -- a signal, the end of ``run_test`` -- removes the screens while
the message loop still runs). So everything that reaches the screens checks ``exiting`` first
and does nothing once it is true; worker threads hand work to the UI through ``from_worker``,
which checks it on the UI thread, where it cannot change under the check.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

from textual import events, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import get_current_worker

from fleetops.ops import results as ops_results
from fleetops.tui import data

DANGEROUS_ACTIONS = frozenset({"reaudit", "reset", "drain", "resume", "drain_set"})
# how long what is known of a node's Slurm side holds before it is asked again: whether it is
# a Slurm node here (no network) and whether a resume from here would be refused (scontrol)
SLURM_STATE_S = 5.0
RESUME_STATE_S = 30.0
RESUME_ASK_AFTER_S = 0.3  # the selection rests this long before its node's drain is asked
GC_GEN0_THRESHOLD = 50_000


def snapshot_time(collected_at: float) -> str:
    """A snapshot's time as the toast and the header name it (the node's clock, local time)."""
    return time.strftime("%H:%M:%S", time.localtime(collected_at))


class EntriesReady(Message):
    """New node entries are waiting in the app's inbox (posted at most once until handled)."""


class FleetApp(App[None]):
    CSS_PATH = str(Path(__file__).with_name("fleet.tcss"))  # absolute: subclasses live elsewhere
    ENABLE_COMMAND_PALETTE = False  # every action has its key; see the help screen
    TITLE = "fleetops"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("l", "action_log", "Action log", show=False),
    ]

    def __init__(
        self,
        source: Any = None,
        *,
        names: Iterable[str] | None = None,
        readonly: bool = False,
        interval: float = 2.0,
        where: str = "",
        store: Any = None,
        clock: Callable[[], float] = time.time,
        highlight_s: float = 1.5,
        tick_s: float = 1.0,
        feed_every_s: float = 0.1,
        inventory: str | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.inventory = inventory  # the inventory path the TUI was started with (copied commands name it)
        self.readonly = readonly
        self.interval = interval
        self.where = where
        self.store = store
        self.highlight_s = highlight_s
        self.tick_s = tick_s
        # a streaming source says when its data is stale (its daemons' data ages by design)
        stale_after = getattr(source, "stale_after_s", None) or max(3 * interval, 10.0)
        self.state = data.FleetState(clock=clock, stale_after=stale_after)
        self.state.set_hosts(names if names is not None else (source.names if source is not None else []))
        self._inbox: list[data.NodeEntry] = []
        self._inbox_lock = threading.Lock()
        self._posted = False
        self._last_feed = 0.0  # time.monotonic() of the last refresh from the inbox
        self.feed_every_s = feed_every_s
        self._stop = threading.Event()
        self.last_action: Any = None  # the latest action's result, with ok and message (tests read it)
        # what the header says of the latest action's verdict: which snapshot it comes from
        self.action_note = ""
        from fleetops.tui.actionlog import ActionLog

        # every action from this screen and its outcome, in the history store the drains go to
        db = getattr(source, "drain_db", None)
        self.action_log = ActionLog(db if isinstance(db, str) else getattr(store, "path", None))
        # what is known of each node's Slurm side, for actions shown disabled (disabled_reason):
        # (when asked, why a resume from here is refused, or None); (when, slurm_refusal) per verb
        self.resume_refusals: dict[str, tuple[float, str | None]] = {}
        self._slurm_refusals: dict[tuple[str, str], tuple[float, str | None]] = {}
        self._slurm_asks: dict[str, int] = {}  # per node, bumped by each action: older answers are dropped
        self._resume_timer: Any = None  # the pending ask of the selected node's drain, and its node
        self._resume_timer_node: str | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def on_mount(self) -> None:
        from fleetops.tui.screens.fleet import FleetScreen

        # Rendering allocates many short-lived objects; with the default gen0 threshold (700)
        # that means a young collection every few hundred cells and frequent full ones over
        # a heap that holds a thousand node snapshots. A larger first threshold makes young
        # collections rarer (each still small) and full ones far rarer.
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(max(self._gc_threshold[0], GC_GEN0_THRESHOLD), *self._gc_threshold[1:])
        self.push_screen(FleetScreen())
        self.action_log.load()  # what earlier sessions did
        if self.tick_s:
            self.set_interval(self.tick_s, self.tick)
        if self.source is not None:
            self.poll()

    def on_unmount(self) -> None:
        gc.set_threshold(*self._gc_threshold)
        self.stop_polling()

    @property
    def exiting(self) -> bool:
        """True from the moment the app starts to exit (``exit`` called, or a shutdown without
        it) until it is gone: the screens may be removed, nothing may touch them."""
        return not self.is_running or self.return_code is not None or not self.screen_stack

    async def on_event(self, event: events.Event) -> None:
        # an open ``/`` or ``:`` prompt takes its keys here, in the order they came, not after a
        # focus change and a forward to another widget's queue (screens/fleet.py, prompt_key)
        if isinstance(event, events.Key) and not event.is_forwarded and self.screen_stack:
            take = getattr(self.screen, "prompt_key", None)
            if take is not None and take(event):
                return
        await super().on_event(event)

    def from_worker(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """From a worker thread: run ``callback`` on the UI thread and wait for it, unless the
        app is exiting by then (checked there). Its exceptions reach the caller."""

        def unless_exiting() -> None:
            if not self.exiting:
                callback(*args, **kwargs)

        if self.exiting:
            return
        try:
            self.call_from_thread(unless_exiting)
        except RuntimeError:
            if not self.exiting:  # the loop ended between the check and the call; else a real error
                raise

    def stop_polling(self) -> None:
        self._stop.set()
        if self.source is not None:
            self.source.close()

    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def poll(self) -> None:
        worker = get_current_worker()
        self.source.run(lambda: self._stop.is_set() or worker.is_cancelled, self.deliver)

    # --- data in -----------------------------------------------------------------------

    def deliver(self, entry: data.NodeEntry) -> None:
        """From any thread: queue an entry; one message carries everything queued so far."""
        with self._inbox_lock:
            self._inbox.append(entry)
            if self._posted:
                return
            self._posted = True
        self.post_message(EntriesReady())

    def on_entries_ready(self, _: EntriesReady) -> None:
        # At most one refresh per ``feed_every_s``: a thousand streaming nodes deliver a hundred
        # entries a second, and each refresh lays out the whole table. Entries that come
        # sooner wait in the inbox (one timer, still "posted") and go in together.
        wait = self._last_feed + self.feed_every_s - time.monotonic()
        if wait > 0 and not self.exiting:  # exiting: no timer to wait on, the data still goes in
            self.set_timer(wait, self._take_inbox)
            return
        self._take_inbox()

    def _take_inbox(self) -> None:
        with self._inbox_lock:
            entries, self._inbox = self._inbox, []
            self._posted = False
        self._last_feed = time.monotonic()
        self.feed(entries)

    def feed(self, entries: Iterable[data.NodeEntry]) -> None:
        """Swap in new entries and update what is on screen (main thread)."""
        changed = self.state.update(entries)
        if changed:
            self.refresh_screens(changed)

    def refresh_screens(self, changed: list[str] | None = None) -> None:
        if self.exiting:  # the screens may be gone already
            return
        screen = self.screen
        refresh = getattr(screen, "refresh_data", None)
        if refresh is not None:
            try:
                refresh(changed)
            except NoMatches:  # its widgets are being removed: quitting while data arrives
                return
        for other in self.screen_stack:
            if other is not screen and hasattr(other, "refresh_data"):
                other.stale = True  # type: ignore[attr-defined]

    def tick(self) -> None:
        """Ages move on without new data."""
        self.refresh_screens(None)

    # --- actions -----------------------------------------------------------------------

    def allowed(self, action: str) -> bool:
        return not (self.readonly and action in DANGEROUS_ACTIONS)

    def refuse_readonly(self, what: str) -> bool:
        if self.readonly:
            self.notify(f"read-only mode: {what} is disabled", severity="warning")
            return True
        return False

    def request_reaudit(self, name: str) -> None:
        if self.refuse_readonly("re-audit"):
            return
        if self.source is None:
            self.notify(f"{name}: no live source to re-audit from", severity="warning")
            return
        self.notify(f"re-auditing {name} ...", timeout=2)
        self._reaudit(name)

    @work(thread=True, group="actions", exit_on_error=False)
    def _reaudit(self, name: str, after: str = "re-audited") -> None:
        entry = self.source.collect(name, after_action=True)  # the node now, not the daemon's last sample
        self.deliver(entry)
        self.from_worker(self._report_entry, entry, after)

    def _report_entry(self, entry: data.NodeEntry, what: str, logged: Any = None) -> None:
        """Toast the verdict of ``entry`` (collected after the action), naming its snapshot's
        time; the header keeps the same words until the next action."""
        shown = self.state.entries.get(entry.name)
        if (
            entry.status == data.STATUS_OK and shown is not None and shown.status == data.STATUS_OK
            and shown.snapshot is not None and entry.snapshot is not None
            and shown.snapshot.collected_at > entry.snapshot.collected_at
        ):
            entry = shown  # a newer snapshot reached the screen first: the toast says what it shows
        if entry.status != data.STATUS_OK:
            why = entry.problem.message if entry.problem else entry.status
            self.action_note = f"{entry.name} {what}: {entry.mark}, no snapshot after it"
            self._log_verdict(entry.name, what, "unknown", f"{self.action_note} ({why})", logged)
            self.notify(f"{entry.name} {what}: {entry.mark} ({why})", severity="error", timeout=8)
            self.refresh_screens(None)
            return
        counts: dict[str, int] = {}
        for f in entry.findings:
            if f.severity in ("warn", "crit", "unknown"):
                counts[f.severity] = counts.get(f.severity, 0) + 1
        detail = ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items())) or "no faults"
        sev: SeverityLevel = (
            "error" if entry.health == "crit" else "warning" if entry.health == "warn" else "information"
        )
        snap = entry.snapshot
        source = "daemon, sampled now" if snap is not None and isinstance(snap.daemon, dict) else "cold collect"
        taken = snapshot_time(snap.collected_at) if snap is not None else "?"
        self.action_note = f"{entry.name} {what}: {entry.health.upper()} from the snapshot of {taken}"
        self._log_verdict(entry.name, what, "verified", f"{self.action_note} ({detail})", logged)
        self.notify(
            f"{entry.name} {what}: {entry.health.upper()} ({detail}; {source}; snapshot {taken})", severity=sev, timeout=6
        )
        self.refresh_screens(None)

    def _log_verdict(self, name: str, what: str, outcome: str, why: str, logged: Any) -> None:
        """The action log: a sent action settles with the verdict after it; a re-audit is logged."""
        if logged is not None:
            self.action_log.settle(logged, outcome, why)
        elif what == "re-audited":
            self.action_log.add(name, "re-audit", outcome, why)

    def action_action_log(self) -> None:
        from fleetops.tui.screens.actions import ActionLogScreen

        self.push_screen(ActionLogScreen(self.action_log))

    def request_reset(self, name: str, uuid: str) -> None:
        """Ask first (the dialog names node, GPU and the processes a reset ends), then reset,
        passing exactly the PIDs the dialog showed: none shown, none ended."""
        if self.refuse_readonly("GPU reset"):
            return
        from fleetops.tui.screens.confirm import ConfirmScreen, reset_question

        entry = self.state.entries.get(name)
        if entry is None or entry.gpu(uuid) is None:
            self.notify(f"{name}: no GPU {uuid} to reset", severity="error")
            return
        from fleetops.tui.refusals import reset_refusal

        refusal = reset_refusal(entry, uuid)
        if refusal:  # disabled: said at once, no dialog
            self.notify(f"{name}: reset refused: {refusal}", severity="warning", timeout=8)
            self.action_log.add(name, "reset", "refused", refusal, gpu=uuid)
            return
        question = reset_question(entry, uuid, self.state.clock())
        bus_id = entry.gpu(uuid).bus_id  # type: ignore[union-attr]
        shown = question.pids or ()

        def answered(yes: bool | None) -> None:
            if yes:
                self.notify(f"resetting {uuid} on {name} ...", timeout=3)
                self._action(name, "reset", lambda: self.source.reset_gpu(name, uuid, bus_id, shown), gpu=uuid)
            else:
                self.notify(f"reset of {uuid} on {name} cancelled", timeout=3)

        self.push_screen(ConfirmScreen(question, confirm_label="Reset GPU"), answered)

    def _slurm_refused(self, name: str, verb: str) -> bool:
        if self.source is None:
            self.notify(f"{name}: no live source to {verb} through", severity="warning")
            return True
        refusal = self.source.slurm_refusal(name, verb)
        if refusal:
            self.notify(refusal, severity="warning", timeout=8)
            self.action_log.add(name, verb, "refused", refusal)
        return bool(refusal)

    def request_drain(self, name: str) -> None:
        if self.refuse_readonly("drain") or self._slurm_refused(name, "drain"):
            return
        lines = [
            f"Node:    {name}",
            "",
            "Slurm stops scheduling jobs on it; running jobs finish.",
            "A drain someone else set stays as it is (theirs, named).",
        ]

        def answered(purpose: str | None) -> None:
            if purpose:
                self._action(name, "drain", lambda: self.source.drain(name, purpose))
            else:
                self._drain_cancelled([name])

        self.push_screen(self._drain_screen(f"Drain {name}?", lines, self.drain_purpose([name])), answered)

    # --- the drain's reason prompt and the drain of a filtered set ------------------------

    def drain_purpose(self, names: list[str]) -> str:
        """The reason the prompt starts with: the check of the nodes' worst finding (the one most
        of them share), or a plain one where none has a finding."""
        checks: dict[str, int] = {}
        for name in names:
            entry = self.state.entries.get(name)
            worst = entry.worst if entry else None
            if worst is not None and worst.check:
                checks[worst.check] = checks.get(worst.check, 0) + 1
        return max(checks, key=lambda c: (checks[c], c)) if checks else "drained from the TUI"

    def drain_purpose_refusal(self, purpose: str) -> str | None:
        """Why the prompt's reason cannot be sent (empty, too long for Slurm's Reason)."""
        from fleetops.ops import slurm

        run = getattr(self.source, "operator_run", None)
        if not isinstance(run, str):  # no source that names its run: the rule's limit with a short one
            run = "operator"
        return slurm.purpose_refusal("operator", run, purpose)

    def _drain_screen(self, title: str, lines: list[str], purpose: str, waiting: str | None = None) -> Any:
        from fleetops.tui.screens.drain import DrainScreen

        return DrainScreen(title, lines, purpose, self.drain_purpose_refusal, self._drain_reason, waiting=waiting)

    def _drain_cancelled(self, names: list[str]) -> None:
        from fleetops.ops import action_log

        self.notify("drain cancelled: nothing sent", timeout=3)
        for name in names:
            self.action_log.add(name, "drain", action_log.CANCELLED, "cancelled at the reason prompt: nothing sent")

    def request_drain_set(self, names: list[str], filter_text: str) -> None:
        """Drain the nodes the filter shows, through the capacity guard: one dialog with the
        count, the reason prompt and the guard's answer (asked before anything is sent); the
        allowed nodes are then drained once each, the others are not sent, and every node's
        outcome goes to the action log. Without a filter nothing is offered."""
        if self.refuse_readonly("drain"):
            return
        if not filter_text:
            self.notify("filter first (/): a drain of every node the screen shows is not offered", severity="warning")
            return
        if not names:
            self.notify(f"the filter /{filter_text}/ shows no node: nothing to drain", severity="warning")
            return
        if self.source is None or not hasattr(self.source, "drain_plan"):
            self.notify("no live source to drain through", severity="warning")
            return
        from fleetops.tui.screens.drain import plan_placeholder

        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        lines = [
            f"Filter /{filter_text}/: {len(names)} node{'s' if len(names) != 1 else ''} ({shown})",
            "Each allowed node is drained once, in turn; refused nodes are not sent.",
            "Slurm stops scheduling jobs on them; running jobs finish. A drain someone else set stays as it is.",
        ]
        purpose = self.drain_purpose(names)
        screen = self._drain_screen(
            f"Drain {len(names)} node{'s' if len(names) != 1 else ''}?", lines, purpose, plan_placeholder(len(names))
        )

        def answered(chosen: str | None) -> None:
            plan = screen.plan
            if chosen and plan is not None:
                self._drain_set(plan, chosen)
            else:
                self._drain_cancelled(list(names))

        self.push_screen(screen, answered)
        self._plan_drain_set(screen, list(names), purpose)

    @work(thread=True, group="actions", exit_on_error=False)
    def _plan_drain_set(self, screen: Any, names: list[str], purpose: str) -> None:
        from fleetops.tui.screens.drain import Plan

        try:
            planned = self.source.drain_plan(names, purpose)
        except Exception as exc:  # noqa: BLE001 - said in the dialog, which then cannot confirm
            why = f"the capacity guard could not be asked: {type(exc).__name__}: {exc}"
            self.from_worker(lambda: screen.show_error(why) if screen.is_running else None)
            return

        def show() -> None:
            if screen.is_running:  # not dismissed while Slurm was asked
                screen.show_plan(Plan.of(planned))

        self.from_worker(show)

    @work(thread=True, group="actions", exit_on_error=False)
    def _drain_set(self, plan: Any, purpose: str) -> None:
        """The set's drain, as the dialog showed it: the refused are logged, the allowed are sent
        once each, in turn (each drain passes the guard again; nothing is retried)."""
        from fleetops.ops import action_log

        for node, why in (*plan.refused, *plan.not_slurm, *plan.already):
            self.action_log.add(node, "drain", ops_results.REFUSED, why)
        sent = 0
        for node in plan.allowed:
            if self.exiting:
                return
            try:
                result = self.source.drain(node, purpose)
            except Exception as exc:  # noqa: BLE001 - one node's failure is logged; the next is its own drain
                result = ops_results.ActionResult(node, "drain", ops_results.FAILED, f"{node}: drain failed: {exc}")
            self.action_log.add(node, "drain", action_log.outcome_of(result), action_log.why_of(result))
            sent += bool(result.ok)
            self.last_action = result
            self.from_worker(self.forget_slurm_state, node)
        refused = len(plan.refused) + len(plan.not_slurm) + len(plan.already)
        self.from_worker(
            self.notify,
            f"drained {sent} of {len(plan.allowed)} allowed node(s); {refused} not sent (action log: l)",
            severity="information" if sent == len(plan.allowed) else "warning",
            timeout=10,
        )

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

    def _drain_reason(self, purpose: str) -> str:
        """The Reason the drain writes, as Slurm will show it (the source's operator run)."""
        from fleetops.catalog import slurm as rule

        run = getattr(self.source, "operator_run", None)
        try:
            return rule.drain_reason("operator", run, purpose) if isinstance(run, str) else purpose
        except ValueError:
            return purpose

    def request_resume(self, name: str) -> None:
        if self.refuse_readonly("resume") or self._slurm_refused(name, "resume"):
            return
        if hasattr(self.source, "resume_refusal"):  # another owner's drain: refused before the dialog
            self._resume_precheck(name)
            return
        self._ask_resume(name, None)

    @work(thread=True, group="actions", exit_on_error=False)
    def _resume_precheck(self, name: str) -> None:
        try:
            refusal = self.source.resume_refusal(name)
        except Exception:  # noqa: BLE001 - the check is advisory: the resume itself decides again
            refusal = None
        self.from_worker(self._ask_resume, name, refusal)

    def _ask_resume(self, name: str, refusal: str | None) -> None:
        self.resume_refusals[name] = (time.monotonic(), refusal)
        self.update_gates()
        if refusal:
            self.notify(refusal, severity="warning", timeout=10)
            self.action_log.add(name, "resume", "refused", refusal)
            return
        from fleetops.tui.screens.confirm import ConfirmScreen, Question

        question = Question(
            title=f"Resume {name}?",
            lines=[
                f"Node:    {name}",
                "",
                "Slurm may schedule jobs on it again.",
                "Only an operator's drain is lifted; another owner's is refused and named",
                "(fleetops resume --force lifts it, after reading why it was drained).",
            ],
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self._action(name, "resume", lambda: self.source.resume(name))

        self.push_screen(ConfirmScreen(question, confirm_label="Resume"), answered)

    @work(thread=True, group="actions", exit_on_error=False)
    def _action(self, name: str, what: str, call: Callable[[], Any], gpu: str | None = None) -> None:
        if self.source is None:
            self.from_worker(self.notify, f"{name}: no live source for {what}", severity="warning")
            return
        try:
            result = call()
        except Exception as exc:  # a failed action is reported, never kills the screen  # noqa: BLE001
            result = ops_results.ActionResult(
                name, what, ops_results.FAILED, f"{name}: {what} failed: {type(exc).__name__}: {exc}"
            )
        self.from_worker(
            self.notify, result.message, severity="information" if result.ok else "error", timeout=10
        )
        from fleetops.ops import action_log

        logged: Any = self.action_log.add(name, what, action_log.outcome_of(result), action_log.why_of(result), gpu)
        self.last_action = result
        if what in ("drain", "resume"):
            self.from_worker(self.forget_slurm_state, name)
            reading = None
            if result.ok and logged is not None and hasattr(self.source, "slurm_node"):
                # a drain's outcome is Slurm's State read after it, not the node's GPUs (a node
                # with no agent, or one whose GPUs are sick, was drained all the same)
                reading = self._settle_slurm(name, what, logged)
                logged = None
            self.from_worker(self.slurm_changed, name, reading)
        if result.ok and not self.exiting:
            # what the action left behind, from a snapshot taken after it (the daemon samples on
            # request, else a cold collect), now rather than at the next round
            entry = self.source.collect(name, after_action=True)
            self.deliver(entry)
            self.from_worker(self._report_entry, entry, f"after {what}", logged)

    def _settle_slurm(self, name: str, what: str, logged: Any) -> Any:
        """Settle a sent drain or resume with the node as Slurm shows it right after (worker
        thread): verified when the drain is there (or gone, after a resume), failed when not,
        unknown when Slurm could not be read. Returns the reading (None: not read), which the
        node screens show rather than asking Slurm again."""
        try:
            reading = self.source.slurm_node(name)
        except Exception as exc:  # noqa: BLE001 - the log says it, the action stays sent
            reading, problem = None, f"{type(exc).__name__}: {exc}"
        else:
            problem = reading.problem
        if reading is None or problem or reading.state is None:
            self.action_log.settle(logged, "unknown", f"{name} after {what}: Slurm not read ({problem})")
            return None
        wanted = reading.drained if what == "drain" else not reading.drained
        shown = f"Slurm State {reading.state}" + (f", Reason {reading.reason}" if reading.reason else "")
        if wanted:
            self.action_log.settle(logged, "verified", f"{name} after {what}: {shown}")
        else:
            self.action_log.settle(logged, "failed", f"{name} after {what}: still {shown}")
        return reading

    def slurm_changed(self, name: str, reading: Any = None) -> None:
        """A drain or resume from this TUI is done: node screens of ``name`` show ``reading``
        (Slurm read after it), or read Slurm again where there is none."""
        for screen in self.screen_stack:
            if getattr(screen, "node", None) != name or not hasattr(screen, "load_slurm"):
                continue
            if reading is not None:
                screen.show_slurm(reading)  # type: ignore[attr-defined]  # NodeScreen's
            else:
                screen.load_slurm()

    def copy_command(self, command: str, what: str) -> None:
        """Put ``command`` on the clipboard (the terminal's, through Textual) and show it whole."""
        self.copy_to_clipboard(command)
        self.notify(command, title=f"copied: {what}", timeout=10)

    def action_help(self) -> None:
        from fleetops.tui.screens.help import HelpScreen

        self.push_screen(HelpScreen())
