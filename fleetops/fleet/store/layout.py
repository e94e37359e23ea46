"""The history database's file: where it lives, its layout and how an older one is brought forward.

The layout is versioned with ``PRAGMA user_version`` and migrated forward on open, one step per
version inside one transaction (a database from a newer fleetops is refused, not guessed at). A
new file is laid out for incremental vacuum; an old one is switched to it once, after its
migration. Snapshots are stored zlib-compressed with their schema id beside them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from collections.abc import Callable

from fleetops import model

# Layout versions: 1 is the first release's (no user_version set, snapshots as JSON text);
# 2 stores snapshots compressed with their schema id beside them and vacuums incrementally;
# 3 adds the validation runs (``fleetops validate``) and each GPU's result; 4 adds the drains and
# resumes fleetops made in Slurm, each with its owner and outcome; 5 adds the actions taken from
# the TUI (reset, drain, resume, re-audit) with their outcome and why.
LAYOUT_VERSION = 5
_ZLIB_LEVEL = 6  # level 9 saves under 1 % more on snapshots and costs a third more time

_AUDIT_TABLES = """
CREATE TABLE IF NOT EXISTS audits (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL,
    inventory TEXT,
    worst TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audits_started ON audits(started_at);
CREATE TABLE IF NOT EXISTS snapshots (
    audit_id INTEGER NOT NULL REFERENCES audits(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    reachable INTEGER NOT NULL,
    error TEXT,
    collected_at REAL,
    snapshot BLOB,
    schema TEXT,
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
VALIDATION_TABLES = """
CREATE TABLE IF NOT EXISTS validate_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at REAL NOT NULL,
    duration_s REAL NOT NULL,
    inventory TEXT,
    level TEXT NOT NULL,
    status TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS validate_runs_started ON validate_runs(started_at);
CREATE TABLE IF NOT EXISTS validations (
    run_id INTEGER NOT NULL REFERENCES validate_runs(id) ON DELETE CASCADE,
    node TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    bus_id TEXT,
    gpu_index INTEGER,
    model TEXT,
    level TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL,
    expires REAL,
    result TEXT NOT NULL,
    PRIMARY KEY (run_id, node, gpu_uuid)
);
CREATE INDEX IF NOT EXISTS validations_node ON validations(node, gpu_uuid, run_id);
"""
# One row per drain or resume fleetops sent (or was refused) from the controller: the owner
# (kind, run, purpose) it wrote, what came of it, the Reason Slurm keeps after it, and the owner
# of a drain it met (held, taken over, forced over). Slurm forgets a Reason once it is lifted;
# this is where "who drained gpu17 last Tuesday, and who lifted it" is answered.
DRAIN_TABLES = """
CREATE TABLE IF NOT EXISTS drains (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    node TEXT NOT NULL,
    slurm_name TEXT,
    action TEXT NOT NULL,
    kind TEXT NOT NULL,
    run TEXT NOT NULL,
    purpose TEXT,
    outcome TEXT NOT NULL,
    reason TEXT,
    previous_owner TEXT,
    message TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS drains_at ON drains(at);
CREATE INDEX IF NOT EXISTS drains_node ON drains(node, at);
"""
# One row per action an operator took from the TUI (reset, drain, resume, re-audit): when, on
# which node and GPU, what came of it (sent, refused, failed, unknown, verified) and why. The
# TUI's action log reads it back at start, so the next shift sees what the last one did.
ACTION_TABLES = """
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    node TEXT NOT NULL,
    gpu TEXT,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    why TEXT NOT NULL,
    source TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_at ON actions(at);
CREATE INDEX IF NOT EXISTS actions_node ON actions(node, at);
"""
TABLES = _AUDIT_TABLES + VALIDATION_TABLES + DRAIN_TABLES + ACTION_TABLES


def default_path() -> str:
    env = os.environ.get("FLEETOPS_DB")
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "fleetops", "history.db")


class StoreError(Exception):
    pass


def encode_snapshot(node: model.Node) -> bytes:
    return zlib.compress(model.node_to_json(node).encode(), _ZLIB_LEVEL)


def decode_snapshot(value: bytes | str) -> model.Node:
    """A stored snapshot (compressed, or text from a layout-1 row) as a Node; SchemaError if its
    schema is not one this release reads."""
    if isinstance(value, bytes):
        try:
            text = zlib.decompress(value).decode()
        except (zlib.error, UnicodeDecodeError) as exc:
            raise model.SchemaError(f"snapshot: stored data is damaged ({exc})") from exc
    else:
        text = value
    return model.node_from_json(text)


def _schema_of(text: str) -> str | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if isinstance(schema, str) else None


def _migrate_1_to_2(db: sqlite3.Connection) -> None:
    """Compress every snapshot and record its schema id (in batches: a year of a big fleet)."""
    db.execute("ALTER TABLE snapshots ADD COLUMN schema TEXT")
    last = (-1, "")
    while True:
        rows = db.execute(
            """SELECT audit_id, node, snapshot FROM snapshots WHERE (audit_id, node) > (?, ?)
               ORDER BY audit_id, node LIMIT 2000""",
            last,
        ).fetchall()
        if not rows:
            break
        updates = []
        for audit_id, node, text in rows:
            if isinstance(text, str):
                updates.append((zlib.compress(text.encode(), _ZLIB_LEVEL), _schema_of(text), audit_id, node))
        db.executemany("UPDATE snapshots SET snapshot = ?, schema = ? WHERE audit_id = ? AND node = ?", updates)
        last = (rows[-1][0], rows[-1][1])
    db.execute("CREATE INDEX IF NOT EXISTS audits_started ON audits(started_at)")


def _migrate_2_to_3(db: sqlite3.Connection) -> None:
    """Add the validation tables (nothing earlier to convert)."""
    for statement in VALIDATION_TABLES.split(";"):
        if statement.strip():
            db.execute(statement)


def _migrate_3_to_4(db: sqlite3.Connection) -> None:
    """Add the drains table (nothing earlier to convert: drains were only in Slurm)."""
    for statement in DRAIN_TABLES.split(";"):
        if statement.strip():
            db.execute(statement)


def _migrate_4_to_5(db: sqlite3.Connection) -> None:
    """Add the actions table (nothing earlier to convert: TUI actions were only toasts)."""
    for statement in ACTION_TABLES.split(";"):
        if statement.strip():
            db.execute(statement)



# from layout N to N+1; each runs inside one transaction
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
}


def has_tables(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'snapshots'").fetchone() is not None


def open_layout(db: sqlite3.Connection, path: str) -> int | None:
    """Lay out a new file, or migrate an older layout to ``LAYOUT_VERSION``; returns the layout
    migrated from (None: the file was new or current). ``db`` is in autocommit mode."""
    migrated_from: int | None = None
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == LAYOUT_VERSION:
        return None
    if version > LAYOUT_VERSION:
        raise StoreError(
            f"{path}: history layout {version} was written by a newer fleetops "
            f"(this one reads up to {LAYOUT_VERSION}); upgrade fleetops or use another --db"
        )
    if version == 0 and not has_tables(db):
        # before the first table: incremental vacuum is fixed when the file is laid out
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see it done
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version == 0 and not has_tables(db):
            for statement in TABLES.split(";"):
                if statement.strip():
                    db.execute(statement)
        elif version < LAYOUT_VERSION:
            start = version = version or 1  # layout 1 never set user_version
            while version < LAYOUT_VERSION:
                MIGRATIONS[version](db)
                version += 1
            migrated_from = start
        db.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    if migrated_from is not None:
        # an old file: switching to incremental vacuum takes one full VACUUM, once
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        db.execute("VACUUM")
    return migrated_from
