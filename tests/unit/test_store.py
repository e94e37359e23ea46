"""The history store: layout versions and migration from the first release's layout, compressed
snapshots, retention, and snapshots it cannot read reported rather than skipped."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetops import checks, model
from fleetops.catalog.durations import DurationError, parse_retention
from fleetops.checks.verdict import NodeResult
from fleetops.fleet.audit import AuditResult
from fleetops.fleet.store.database import Store
from fleetops.fleet.store.layout import LAYOUT_VERSION, StoreError
from fleetops.sim import gpu as sim

# The first release's layout, as that release created it.
LAYOUT_1 = (Path(__file__).parent.parent / "fixtures" / "history_layout1.sql").read_text()


def _result(nodes: list[model.Node], started: float, findings: list[model.Finding] | None = None) -> AuditResult:
    return AuditResult(
        started_at=started,
        duration_s=1.0,
        nodes=[NodeResult(n.hostname, True, None, n, 0.1) for n in nodes],
        findings=findings or [],
        inventory="inv.yml",
    )


def _layout_1_db(path: str, snapshots: list[tuple[float, model.Node]]) -> None:
    db = sqlite3.connect(path)
    db.executescript(LAYOUT_1)
    for started, node in snapshots:
        cur = db.execute(
            "INSERT INTO audits (started_at, duration_s, inventory, worst, exit_code, summary) VALUES (?,?,?,?,?,?)",
            (started, 1.0, "inv.yml", "ok", 0, json.dumps({"worst": "ok"})),
        )
        db.execute(
            "INSERT INTO snapshots VALUES (?,?,?,?,?,?)",
            (cur.lastrowid, node.hostname, 1, None, node.collected_at, model.node_to_json(node)),
        )
    db.commit()
    db.close()


def test_new_database_has_the_current_layout_and_stores_snapshots_compressed(tmp_path, sim_node: Callable[..., model.Node]) -> None:
    path = str(tmp_path / "h.db")
    node = sim_node("n1")
    with Store(path) as store:
        store.record(_result([node], time.time()), 0)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    blob, schema = db.execute("SELECT snapshot, schema FROM snapshots").fetchone()
    assert isinstance(blob, bytes)
    assert schema == model.SCHEMA_ID
    assert len(blob) * 5 < len(model.node_to_json(node))  # JSON of 8 GPUs compresses well
    with Store(path) as store:
        back = store.previous_snapshots(["n1"])["n1"]
    assert model.node_to_json(back) == model.node_to_json(node)


def test_layout_1_database_migrates_and_keeps_the_rate_checks_baseline(tmp_path, sim_node: Callable[..., model.Node]) -> None:
    """A database written by the first release opens, is migrated in place, and the latest
    snapshot still feeds the rate checks: an SBE count that grew since then is found."""
    path = str(tmp_path / "old.db")
    state = sim.build_state("n1", {"faults": ["pcie-replay-storm@2"]})
    t0 = time.time()  # the simulated storm counts from the state's creation
    before = sim_node(state=state, now=t0 + 60)
    _layout_1_db(path, [(t0 - 600, sim_node(state=state, now=t0)), (t0, before)])
    with Store(path) as store:
        assert store.migrated_from == 1
        prev = store.previous_snapshots(["n1"])
        assert store.unreadable == {}
    assert model.node_to_json(prev["n1"]) == model.node_to_json(before)

    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    kinds = {type(r[0]) for r in db.execute("SELECT snapshot FROM snapshots")}
    assert kinds == {bytes}
    assert db.execute("SELECT COUNT(*) FROM snapshots WHERE schema = ?", (model.SCHEMA_ID,)).fetchone()[0] == 2
    db.close()

    now_node = sim_node(state=state, now=t0 + 180)
    [rate] = [f for f in checks.run_node_checks(now_node, None, prev["n1"]) if f.check == "pcie.replay_rate"]
    assert rate.severity == "warn"
    assert rate.gpu is not None and rate.gpu["index"] == 2
    assert rate.observed["per_min"] == pytest.approx(sim.REPLAY_STORM_PER_MIN, rel=0.01)


def test_a_snapshot_of_another_schema_is_reported_not_skipped(tmp_path, sim_node: Callable[..., model.Node]) -> None:
    path = str(tmp_path / "h.db")
    with Store(path) as store:
        store.record(_result([sim_node("n1"), sim_node("n2")], time.time()), 0)
    db = sqlite3.connect(path)
    import zlib

    doc = json.loads(zlib.decompress(db.execute("SELECT snapshot FROM snapshots WHERE node='n2'").fetchone()[0]))
    doc["schema"] = "fleetops.snapshot/v0"
    db.execute("UPDATE snapshots SET snapshot = ? WHERE node = 'n2'", (zlib.compress(json.dumps(doc).encode()),))
    db.commit()
    db.close()
    with Store(path) as store:
        prev = store.previous_snapshots(["n1", "n2"])
        assert set(prev) == {"n1"}
        assert set(store.unreadable) == {"n2"}
        assert "fleetops.snapshot/v0" in store.unreadable["n2"]


def test_retention_prunes_old_audits_with_their_rows_and_gives_space_back(tmp_path, sim_node: Callable[..., model.Node]) -> None:
    path = str(tmp_path / "h.db")
    now = time.time()
    nodes = [sim_node(f"n{i}") for i in range(20)]
    with Store(path, keep_s=None) as store:
        for day in range(10, 0, -1):
            store.record(_result(nodes, now - day * 86400), 0)
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size_full = os.path.getsize(path)
    with Store(path, keep_s=3 * 86400 + 60) as store:
        store.record(_result(nodes, now), 0)
        rows = store.audits(limit=100)
        assert [round((now - r.started_at) / 86400) for r in rows] == [0, 1, 2, 3]
        left = store.db.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0]
        assert left == 4 * len(nodes)
        orphans = store.db.execute(
            "SELECT COUNT(*) FROM snapshots WHERE audit_id NOT IN (SELECT id FROM audits)"
        ).fetchone()[0]
        assert orphans == 0
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert os.path.getsize(path) < size_full * 0.7


def test_retention_never_prunes_the_audit_just_written(tmp_path, sim_node: Callable[..., model.Node]) -> None:
    path = str(tmp_path / "h.db")
    with Store(path, keep_s=86400) as store:
        audit_id = store.record(_result([sim_node("n1")], time.time() - 5 * 86400), 0)
        assert [r.id for r in store.audits()] == [audit_id]


def test_a_database_from_a_newer_release_is_refused_with_its_path(tmp_path) -> None:
    path = str(tmp_path / "new.db")
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {LAYOUT_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match=rf"new\.db: history layout {LAYOUT_VERSION + 1} was written by a newer fleetops"):
        Store(path)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * 86400.0), ("12h", 43200.0), ("2w", 14 * 86400.0), ("forever", None), ("0", None)]
)
def test_keep_reads_the_duration_grammar_or_forever(text: str, seconds: float | None) -> None:
    assert parse_retention(text, flag="--keep", unit_required=True) == seconds


@pytest.mark.parametrize("text", ["", "30", "-1d", "3y", "d"])
def test_keep_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(DurationError, match="--keep"):
        parse_retention(text, flag="--keep", unit_required=True)
