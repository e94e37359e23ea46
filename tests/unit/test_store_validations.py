"""Validation results in the history: written per run, read back per GPU and level, migrated
onto a layout-2 database, pruned without losing a GPU's latest result."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from fleetops.fleet.store.database import Store
from fleetops.fleet.store.layout import LAYOUT_VERSION

DAY = 86400.0


def _gpu(node: str, uuid: str, level: str, status: str, started: float, index: int = 0) -> dict[str, Any]:
    return {"node": node, "uuid": uuid, "bus_id": f"00000000:1{index}:00.0", "index": index, "model": "H200 SXM",
            "level": level, "status": status, "started_at": started,
            "expires": started + (7 if level == "quick" else 30) * DAY,
            "result": {"provenance": {"backend": "sim"}, "findings": []}}


def _run(store: Store, started: float, level: str, gpus: list[dict[str, Any]]) -> int:
    status = "crit" if any(g["status"] == "crit" for g in gpus) else "ok"
    return store.record_validation(
        {"started_at": started, "duration_s": 1.0, "inventory": "inv.yml", "level": level, "status": status,
         "exit_code": 2 if status == "crit" else 0, "summary": {"gpus": len(gpus)}}, gpus)


def test_latest_per_gpu_and_level(tmp_path: Path) -> None:
    now = time.time()
    with Store(str(tmp_path / "h.db")) as store:
        r1 = _run(store, now - 3 * DAY, "full", [_gpu("n1", "GPU-a", "full", "ok", now - 3 * DAY),
                                                 _gpu("n1", "GPU-b", "full", "ok", now - 3 * DAY, 1)])
        r2 = _run(store, now - DAY, "quick", [_gpu("n1", "GPU-a", "quick", "crit", now - DAY)])
        r3 = _run(store, now, "quick", [_gpu("n2", "GPU-c", "quick", "ok", now)])
        latest = store.latest_validations(["n1", "n2", "n3"])
        runs = store.validate_runs()
        only_n1 = store.validate_runs("n1")
        rows = store.validations(r1)
    assert latest["n3"] == {}
    assert {u: {lv: (r.run_id, r.status) for lv, r in by.items()} for u, by in latest["n1"].items()} == {
        "GPU-a": {"full": (r1, "ok"), "quick": (r2, "crit")},
        "GPU-b": {"full": (r1, "ok")},
    }
    assert latest["n2"]["GPU-c"]["quick"].expires == now + 7 * DAY
    assert [r.id for r in runs] == [r3, r2, r1]
    assert [r.id for r in only_n1] == [r2, r1]
    assert [(r.gpu_uuid, r.gpu_index, r.result["provenance"]["backend"]) for r in rows] == [
        ("GPU-a", 0, "sim"), ("GPU-b", 1, "sim")]


def test_prune_keeps_the_run_holding_a_gpus_latest_result(tmp_path: Path) -> None:
    now = time.time()
    with Store(str(tmp_path / "h.db"), keep_s=30 * DAY) as store:
        old_a = _run(store, now - 50 * DAY, "quick", [_gpu("n1", "GPU-a", "quick", "ok", now - 50 * DAY)])
        old_b = _run(store, now - 45 * DAY, "quick", [_gpu("n1", "GPU-b", "quick", "ok", now - 45 * DAY)])
        _run(store, now - 40 * DAY, "quick", [_gpu("n1", "GPU-b", "quick", "ok", now - 40 * DAY)])
        new = _run(store, now, "quick", [_gpu("n2", "GPU-c", "quick", "ok", now)])
        ids = [r.id for r in store.validate_runs()]
        latest = store.latest_validations(["n1"])["n1"]
    # old_b is superseded by the 40-day-old run and goes; old_a and the 40-day-old run each hold
    # a GPU's only remaining result and stay, so the audit can say "expired on ..."
    assert old_b not in ids
    assert ids == [new, old_b + 1, old_a]
    assert latest["GPU-a"]["quick"].run_id == old_a


def test_layout_2_database_gains_the_validation_tables(tmp_path: Path) -> None:
    path = str(tmp_path / "v2.db")
    with Store(path) as store:
        store.db.execute("DROP TABLE validations")
        store.db.execute("DROP TABLE validate_runs")
        store.db.execute("PRAGMA user_version = 2")
    with Store(path) as store:
        assert store.migrated_from == 2
        run = _run(store, time.time(), "quick", [_gpu("n1", "GPU-a", "quick", "ok", time.time())])
        assert [r.id for r in store.validate_runs()] == [run]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION >= 3
    db.close()
