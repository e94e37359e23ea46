"""Snapshot tests of the drain dialogs and of the footer with a disabled action, at 80, 120 and
200 columns: the reason prompt of one node's drain, the filtered drain with the capacity
guard's answer, and the gpus view with a lost GPU selected (reset dimmed, the reason above the
footer). Fed snapshots at a frozen clock; the guard's answer is fixed here (tests/tui/
test_drains.py checks the real one against the strict stand-in scontrol).

Update after an intended change with ``pytest tests/tui/test_snapshots_drain.py
--snapshot-update`` and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from textual.widgets import Input

from fleetops.ops import results
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.drain import DrainScreen

from .conftest import NAMES, SIZE, FakeSource, fed_app, fed_entries, wait_for

ENTRIES = fed_entries()
WIDTHS = (80, 120, 200)
GUARD = (
    "partition gpu: 1 of 12 nodes are out of service already (node006); draining node003 would make 2, "
    "more than the allowed 1 (10%)"
)


class PlanSource(FakeSource):
    """Names its operator run, and answers the capacity guard's plan with a fixed one."""

    operator_run = "alice@ctl01"

    def drain_plan(self, names: Sequence[str], purpose: str) -> list[results.ActionResult]:
        fixed = {
            "node003": results.ActionResult("node003", "drain", results.REFUSED, f"node003: not drained: {GUARD}"),
            "node005": results.ActionResult("node005", "drain", results.DRY_RUN, "node005: would be drained"),
            "node006": results.ActionResult(
                "node006", "drain", results.REFUSED,
                "node006: drained by the health program (run 20261206T031207Z-7c1e-node006): "
                "memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0; left as it is",
            ),  # fmt: skip
            "node007": results.ActionResult(
                "node007", "drain", results.REFUSED,
                "node007: cannot drain: node007 is not managed by Slurm (fleetops_slurm_managed: false)",
                detail={"slurm": False},
            ),  # fmt: skip
        }
        return [fixed[n] for n in names]


def fed() -> FleetApp:
    app = fed_app(source=PlanSource(NAMES))
    app.call_later(app.feed, ENTRIES)
    return app


async def _steady(pilot: Any) -> None:
    """No blinking cursor in the picture."""
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


@pytest.mark.parametrize("width", WIDTHS)
def test_snapshot_drain_reason_prompt(snap_compare: Any, width: int) -> None:
    async def open_prompt(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key("node011")
        await pilot.press("d")
        assert isinstance(pilot.app.screen, DrainScreen)
        await _steady(pilot)

    assert snap_compare(fed(), terminal_size=(width, SIZE[1]), run_before=open_prompt)


@pytest.mark.parametrize("width", WIDTHS)
def test_snapshot_drain_filtered_with_the_guards_answer(snap_compare: Any, width: int) -> None:
    async def open_set(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.set_filter("node00[3567]")
        await pilot.press("ctrl+d")
        screen = pilot.app.screen
        assert isinstance(screen, DrainScreen)
        await wait_for(pilot, lambda: screen.plan is not None, 10, "the guard's answer")
        await _steady(pilot)

    assert snap_compare(fed(), terminal_size=(width, SIZE[1]), run_before=open_set)


@pytest.mark.parametrize("width", WIDTHS)
def test_snapshot_disabled_reset_of_a_lost_gpu(snap_compare: Any, width: int) -> None:
    lost = next(e for e in ENTRIES if e.name == "node011").gpus[5]
    assert lost.lost

    async def select_lost(pilot: Any) -> None:
        await pilot.pause()
        await pilot.press("2")
        pilot.app.screen.table().select_key(f"node011:{lost.uuid}")
        await pilot.pause()

    assert snap_compare(fed(), terminal_size=(width, SIZE[1]), run_before=select_lost)
