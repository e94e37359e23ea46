"""Helpers for driving the TUI with ``App.run_test()`` and its Pilot (no async plugin needed)."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fleetops.tui import data, simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.source import ActionResult

SIZE = (160, 45)
NAMES = [f"node{i:03d}" for i in range(1, 13)]
FAULTS = {
    "node003": ["ecc-dbe@3"],
    "node005": ["pcie-downgrade@1", "thermal-slowdown@2"],
    "node008": ["row-remap-pending@0", "stray-process@6", "nvlink-down@6"],
    "node011": ["xid:79@5"],
}
FAULTY = ["node003", "node005", "node008", "node011"]


def fed_entries(faults: dict[str, list[str]] | None = None, now: float = simfeed.T0) -> list[data.NodeEntry]:
    faults = FAULTS if faults is None else faults
    return simfeed.fleet({n: faults.get(n, []) for n in NAMES}, now)


class FakeSource:
    """Stands in for ``SshSource`` where a test feeds entries itself: records the actions."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.resets: list[tuple[str, str, str | None, tuple[int, ...]]] = []
        self.reset_jobs: list[tuple[str, ...] | None] = []  # the jobs each reset was confirmed under
        self.drains: list[str] = []
        self.collects: list[tuple[str, bool]] = []  # (node, after an action)
        self.entries: dict[str, data.NodeEntry] = {}

    def run(self, should_stop: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        while not should_stop():
            time.sleep(0.02)

    def collect(self, name: str, after_action: bool = False) -> data.NodeEntry:
        self.collects.append((name, after_action))
        return self.entries.get(name) or data.pending_entry(name)

    def reset_gpu(self, name: str, uuid: str, bus_id: str | None = None, pids: Any = (), jobs: Any = None) -> ActionResult:
        self.resets.append((name, uuid, bus_id, tuple(pids or ())))
        self.reset_jobs.append(None if jobs is None else tuple(jobs))
        return ActionResult(True, f"{name}: reset {uuid}")

    def slurm_refusal(self, name: str, verb: str) -> str | None:
        return None

    def drain(self, name: str, reason: str) -> ActionResult:
        self.drains.append(name)
        return ActionResult(True, f"{name}: drain done")

    def resume(self, name: str) -> ActionResult:
        return ActionResult(True, f"{name}: resume done")

    def close(self) -> None:
        pass


def fed_app(readonly: bool = False, source: Any = None) -> FleetApp:
    """An app for fed entries at a frozen clock (five seconds after the snapshots)."""
    return FleetApp(source, names=NAMES, readonly=readonly, clock=lambda: simfeed.T0 + 5, tick_s=0)


def drive(
    app: FleetApp,
    body: Callable[[Any], Awaitable[None]],
    entries: list[data.NodeEntry] | None = None,
    size: tuple[int, int] = SIZE,
) -> None:
    """Run ``body(pilot)`` against the app, after feeding it ``entries`` if given."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            if entries is not None:
                app.feed(entries)
            await pilot.pause()
            await body(pilot)

    asyncio.run(main())


def screen_lines(app: FleetApp) -> list[str]:
    """The text on the app's screen, line by line, as drawn (from its SVG screenshot)."""
    svg = app.export_screenshot()
    rows: dict[float, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(float(m.group(2)), []).append((float(m.group(1)), html.unescape(m.group(3))))
    return ["".join(t for _, t in sorted(parts)).replace("\xa0", " ") for _, parts in sorted(rows.items())]


async def wait_for(
    pilot: Any, condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await pilot.pause(0.05)
