"""Quitting while entries keep arriving: the app exits cleanly however the exit and the
deliveries interleave (no ``ScreenStackError`` from a refresh after the screens are gone)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from fleetops.tui import data
from fleetops.tui.app import EntriesReady, FleetApp

from .conftest import NAMES, SIZE, FakeSource, fed_entries, wait_for

ENTRIES = fed_entries()
OTHER = fed_entries({"node002": ["ecc-dbe@1"]})  # other objects: every delivery is a change
NOW = ENTRIES[0].snapshot.collected_at + 5  # type: ignore[union-attr]


class FloodSource(FakeSource):
    """Delivers changed entries without pause from the poll thread, and keeps delivering after
    it is asked to stop (as a collect in flight does) until ``close``."""

    def __init__(self) -> None:
        super().__init__(NAMES)
        self.delivered = 0
        self.closed = threading.Event()
        self.entries = {e.name: e for e in OTHER}

    def run(self, should_stop: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        i = 0
        while not self.closed.is_set():
            deliver((ENTRIES, OTHER)[i // len(NAMES) % 2][i % len(NAMES)])
            self.delivered += 1
            i += 1

    def close(self) -> None:
        self.closed.set()


# "shutdown": the app is torn down without exit() (a signal, the end of run_test): the screens
# go while the message loop still handles the entries queued before it closes
EXPECTED_RETURN_CODE = {"key": 0, "exit": 3, "reaudit-and-key": 0, "shutdown": None}


@pytest.mark.parametrize("round_", range(6))
@pytest.mark.parametrize("how", list(EXPECTED_RETURN_CODE))
def test_quitting_while_entries_arrive_exits_cleanly(how: str, round_: int) -> None:
    source = FloodSource()
    app = FleetApp(source, names=NAMES, clock=lambda: NOW, tick_s=0.001)

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: source.delivered > 200, what="entries flowing")
            await wait_for(pilot, lambda: app.state.entries.get("node002") is not None, what="entries shown")
            if how == "reaudit-and-key":
                for name in NAMES:
                    app.request_reaudit(name)
            if how in ("key", "reaudit-and-key"):
                await pilot.press("q")
            elif how == "exit":
                app.exit(return_code=3)
        # run_test re-raises whatever the app raised while it ran and shut down

    asyncio.run(main())
    assert source.closed.is_set()
    assert app.return_code == EXPECTED_RETURN_CODE[how]


def test_refreshes_and_worker_calls_after_the_screens_are_gone_do_nothing() -> None:
    source = FloodSource()
    app = FleetApp(source, names=NAMES, clock=lambda: NOW, tick_s=0)
    ran: list[str] = []

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            app.feed(ENTRIES)
            await pilot.pause()
            assert not app.exiting
            app.exit()
            assert app.exiting  # from exit() on, before the screens go

    asyncio.run(main())
    assert app.screen_stack == []
    app.tick()
    app.feed(OTHER)
    app.deliver(ENTRIES[0])
    app.on_entries_ready(EntriesReady())
    assert app.state.entries["node001"] is ENTRIES[0]  # the data side still takes entries
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            app.from_worker(ran.append, "ran")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and errors == [] and ran == []


def test_worker_calls_reach_the_ui_while_the_app_runs() -> None:
    app = FleetApp(FakeSource(NAMES), names=NAMES, clock=lambda: NOW, tick_s=0)
    ran: list[str] = []

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            thread = threading.Thread(target=app.from_worker, args=(ran.append, "ran"))
            thread.start()
            await wait_for(pilot, lambda: not thread.is_alive(), what="the worker call")
            assert ran == ["ran"]

    asyncio.run(main())
