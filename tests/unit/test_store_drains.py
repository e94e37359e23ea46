"""Drains and resumes in the history: a layout-3 database gains the table and keeps its audits,
rows read back newest first by node and time, and they go with the audits' retention."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from fleetops.fleet.audit import AuditResult
from fleetops.fleet.store.database import Store
from fleetops.fleet.store.layout import LAYOUT_VERSION
from fleetops.fleet.store.rows import DrainRow

DAY = 86400.0


def _audit(started: float) -> AuditResult:
    return AuditResult(started_at=started, duration_s=1.0, nodes=[], findings=[], inventory="inv.yml")


def _drain(
    at: float, node: str = "gpu01", action: str = "drain", outcome: str = "done", **kw: str
) -> DrainRow:
    return DrainRow(
        at=at,
        node=node,
        slurm_name=node,
        action=action,
        kind=kw.get("kind", "operator"),
        run=kw.get("run", "alice@ctl01"),
        purpose=kw.get("purpose", "GPU 3 hangs"),
        outcome=outcome,
        reason=kw.get("reason", "[fleetops] operator/alice@ctl01: GPU 3 hangs"),
        previous_owner=kw.get("previous_owner"),
        message=f"{node}: {action} {outcome}",
        source=kw.get("source", "cli"),
    )


def test_a_layout_3_database_gains_the_drains_table_and_keeps_its_audits(tmp_path: Path) -> None:
    path = str(tmp_path / "v3.db")
    now = time.time()
    with Store(path) as store:
        audit_id = store.record(_audit(now - 60), 0)
        store.db.execute("DROP TABLE drains")
        store.db.execute("PRAGMA user_version = 3")
    with Store(path) as store:
        assert store.migrated_from == 3
        assert [a.id for a in store.audits()] == [audit_id]
        store.record_drain(_drain(now))
        assert [(d.node, d.action, d.kind, d.run) for d in store.drains()] == [
            ("gpu01", "drain", "operator", "alice@ctl01")
        ]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION == 5
    db.close()


def test_a_new_database_has_the_drains_table(tmp_path: Path) -> None:
    with Store(str(tmp_path / "new.db")) as store:
        assert store.migrated_from is None
        assert store.drains() == []


def test_drains_read_back_newest_first_by_node_slurm_name_and_time(tmp_path: Path) -> None:
    now = time.time()
    held = "the health program (run 20261206T031207Z-7c1e-gpu03): memory.ecc_dbe_volatile"
    with Store(str(tmp_path / "h.db")) as store:
        first = store.record_drain(_drain(now - 3 * 3600))
        store.record_drain(
            _drain(now - 3600, node="gpu03.example", action="resume", outcome="refused", previous_owner=held)
        )
        last = store.record_drain(_drain(now, action="resume", reason=""))
        every = store.drains()
        gpu01 = store.drains("gpu01")
        by_slurm_name = store.drains("gpu03.example")
        recent = store.drains(since=now - 2 * 3600)
        one = store.drains(limit=1)
    assert [d.at for d in every] == sorted((d.at for d in every), reverse=True)
    assert [d.id for d in gpu01] == [last, first]
    assert [(d.outcome, d.previous_owner) for d in by_slurm_name] == [("refused", held)]
    assert len(recent) == 2 and [d.id for d in one] == [last]
    assert every[-1].to_dict()["purpose"] == "GPU 3 hangs" and every[-1].source == "cli"


def test_prune_removes_drains_older_than_the_audits_retention(tmp_path: Path) -> None:
    now = time.time()
    with Store(str(tmp_path / "h.db"), keep_s=30 * DAY) as store:
        store.record_drain(_drain(now - 40 * DAY, node="old"))
        store.record_drain(_drain(now - 10 * DAY, node="kept"))
        assert len(store.drains()) == 2  # writing a drain never prunes
        store.record(_audit(now), 0)  # an audit prunes with its retention
        assert [d.node for d in store.drains()] == ["kept"]
