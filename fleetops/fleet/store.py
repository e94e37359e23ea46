"""Audit history in SQLite: one transaction per audit, WAL so readers (the TUI) never block it.

The latest reachable snapshot of each node feeds the growth and rate checks of the next audit;
``diff`` tells which findings are new, resolved or persisting between two audits.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from fleetops import model

SCHEMA = """
CREATE TABLE IF NOT EXISTS audits (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL,
    inventory TEXT,
    worst TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    summary TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    audit_id INTEGER NOT NULL REFERENCES audits(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    reachable INTEGER NOT NULL,
    error TEXT,
    collected_at REAL,
    snapshot TEXT,
    PRIMARY KEY (audit_id, node)
);
CREATE INDEX IF NOT EXISTS snapshots_node ON snapshots(node, audit_id);
CREATE TABLE IF NOT EXISTS findings (
    audit_id INTEGER NOT NULL REFERENCES audits(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    key TEXT NOT NULL,
    severity TEXT NOT NULL,
    finding TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_audit ON findings(audit_id);
CREATE INDEX IF NOT EXISTS findings_node ON findings(node, audit_id);
"""


def default_path() -> str:
    env = os.environ.get("FLEETOPS_DB")
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "fleetops", "history.db")


class StoreError(Exception):
    pass


@dataclass
class AuditRow:
    id: int
    started_at: float
    duration_s: float
    inventory: str | None
    worst: str
    exit_code: int
    summary: dict[str, Any]


class Store:
    def __init__(self, path: str | None = None) -> None:
        self.path = path or default_path()
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open history database: {exc}") from exc

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ---------------------------------------------------------------------

    def record(self, result: Any, exit_code: int) -> int:
        """Write one ``AuditResult`` in a single transaction; returns the audit id."""
        summary = result.summary()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO audits (started_at, duration_s, inventory, worst, exit_code, summary) VALUES (?,?,?,?,?,?)",
                (result.started_at, result.duration_s, result.inventory, summary["worst"], exit_code, json.dumps(summary)),
            )
            audit_id = int(cur.lastrowid or 0)
            self.db.executemany(
                "INSERT INTO snapshots (audit_id, node, reachable, error, collected_at, snapshot) VALUES (?,?,?,?,?,?)",
                [
                    (
                        audit_id,
                        n.name,
                        1 if n.snapshot is not None else 0,
                        n.error,
                        n.snapshot.collected_at if n.snapshot else None,
                        model.node_to_json(n.snapshot) if n.snapshot else None,
                    )
                    for n in result.nodes
                ],
            )
            self.db.executemany(
                "INSERT INTO findings (audit_id, node, key, severity, finding) VALUES (?,?,?,?,?)",
                [(audit_id, f.node, f.key, f.severity, json.dumps(f.to_dict())) for f in result.findings],
            )
        return audit_id

    # --- reading ---------------------------------------------------------------------

    def previous_snapshots(self, nodes: list[str]) -> dict[str, model.Node]:
        """The latest snapshot of each node that had one."""
        out: dict[str, model.Node] = {}
        for chunk_start in range(0, len(nodes), 500):
            chunk = nodes[chunk_start : chunk_start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"""SELECT s.node, s.snapshot FROM snapshots s
                    JOIN (SELECT node, MAX(audit_id) AS a FROM snapshots
                          WHERE snapshot IS NOT NULL AND node IN ({marks}) GROUP BY node) last
                    ON s.node = last.node AND s.audit_id = last.a""",
                chunk,
            ).fetchall()
            for node, text in rows:
                try:
                    out[node] = model.node_from_json(text)
                except model.SchemaError:
                    continue  # an older schema: no previous snapshot rather than a crash
        return out

    def audits(self, node: str | None = None, since: float | None = None, limit: int = 50) -> list[AuditRow]:
        sql = "SELECT id, started_at, duration_s, inventory, worst, exit_code, summary FROM audits"
        where: list[str] = []
        args: list[str | float | int] = []
        if node:
            where.append("id IN (SELECT audit_id FROM snapshots WHERE node = ?)")
            args.append(node)
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        rows = self.db.execute(sql, args).fetchall()
        return [AuditRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    def findings(self, audit_id: int, node: str | None = None) -> list[model.Finding]:
        sql = "SELECT finding FROM findings WHERE audit_id = ?"
        args: list[str | int] = [audit_id]
        if node:
            sql += " AND node = ?"
            args.append(node)
        return [model.Finding.from_dict(json.loads(r[0])) for r in self.db.execute(sql, args)]

    def audited_nodes(self, audit_id: int) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT node FROM snapshots WHERE audit_id = ?", (audit_id,))}

    def previous_audit(self, audit_id: int, node: str | None = None) -> int | None:
        if node:
            row = self.db.execute(
                "SELECT MAX(audit_id) FROM snapshots WHERE audit_id < ? AND node = ?", (audit_id, node)
            ).fetchone()
        else:
            row = self.db.execute("SELECT MAX(id) FROM audits WHERE id < ?", (audit_id,)).fetchone()
        return row[0] if row and row[0] is not None else None

    def diff(self, audit_id: int, node: str | None = None) -> dict[str, list[model.Finding]]:
        """new / resolved / persisting warn+crit+unknown findings against the audit before it.

        Only nodes present in both audits can have resolved findings (a node left out by a
        --limit is not 'resolved')."""
        prev_id = self.previous_audit(audit_id, node)
        now = [f for f in self.findings(audit_id, node) if f.severity in ("warn", "crit", "unknown")]
        if prev_id is None:
            return {"new": now, "resolved": [], "persisting": []}
        both = self.audited_nodes(audit_id) & self.audited_nodes(prev_id)
        before = [f for f in self.findings(prev_id, node) if f.severity in ("warn", "crit", "unknown")]
        before_keys = {f.key for f in before}
        now_keys = {f.key for f in now}
        return {
            "new": [f for f in now if f.key not in before_keys],
            "resolved": [f for f in before if f.key not in now_keys and f.node in both],
            "persisting": [f for f in now if f.key in before_keys],
        }

    def node_history(self, node: str, limit: int = 20) -> list[tuple[int, float, bool, str | None]]:
        rows = self.db.execute(
            """SELECT s.audit_id, a.started_at, s.reachable, s.error FROM snapshots s JOIN audits a ON a.id = s.audit_id
               WHERE s.node = ? ORDER BY s.audit_id DESC LIMIT ?""",
            (node, limit),
        ).fetchall()
        return [(r[0], r[1], bool(r[2]), r[3]) for r in rows]


def parse_since(text: str) -> float:
    """``2h``, ``30m``, ``7d``, ``90s`` ago, or an ISO date/time, to epoch seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    text = text.strip()
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(text[:-1]) * units[text[-1]]
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise StoreError(f"--since {text!r}: use 2h, 30m, 7d or an ISO date like 2026-12-01T08:00") from exc
