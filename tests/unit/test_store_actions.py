"""Actions taken from the TUI in the history: a layout-4 database (built here as layout 4 laid
it out) gains the actions table and keeps every row, actions are recorded, settled and read back
newest first, and ``fleetops history --kind actions`` prints them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from fleetops import cli
from fleetops.fleet.store import layout as store_layout
from fleetops.fleet.store.database import Store
from fleetops.fleet.store.layout import LAYOUT_VERSION
from fleetops.fleet.store.rows import ActionRow
from fleetops.ops import action_log
from fleetops.ops.results import ActionResult

T0 = 1_780_000_000.0  # a fixed time: the printed stamps are exact


def _layout_4(path: str) -> None:
    """A database exactly as layout 4 created it (its tables, user_version 4), with one row in
    each of the audits, snapshots, findings, validate_runs, validations and drains tables."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(store_layout._AUDIT_TABLES + store_layout.VALIDATION_TABLES + store_layout.DRAIN_TABLES)
    db.execute("INSERT INTO audits VALUES (1, ?, 2.5, 'inv.yml', 'crit', 2, '{\"nodes\": 1}')", (T0,))
    db.execute("INSERT INTO snapshots VALUES (1, 'gpu01', 0, 'timeout', NULL, NULL, NULL)")
    db.execute("INSERT INTO findings VALUES (1, 'gpu01', 'gpu01/node.reachable', 'crit', '{}')")
    db.execute("INSERT INTO validate_runs VALUES (7, ?, 30.0, 'inv.yml', 'quick', 'pass', 0, '{}')", (T0,))
    db.execute("INSERT INTO validations VALUES (7, 'gpu01', 'GPU-a', '0000:19:00.0', 0, 'H200', 'quick', 'pass', "
               "?, NULL, '{}')", (T0,))
    db.execute("INSERT INTO drains (at, node, action, kind, run, outcome, message, source) VALUES "
               "(?, 'gpu01', 'drain', 'operator', 'alice@ctl01', 'done', 'gpu01: drained', 'tui')", (T0,))
    db.execute("PRAGMA user_version = 4")
    db.close()


def _dump(path: str, table: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
    finally:
        db.close()


def test_a_layout_4_database_migrates_to_5_keeping_every_row(tmp_path: Path) -> None:
    path = str(tmp_path / "v4.db")
    _layout_4(path)
    before = {t: _dump(path, t) for t in ("audits", "snapshots", "findings", "validate_runs", "validations", "drains")}
    assert all(len(rows) == 1 for rows in before.values()), before
    with Store(path) as store:
        assert store.migrated_from == 4
        assert store.actions() == []
    assert {t: _dump(path, t) for t in before} == before
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION == 5
    columns = [r[1] for r in db.execute("PRAGMA table_info(actions)")]
    assert columns == ["id", "at", "node", "gpu", "action", "outcome", "why", "source"]
    indexes = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'actions' "
                                              "AND type = 'index'"))
    assert indexes == ["actions_at", "actions_node"]
    db.close()
    with Store(path) as store:  # opened again: nothing more to migrate
        assert store.migrated_from is None


def test_actions_are_recorded_settled_and_read_back_newest_first(tmp_path: Path) -> None:
    path = str(tmp_path / "h.db")
    first, first_id = action_log.record(path, "gpu01", "drain", "refused", "gpu01: not  a Slurm node", now=T0)
    sent, sent_id = action_log.record(path, "gpu02", "reset", "sent", "gpu02: reset done", gpu="GPU-b", now=T0 + 60)
    assert first_id is not None and sent_id is not None and sent_id > first_id
    settled = action_log.update(path, sent, "verified", "gpu02 after reset: OK from the snapshot of 08:00:00")
    assert settled.id == sent_id and settled.outcome == "verified"
    with Store(path) as store:
        every = store.actions()
        gpu01 = store.actions("gpu01")
        recent = store.actions(since=T0 + 30)
        one = store.actions(limit=1)
        with pytest.raises(ValueError, match="action outcome 'done'"):
            store.record_action(ActionRow(at=T0, node="x", action="reset", outcome="done", why=""))
    assert every == [
        ActionRow(at=T0 + 60, node="gpu02", gpu="GPU-b", action="reset", outcome="verified",
                  why="gpu02 after reset: OK from the snapshot of 08:00:00", source="tui", id=sent_id),
        ActionRow(at=T0, node="gpu01", gpu=None, action="drain", outcome="refused",
                  why="gpu01: not a Slurm node", source="tui", id=first_id),
    ]
    assert first == every[1]
    assert [r.id for r in gpu01] == [first_id]
    assert [r.id for r in recent] == [sent_id]
    assert [r.id for r in one] == [sent_id]
    assert action_log.recent(path, limit=5) == every


def test_outcomes_of_action_results() -> None:
    done = ActionResult("gpu01", "reset", "done", "gpu01: reset GPU-a done")
    unknown = ActionResult("gpu01", "reset", "unknown", "gpu01: no answer", check="fleetops collect gpu01")
    refused = ActionResult("gpu01", "reset", "refused", "gpu01: GPU-a is busy")
    assert [action_log.outcome_of(r) for r in (done, unknown, refused)] == ["sent", "unknown", "refused"]
    assert action_log.why_of(unknown) == "gpu01: no answer; check: fleetops collect gpu01"


def test_a_store_that_cannot_be_written_is_a_warning(tmp_path: Path) -> None:
    import io

    (tmp_path / "dir.db").mkdir()
    warned = io.StringIO()
    row, row_id = action_log.record(str(tmp_path / "dir.db"), "gpu01", "resume", "sent", "ok", warn=warned)
    assert row_id is None and row.outcome == "sent"
    assert warned.getvalue().startswith("fleetops: warning: gpu01: resume sent, but not recorded in the history")


def test_history_kind_actions_prints_every_action_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    path = str(tmp_path / "h.db")
    action_log.record(path, "gpu01", "drain", "refused", "gpu01 is a simulated node, not a Slurm node", now=T0)
    action_log.record(path, "gpu02", "reset", "verified", "gpu02 after reset: OK", gpu="GPU-b", now=T0 + 61)
    try:
        assert cli.main(["history", "--kind", "actions", "--db", path]) == 0
        out = capsys.readouterr().out
        assert cli.main(["history", "gpu01", "--kind", "actions", "--db", path, "--format", "json"]) == 0
        doc = capsys.readouterr().out
        assert cli.main(["history", "gpu03", "--kind", "actions", "--db", path]) == 0
        empty = capsys.readouterr().out
    finally:
        monkeypatch.undo()
        time.tzset()
    assert out.splitlines() == [
        "TIME                 NODE             GPU                                      ACTION   OUTCOME  WHY",
        "2026-05-28 20:27:41  gpu02            GPU-b                                    reset    verified gpu02 after reset: OK",
        "2026-05-28 20:26:40  gpu01            -                                        drain    refused  "
        "gpu01 is a simulated node, not a Slurm node",
    ]
    import json

    assert [(r["node"], r["action"], r["outcome"], r["gpu"], r["at"]) for r in json.loads(doc)] == [
        ("gpu01", "drain", "refused", None, T0)
    ]
    assert empty == f"no actions recorded for gpu03 in {path}\n"
