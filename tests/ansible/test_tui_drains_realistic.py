"""The TUI's drain reason prompt, its drain of a filtered set through the capacity guard, and
its resume shown disabled for another owner's drain, through a real slurmctld: three Debian
hosts booted with systemd-nspawn -b, each with slurmd (nspawn_hosts.py), scontrol on the
controller (SLURM_CONF points it at this cluster), never on a node. No agent is installed: the
TUI shows the nodes as failing to collect, and drains them all the same.

- the reason typed in the prompt is exactly the Reason ``scontrol show node`` prints;
- three nodes at 10 % may have one out: the filtered drain of all three drains the first and
  refuses the other two with the guard's words, each once, all in the action log;
- a drain someone else set: resume is shown disabled with the owner named, before any key.

The hosts use their own first address (``FLEETOPS_NSPAWN_TUI_DRAIN_TEST_ADDRESS``, default
127.0.51.1), apart from the other realistic modules' clusters.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nspawn_hosts
import pytest

from fleetops.ops import slurm as ops_slurm

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODES = ["node301", "node302", "node303"]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_TUI_DRAIN_TEST_ADDRESS", "127.0.51.1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    reason = nspawn_hosts.skip_reason() or nspawn_hosts.slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("nspawn-tui-drain")
    try:
        c = nspawn_hosts.up(directory, NODES, "580.159.04", "580.163.01", first=FIRST_ADDRESS, slurm=True)
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        nspawn_hosts.write_inventory(c, directory / "wheelhouse")  # no agent: the drains never need it
        c.slurm.until_idle()  # every slurmd registered
        yield c
    finally:
        nspawn_hosts.down(c)


@pytest.fixture
def app(cluster, monkeypatch: pytest.MonkeyPatch):
    from fleetops.fleet import inventory
    from fleetops.tui.app import FleetApp
    from fleetops.tui.source import SshSource

    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm.conf))
    cluster.slurm.resume_all()
    source = SshSource(inventory.load(str(cluster.inventory)), {}, interval=5.0, connect_timeout=3.0, command_timeout=3.0)
    yield FleetApp(source, interval=5.0)
    cluster.slurm.resume_all()


def _drive(app: Any, body: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await body(pilot)

    asyncio.run(main())


async def _until(pilot: Any, condition: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await pilot.pause(0.1)


async def _type_reason(pilot: Any, text: str) -> None:
    from textual.widgets import Input

    field = pilot.app.screen.query_one("#drain-reason", Input)
    await pilot.press("end", "ctrl+u", *["space" if ch == " " else ch for ch in text])
    assert field.value == text


def test_the_reason_typed_in_the_tui_is_the_reason_slurmctld_keeps(cluster, app) -> None:
    from fleetops.tui.screens.drain import DrainScreen

    run = ops_slurm.operator_run()
    typed = "GPU 3 hangs under NCCL; ticket 4411"

    async def body(pilot: Any) -> None:
        await _until(pilot, lambda: "node301" in app.state.entries, "node301 listed")
        app.screen.table().select_key("node301")
        await pilot.press("d")
        assert isinstance(app.screen, DrainScreen)
        await _type_reason(pilot, "")
        await pilot.press("enter")  # empty: refused in the prompt, nothing sent
        assert isinstance(app.screen, DrainScreen) and "DRAIN" not in cluster.slurm.show("node301")[0]
        await _type_reason(pilot, typed)
        await pilot.press("enter")
        await _until(pilot, lambda: app.last_action is not None, "the drain")
        assert app.last_action.ok, app.last_action
        state, reason = cluster.slurm.show("node301")
        assert "DRAIN" in state and reason == f"[fleetops] operator/{run}: {typed}", (state, reason)
        assert app.last_action.message == f"node301: drained ([fleetops] operator/{run}: {typed})"

    _drive(app, body)


def test_the_tuis_filtered_drain_drains_what_the_guard_allows_and_refuses_the_rest(cluster, app) -> None:
    from fleetops.tui.screens.drain import DrainScreen

    run = ops_slurm.operator_run()

    async def body(pilot: Any) -> None:
        await _until(pilot, lambda: len(app.state.entries) == 3, "the nodes listed")
        app.screen.set_filter("node30")
        await pilot.press("ctrl+d")
        dialog = app.screen
        assert isinstance(dialog, DrainScreen)
        await _until(pilot, lambda: dialog.plan is not None, "the capacity guard's answer")
        assert dialog.plan.allowed == ("node301",)
        assert [n for n, _ in dialog.plan.refused] == ["node302", "node303"]
        states = cluster.slurm.states()
        assert all(s == "IDLE" for s in states.values()), states  # nothing sent yet
        await _type_reason(pilot, "rack 7 PDU swap")
        await pilot.press("enter")
        await _until(pilot, lambda: len(app.action_log.rows) == 3, "every node's outcome")
        states = cluster.slurm.states()
        assert "DRAIN" in states["node301"] and "DRAIN" not in states["node302"] and "DRAIN" not in states["node303"]
        assert cluster.slurm.show("node301")[1] == f"[fleetops] operator/{run}: rack 7 PDU swap"
        rows = {r.node: r for r in app.action_log.rows}
        assert {n: r.outcome for n, r in rows.items()} == {"node301": "sent", "node302": "refused", "node303": "refused"}
        for node in ("node302", "node303"):
            assert rows[node].why == (
                f"{node}: not drained: partition gpu: 0 of 3 nodes are out of service already (none); draining "
                f"node301, {node} would make 2, more than the allowed 1 (10%)"
            ), rows[node].why

    _drive(app, body)


def test_the_tui_shows_resume_disabled_for_a_drain_someone_else_set(cluster, app) -> None:
    cluster.slurm.run("update", "NodeName=node302", "State=DRAIN", "Reason=maintenance by alice")

    async def body(pilot: Any) -> None:
        from textual.widgets import Static

        await _until(pilot, lambda: "node302" in app.state.entries, "node302 listed")
        app.screen.table().select_key("node302")
        await _until(pilot, lambda: not app.active_bindings["u"].enabled, "resume shown disabled")
        note = str(app.screen.query_one("#disabled-note", Static).render())
        assert note.startswith("disabled: u Resume: resume refused: node302: drained by someone outside fleetops"), note
        assert "maintenance by alice" in note and "set by root at " in note, note

    _drive(app, body)
    assert cluster.slurm.show("node302")[1] == "maintenance by alice"
