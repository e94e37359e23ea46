"""``fleetops tui``: the fleet during an incident, modelled on k9s.

The app owns the ``FleetState`` (data side, no Textual) and the source. A background thread
worker runs ``source.run``; every node that answers becomes a ``NodeEntry`` in that thread
(parse, checks and row building included) and is handed over through one coalescing message,
so the main thread only swaps entries and updates the cells that changed. Tests and the
benchmark feed entries straight in with ``feed``.

Actions (re-audit, GPU reset, drain/resume) run in thread workers too and report with
``notify``; in read-only mode they are unbound (``check_action``) and refused if called. They
are parts of the app of their own: the handlers in ``tui/actions.py`` and what shows them
disabled, with the reason, in ``tui/gating.py`` (mixins of ``FleetApp``); here are the
lifecycle, the data coming in, the bindings and the screens the app opens itself.

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
from textual.worker import get_current_worker

from fleetops.tui import data
from fleetops.tui.actions import ActionHandlers

GC_GEN0_THRESHOLD = 50_000


class EntriesReady(Message):
    """New node entries are waiting in the app's inbox (posted at most once until handled)."""


class FleetApp(ActionHandlers, App[None]):
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

    # --- screens the app opens, the clipboard ---------------------------------------------

    def action_action_log(self) -> None:
        from fleetops.tui.screens.actions import ActionLogScreen

        self.push_screen(ActionLogScreen(self.action_log))

    def copy_command(self, command: str, what: str) -> None:
        """Put ``command`` on the clipboard (the terminal's, through Textual) and show it whole."""
        self.copy_to_clipboard(command)
        self.notify(command, title=f"copied: {what}", timeout=10)

    def action_help(self) -> None:
        from fleetops.tui.screens.help import HelpScreen

        self.push_screen(HelpScreen())
