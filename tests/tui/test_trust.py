"""What the screen claims is never older than it says: ages that move with the clock alone, data
past the stale threshold out of the "ok" count, a polled healthy node OK with one header note,
the verdict after an action naming its snapshot, a filter typed at full speed applied before the
next key, and the SSH-port probe that tells HUNG from UNREACH."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from textual import events
from textual.widgets import Static

from fleetops.tui import data, liveness, simfeed
from fleetops.tui.actions import snapshot_time
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.drain import DrainScreen
from fleetops.tui.screens.node import NodeScreen, fabric_text
from fleetops.tui.widgets.summary import summary_text

from .conftest import NAMES, FakeSource, drive, fed_entries, screen_lines, wait_for

ADDRESS = os.environ.get("FLEETOPS_TEST_PROBE_ADDRESS", "127.88.7.1")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node_cells(app: FleetApp, name: str) -> dict[str, str]:
    tbl = app.screen.table()  # type: ignore[attr-defined]
    row = tbl.row(name)
    assert row is not None, name
    return dict(zip((c.key for c in tbl.spec), row.cells, strict=False))


# --- ages and the stale threshold -------------------------------------------------------------


def test_age_moves_with_the_clock_alone_and_old_data_leaves_the_ok_count() -> None:
    clock = Clock(simfeed.T0 + 3)
    app = FleetApp(None, names=NAMES, clock=clock, tick_s=0)  # stale after max(3 x 2 s, 10 s)
    assert app.state.stale_after == 10.0

    async def body(pilot: Any) -> None:
        await pilot.pause()
        assert node_cells(app, "node001")["seen"] == "3s"
        ok_before = app.state.totals().ok
        clock.now = simfeed.T0 + 9  # no new data: only the clock moved
        app.tick()
        await pilot.pause()
        row = node_cells(app, "node001")
        assert (row["seen"], row["health"]) == ("9s", "OK")
        assert app.state.totals().ok == ok_before
        clock.now = simfeed.T0 + 10.5  # past the threshold: not current any more, at once
        app.tick()
        await pilot.pause()
        row = node_cells(app, "node001")
        assert (row["seen"], row["health"]) == ("10s", "STALE")
        totals = app.state.totals()
        assert ok_before == 8 and totals.ok == 0 and totals.stale == len(NAMES)
        assert "stale" in "".join(screen_lines(app)[:1])

    drive(app, body, fed_entries())


def test_an_older_snapshot_never_replaces_a_newer_one() -> None:
    state = data.FleetState(clock=lambda: simfeed.T0)
    new, old = fed_entries(now=simfeed.T0)[0], fed_entries(now=simfeed.T0 - 30)[0]
    assert new.snapshot is not None and old.snapshot is not None
    assert old.snapshot.collected_at < new.snapshot.collected_at
    state.update([new])
    assert state.update([old]) == [] and state.entries[new.name] is new
    failed = data.mark_failed(new.name, "timeout", _problem(new.name), new)
    assert state.update([failed]) == [new.name]  # a mark keeps the same snapshot: it goes in


def _problem(name: str) -> Any:
    from fleetops import model

    return model.Finding("transport.timeout", "crit", name, "timeout: no answer")


# --- a fleet with no daemon -----------------------------------------------------------------------


def test_header_says_once_that_the_fleet_has_no_daemons() -> None:
    totals = data.Totals(nodes=12, ok=12)
    text = summary_text(totals, where="", interval=2.0, readonly=False, live=True, streaming=(0, 12)).plain
    assert text.count("no daemons") == 1 and "polled every 2s" in text
    assert "ok 12" in text
    mixed = summary_text(totals, where="", interval=2.0, readonly=False, live=True, streaming=(9, 3)).plain
    assert "no daemons" not in mixed and "streaming 9" in mixed and "no daemon (polled every 2s) 3" in mixed


# --- the verdict after an action ------------------------------------------------------------------


def test_the_verdict_after_an_action_names_its_snapshot_and_an_older_poll_does_not_replace_it() -> None:
    source = FakeSource(NAMES)
    before = fed_entries({"node003": ["ecc-dbe@3"]}, now=simfeed.T0)
    after = fed_entries({}, now=simfeed.T0 + 60)
    source.entries = {e.name: e for e in after}
    app = FleetApp(source, names=NAMES, clock=lambda: simfeed.T0 + 61, tick_s=0)

    async def body(pilot: Any) -> None:
        await pilot.pause()
        assert app.state.entries["node003"].health == "crit"
        app.screen.table().select_key("node003")  # type: ignore[attr-defined]
        await pilot.press("d")
        assert isinstance(app.screen, DrainScreen)
        await pilot.press("enter")  # the reason prompt: Enter drains with the reason shown
        await wait_for(pilot, lambda: any("after drain" in str(n.message) for n in app._notifications), 30,
                       "the verdict after the drain")
        assert source.collects == [("node003", True)]  # a snapshot taken after the action
        (toast,) = [str(n.message) for n in app._notifications if "after drain" in str(n.message)]
        taken = snapshot_time(simfeed.T0 + 60)
        assert toast == f"node003 after drain: OK (no faults; cold collect; snapshot {taken})", toast
        assert app.action_note == f"node003 after drain: OK from the snapshot of {taken}"
        assert app.action_note in screen_lines(app)[0]
        # a poll begun before the action and answered after it: the screen keeps the newer data
        app.feed([before[2]])
        await pilot.pause()
        shown = app.state.entries["node003"]
        assert shown.health == "ok" and shown.snapshot is not None
        assert shown.snapshot.collected_at == simfeed.T0 + 60

    drive(app, body, before)


# --- keys typed at full speed ---------------------------------------------------------------------


FILTER = "dan|node007"  # letters that are bindings of the fleet screen: d drains, a re-audits


def test_a_filter_typed_at_full_speed_opens_the_filtered_node() -> None:
    source = FakeSource(NAMES)
    app = FleetApp(source, names=NAMES, clock=lambda: simfeed.T0 + 5, tick_s=0)

    async def body(pilot: Any) -> None:
        await pilot.press("slash", *FILTER, "enter", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen), 30, "the node screen")
        assert app.screen.node == "node007"  # type: ignore[attr-defined]
        assert app.state.filter.text == FILTER
        assert source.drains == [] and source.collects == []

    drive(app, body, fed_entries())


def test_keys_queued_before_the_prompt_opens_are_not_lost() -> None:
    """Every key in the app's queue at once, as a fast typist or a paste delivers them: before
    the fix the letters after ``/`` went to the table (lost, or ran its bindings) and the Enter
    opened node001, the row under the cursor."""
    source = FakeSource(NAMES)
    app = FleetApp(source, names=NAMES, clock=lambda: simfeed.T0 + 5, tick_s=0)

    async def body(pilot: Any) -> None:
        for key in ["slash", *FILTER, "backspace", "7", "enter", "enter"]:
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen), 30, "the node screen")
        assert app.screen.node == "node007"  # type: ignore[attr-defined]
        assert app.state.filter.text == FILTER
        assert source.drains == [] and source.collects == []

    drive(app, body, fed_entries())


# --- the probe ------------------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, int]]:
    sock = socket.socket()
    try:
        sock.bind((ADDRESS, 0))
    except OSError as exc:
        sock.close()
        pytest.skip(f"cannot bind {ADDRESS}: {exc}")
    sock.listen(8)
    try:
        yield sock, sock.getsockname()[1]
    finally:
        sock.close()


def test_probe_answers_when_a_banner_comes(listener: tuple[socket.socket, int]) -> None:
    sock, port = listener

    def serve() -> None:
        conn, _ = sock.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    verdict, why = liveness.probe(ADDRESS, port, 5.0)
    assert verdict == liveness.ANSWERS and "OpenSSH_9.6" in why


def test_probe_is_hung_when_tcp_is_taken_and_no_banner_comes(listener: tuple[socket.socket, int]) -> None:
    _, port = listener  # listening, never accepting: the kernel completes the handshake, as for a stopped sshd
    verdict, why = liveness.probe(ADDRESS, port, 0.5)
    assert verdict == liveness.HUNG and "no SSH banner" in why


def test_probe_is_unreachable_when_the_port_refuses() -> None:
    with socket.socket() as sock:
        try:
            sock.bind((ADDRESS, 0))
        except OSError as exc:
            pytest.skip(f"cannot bind {ADDRESS}: {exc}")
        port = sock.getsockname()[1]  # bound, not listening: refused
        verdict, _ = liveness.probe(ADDRESS, port, 2.0)
    assert verdict == liveness.UNREACHABLE


def test_probe_lead_leaves_room_for_the_probe_and_never_probes_a_stream_between_lines() -> None:
    assert liveness.probe_lead_s(liveness.STALE_AFTER_S) == liveness.PROBE_TIMEOUT_S
    assert liveness.probe_lead_s(4.0) == 2.0
    assert liveness.STALE_AFTER_S - liveness.probe_lead_s(liveness.STALE_AFTER_S) > 10.0  # the daemon's full interval


# --- a node screen whose panes mount late ---------------------------------------------------------


class LateNotesScreen(NodeScreen):
    """The node screen with the fabric notes mounted a moment after the screen's own Mount, as a
    loaded machine delivers them: the deepest pane's content is mounted by the pane, later."""

    def compose(self) -> Any:
        for widget in super().compose():
            if widget.id != "node-fabric-text":
                yield widget

    def on_mount(self) -> None:
        self.set_timer(0.3, lambda: self.query_one("#node-fabric-notes").mount(Static(id="node-fabric-text")))
        super().on_mount()


def test_node_screen_waits_for_its_panes_before_it_fills_them() -> None:
    """Before the fix the screen filled its panes in its Mount handler and died with NoMatches
    when the fabric notes were not mounted yet (seen once in CI under three workers)."""
    app = FleetApp(FakeSource(NAMES), names=NAMES, clock=lambda: simfeed.T0 + 5, tick_s=0)

    async def body(pilot: Any) -> None:
        screen = LateNotesScreen("node003")
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.ready, 30, "the node screen's panes")
        notes = screen.query_one("#node-fabric-text", Static)
        assert str(notes.render()) == str(fabric_text(app.state.entries["node003"]))
        assert screen.query_one("#node-gpus").border_title == " node003: GPUs "

    drive(app, body, fed_entries())
