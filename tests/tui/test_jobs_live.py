"""The job view against a real simulated fleet: a job started on a node the way slurmd does it
(``fleetops sim job start``: the shipped prolog over SSH writes the job record), the node's
resident agent tagging its snapshot, the app's ``StreamSource`` carrying it to the JOBS column
and the job filter; the epilog's end shown as the job's end. Marked ``root`` (real sshd)."""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Static

from fleetops.sim.fleet import jobs as sim_jobs

from .conftest import drive, wait_for
from .test_live import cells, fleet_table, uuid_of
from .test_stream import Daemon, all_streaming, fleet_dir, sim_fleet, stream_app  # noqa: F401 - fixtures

pytestmark = pytest.mark.root


def test_live_a_job_started_by_the_prolog_shows_in_the_jobs_column_and_the_job_view(
    fleet_dir: tuple[str, Daemon],  # noqa: F811 - the fixture
) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        await wait_for(pilot, lambda: cells(fleet_table(app), "node002")["jobs"] == "", 30, "the daemon's job records")
        sim_jobs.start(directory, "node002", "4321", gpus="0,3", user="alice", uid=1000)
        try:
            await wait_for(pilot, lambda: cells(fleet_table(app), "node002")["jobs"] == "4321", 30, "the job's cell")
            assert cells(fleet_table(app), "node001")["jobs"] == ""
            await pilot.press("j", "ctrl+u", *"4321", "enter", "2")
            table = app.screen.table()
            assert table.keys == [f"job:node002:{uuid_of(directory, 'node002', i)}" for i in (0, 3)]
            header = str(app.screen.query_one("#job-header", Static).render())
            assert header.startswith(" JOB  job 4321  user alice  started ") and "2 GPUs on 1 node" in header
        finally:
            sim_jobs.stop(directory, "node002", "4321", user="alice", uid=1000)
        await wait_for(
            pilot, lambda: "ENDED " in str(app.screen.query_one("#job-header", Static).render()), 30, "the job's end"
        )
        await pilot.press("escape", "1")
        assert cells(fleet_table(app), "node002")["jobs"] == ""

    drive(app, body)
