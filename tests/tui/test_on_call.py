"""The TUI an on-call engineer trusts: refused actions say why before any dialog, the History
tab follows the store, the node screen copies the command it shows, and says since when the
node is in its bad state."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, FakeSource, drive, fed_app, fed_entries, wait_for

ENTRIES = fed_entries()
NODE011 = ENTRIES[NAMES.index("node011")]  # xid:79 on GPU 5: lost


def messages(app: Any) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_reset_of_a_lost_gpu_is_refused_with_the_reason_and_no_dialog() -> None:
    source = FakeSource(NAMES)
    app = fed_app(source=source)
    gpu5 = next(g for g in NODE011.gpus if g.index == 5)
    assert gpu5.lost
    reason = "GPU 5 is lost (XID 79): a reset cannot bring it back; reboot the node"

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node011", select_gpu=gpu5.uuid))
        await pilot.pause()
        await pilot.press("2")  # the GPU tab shows the action disabled, with its reason
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert f"r Reset GPU: disabled: {reason}" in detail, detail
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)  # no dialog
        assert messages(app) == [f"node011: reset refused: {reason}"]
        assert source.resets == []
        # a healthy GPU of the same node still asks first
        app.screen.query_one("#node-gpus", FleetTable).select_key(NODE011.gpus[0].uuid)
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)

    drive(app, body, ENTRIES)


class DrainedByOthers(FakeSource):
    def resume_refusal(self, name: str) -> str | None:
        if name == "node003":
            return "resume refused: node003: drained by alice (maintenance by alice), not by this run; left drained"
        return None


def test_resume_of_another_owners_drain_is_refused_before_the_dialog_naming_the_owner() -> None:
    app = fed_app(source=DrainedByOthers(NAMES))

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node003"))
        await pilot.pause()
        await pilot.press("u")
        await wait_for(pilot, lambda: messages(app), 30, "the refusal")
        assert isinstance(app.screen, NodeScreen)
        assert messages(app) == [
            "resume refused: node003: drained by alice (maintenance by alice), not by this run; left drained"
        ]
        app.pop_screen()
        app.push_screen(NodeScreen("node005"))  # an operator's own drain: the dialog asks
        await pilot.pause()
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the dialog")

    drive(app, body, ENTRIES)


def test_the_history_tab_reads_a_store_written_after_the_tui_started(tmp_path: Any) -> None:
    from fleetops.checks.verdict import NodeResult
    from fleetops.fleet.audit import AuditResult
    from fleetops.fleet.store.database import Store

    db = tmp_path / "later" / "history.db"  # does not exist when the TUI starts
    source = FakeSource(NAMES)
    source.drain_db = str(db)  # type: ignore[attr-defined]  # where SshSource keeps --db
    app = fed_app(source=source)
    snap = NODE011.snapshot
    assert snap is not None

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node011"))
        await pilot.pause()
        await pilot.press("4")
        history = app.screen.query_one("#node-history", FleetTable)
        await wait_for(pilot, lambda: history.row_count == 1, 10, "the note")
        note = history.row("note")
        # the action log's read at start made the (empty) database; no audit is in it yet
        assert note is not None and note.cells[-1] == "no audits of node011 in the history database", note
        with Store(str(db)) as store:
            audit_id = store.record(
                AuditResult(
                    started_at=1_700_000_000.0, duration_s=1.0,
                    nodes=[NodeResult("node011", True, None, snap, 0.1)],
                    findings=[f for f in NODE011.findings], inventory="inv.yml",
                ),
                2,
            )
        await pilot.press("1", "4")  # the tab opened again: the store as it is now
        await wait_for(pilot, lambda: history.row(f"audit:{audit_id}") is not None, 10, "the audit row")
        row = str(history.row(f"audit:{audit_id}"))
        assert f"#{audit_id}" in row and "CRIT" in row, row

    drive(app, body, ENTRIES)
