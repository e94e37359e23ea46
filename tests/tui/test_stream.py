"""The streaming app against a real simulated fleet: sshd on loopback, one real resident agent
(``fleetops-agent serve --backend sim``) serving every node, the app's ``StreamSource`` reading
each node's ``watch`` stream over real SSH through the node-side relay. Marked ``root``.

The daemon is started here rather than by ``fleet.up(daemon=True)`` so a test can stop it
(SIGSTOP: the sockets stay open and go silent), end it and start it again; it takes full
snapshots every second so a change is pushed within about a second."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fleetops.sim import fleet
from fleetops.tui import data, stream
from fleetops.tui.app import FleetApp
from fleetops.tui.source import resolve_hosts
from fleetops.tui.stream import StreamSource

from .conftest import drive, wait_for
from .test_live import _skip_reason, cells, fleet_table

pytestmark = pytest.mark.root
NODES = [f"node{i:03d}" for i in range(1, 5)]
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_TUI_ADDRESS", "127.0.30.1")
STALE_AFTER_S = 4.0


class Daemon:
    """One ``fleetops-agent serve`` for the fleet's state files, started and ended by the test."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        agent = os.path.join(fleet.agent_bin_dir(), "fleetops-agent")
        argv = [agent, "serve", "--backend", "sim", "--states", os.path.join(self.directory, "state"),
                "--interval", "0.5", "--full-interval", "1"]  # fmt: skip
        with open(os.path.join(self.directory, "log", "test-serve.log"), "ab") as log:  # the child keeps its copy
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        sockets = [os.path.join(self.directory, "state", f"{n}.agent", "agent.sock") for n in NODES]
        deadline = time.monotonic() + 20
        while not all(os.path.exists(s) for s in sockets):
            assert self.proc.poll() is None, "the daemon exited at start"
            assert time.monotonic() < deadline, "the daemon's sockets did not appear"
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


@pytest.fixture(scope="module")
def sim_fleet() -> Iterator[str]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tempfile.mkdtemp(prefix="fleetops-tui-stream-test-")
    with socket.socket() as sock:
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    try:
        fleet.up(len(NODES), directory, first_address=FIRST_ADDRESS, port=port)
        yield directory
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def fleet_dir(sim_fleet: str) -> Iterator[tuple[str, Daemon]]:
    daemon = Daemon(sim_fleet)
    daemon.start()
    try:
        yield sim_fleet, daemon
    finally:
        daemon.stop()
        for name in NODES:
            fleet.clear(sim_fleet, name, "all")


def stream_app(directory: str) -> tuple[FleetApp, StreamSource]:
    hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
    source = StreamSource(
        hosts, baselines, interval=0.5, connect_timeout=2.0, command_timeout=5.0,
        stale_after_s=STALE_AFTER_S, backoff_base_s=0.2, backoff_cap_s=1.0, retry_no_daemon_s=1.0, seed=1,
    )  # fmt: skip
    return FleetApp(source, interval=0.5), source


def streaming(source: StreamSource) -> bool:
    return all(source.node_state(n) == stream.STREAMING for n in NODES)


async def all_streaming(pilot: Any, app: FleetApp, source: StreamSource) -> None:
    await wait_for(
        pilot,
        lambda: streaming(source) and all(e.status == data.STATUS_OK for e in app.state.entries.values()),
        30,
        "every node streaming",
    )


def test_stream_shows_every_node_from_its_daemon_with_no_command_run(fleet_dir: tuple[str, Daemon]) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        await pilot.pause(0.1)
        tbl = fleet_table(app)
        assert tbl.keys == NODES
        for name in NODES:
            row = cells(tbl, name)
            assert (row["health"], row["gpus"], row["driver"]) == ("OK", "8/8", "580.159.04"), name
            snap = app.state.entries[name].snapshot
            assert snap is not None and isinstance(snap.daemon, dict), name  # the daemon's document
            assert not [f for f in app.state.entries[name].findings if f.check == "tui.no_daemon"]
        assert source.pool.connected() == []  # no collect was run: the data came on the streams
        assert source.stream_counts() == (len(NODES), 0)

    drive(app, body)


def test_stream_transports_wake_only_for_packets_and_end_after_close(fleet_dir: tuple[str, Daemon]) -> None:
    """An idle stream's transport thread waits ``idle_wakeup_s`` between its own looks (not
    paramiko's 0.1 s, which at 1000 nodes is what held the controller's CPU), data still comes
    at once (the streams deliver every node), and closing ends every transport thread."""
    directory, _ = fleet_dir
    app, source = stream_app(directory)
    transports: list[Any] = []

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        for name in NODES:
            s = source._nodes[name].stream
            assert s is not None, name
            transport = s._client.get_transport()
            assert transport is not None and transport.is_alive(), name
            assert transport.sock.gettimeout() == source.opener.idle_wakeup_s == 2.0, name
            transports.append(transport)

    drive(app, body)
    source.close()
    for transport in transports:
        transport.join(10.0)
        assert not transport.is_alive()


def test_stream_an_injected_fault_arrives_without_a_poll(fleet_dir: tuple[str, Daemon]) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        injected = time.time()
        fleet.inject(directory, "node003", "ecc-dbe", 2)
        await wait_for(pilot, lambda: app.state.entries["node003"].health == "crit", 15, "the DBE to show")
        snap = app.state.entries["node003"].snapshot
        assert snap is not None and snap.daemon is not None
        assert snap.daemon["collected_at"] >= injected - 0.01  # the daemon's new snapshot, pushed
        assert [g.ecc_uncorrected_volatile for g in snap.gpus][2] == 2
        assert source.pool.connected() == []  # nothing polled it
        for name in ("node001", "node002", "node004"):
            assert app.state.entries[name].health == "ok", name

    drive(app, body)


def test_stream_a_silent_daemon_shows_stale_with_its_age_never_unreach(fleet_dir: tuple[str, Daemon]) -> None:
    directory, daemon = fleet_dir
    app, source = stream_app(directory)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        daemon.signal(signal.SIGSTOP)  # the sockets stay open and say nothing
        try:
            await wait_for(
                pilot,
                lambda: all(app.state.entries[n].status == data.STATUS_STALE for n in NODES),
                STALE_AFTER_S + 10,
                "every node to go stale",
            )
            await pilot.pause(1.2)
            app.refresh_screens(None)
            await pilot.pause(0.1)
            row = cells(fleet_table(app), "node002")
            assert row["health"] == "STALE"
            assert (row["gpus"], row["driver"]) == ("8/8", "580.159.04")  # its last data
            age = row["seen"]
            assert age.endswith("s") and int(age.rstrip("s")) >= STALE_AFTER_S, age
            assert "silent" in row["worst"]
            assert source.unreachable_marks == {}
            assert all(app.state.entries[n].display_health == "stale" for n in NODES)
            assert app.state.totals().stale == len(NODES) and app.state.totals().unreachable == 0
        finally:
            daemon.signal(signal.SIGCONT)
        await wait_for(
            pilot, lambda: all(app.state.entries[n].status == data.STATUS_OK for n in NODES), 15, "the streams to flow"
        )
        assert source.unreachable_marks == {}

    drive(app, body)


def test_stream_a_node_whose_sshd_is_gone_is_unreach_then_comes_back(fleet_dir: tuple[str, Daemon]) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        fleet.inject(directory, "node004", "host-down")
        await wait_for(
            pilot, lambda: app.state.entries["node004"].display_health == "unreach", 20, "node004 to be UNREACH"
        )
        await pilot.pause(0.1)
        row = cells(fleet_table(app), "node004")
        assert row["health"] == "UNREACH" and "refused" in row["worst"]
        assert row["gpus"] == "8/8"  # its last state
        assert set(source.unreachable_marks) == {"node004"}
        for name in ("node001", "node002", "node003"):
            assert app.state.entries[name].status == data.STATUS_OK, name
        fleet.clear(directory, "node004", "host-down")
        await wait_for(
            pilot,
            lambda: source.node_state("node004") == stream.STREAMING
            and app.state.entries["node004"].status == data.STATUS_OK,
            20,
            "node004 to stream again",
        )

    drive(app, body)


def test_stream_daemon_gone_falls_back_to_collect_then_reconnects(fleet_dir: tuple[str, Daemon]) -> None:
    directory, daemon = fleet_dir
    app, source = stream_app(directory)

    def no_daemon_note(name: str) -> bool:
        return any(f.check == "tui.no_daemon" for f in app.state.entries[name].findings)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        daemon.stop()
        await wait_for(
            pilot,
            lambda: all(source.node_state(n) == stream.POLLING and no_daemon_note(n) for n in NODES),
            20,
            "every node polled with a cold collect",
        )
        assert all(app.state.entries[n].status == data.STATUS_OK for n in NODES)
        assert source.stream_counts() == (0, len(NODES))
        fleet.inject(directory, "node001", "ecc-dbe", 1)  # polled nodes still show faults
        await wait_for(pilot, lambda: app.state.entries["node001"].health == "crit", 15, "the DBE by collect")
        daemon.start()
        await wait_for(
            pilot,
            lambda: streaming(source) and not any(no_daemon_note(n) for n in NODES),
            20,
            "the streams back",
        )
        assert app.state.entries["node001"].health == "crit"  # from the daemon now
        assert source.unreachable_marks == {}

    drive(app, body)


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    import random

    rng = random.Random(3)
    waits = [stream.backoff_s(n, 1.0, 30.0, rng) for n in range(1, 9)]
    for n, w in enumerate(waits, start=1):
        full = min(30.0, 2.0 ** (n - 1))
        assert full / 2 <= w <= full, (n, w)
    assert len({round(stream.backoff_s(4, 1.0, 30.0, rng), 6) for _ in range(20)}) > 1  # jittered
