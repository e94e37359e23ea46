"""The drain's reason prompt, the drain of a filtered set through the capacity guard, and the
actions that preconditions refuse shown disabled with the reason, through the Pilot.

The Slurm side is the TUI's own source (``SshSource``: ``ops.slurm`` with the operator's owner)
against the strict stand-in scontrol (tests/fake_scontrol.py): what Slurm keeps is read back
with ``scontrol show node``, and every update it was sent is in its log. The source does not
poll (the test feeds the entries); everything else is the real app.
tests/ansible/test_tui_drains_realistic.py does the same against a real slurmctld."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fake_scontrol
import pytest
from textual.widgets import Input, Static

from fleetops.catalog import slurm as rule
from fleetops.fleet.inventory import Host
from fleetops.ops import slurm
from fleetops.tui import data, simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.screens.drain import DrainScreen
from fleetops.tui.screens.fleet import FleetScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.source import SshSource
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, FakeSource, drive, fed_app, fed_entries, wait_for

HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu02: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
RUN = "alice@ctl01"
SHOWN = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "ws01"]


class SlurmSide(SshSource):
    """The real source's drains and resumes; no polling, and a collect after an action gives
    back the entry the test fed (the Slurm side never touches the node)."""

    def __init__(self, hosts: list[Host], entries: dict[str, data.NodeEntry]) -> None:
        super().__init__(hosts, {}, interval=600.0, connect_timeout=1.0, command_timeout=5.0)
        self.fed = entries

    def run(self, should_stop: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        while not should_stop():
            time.sleep(0.02)

    def collect(self, name: str, after_action: bool = False) -> data.NodeEntry:
        return self.fed[name]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FleetApp, fake_scontrol.FakeSlurm]]:
    """30 Slurm nodes in one partition (10 %: at most 3 out at once), gpu02 drained by the
    health program; the inventory's gpu01-gpu05 and ws01, which is no Slurm node."""
    fs = fake_scontrol.FakeSlurm(tmp_path)
    monkeypatch.setenv("FAKE_SLURM", str(fs.db))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    nodes = fake_scontrol.cluster(30)
    nodes["gpu02"].update(state="IDLE+DRAIN", reason=HEALTH, by="slurm", at="2026-12-06T03:12:07")
    fs.set(nodes)
    hosts = [Host(name=f"gpu{i:02d}", address=f"127.0.0.{i}") for i in range(1, 6)]
    hosts.append(Host(name="ws01", address="127.0.0.9", vars={"fleetops_slurm_managed": False}))
    entries = {e.name: e for e in simfeed.fleet({h.name: (["xid:79@5"] if h.name == "gpu01" else []) for h in hosts})}
    source = SlurmSide(hosts, entries)
    source.__dict__["_slurm_control"] = slurm.SlurmControl(hosts, scontrol=str(fs.scontrol))
    source.__dict__["operator_run"] = RUN
    app = FleetApp(source, clock=lambda: simfeed.T0 + 5, tick_s=0)
    app.call_later(app.feed, list(entries.values()))
    try:
        yield app, fs
    finally:
        source.close()


def shown_reason(fs: fake_scontrol.FakeSlurm, node: str) -> str | None:
    """The Reason as ``scontrol show node`` prints it (slurmctld's stamp taken off)."""
    out = subprocess.run([str(fs.scontrol), "show", "node", "-o", node], capture_output=True, text=True, check=True)
    return rule.parse_node(out.stdout)[1]


async def open_drain(pilot: Any, app: FleetApp, node: str) -> DrainScreen:
    await wait_for(pilot, lambda: node in app.state.entries, 10, f"{node} fed")
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    screen.table().select_key(node)
    await pilot.press("d")
    assert isinstance(app.screen, DrainScreen)
    return app.screen


async def retype(pilot: Any, dialog: DrainScreen, text: str) -> None:
    """Empty the reason input and type ``text`` key by key, as an operator does."""
    field = dialog.query_one("#drain-reason", Input)
    field.cursor_blink = False
    await pilot.press("end", "ctrl+u")
    assert field.value == ""
    await pilot.press(*["space" if ch == " " else ch for ch in text])
    assert field.value == text


def guard_asked(fs: fake_scontrol.FakeSlurm) -> list[list[str]]:
    """The capacity guard's listings of every node (``scontrol show nodes -o``)."""
    return [c for c in fs.calls() if c[:2] == ["show", "nodes"]]


def error_text(dialog: DrainScreen) -> str:
    return str(dialog.query_one("#drain-error", Static).render())


# --- the reason prompt ----------------------------------------------------------------------


def test_the_reason_typed_in_the_prompt_is_the_reason_slurm_shows(cluster) -> None:
    app, fs = cluster
    worst = app.source.fed["gpu01"].worst

    async def body(pilot: Any) -> None:
        dialog = await open_drain(pilot, app, "gpu01")
        field = dialog.query_one("#drain-reason", Input)
        assert worst is not None and field.value == worst.check  # the worst finding, to edit
        typed = "GPU 5 fell off the bus; RMA ticket 4711"
        await retype(pilot, dialog, typed)
        preview = str(dialog.query_one("#drain-preview", Static).render())
        assert preview == f"Slurm's Reason: [fleetops] operator/{RUN}: {typed}", preview
        assert fs.updates() == []  # nothing sent while the operator types
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the drain")
        assert app.last_action.ok, app.last_action
        assert shown_reason(fs, "gpu01") == f"[fleetops] operator/{RUN}: {typed}"
        assert [c[1:] for c in fs.updates()] == [["NodeName=gpu01", "State=DRAIN", f"Reason=[fleetops] operator/{RUN}: {typed}"]]
        await wait_for(pilot, lambda: app.action_log.rows[0].outcome == "verified", 30, "the verdict after the drain")
        (row,) = app.action_log.rows
        assert (row.node, row.action) == ("gpu01", "drain")
        # settled by Slurm's State read after the drain, not by the node's GPUs
        assert re.fullmatch(
            rf"gpu01 after drain: Slurm State [A-Z_+]*DRAIN[A-Z_+]*, Reason {re.escape(f'[fleetops] operator/{RUN}: {typed}')}",
            row.why,
        ), row.why

    drive(app, body)


def test_an_empty_or_overlong_reason_is_refused_in_the_prompt_and_esc_sends_nothing(cluster) -> None:
    app, fs = cluster

    async def body(pilot: Any) -> None:
        dialog = await open_drain(pilot, app, "gpu03")
        await retype(pilot, dialog, "")
        await pilot.press("enter")
        assert app.screen is dialog  # still asking
        assert error_text(dialog) == (
            "not sent: a reason is needed: it is what Slurm's Reason (sinfo -R) tells the next person"
        )
        room = rule.MAX_REASON - len(f"[fleetops] operator/{RUN}: ")
        field = dialog.query_one("#drain-reason", Input)
        field.value = "x" * (room + 1)
        await pilot.press("enter")
        assert app.screen is dialog
        assert error_text(dialog).startswith(f"not sent: the reason is {room + 1} characters; at most {room} fit"), (
            error_text(dialog)
        )
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        await pilot.pause()
        assert fs.updates() == [] and guard_asked(fs) == []  # nothing sent, no guard asked
        (row,) = app.action_log.rows
        assert (row.node, row.action, row.outcome, row.why) == (
            "gpu03", "drain", "cancelled", "cancelled at the reason prompt: nothing sent",
        )  # fmt: skip
        assert app.last_action is None

    drive(app, body)


# --- the drain of the filtered set ----------------------------------------------------------


def test_the_filtered_drain_drains_the_allowed_nodes_once_and_refuses_the_rest_with_the_guards_reason(
    cluster,
) -> None:
    app, fs = cluster
    guard = (
        "partition gpu: 1 of 30 nodes are out of service already (gpu02); draining gpu01, gpu03, gpu04 "
        "would make 4, more than the allowed 3 (10%)"
    )

    async def body(pilot: Any) -> None:
        await wait_for(pilot, lambda: len(app.state.entries) == 6, 10, "the nodes fed")
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        screen.set_filter("gpu0[1-5]|ws01")
        await pilot.press("ctrl+d")
        dialog = app.screen
        assert isinstance(dialog, DrainScreen)
        assert "Filter /gpu0[1-5]|ws01/: 6 nodes" in str(dialog.query_one("#dialog-body", Static).render())
        await wait_for(pilot, lambda: dialog.plan is not None, 30, "the capacity guard's answer")
        plan = str(dialog.query_one("#drain-plan", Static).render()).splitlines()
        assert plan == [
            "Will drain (2): gpu01, gpu03",
            "Refused, not sent (3):",
            "  gpu02: drained by the health program (run 20261206T031207Z-7c1e-gpu02): "
            "memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0; left as it is",
            f"  gpu04: not drained: {guard}",
            f"  gpu05: not drained: {guard.replace('gpu04 would', 'gpu05 would')}",
            "Not Slurm nodes, not sent (1):",
            "  ws01: cannot drain: ws01 is not managed by Slurm (fleetops_slurm_managed: false)",
        ], plan
        assert fs.updates() == []  # the guard was asked; nothing was sent
        await retype(pilot, dialog, "bad PSU batch, vendor case 88")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.action_log.rows) == 6, 30, "every node's outcome")
        reason = f"[fleetops] operator/{RUN}: bad PSU batch, vendor case 88"
        assert [c[1:] for c in fs.updates()] == [
            ["NodeName=gpu01", "State=DRAIN", f"Reason={reason}"],
            ["NodeName=gpu03", "State=DRAIN", f"Reason={reason}"],
        ]  # each allowed node once, nothing else
        assert (shown_reason(fs, "gpu01"), shown_reason(fs, "gpu03")) == (reason, reason)
        assert shown_reason(fs, "gpu02") == HEALTH
        assert "DRAIN" not in fs.nodes()["gpu04"]["state"] and "DRAIN" not in fs.nodes()["gpu05"]["state"]
        rows = {r.node: r for r in app.action_log.rows}
        assert {n: (r.action, r.outcome) for n, r in rows.items()} == {
            "gpu01": ("drain", "sent"),
            "gpu03": ("drain", "sent"),
            "gpu02": ("drain", "refused"),
            "gpu04": ("drain", "refused"),
            "gpu05": ("drain", "refused"),
            "ws01": ("drain", "refused"),
        }
        assert rows["gpu01"].why == f"gpu01: drained ({reason})"
        assert rows["gpu04"].why == f"gpu04: not drained: {guard}"
        assert rows["gpu02"].why.startswith("gpu02: drained by the health program")
        assert rows["ws01"].why == "ws01: cannot drain: ws01 is not managed by Slurm (fleetops_slurm_managed: false)"

    drive(app, body)


def test_the_filtered_drain_without_a_filter_refuses_and_asks_nothing(cluster) -> None:
    app, fs = cluster

    async def body(pilot: Any) -> None:
        await wait_for(pilot, lambda: len(app.state.entries) == 6, 10, "the nodes fed")
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        messages = [str(n.message) for n in app._notifications]
        assert messages == ["filter first (/): a drain of every node the screen shows is not offered"], messages
        assert fs.updates() == [] and guard_asked(fs) == []

    drive(app, body)


# --- actions shown disabled, with the reason, before any key --------------------------------


def note(app: FleetApp) -> str:
    widget = app.screen.query_one("#disabled-note", Static)
    return str(widget.render()) if widget.display else ""


def test_resume_of_another_owners_drain_is_disabled_with_the_owner_named_and_follows_the_drains(cluster) -> None:
    app, fs = cluster

    async def body(pilot: Any) -> None:
        await wait_for(pilot, lambda: len(app.state.entries) == 6, 10, "the nodes fed")
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        screen.table().select_key("gpu02")
        await wait_for(pilot, lambda: "u Resume: resume refused: gpu02" in note(app), 30, "gpu02's drain read")
        assert app.active_bindings["u"].enabled is False
        assert screen.check_action("resume", ()) is None
        assert app.active_bindings["d"].enabled is True
        assert note(app) == (
            "disabled: u Resume: resume refused: gpu02: drained by the health program (run "
            "20261206T031207Z-7c1e-gpu02): memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0 [set by slurm at "
            "2026-12-06T03:12:07], not by this run; left drained; an operator can lift it with: fleetops "
            "resume --force"
        ), note(app)
        await pilot.press("u")  # pressed all the same: refused at once with the reason, no dialog
        await wait_for(pilot, lambda: len(app.action_log.rows) == 1, 30, "the refusal")
        assert isinstance(app.screen, FleetScreen)
        assert (app.action_log.rows[0].node, app.action_log.rows[0].outcome) == ("gpu02", "refused")
        # a node that is no Slurm node: drain and resume disabled, nothing asked of Slurm for it
        before = len(fs.calls())
        screen.table().select_key("ws01")
        await pilot.pause(0.2)
        assert (app.active_bindings["d"].enabled, app.active_bindings["u"].enabled) == (False, False)
        assert note(app) == (
            "disabled: d Drain, u Resume: ws01: cannot drain or resume: ws01 is not managed by Slurm "
            "(fleetops_slurm_managed: false)"
        ), note(app)
        assert len(fs.calls()) == before
        # gpu03 is not drained: nothing to resume; once this operator drains it, resume is enabled
        screen.table().select_key("gpu03")
        await wait_for(pilot, lambda: "u Resume: resume refused: gpu03" in note(app), 30, "gpu03's state read")
        assert "not drained (Slurm state IDLE): nothing to resume" in note(app)
        await pilot.press("d")
        assert isinstance(app.screen, DrainScreen)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the drain")
        await wait_for(pilot, lambda: app.active_bindings["u"].enabled, 30, "resume enabled after the drain")
        assert note(app) == ""

    drive(app, body)


def test_reset_of_a_lost_gpu_is_disabled_with_the_reason_in_the_gpus_view_and_on_the_node_screen() -> None:
    entries = fed_entries()
    node011 = next(e for e in entries if e.name == "node011")
    lost = node011.gpus[5]
    assert lost.lost
    source = FakeSource(NAMES)
    app = fed_app(source=source)
    why = "disabled: r Reset GPU: GPU 5 is lost (XID 79): a reset cannot bring it back; reboot the node"

    async def body(pilot: Any) -> None:
        await pilot.press("2")
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        screen.table().select_key(f"node011:{node011.gpus[4].uuid}")
        await pilot.pause()
        assert app.active_bindings["r"].enabled is True and note(app) == ""
        screen.table().select_key(f"node011:{lost.uuid}")
        await pilot.pause()
        assert app.active_bindings["r"].enabled is False
        assert screen.check_action("reset", ()) is None
        assert note(app) == why
        await pilot.press("r")  # no dialog: the reason at once, and in the action log
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        (row,) = app.action_log.rows
        assert (row.node, row.gpu, row.action, row.outcome) == ("node011", lost.uuid, "reset", "refused")
        await pilot.press("enter")
        node = app.screen
        assert isinstance(node, NodeScreen)
        assert node.query_one("#node-gpus", FleetTable).cursor_key == lost.uuid
        await pilot.pause()
        assert app.active_bindings["r"].enabled is False and node.check_action("reset", ()) is None
        assert note(app) == why
        node.query_one("#node-gpus", FleetTable).select_key(node011.gpus[0].uuid)
        await pilot.pause()
        assert app.active_bindings["r"].enabled is True and note(app) == ""
        assert source.resets == []

    drive(app, body, entries)


def test_read_only_shows_every_action_disabled_with_the_reason() -> None:
    source = FakeSource(NAMES)
    app = fed_app(readonly=True, source=source)

    async def body(pilot: Any) -> None:
        for key in ("a", "r", "d", "u", "ctrl+d"):
            assert app.active_bindings[key].enabled is False, key
        assert note(app) == "disabled: a, r, d, u, ^d: read-only mode (fleetops tui --readonly): actions are off"
        await pilot.press("enter")
        assert isinstance(app.screen, NodeScreen)
        await pilot.pause()
        for key in ("a", "r", "d", "u"):
            assert app.active_bindings[key].enabled is False, key
        assert note(app) == "disabled: a, r, d, u: read-only mode (fleetops tui --readonly): actions are off"
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and source.drains == []

    drive(app, body, fed_entries())
