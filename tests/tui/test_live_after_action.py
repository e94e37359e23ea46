"""The verdict the TUI gives right after an action comes from a snapshot taken after it: on a
simulated fleet whose nodes answer from the resident agent (``sim up --daemon``), a reset from
the node screen is followed by a snapshot the daemon sampled on request, and the TUI says the
node is OK and where that came from, not the daemon's last sample from before the reset."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetops.agent.serve import client
from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui.actions import snapshot_time
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.source import SshSource, resolve_hosts
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import drive, wait_for

pytestmark = pytest.mark.root
ADDRESS = os.environ.get("FLEETOPS_TEST_AFTER_ACTION_ADDRESS", "127.0.36.1")


@pytest.fixture(scope="module")
def daemon_fleet() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the simulated fleet runs real sshd processes")
    if fleet.find_sshd() is None:
        pytest.skip("needs sshd: apt-get install -y openssh-server")
    directory = tempfile.mkdtemp(prefix="fleetops-after-action-")
    ports = []
    for _ in range(2):  # sshd's and the metrics endpoints': ports nobody listens on, so parallel runs do not collide
        with socket.socket() as sock:
            sock.bind((ADDRESS, 0))
            ports.append(sock.getsockname()[1])
    try:
        fleet.up(2, directory, first_address=ADDRESS, port=ports[0], daemon=True, metrics_port=ports[1])
        yield directory
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def test_live_the_verdict_after_a_reset_is_sampled_after_it(daemon_fleet: str) -> None:
    hosts, baselines = resolve_hosts(os.path.join(daemon_fleet, "inventory.yml"), None)
    # a long refresh interval: the only snapshot after the reset that can reach the screen in
    # time is the one the action itself asks for
    source = SshSource(hosts, baselines, interval=600.0, connect_timeout=2.0, command_timeout=10.0)
    app = FleetApp(source, interval=600.0)
    state_path = os.path.join(daemon_fleet, "state", "node001.json")
    bad = str(sim.read_state(state_path)["gpus"][3]["uuid"])
    fleet.inject(daemon_fleet, "node001", "xid:48", 3)  # a DBE's XID: the GPU needs a reset
    sock = os.path.join(daemon_fleet, "state", "node001.agent", "agent.sock")
    deadline = time.monotonic() + 90
    while not [x for x in json.loads(client.ask(sock, b"snapshot\n", 5.0))["xids"] if x["code"] == 48]:
        assert time.monotonic() < deadline, "the daemon never saw the XID"
        time.sleep(0.5)  # the daemon has the fault before the TUI's first (and only) poll

    async def body(pilot: Any) -> None:
        await wait_for(pilot, lambda: "node001" in app.state.entries and app.state.entries["node001"].health == "crit",
                       90, "the XID to show")
        before = app.state.entries["node001"]
        assert before.snapshot is not None and isinstance(before.snapshot.daemon, dict)  # served by the daemon
        app.screen.table().select_key("node001")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(bad)
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 90, "the reset to finish")
        assert app.last_action is not None and app.last_action.ok, app.last_action
        await wait_for(pilot, lambda: any("after reset" in str(n.message) for n in app._notifications), 60,
                       "the verdict after the reset")
        (verdict,) = [str(n.message) for n in app._notifications if "after reset" in str(n.message)]
        after = app.state.entries["node001"]
        assert after.snapshot is not None and isinstance(after.snapshot.daemon, dict)
        taken = snapshot_time(after.snapshot.collected_at)  # the toast and the header name the snapshot shown
        assert verdict == f"node001 after reset: OK (no faults; daemon, sampled now; snapshot {taken})", verdict
        assert app.action_note == f"node001 after reset: OK from the snapshot of {taken}"
        assert after.snapshot.collected_at > before.snapshot.collected_at
        assert after.health == "ok"

    drive(app, body)
