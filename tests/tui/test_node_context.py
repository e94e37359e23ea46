"""The node's context on the node screen, through the real app and its Pilot: its Slurm State and
Reason with the drain's owner (read from a real slurmctld, again after a drain and a resume from
the TUI), since when it is bad (in the header and the nodes view's column, kept through STALE),
the copy-command key (the exact ``fleetops reset`` / ``fleetops drain`` line on the clipboard),
the processes of each GPU (count and largest in the GPU table; PID, user, command, memory, MIG
instance on the GPU tab), and every finding's action read in full at 120 columns."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from fleetops import model
from fleetops.fleet.inventory import Host
from fleetops.sim import gpu as sim
from fleetops.tui import data, simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.drain import DrainScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.source import SshSource
from fleetops.tui.widgets.fleet_table import FleetTable

from . import slurmctld
from .conftest import NAMES, drive, fed_app, fed_entries, screen_lines, wait_for

ENTRIES = fed_entries()
T0 = simfeed.T0
HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu02: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
INVENTORY = "/srv/fleet inventories/prod.yml"  # a space: the copied command must quote it


def entry_of(name: str) -> data.NodeEntry:
    return ENTRIES[NAMES.index(name)]


def header(app: Any) -> str:
    return str(app.screen.query_one("#node-header", Static).render())


def slurm(app: Any) -> str:
    """The node screen's Slurm lines, as drawn from their widget's text."""
    return str(app.screen.query_one("#node-slurm", Static).render())


STAMP = r"\(set by root at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\)"  # slurmctld's, of this run


def messages(app: Any) -> list[str]:
    return [str(n.message) for n in app._notifications]


# --- Slurm State and Reason, from a real slurmctld ------------------------------------------


class QuietSource(SshSource):
    """The real source for everything Slurm (``slurm_node``, ``drain``, ``resume`` through
    ops.slurm and scontrol); the fleet's data is fed by the test (``fed``: what a collect after
    an action answers), so its poll loop only waits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fed: dict[str, data.NodeEntry] = {}

    def run(self, should_stop: Any, deliver: Any) -> None:
        import time

        while not should_stop():
            time.sleep(0.05)

    def collect(self, name: str, after_action: bool = False) -> data.NodeEntry:
        return self.fed.get(name) or data.pending_entry(name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurmctld.Slurm]:
    reason = slurmctld.skip_reason()
    if reason:
        pytest.skip(reason)
    slurm = slurmctld.start(tmp_path_factory.mktemp("slurmctld"), ["gpu01", "gpu02"])
    try:
        yield slurm
    finally:
        slurmctld.stop(slurm)


@pytest.fixture
def slurm_app(cluster: slurmctld.Slurm, monkeypatch: pytest.MonkeyPatch) -> Iterator[FleetApp]:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # scontrol on the controller: this cluster
    for node in ("gpu01", "gpu02"):
        if "DRAIN" in cluster.show(node)[0]:
            cluster.run("update", f"NodeName={node}", "State=RESUME")
    # the health program's drain, set with the cluster's own scontrol as the program sets it
    cluster.run("update", "NodeName=gpu02", "State=DRAIN", f"Reason={HEALTH}")
    hosts = [
        Host(name="gpu01", address="127.0.0.1"),
        Host(name="gpu02", address="127.0.0.1"),
        Host(name="gpu09", address="127.0.0.1"),  # not in slurm.conf
        Host(name="ws01", address="127.0.0.1", vars={"fleetops_slurm_managed": False}),
        # its Slurm host does not answer SSH (nothing listens there)
        Host(name="gpu03", address="127.0.0.1", vars={"fleetops_slurm_host": "127.0.77.77"}),
    ]
    source = QuietSource(hosts, {}, interval=600.0, connect_timeout=2.0, command_timeout=5.0)
    source.__dict__["operator_run"] = "alice@ctl01"
    app = FleetApp(source, clock=lambda: T0 + 5, tick_s=0)
    try:
        yield app
    finally:
        source.close()


def _fed(name: str) -> data.NodeEntry:
    # the simulator's node under this name, so the screen has GPUs and findings to show
    return replace(entry_of("node011"), name=name)


@pytest.mark.root  # munged and slurmctld run as root
def test_the_header_shows_slurm_state_reason_and_owner_read_from_slurmctld(slurm_app: FleetApp, cluster) -> None:
    app = slurm_app

    async def body(pilot: Any) -> None:
        app.feed([_fed("gpu02")])
        app.push_screen(NodeScreen("gpu02"))
        await pilot.pause()
        await wait_for(pilot, lambda: "Reason " in slurm(app), 30, "gpu02's Slurm lines")
        state, reason = cluster.show("gpu02")
        assert reason == HEALTH and "DRAIN" in state
        expected = (
            rf" Slurm {re.escape(state)} \(drained\)  owner: health, run 20261206T031207Z-7c1e-gpu02\n"
            rf" Reason {re.escape(HEALTH)}  {STAMP}"
        )
        assert re.fullmatch(expected, slurm(app)), slurm(app)

    drive(app, body)


@pytest.mark.root  # munged and slurmctld run as root
def test_a_drain_and_a_resume_from_the_tui_are_read_back_into_the_header(slurm_app: FleetApp, cluster) -> None:
    app = slurm_app
    worst = entry_of("node011").worst
    assert worst is not None

    async def body(pilot: Any) -> None:
        fed = _fed("gpu01")
        app.source.fed["gpu01"] = fed  # type: ignore[union-attr]
        app.feed([fed])
        before = cluster.show("gpu01")
        assert "DRAIN" not in before[0] and before[1] is None, before  # not drained, no Reason
        app.push_screen(NodeScreen("gpu01"))
        await pilot.pause()
        # the State alone: no drain, no owner, no Reason
        await wait_for(pilot, lambda: slurm(app) == f" Slurm {before[0]}", 30, "gpu01's Slurm state")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, DrainScreen), 10, "the drain's reason prompt")
        await pilot.press("enter")  # the reason as prefilled: the worst finding's check
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the drain")
        assert app.last_action.ok, app.last_action
        reason = f"[fleetops] operator/alice@ctl01: {worst.check}"
        await wait_for(pilot, lambda: f"Reason {reason}" in slurm(app), 30, "the drain read back")
        state = cluster.show("gpu01")[0]
        assert "DRAIN" in state
        expected = rf" Slurm {re.escape(state)} \(drained\)  owner: operator, run alice@ctl01\n Reason {re.escape(reason)}  {STAMP}"
        assert re.fullmatch(expected, slurm(app)), slurm(app)
        app.last_action = None
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the resume dialog")
        await pilot.press("tab", "enter")
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the resume")
        assert app.last_action.ok, app.last_action
        await wait_for(pilot, lambda: "Reason " not in slurm(app), 30, "the resume read back")
        after = cluster.show("gpu01")
        assert "DRAIN" not in after[0] and after[1] is None, after
        assert slurm(app) == f" Slurm {after[0]}"

    drive(app, body)


@pytest.mark.root  # munged and slurmctld run as root
def test_a_node_slurm_does_not_know_or_the_inventory_excludes_is_not_a_slurm_node(slurm_app: FleetApp) -> None:
    app = slurm_app

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("gpu09"))
        await pilot.pause()
        await wait_for(pilot, lambda: "not a Slurm node" in slurm(app), 30, "gpu09's Slurm line")
        assert slurm(app) == (
            " Slurm not a Slurm node (Slurm (asked from the controller) knows no node named 'gpu09': set "
            "fleetops_slurm_node_name for gpu09 in the inventory to its Slurm name)"
        )
        app.pop_screen()
        app.push_screen(NodeScreen("ws01"))
        await pilot.pause()
        await wait_for(pilot, lambda: "not a Slurm node" in slurm(app), 30, "ws01's Slurm line")
        assert slurm(app) == " Slurm not a Slurm node (fleetops_slurm_managed: false in the inventory)"

    drive(app, body)


@pytest.mark.root  # munged and slurmctld run as root
def test_a_slurm_host_that_does_not_answer_says_why_slurm_was_not_read(slurm_app: FleetApp) -> None:
    app = slurm_app

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("gpu03"))
        await pilot.pause()
        await wait_for(pilot, lambda: "not read" in slurm(app), 30, "gpu03's Slurm line")
        assert slurm(app).startswith(" Slurm not read: scontrol on Slurm host 127.0.77.77 failed: "), slurm(app)

    drive(app, body)


def test_without_a_live_source_the_header_says_slurm_was_not_read() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node003"))
        await pilot.pause()
        assert slurm(app) == " Slurm not read: no live source to ask Slurm through"

    drive(app, body, ENTRIES)


# --- bad since --------------------------------------------------------------------------------


def _ok(name: str, at: float, previous: data.NodeEntry | None = None) -> data.NodeEntry:
    return simfeed.entry(name, (), now=at, previous=previous)


def _bad(name: str, at: float, previous: data.NodeEntry | None = None) -> data.NodeEntry:
    # a PCIe downgrade: a fault without a time of its own (no XID), dated when first seen
    return simfeed.entry(name, ["pcie-downgrade@1"], now=at, previous=previous)


def _nodes_cell(app: FleetApp, name: str, key: str) -> str:
    table = app.screen.query_one("#view-nodes", FleetTable)
    row = table.row(name)
    assert row is not None, name
    return dict(zip((c.key for c in data.COLUMNS["nodes"]), row.cells, strict=True))[key]


def test_bad_since_is_when_the_node_turned_bad_and_holds_through_stale_until_ok() -> None:
    now = [T0]
    app = FleetApp(None, names=NAMES, clock=lambda: now[0], tick_s=0)

    async def body(pilot: Any) -> None:
        first = _ok("node001", T0)
        app.feed([first])
        await pilot.pause()
        assert _nodes_cell(app, "node001", "bad") == ""
        now[0] = T0 + 60
        bad = _bad("node001", T0 + 60, first)
        assert bad.health == "warn"
        app.feed([bad])
        now[0] = T0 + 60 + 14 * 60 + 7  # 14 min later, still bad
        later = _bad("node001", now[0], bad)
        app.feed([later])
        await pilot.pause()
        assert app.state.entries["node001"].bad_since == T0 + 60
        assert _nodes_cell(app, "node001", "bad") == "08:01 14m"  # T0 is 08:00:00 UTC
        app.push_screen(NodeScreen("node001"))
        await pilot.pause()
        assert "bad since 08:01:00 UTC (14m07s)" in header(app), header(app)
        # the stream goes silent, then speaks again: the bad period goes on, from its start
        stale = data.mark_failed(
            "node001", data.STATUS_STALE,
            model.Finding("transport.stale", "warn", "node001", "no news from the daemon for 40s"), later,
        )  # fmt: skip
        app.feed([stale])
        await pilot.pause()
        assert "STALE" in header(app) and "bad since 08:01:00 UTC" in header(app), header(app)
        again = _bad("node001", now[0] + 45, stale)
        app.feed([again])
        await pilot.pause()
        assert app.state.entries["node001"].bad_since == T0 + 60
        # OK again: no bad since, in the header nor in the column
        healed = _ok("node001", now[0] + 90, again)
        app.feed([healed])
        await pilot.pause()
        assert app.state.entries["node001"].bad_since is None
        assert "bad since" not in header(app)
        app.pop_screen()
        await pilot.pause()
        assert _nodes_cell(app, "node001", "bad") == ""

    drive(app, body)


def test_bad_since_takes_the_xids_own_time_and_a_node_that_stops_answering_is_dated_when_seen() -> None:
    now = [T0 + 5]
    app = FleetApp(None, names=NAMES, clock=lambda: now[0], tick_s=0)

    async def body(pilot: Any) -> None:
        app.feed(ENTRIES)
        await pilot.pause()
        # node011's GPU fell off the bus at T0-120 (XID 79, the kernel's time); seen at T0
        assert app.state.entries["node011"].bad_since == T0 - 120
        assert _nodes_cell(app, "node011", "bad") == "07:58 2m"
        now[0] = T0 + 30
        gone = data.mark_failed(
            "node002", "unreachable",
            model.Finding("transport.unreachable", "crit", "node002", "unreachable: connection refused"),
            entry_of("node002"),
        )  # fmt: skip
        app.feed([gone])
        await pilot.pause()
        assert app.state.entries["node002"].bad_since == T0 + 30
        now[0] = T0 + 90
        app.feed([data.mark_failed("node002", "unreachable", gone.problem, gone)])  # type: ignore[arg-type]
        await pilot.pause()
        assert app.state.entries["node002"].bad_since == T0 + 30  # still the first time seen
        app.push_screen(NodeScreen("node011"))
        await pilot.pause()
        assert "bad since 07:58:00 UTC (3m30s)" in header(app), header(app)

    drive(app, body)


def test_the_nodes_view_sorts_by_bad_since_longest_bad_first() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("B")
        table = app.screen.query_one("#view-nodes", FleetTable)
        since = {e.name: e.bad_since for e in app.state.entries.values()}
        # node003 and node011 from their XIDs' time (T0-120, ties in inventory order), the
        # others from when they were seen (T0); the healthy after them, in inventory order
        assert (since["node003"], since["node011"], since["node005"], since["node008"]) == (T0 - 120, T0 - 120, T0, T0)
        ok = [n for n in NAMES if n not in ("node003", "node005", "node008", "node011")]
        assert table.keys == ["node003", "node011", "node005", "node008", *ok]
        assert all(since[n] is None for n in ok)

    drive(app, body, ENTRIES)


def test_a_held_throttle_dates_the_bad_state_from_its_first_sample() -> None:
    snap = entry_of("node001").snapshot
    assert snap is not None
    held = model.Finding(
        "thermal_power.throttle", "warn", "node001", "GPU 0: clocks were held down by hw_slowdown",
        gpu=model.gpu_ref(snap.gpus[0]),
        observed={"reasons": ["hw_slowdown"], "first_seen": T0 - 600, "last_seen": T0 - 30},
    )  # fmt: skip
    e = data.summarize("node001", snap, [held], T0)
    assert e.health == "warn" and e.bad_since == T0 - 600


# --- the copy-command key -------------------------------------------------------------------


def _parse(command: str) -> Any:
    from fleetops import cli

    argv = shlex.split(command)
    assert argv[0] == "fleetops"
    return cli.build_parser().parse_args(argv[1:])


def test_c_copies_the_reset_of_the_selected_gpu_and_the_drain_of_a_lost_gpus_node() -> None:
    app = FleetApp(None, names=NAMES, clock=lambda: T0 + 5, tick_s=0, inventory=INVENTORY)
    node008, node011 = entry_of("node008"), entry_of("node011")
    gpu6 = node008.gpus[6]
    lost = next(g for g in node011.gpus if g.lost)
    assert node011.worst is not None and node011.worst.check == "config.gpu_missing"

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node008", select_gpu=gpu6.uuid))
        await pilot.pause()
        await pilot.press("c")
        reset = f"fleetops reset -i '/srv/fleet inventories/prod.yml' node008 {gpu6.uuid}"
        assert app.clipboard == reset
        assert messages(app) == [reset]  # the toast shows the command whole
        args = _parse(app.clipboard)
        assert (args.command, args.inventory, args.node, args.gpu) == ("reset", INVENTORY, "node008", gpu6.uuid)
        await pilot.press("C")  # the node's drain
        drain8 = "fleetops drain -i '/srv/fleet inventories/prod.yml' node008 --reason " + str(node008.worst.check)  # type: ignore[union-attr]
        assert app.clipboard == drain8
        app.pop_screen()
        app.push_screen(NodeScreen("node011", select_gpu=lost.uuid))
        await pilot.pause()
        await pilot.press("c")  # a lost GPU cannot be reset: the node's drain
        drain = "fleetops drain -i '/srv/fleet inventories/prod.yml' node011 --reason config.gpu_missing"
        assert app.clipboard == drain
        args = _parse(app.clipboard)
        assert (args.command, args.inventory, args.nodes, args.reason) == (
            "drain", INVENTORY, ["node011"], "config.gpu_missing"
        )

    drive(app, body, ENTRIES)


def test_c_on_the_fleet_screen_copies_the_rows_command() -> None:
    app = FleetApp(None, names=NAMES, clock=lambda: T0 + 5, tick_s=0, inventory="/etc/fleetops/hosts.yml")
    node003 = entry_of("node003")
    assert node003.worst is not None and node003.worst.check == "memory.ecc_dbe_volatile"

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node003")
        await pilot.press("c")
        assert app.clipboard == "fleetops drain -i /etc/fleetops/hosts.yml node003 --reason memory.ecc_dbe_volatile"
        await pilot.press("2")  # the gpus view: a GPU row's reset
        gpu3 = node003.gpus[3]
        app.screen.table().select_key(f"node003:{gpu3.uuid}")
        await pilot.press("c")
        assert app.clipboard == f"fleetops reset -i /etc/fleetops/hosts.yml node003 {gpu3.uuid}"

    drive(app, body, ENTRIES)


def test_the_tui_command_passes_its_inventory_path_to_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fleetops tui -i PATH``: the app knows PATH (absolute), for the commands it copies."""

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n")
    seen: list[Any] = []
    monkeypatch.setattr(FleetApp, "run", lambda self: seen.append(self.inventory))
    monkeypatch.chdir(tmp_path)
    from fleetops import cli

    assert cli.main(["tui", "-i", "hosts.yml", "--readonly"]) == 0
    assert seen == [str(inventory)]


# --- processes per GPU ------------------------------------------------------------------------


def _gpu_cells(app: Any, uuid: str) -> dict[str, str]:
    table = app.screen.query_one("#node-gpus", FleetTable)
    row = table.row(uuid)
    assert row is not None
    return dict(zip((c.key for c in table.spec), row.cells, strict=True))


def test_the_gpu_table_counts_processes_and_the_gpu_tab_lists_each_with_its_user() -> None:
    node008 = entry_of("node008")
    gpu6 = node008.gpus[6]
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node008", select_gpu=gpu6.uuid))
        await pilot.pause()
        assert _gpu_cells(app, gpu6.uuid)["procs"] == "1 20G"  # the stray process, 20480 MiB
        assert _gpu_cells(app, node008.gpus[0].uuid)["procs"] == "0"
        await pilot.press("2")
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert f"\n  pid {sim.STRAY_PID} python3 train.py 20480 MiB  user {sim.STRAY_USER}" in detail, detail

    drive(app, body, ENTRIES)


def test_a_process_in_a_mig_instance_shows_its_user_and_instance() -> None:
    state = simfeed.sim_state("node002")
    state["gpus"][4]["mig_mode_current"] = True
    made = sim.set_mig_instances(state, 4, ["3g.71gb", "2g.35gb"])
    sim.add_process(state, 4, 4242, "vllm", 30720, user="alice")
    gi = made[1]["gpu_instance_id"]
    state["processes"]["4"][-1].update({"gpu_instance_id": gi, "compute_instance_id": 0})
    sim.add_process(state, 4, 4343, "python3", 2048)  # a record without an owner: user n/a
    entries = fed_entries({})
    entries[NAMES.index("node002")] = simfeed.entry("node002", state=state)
    uuid = state["gpus"][4]["uuid"]
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node002", select_gpu=uuid))
        await pilot.pause()
        assert _gpu_cells(app, uuid)["procs"] == "2 30G"
        await pilot.press("2")
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert f"\n      pid 4242 vllm 30720 MiB  user alice  GI {gi} CI 0" in detail, detail
        assert "\n  pid 4343 python3 2048 MiB  user n/a  GI - CI -" in detail, detail

    drive(app, body, entries, size=(160, 90))


# --- the action in full -----------------------------------------------------------------------


def _words(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize("width", [80, 120])
def test_every_findings_action_is_on_screen_in_full(width: int) -> None:
    node011 = entry_of("node011")
    actions = [f.action for f in node011.findings if f.action]
    assert len(actions) == 2 and all(len(a) > width for a in actions)  # longer than a line
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node011"))
        await pilot.pause()
        shown = _words(screen_lines(app))
        for action in actions:
            assert f"-> {' '.join(action.split())}" in shown, (action, shown)

    drive(app, body, ENTRIES, size=(width, 60))
