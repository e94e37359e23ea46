"""The real app against a real simulated fleet: sshd on loopback, ``fleetops-agent`` on the far
side, the refresh thread on persistent SSH sessions. Marked ``root`` (it starts sshd)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import data
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.fleet import FleetScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.source import SshSource, resolve_hosts
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import drive, wait_for

pytestmark = pytest.mark.root
NODES = [f"node{i:03d}" for i in range(1, 7)]
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_TUI_ADDRESS", "127.0.30.1")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[str]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tempfile.mkdtemp(prefix="fleetops-tui-test-")
    with socket.socket() as sock:  # a port nobody listens on, so parallel runs do not collide
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    try:
        fleet.up(len(NODES), directory, first_address=FIRST_ADDRESS, port=port)
        yield directory
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def fleet_dir(sim_fleet: str) -> Iterator[str]:
    yield sim_fleet
    for name in NODES:  # every test starts from a healthy, reachable fleet
        fleet.clear(sim_fleet, name, "all")


def live_app(directory: str, readonly: bool = False) -> FleetApp:
    hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
    source = SshSource(hosts, baselines, interval=0.5, connect_timeout=10.0, command_timeout=10.0)  # a loaded machine is slow, not down
    return FleetApp(source, readonly=readonly, interval=0.5)


def uuid_of(directory: str, node: str, index: int) -> str:
    state = sim.read_state(os.path.join(directory, "state", f"{node}.json"))
    return str(state["gpus"][index]["uuid"])


def entry(app: FleetApp, name: str) -> data.NodeEntry:
    return app.state.entries[name]


def fleet_table(app: FleetApp) -> FleetTable:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    return screen.table()


def cells(tbl: FleetTable, key: str) -> dict[str, str]:
    row = tbl.row(key)
    assert row is not None, key
    return dict(zip((c.key for c in tbl.spec), row.cells, strict=False))


async def all_seen(pilot: Any, app: FleetApp) -> None:
    await wait_for(
        pilot, lambda: all(e.status == data.STATUS_OK for e in app.state.entries.values()), 30, "every node"
    )


def test_live_every_node_listed_after_the_first_refresh(fleet_dir: str) -> None:
    app = live_app(fleet_dir)

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        await pilot.pause(0.1)
        tbl = fleet_table(app)
        assert tbl.keys == NODES
        for name in NODES:
            row = cells(tbl, name)
            assert (row["health"], row["gpus"], row["driver"]) == ("OK", "8/8", "580.159.04"), name

    drive(app, body)


def test_live_drill_down_shows_an_injected_fault_on_the_right_gpu(fleet_dir: str) -> None:
    app = live_app(fleet_dir)
    bad = uuid_of(fleet_dir, "node004", 5)

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node004", "ecc-dbe", 5)
        await wait_for(pilot, lambda: entry(app, "node004").health == "crit", 90, "the DBE to show")
        fleet_table(app).select_key("node004")
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        gpus = screen.query_one("#node-gpus", FleetTable)
        assert len(gpus.keys) == 8
        assert {k for k in gpus.keys if cells(gpus, k)["health"] != "OK"} == {bad}
        assert cells(gpus, bad)["idx"] == "5" and cells(gpus, bad)["ecc"] == "0/2"

    drive(app, body)


def test_live_confirmed_reset_clears_the_fault_at_the_next_refresh(fleet_dir: str) -> None:
    app = live_app(fleet_dir)
    bad = uuid_of(fleet_dir, "node002", 1)
    state_path = os.path.join(fleet_dir, "state", "node002.json")

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node002", "ecc-dbe", 1)
        await wait_for(pilot, lambda: entry(app, "node002").health == "crit", 90, "the DBE to show")
        fleet_table(app).select_key("node002")
        await pilot.press("enter")
        app.screen.query_one("#node-gpus", FleetTable).select_key(bad)
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 60, "the reset to finish")
        assert app.last_action is not None and app.last_action.ok, app.last_action
        assert not sim.read_state(state_path)["faults"]  # the simulator's GPU really was reset
        seen = entry(app, "node002").version
        await wait_for(pilot, lambda: entry(app, "node002").version > seen, 90, "the next refresh")
        assert entry(app, "node002").health == "ok"
        gpus = app.screen.query_one("#node-gpus", FleetTable)
        assert cells(gpus, bad)["health"] == "OK" and cells(gpus, bad)["ecc"] == "0/0"

    drive(app, body)


def test_live_host_taken_down_shows_unreachable_with_its_last_state(fleet_dir: str) -> None:
    app = live_app(fleet_dir)

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node006", "pcie-downgrade", 2)
        await wait_for(pilot, lambda: entry(app, "node006").health == "warn", 90, "the PCIe fault to show")
        fleet.inject(fleet_dir, "node006", "host-down")
        await wait_for(pilot, lambda: entry(app, "node006").status != data.STATUS_OK, 90, "node006 to drop")
        await pilot.pause(1.2)  # the age moves on while the node stays down
        row = cells(fleet_table(app), "node006")
        assert row["health"] == "UNREACH"
        assert (row["gpus"], row["driver"]) == ("7/8", "580.159.04")  # its last good state
        assert "pcie" in row["worst"] and "refused" in row["worst"]
        assert row["seen"] not in ("0s", "-")
        for name in NODES[:-1]:  # the others keep refreshing
            assert entry(app, name).status == data.STATUS_OK
        fleet.clear(fleet_dir, "node006", "host-down")
        await wait_for(pilot, lambda: entry(app, "node006").status == data.STATUS_OK, 90, "node006 to return")

    drive(app, body)


def test_live_readonly_blocks_reset(fleet_dir: str) -> None:
    app = live_app(fleet_dir, readonly=True)
    state_path = os.path.join(fleet_dir, "state", "node003.json")

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node003", "ecc-dbe", 0)
        await wait_for(pilot, lambda: entry(app, "node003").health == "crit", 90, "the DBE to show")
        fleet_table(app).select_key("node003")
        await pilot.press("enter")
        await pilot.press("r", "tab", "enter")
        await pilot.pause(1.0)
        assert isinstance(app.screen, NodeScreen)
        assert app.last_action is None
        assert [f["name"] for f in sim.read_state(state_path)["faults"]] == ["ecc-dbe"]

    drive(app, body)


def test_live_drain_on_a_simulated_node_says_it_is_not_a_slurm_node(fleet_dir: str) -> None:
    app = live_app(fleet_dir)

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet_table(app).select_key("node001")
        await pilot.press("d")
        assert isinstance(app.screen, FleetScreen)  # no dialog: there is nothing to drain
        messages = [n.message for n in app._notifications]
        assert any("not a Slurm node" in m for m in messages), messages

    drive(app, body)


# --- the reset does what the dialog showed, and waits as long as a reset takes -----------------


async def _open_reset_dialog(pilot: Any, app: FleetApp, node: str, gpu: str) -> str:
    fleet_table(app).select_key(node)
    await pilot.press("enter")
    app.screen.query_one("#node-gpus", FleetTable).select_key(gpu)
    await pilot.press("r")
    assert isinstance(app.screen, ConfirmScreen)
    return str(app.screen.question.lines)


def test_live_a_process_that_starts_while_the_dialog_is_open_makes_the_reset_refused(fleet_dir: str) -> None:
    app = live_app(fleet_dir)
    gpu = uuid_of(fleet_dir, "node005", 2)
    state_path = os.path.join(fleet_dir, "state", "node005.json")

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        shown = await _open_reset_dialog(pilot, app, "node005", gpu)
        assert "Processes: none" in shown
        with sim.locked_state(state_path) as st:  # a job starts on the GPU while the operator reads
            sim.add_process(st, 2, 7781, "late_job.py")
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 60, "the reset's answer")
        result = app.last_action
        assert result.outcome == "refused", result
        assert "pid 7781" in result.message and "late_job.py" in result.message
        assert "--kill-processes" not in result.detail["argv"]
        assert [p["pid"] for p in sim.gpu_processes(sim.read_state(state_path), 2)] == [7781]

    drive(app, body)


def test_live_reset_ends_only_the_processes_the_dialog_showed(fleet_dir: str) -> None:
    app = live_app(fleet_dir)
    gpu = uuid_of(fleet_dir, "node004", 3)
    state_path = os.path.join(fleet_dir, "state", "node004.json")

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node004", "stray-process", 3)
        await wait_for(pilot, lambda: any(p.pid == sim.STRAY_PID for p in (entry(app, "node004").snapshot.gpus[3].processes or [])),
                       90, "the stray process to show")
        shown = await _open_reset_dialog(pilot, app, "node004", gpu)
        assert f"pid {sim.STRAY_PID}" in shown and "7782" not in shown
        with sim.locked_state(state_path) as st:
            sim.add_process(st, 3, 7782, "late_job.py")
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 60, "the reset's answer")
        result = app.last_action
        argv = result.detail["argv"]
        assert argv[argv.index("--expect-pids") + 1] == str(sim.STRAY_PID) and "--kill-processes" in argv
        assert result.outcome == "refused", result
        assert "7782" in result.message
        left = {p["pid"] for p in sim.gpu_processes(sim.read_state(state_path), 3)}
        assert left == {sim.STRAY_PID, 7782}

    drive(app, body)


def test_live_a_reset_longer_than_the_collect_timeout_is_reported_as_done(fleet_dir: str) -> None:
    app = live_app(fleet_dir)  # collect timeout 5 s
    gpu = uuid_of(fleet_dir, "node006", 1)
    state_path = os.path.join(fleet_dir, "state", "node006.json")
    with sim.locked_state(state_path) as st:
        st["node"]["reset_duration_s"] = 8.0

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        fleet.inject(fleet_dir, "node006", "ecc-dbe", 1)
        await wait_for(pilot, lambda: entry(app, "node006").health == "crit", 90, "the DBE to show")
        await _open_reset_dialog(pilot, app, "node006", gpu)
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 120, "the reset's answer")
        result = app.last_action
        assert result.outcome == "done", result
        assert result.detail["timeout_s"] > 5.0
        report = result.detail["report"]
        assert report["result"] == "reset" and report["verified"] is True
        assert not sim.read_state(state_path)["faults"]

    try:
        drive(app, body)
    finally:
        with sim.locked_state(state_path) as st:
            st["node"]["reset_duration_s"] = 0.0
