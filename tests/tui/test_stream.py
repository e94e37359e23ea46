"""The streaming app against a real simulated fleet: sshd on loopback, one real resident agent
(``fleetops-agent serve --backend sim``) serving every node, the app's ``StreamSource`` reading
each node's ``watch`` stream over real SSH through the node-side relay. Marked ``root``.

The daemon is started here rather than by ``fleet.up(daemon=True)`` so a test can stop it
(SIGSTOP: the sockets stay open and go silent), end it and start it again; it takes full
snapshots every second so a change is pushed within about a second."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.fleet import transport
from fleetops.sim import fleet
from fleetops.tui import data, liveness, stream
from fleetops.tui.app import FleetApp
from fleetops.tui.source import resolve_hosts
from fleetops.tui.stream import StreamSource

from .conftest import drive, screen_lines, wait_for
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


@pytest.fixture(params=["paramiko", "openssh"])
def kind(request: pytest.FixtureRequest) -> str:
    """The streams' transport: the stream tests run over both."""
    if request.param == "openssh" and transport.openssh_client() is None:
        pytest.skip("needs the OpenSSH client: apt-get install -y openssh-client")
    return str(request.param)


def stream_app(directory: str, kind: str = "paramiko") -> tuple[FleetApp, StreamSource]:
    hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
    source = stream_source(hosts, baselines, kind)
    assert type(source.opener) is (transport.OpenSSHStreamOpener if kind == "openssh" else transport.StreamOpener)
    return FleetApp(source, interval=0.5), source


def stream_source(hosts: list[Any], baselines: dict[str, Any], kind: str) -> StreamSource:
    # Timeouts a loaded machine meets: a connect that times out is UNREACH by design, so a 2 s
    # handshake limit made a healthy node UNREACH under load (the hung-sshd tests set their own).
    return StreamSource(
        hosts, baselines, interval=0.5, connect_timeout=10.0, command_timeout=10.0,
        stale_after_s=STALE_AFTER_S, backoff_base_s=0.2, backoff_cap_s=1.0, retry_no_daemon_s=1.0, seed=1,
        stream_transport=kind,
    )  # fmt: skip


def streaming(source: StreamSource) -> bool:
    return all(source.node_state(n) == stream.STREAMING for n in NODES)


async def all_streaming(pilot: Any, app: FleetApp, source: StreamSource) -> None:
    await wait_for(
        pilot,
        lambda: streaming(source) and all(e.status == data.STATUS_OK for e in app.state.entries.values()),
        30,
        "every node streaming",
    )


def test_stream_shows_every_node_from_its_daemon_with_no_command_run(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory, kind)

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
            assert isinstance(s, transport.Stream), name
            assert isinstance(source.opener, transport.StreamOpener)
            carrier = s._client.get_transport()
            assert carrier is not None and carrier.is_alive(), name
            assert carrier.sock.gettimeout() == source.opener.idle_wakeup_s == 2.0, name
            transports.append(carrier)

    drive(app, body)
    source.close()
    for carrier in transports:
        carrier.join(10.0)
        assert not carrier.is_alive()


def test_stream_an_injected_fault_arrives_without_a_poll(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory, kind)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        injected = time.time()
        fleet.inject(directory, "node003", "ecc-dbe", 2)
        await wait_for(pilot, lambda: app.state.entries["node003"].health == "crit", 60, "the DBE to show")
        snap = app.state.entries["node003"].snapshot
        assert snap is not None and snap.daemon is not None
        assert snap.daemon["collected_at"] >= injected - 0.01  # the daemon's new snapshot, pushed
        assert [g.ecc_uncorrected_volatile for g in snap.gpus][2] == 2
        assert source.pool.connected() == []  # nothing polled it
        for name in ("node001", "node002", "node004"):
            assert app.state.entries[name].health == "ok", name

    drive(app, body)


def ok_is_current(app: FleetApp) -> bool:
    """No node counted "ok" shows data older than the stale threshold (checked at one instant)."""
    now = app.state.clock()
    current = [e for e in app.state.entries.values() if app.state.health_at(e, now) not in ("stale", "unreach", "pending")]
    old = [e.name for e in current if e.seen_at is not None and now - e.seen_at > STALE_AFTER_S]
    return not old and app.state.totals(now).ok <= len(current)


def test_stream_a_silent_daemon_is_hung_with_its_age_never_unreach(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    """sshd answers, the daemon's stream says nothing: HUNG (``transport.stream_silent``), its
    last data and age shown, never UNREACH; never counted "ok" once its data is past the threshold."""
    directory, daemon = fleet_dir
    app, source = stream_app(directory, kind)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        daemon.signal(signal.SIGSTOP)  # the sockets stay open and say nothing
        try:
            def hung() -> bool:
                assert ok_is_current(app)
                assert source.unreachable_marks == {}
                return all(
                    app.state.entries[n].status == "timeout"
                    and app.state.entries[n].problem is not None
                    and app.state.entries[n].problem.check == "transport.stream_silent"  # type: ignore[union-attr]
                    for n in NODES
                )

            await wait_for(pilot, hung, STALE_AFTER_S + 60, "every node to be HUNG")
            app.refresh_screens(None)
            await pilot.pause(0.1)
            row = cells(fleet_table(app), "node002")
            assert row["health"] == "HUNG"
            assert (row["gpus"], row["driver"]) == ("8/8", "580.159.04")  # its last data
            age = row["seen"]
            assert age.endswith("s") and int(age.rstrip("s")) >= STALE_AFTER_S, age
            assert "silent" in row["worst"] and "sshd answers" in row["worst"]
            assert source.unreachable_marks == {}
            totals = app.state.totals()
            assert totals.ok == 0 and totals.hung == len(NODES)
        finally:
            daemon.signal(signal.SIGCONT)
        await wait_for(
            pilot, lambda: all(app.state.entries[n].status == data.STATUS_OK for n in NODES), 60, "the streams to flow"
        )
        assert source.unreachable_marks == {}

    drive(app, body)


def test_stream_a_hung_host_is_hung_never_unreach_then_comes_back(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    """``host-hang`` (sshd and its sessions stopped: TCP taken, no banner): the silent stream's
    host is probed and shown HUNG (``transport.hung``), never UNREACH and never "ok" with data
    past the threshold; the others stay OK; it streams again once the host runs."""
    directory, _ = fleet_dir
    app, source = stream_app(directory, kind)
    seen: list[str] = []

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        fleet.inject(directory, "node002", "host-hang")
        try:
            def hung() -> bool:
                e = app.state.entries["node002"]
                if not seen or seen[-1] != e.status:
                    seen.append(e.status)
                assert ok_is_current(app)
                return e.status == "timeout" and e.problem is not None and e.problem.check == "transport.hung"

            await wait_for(pilot, hung, STALE_AFTER_S + 60, "node002 to be HUNG")
            assert "unreachable" not in seen, seen
            assert seen[0] == data.STATUS_OK and seen[-1] == "timeout", seen
            assert "no SSH banner" in (app.state.entries["node002"].problem.message)  # type: ignore[union-attr]
            for name in ("node001", "node003", "node004"):
                assert app.state.entries[name].status == data.STATUS_OK, name
            assert "node002" not in source.unreachable_marks
            await pilot.pause(3 * liveness.PROBE_EVERY_S / 2)  # probed again meanwhile: still HUNG
            assert app.state.entries["node002"].status == "timeout"
            assert "node002" not in source.unreachable_marks
        finally:
            fleet.clear(directory, "node002", "host-hang")
        await wait_for(
            pilot, lambda: app.state.entries["node002"].status == data.STATUS_OK, 120, "node002 to stream again"
        )

    drive(app, body)


def test_stream_a_node_whose_sshd_is_gone_is_unreach_then_comes_back(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    directory, _ = fleet_dir
    app, source = stream_app(directory, kind)

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        fleet.inject(directory, "node004", "host-down")
        await wait_for(
            pilot, lambda: app.state.entries["node004"].display_health == "unreach", 60, "node004 to be UNREACH"
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
            60,
            "node004 to stream again",
        )

    drive(app, body)


def test_stream_daemon_gone_falls_back_to_collect_then_reconnects(fleet_dir: tuple[str, Daemon], kind: str) -> None:
    directory, daemon = fleet_dir
    app, source = stream_app(directory, kind)

    def no_daemon_note(name: str) -> bool:  # polled, and OK with no finding about it
        return not [f for f in app.state.entries[name].findings if f.check == "tui.no_daemon"] and (
            source.node_state(name) == stream.POLLING
        )

    async def body(pilot: Any) -> None:
        await all_streaming(pilot, app, source)
        daemon.stop()
        await wait_for(
            pilot,
            lambda: all(source.node_state(n) == stream.POLLING and no_daemon_note(n) for n in NODES),
            60,
            "every node polled with a cold collect",
        )
        assert all(app.state.entries[n].status == data.STATUS_OK for n in NODES)
        assert all(app.state.entries[n].health == "ok" for n in NODES)  # OK, not INFO
        assert source.stream_counts() == (0, len(NODES))
        await pilot.pause(0.2)
        app.refresh_screens(None)
        await pilot.pause(0.1)
        header = screen_lines(app)[0]
        assert header.count("no daemons") == 1 and f"ok {len(NODES)}" in header, header
        assert cells(fleet_table(app), "node002")["health"] == "OK"
        fleet.inject(directory, "node001", "ecc-dbe", 1)  # polled nodes still show faults
        await wait_for(pilot, lambda: app.state.entries["node001"].health == "crit", 60, "the DBE by collect")
        daemon.start()
        await wait_for(
            pilot,
            lambda: streaming(source) and not any(no_daemon_note(n) for n in NODES),
            60,
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


# --- OpenSSH streams: what only the ssh-process transport does --------------------------------

needs_ssh = pytest.mark.skipif(transport.openssh_client() is None, reason="needs the OpenSSH client")


class Running:
    """A StreamSource's loop on a thread, its entries kept as delivered (no app: the entries are
    what the screen would draw)."""

    def __init__(self, source: StreamSource) -> None:
        self.source = source
        self.entries: dict[str, data.NodeEntry] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=source.run, args=(self._stop.is_set, self._deliver), daemon=True)

    def _deliver(self, entry: data.NodeEntry) -> None:
        self.entries[entry.name] = entry

    def __enter__(self) -> Running:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.source.close()

    def wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.entries}"
            time.sleep(0.05)


def _hosts(directory: str) -> tuple[list[Any], dict[str, Any]]:
    return resolve_hosts(os.path.join(directory, "inventory.yml"), None)


def _with_args(hosts: list[Any], args: str, **more: Any) -> list[Any]:
    return [dataclasses.replace(h, vars={**h.vars, "ansible_ssh_common_args": args}, **more) for h in hosts]


def _ssh_children() -> list[tuple[int, str]]:
    """(pid, state) of this process's child processes named ssh (a zombie is state Z)."""
    out = []
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if comm == "ssh" and fields[1] == me:
            out.append((int(pid), fields[0]))
    return out


def _problem(entry: data.NodeEntry) -> str:
    assert entry.problem is not None, entry
    return entry.problem.check


def _host_key(directory: str) -> str:
    return " ".join(Path(directory, "ssh_host_ed25519_key.pub").read_text().split()[:2])


@needs_ssh
def test_openssh_argv_is_read_by_ssh_as_the_target_says(tmp_path: Path) -> None:
    """``ssh -G`` prints the configuration ssh would use: the argv's options come through as the
    Target holds them (quoted paths with spaces, a literal %, StrictHostKeyChecking no passed as
    accept-new, several known hosts files), nothing from any ssh_config."""
    from fleetops.fleet import sshconfig

    weird = tmp_path / "my keys" / "id 100%"
    target = sshconfig.Target(
        name="n1", hostname="127.71.3.9", port=2299, user="ops", key_files=(str(weird),),
        known_hosts=(str(tmp_path / "kh one"), str(tmp_path / "kh2")), global_known_hosts=(),
        strict="no", connect_timeout=2.5,
    )  # fmt: skip
    ssh = transport.openssh_client()
    assert ssh is not None
    argv = transport.ssh_argv(ssh, target, [str(weird)], 5.0, 15.0, "true")
    assert argv[-2:] == ["127.71.3.9", "true"]
    shown = subprocess.run([argv[0], "-G", *argv[1:-1]], capture_output=True, text=True, check=True).stdout
    conf: dict[str, list[str]] = {}
    for line in shown.splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key, []).append(value)
    assert conf["hostname"] == ["127.71.3.9"] and conf["port"] == ["2299"] and conf["user"] == ["ops"]
    # -G prints IdentityFile before ssh expands its tokens (%% is one %); a real connection with
    # such a path is in test_openssh_accept_new_records_the_key_then_a_changed_key_is_refused
    assert conf["identityfile"] == [str(weird).replace("%", "%%")]
    assert conf["userknownhostsfile"] == [f"{tmp_path / 'kh one'} {tmp_path / 'kh2'}"]
    assert conf["globalknownhostsfile"] == ["none"]
    assert conf["stricthostkeychecking"] == ["accept-new"]
    assert conf["connecttimeout"] == ["3"] and conf["serveraliveinterval"] == ["15"]
    assert conf["batchmode"] == ["yes"] and conf["identitiesonly"] == ["yes"]
    assert conf["hashknownhosts"] == ["no"] and conf["updatehostkeys"] == ["false"]
    assert conf["controlmaster"] == ["false"] and "controlpath" not in conf  # none: no ControlPath
    assert "proxyjump" not in conf and "proxycommand" not in conf


@needs_ssh
def test_openssh_unknown_host_key_is_unreach_hostkey_and_nothing_recorded(
    fleet_dir: tuple[str, Daemon], tmp_path: Path
) -> None:
    directory, _ = fleet_dir
    hosts, baselines = _hosts(directory)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    source = stream_source(_with_args(hosts[:2], f"-o UserKnownHostsFile={empty}"), baselines, "openssh")
    with Running(source) as run:
        run.wait(lambda: len(run.entries) == 2, 30, "both nodes marked")
        for name in NODES[:2]:
            entry = run.entries[name]
            assert entry.display_health == "unreach" and _problem(entry) == "transport.hostkey", entry.problem
            assert entry.problem is not None and "host key" in entry.problem.message.lower()
        assert source.stream_counts() == (0, 0)
    assert empty.read_text() == ""


@needs_ssh
def test_openssh_accept_new_records_the_key_then_a_changed_key_is_refused(
    fleet_dir: tuple[str, Daemon], tmp_path: Path
) -> None:
    """accept-new records the node's key in the first user known hosts file, plain
    ``[addr]:port`` as the paramiko path writes it; once recorded, a different key is refused.
    The client key is copied to a path with a space and a % in it: ssh gets it as it is."""
    directory, _ = fleet_dir
    hosts, baselines = _hosts(directory)
    host = hosts[0]
    folder = tmp_path / "my keys"
    folder.mkdir()
    key = folder / "id 100%"
    shutil.copy(host.key_file, key)
    key.chmod(0o600)
    first, second = tmp_path / "kh_first", tmp_path / "kh_second"
    args = f"-o StrictHostKeyChecking=accept-new -o 'UserKnownHostsFile={first} {second}'"
    accepting = _with_args([host], args, key_file=str(key))
    source = stream_source(accepting, baselines, "openssh")
    with Running(source) as run:
        run.wait(lambda: host.name in run.entries and run.entries[host.name].status == data.STATUS_OK, 30, "data")
        assert source.node_state(host.name) == stream.STREAMING
    assert first.read_text() == f"[{host.address}]:{host.port} {_host_key(directory)}\n"
    assert not second.exists()
    # the host "reinstalled": another key on file for it now
    fake = tmp_path / "fake"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(fake)], check=True)
    fake_pub = " ".join(Path(str(fake) + ".pub").read_text().split()[:2])
    first.write_text(f"[{host.address}]:{host.port} {fake_pub}\n")
    source = stream_source(accepting, baselines, "openssh")
    with Running(source) as run:
        run.wait(lambda: host.name in run.entries, 30, "the node marked")
        entry = run.entries[host.name]
        assert entry.display_health == "unreach" and _problem(entry) == "transport.hostkey", entry.problem
        assert entry.problem is not None and "CHANGED" in entry.problem.message
    assert first.read_text() == f"[{host.address}]:{host.port} {fake_pub}\n"


@needs_ssh
def test_openssh_wrong_key_is_auth_and_a_closed_port_is_unreachable(
    fleet_dir: tuple[str, Daemon], tmp_path: Path
) -> None:
    directory, _ = fleet_dir
    hosts, baselines = _hosts(directory)
    wrong = tmp_path / "wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind((hosts[1].address, 0))
        closed = sock.getsockname()[1]
    odd = [dataclasses.replace(hosts[0], key_file=str(wrong)), dataclasses.replace(hosts[1], port=closed)]
    source = stream_source(odd, baselines, "openssh")
    with Running(source) as run:
        run.wait(lambda: len(run.entries) == 2, 30, "both nodes marked")
        assert _problem(run.entries[hosts[0].name]) == "transport.auth", run.entries[hosts[0].name].problem
        closed_problem = run.entries[hosts[1].name].problem
        assert _problem(run.entries[hosts[1].name]) == "transport.unreachable", closed_problem
        assert closed_problem is not None and "refused" in closed_problem.message.lower()
        assert all(run.entries[n].display_health == "unreach" for n in (hosts[0].name, hosts[1].name))


@needs_ssh
def test_openssh_a_hung_sshd_is_a_connect_timeout(fleet_dir: tuple[str, Daemon]) -> None:
    """TCP connects, no banner ever comes: ssh's ConnectTimeout ends it, a ``timeout``."""
    directory, _ = fleet_dir
    hosts, _ = _hosts(directory)
    opener = transport.OpenSSHStreamOpener(connect_timeout=1.0, global_known_hosts="")
    fleet.inject(directory, hosts[3].name, "host-hang")
    try:
        with pytest.raises(transport.StreamFailure) as failed:
            opener.open(hosts[3], stream.relay_command("fleetops-agent"))
    finally:
        fleet.clear(directory, hosts[3].name, "host-hang")
    assert failed.value.kind == "timeout", failed.value.message
    assert _ssh_children() == []


@needs_ssh
def test_openssh_connected_to_a_silent_daemon_is_streaming_never_unreach(fleet_dir: tuple[str, Daemon]) -> None:
    """The daemon stopped before the streams open: ssh connects and the relay starts (its line
    comes), nothing else does. Every node is then connected (the opener returned), none is
    UNREACH; the data flows once the daemon runs again."""
    directory, daemon = fleet_dir
    hosts, baselines = _hosts(directory)
    daemon.signal(signal.SIGSTOP)
    try:
        source = stream_source(hosts, baselines, "openssh")
        with Running(source) as run:
            run.wait(lambda: streaming(source), 30, "every node connected")
            assert source.unreachable_marks == {} and run.entries == {}
            daemon.signal(signal.SIGCONT)
            run.wait(
                lambda: len(run.entries) == len(NODES)
                and all(e.status == data.STATUS_OK for e in run.entries.values()),
                30,
                "the data",
            )
            assert source.unreachable_marks == {}
    finally:
        daemon.signal(signal.SIGCONT)


@needs_ssh
def test_openssh_open_edges_and_close_leaves_no_ssh_process(fleet_dir: tuple[str, Daemon]) -> None:
    """A command that ends before the started line is a stream that started and ended (its
    status and stderr kept: sudo refusing reads so); one that never prints it is a ``timeout``
    and its ssh is gone; a streaming source's close ends and reaps every ssh it started."""
    directory, _ = fleet_dir
    hosts, baselines = _hosts(directory)
    opener = transport.OpenSSHStreamOpener(connect_timeout=2.0, global_known_hosts="", start_margin_s=1.0)
    ended = opener.open(hosts[0], ["sh", "-c", "echo 'sudo: a password is required' >&2; exit 1"])
    assert isinstance(ended, transport.ProcessStream)
    assert ended.exit_status(wait_s=10) == 1
    ended.send(b"watch\n")  # as StreamSource does: the end is read from the stream, not raised here
    assert "a password is required" in ended.stderr()
    deadline = time.monotonic() + 10
    while (got := ended.read()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == b""
    ended.close()
    with pytest.raises(transport.StreamFailure) as failed:
        opener.open(hosts[0], ["sleep", "30"])
    assert failed.value.kind == "timeout", failed.value.message
    assert _ssh_children() == []

    source = stream_source(hosts, baselines, "openssh")
    with Running(source) as run:
        run.wait(lambda: streaming(source) and len(run.entries) == len(NODES), 30, "every node streaming")
        pids = [s.pid for s in (source._nodes[n].stream for n in NODES) if isinstance(s, transport.ProcessStream)]
        assert len(pids) == len(NODES)
        assert sorted(p for p, _ in _ssh_children()) == sorted(pids)
    assert _ssh_children() == []  # no ssh left, no zombie either


def test_paramiko_stream_whose_command_ended_before_the_first_write_reads_as_ended(
    fleet_dir: tuple[str, Daemon],
) -> None:
    """The relay exits at once when no daemon socket is there; on a loaded machine the host's
    close can arrive before the source writes ``watch``. That write is no failure (the
    connection is up): the end, its status and stderr are read from the stream, as with the
    OpenSSH stream. Once closed here, a write is an error."""
    directory, _ = fleet_dir
    hosts, baselines = _hosts(directory)
    opener = stream_source(hosts, baselines, "paramiko").opener
    ended = opener.open(hosts[0], ["sh", "-c", "echo 'fleetops relay: no daemon socket' >&2; exit 3"])
    assert isinstance(ended, transport.Stream)
    assert ended.exit_status(wait_s=10) == 3
    deadline = time.monotonic() + 10
    while not ended._channel.closed:  # the race, made certain: the host's close came first
        assert time.monotonic() < deadline, "the channel did not close"
        time.sleep(0.02)
    assert ended.active is False
    ended.send(b"watch\n")
    assert ended.read() == b""
    assert "no daemon socket" in ended.stderr()
    ended.close()
    with pytest.raises(OSError, match="stream closed"):
        ended.send(b"watch\n")


class _LateWriter:
    """An opener whose streams are handed back only once their command has ended, so the
    source's first write always comes after the relay's end (the loaded machine's order)."""

    def __init__(self, opener: Any) -> None:
        self.opener = opener
        self.opened = 0

    def open(self, host: Any, command: Any, env: Any = None) -> Any:
        s = self.opener.open(host, command, env)
        self.opened += 1
        s.exit_status(wait_s=10)
        deadline = time.monotonic() + 10
        while s.active and time.monotonic() < deadline:
            time.sleep(0.02)
        return s


def test_stream_daemon_absent_relay_ended_before_the_write_is_polled_never_unreach(
    fleet_dir: tuple[str, Daemon],
) -> None:
    """No daemon: every stream's relay ends before the source writes to it, over and over (the
    source retries the stream every second). Each node is polled with a cold collect and none
    is ever marked unreachable."""
    directory, daemon = fleet_dir
    hosts, baselines = _hosts(directory)
    daemon.stop()
    source = stream_source(hosts, baselines, "paramiko")
    late = _LateWriter(source.opener)
    source.opener = late
    with Running(source) as run:
        run.wait(
            lambda: all(source.node_state(n) == stream.POLLING for n in NODES)
            and len(run.entries) == len(NODES)
            and late.opened >= 3 * len(NODES),
            60,
            "every node polled, its stream retried",
        )
        assert all(e.status == data.STATUS_OK for e in run.entries.values()), run.entries
        assert source.unreachable_marks == {}
