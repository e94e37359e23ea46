"""The action log pane (key ``l``): a reset from the TUI against a simulated fleet appears with
its outcome (sent, then verified by the snapshot after it), a drain refused before it is sent
appears as refused with why; after the app is closed and started again with the same --db, both
are still in the pane, read back from the history store."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.fleet.store.database import Store
from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import data
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.actions import ActionLogScreen
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.fleet import FleetScreen
from fleetops.tui.source import SshSource, resolve_hosts
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import drive, wait_for

pytestmark = pytest.mark.root
ADDRESS = os.environ.get("FLEETOPS_TEST_ACTION_LOG_ADDRESS", "127.0.38.1")


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated fleet runs real sshd processes")
    if fleet.find_sshd() is None:
        pytest.skip("needs sshd: apt-get install -y openssh-server")
    directory = tempfile.mkdtemp(prefix="fleetops-action-log-")
    with socket.socket() as sock:
        sock.bind((ADDRESS, 0))
        port = sock.getsockname()[1]
    try:
        fleet.up(2, directory, first_address=ADDRESS, port=port)
        yield directory
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def _app(directory: str, db: str) -> FleetApp:
    hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
    source = SshSource(hosts, baselines, interval=0.5, connect_timeout=10.0, command_timeout=10.0, drain_db=db)  # a loaded machine is slow, not down
    return FleetApp(source, interval=0.5)


async def _open_pane(pilot: Any, app: FleetApp) -> list[tuple[str, ...]]:
    await pilot.press("l")
    assert isinstance(app.screen, ActionLogScreen)
    await pilot.pause(0.3)
    return app.screen.table_rows()


def test_an_action_from_the_tui_is_in_the_pane_with_its_outcome_and_still_there_after_a_restart(
    sim_fleet: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "history.db")
    bad = str(sim.read_state(os.path.join(sim_fleet, "state", "node002.json"))["gpus"][1]["uuid"])
    app = _app(sim_fleet, db)
    seen: dict[str, Any] = {}

    async def first(pilot: Any) -> None:
        await wait_for(pilot, lambda: len(app.state.entries) == 2
                       and all(e.status == data.STATUS_OK for e in app.state.entries.values()), 30, "every node")
        assert await _open_pane(pilot, app) == []  # a new store: nothing yet
        await pilot.press("escape")
        fleet.inject(sim_fleet, "node002", "ecc-dbe", 1)
        await wait_for(pilot, lambda: app.state.entries["node002"].health == "crit", 90, "the DBE to show")
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        screen.table().select_key("node001")
        await pilot.press("d")  # a simulated node is no Slurm node: refused before any dialog
        screen.table().select_key("node002")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(bad)
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 60, "the reset to finish")
        assert app.last_action.ok, app.last_action
        await wait_for(pilot, lambda: app.action_log.rows[0].outcome != "sent", 60, "the verdict after the reset")
        rows = await _open_pane(pilot, app)
        reset, drain = app.action_log.rows
        assert [r[1:5] for r in rows] == [
            ("node002", bad, "reset", "verified"),
            ("node001", "-", "drain", "refused"),
        ]
        assert rows[0][5].startswith("node002 after reset: OK from the snapshot of "), rows[0][5]
        assert rows[0][5] == reset.why
        assert rows[1][5].startswith("node001 is a simulated node, not a Slurm node: nothing to drain"), rows[1][5]
        assert rows[0][0] >= rows[1][0]  # newest first
        seen["rows"] = rows

    drive(app, first)
    with Store(db) as store:  # written through, as shown
        assert [(r.node, r.gpu, r.action, r.outcome, r.why) for r in store.actions()] == [
            (r[1], None if r[2] == "-" else r[2], r[3], r[4], r[5]) for r in seen["rows"]
        ]

    again = _app(sim_fleet, db)

    async def second(pilot: Any) -> None:
        assert await _open_pane(pilot, again) == seen["rows"]  # the last session's actions, read back

    drive(again, second)
