"""Snapshot tests of the job view at 80 and 120 columns (pytest-textual-snapshot): the nodes
view with its JOBS column (the fleet of ``jobfleet``: running ids, ``-`` for a node whose
snapshot has no job records, empty for none), and the GPUs view filtered to job 1234 (``j``):
its twelve GPUs on node001 and node005 side by side under the line naming the job, node005's
GPU 2 held down by its temperature. Fed snapshots at a frozen clock.

Update after an intended change with ``pytest tests/tui/test_snapshots_jobs.py --snapshot-update``
and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops.tui.app import FleetApp

from .conftest import SIZE, fed_app
from .jobfleet import job_entries

ENTRIES = job_entries()


def app() -> FleetApp:
    fleet = fed_app()
    fleet.call_later(fleet.feed, ENTRIES)
    return fleet


async def _job_view(pilot: Any) -> None:
    await pilot.pause()
    pilot.app.screen.table().select_key("node005")
    await pilot.press("j", "enter", "2")
    await pilot.pause()


@pytest.mark.parametrize("width", [80, 120])
def test_snapshot_nodes_view_with_the_jobs_column(snap_compare: Any, width: int) -> None:
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), press=["_"])


@pytest.mark.parametrize("width", [80, 120])
def test_snapshot_gpus_of_one_job(snap_compare: Any, width: int) -> None:
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), run_before=_job_view)
