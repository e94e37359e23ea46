"""The history store: one SQLite database per controller, opened by ``Store``, which writes an
audit in one transaction (WAL, so readers such as the TUI never block it), beside it the
``fleetops validate`` runs, the drains and resumes fleetops made in Slurm and the actions taken
from the TUI, and reads them back: the latest reachable snapshot of each node (for the growth and
rate checks of the next audit), ``diff`` (which findings are new, resolved or persisting between
two audits), the escalation analysis's timelines, the latest validations.

Retention: audits older than ``keep_s`` (30 days by default) are pruned on write with their
snapshots and findings, the freed pages handed back by incremental vacuum, so the file stays
bounded: a fleet audited every few minutes writes thousands of node snapshots an hour. Sizes
and timings: bench/store.py, bench/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterable
from typing import Any

from fleetops import model
from fleetops.fleet import escalation
from fleetops.fleet.store.layout import (
    StoreError,
    decode_snapshot,
    default_path,
    encode_snapshot,
    open_layout,
)
from fleetops.fleet.store.rows import (
    ACTION_COLUMNS,
    ACTION_OUTCOMES,
    DRAIN_ACTIONS,
    DRAIN_COLUMNS,
    VALIDATION_COLUMNS,
    ActionRow,
    AuditRow,
    DrainRow,
    NodeResultRow,
    ValidateRunRow,
    ValidationRow,
    validation_row,
)

DEFAULT_KEEP_S = 30 * 86400.0


def _audit_point(
    audit_id: int, collected_at: float | None, blob: bytes | str, findings: list[model.Finding]
) -> escalation.AuditPoint:
    """The few values the escalation analysis needs from a stored snapshot, read from its JSON
    without building a ``model.Node`` (a week of a node's audits is thousands of them)."""
    uptime: float | None = None
    resets: dict[str, float] = {}
    try:
        text = zlib.decompress(blob).decode() if isinstance(blob, bytes) else blob
        data = json.loads(text)
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if isinstance(data, dict):
        up = data.get("uptime_s")
        uptime = float(up) if isinstance(up, int | float) else None
        for gpu in data.get("gpus") or []:
            at = gpu.get("last_reset_at") if isinstance(gpu, dict) else None
            if isinstance(at, int | float) and isinstance(gpu.get("uuid"), str):
                resets[gpu["uuid"]] = float(at)
        if collected_at is None and isinstance(data.get("collected_at"), int | float):
            collected_at = float(data["collected_at"])
    return escalation.AuditPoint(audit_id, float(collected_at or 0.0), uptime, resets, tuple(findings))


class Store:
    """``keep_s``: audits older than this are pruned when one is written (``None``: keep all)."""

    def __init__(self, path: str | None = None, keep_s: float | None = DEFAULT_KEEP_S) -> None:
        self.path = path or default_path()
        self.keep_s = keep_s
        # node -> why its latest snapshot could not be read (set by previous_snapshots)
        self.unreadable: dict[str, str] = {}
        self.migrated_from: int | None = None
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA foreign_keys=ON")
            self.migrated_from = open_layout(self.db, self.path)
            self.db.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open history database: {exc}") from exc

    def _transaction(self) -> Any:
        return _Transaction(self.db)

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
        with self._transaction():
            cur = self.db.execute(
                "INSERT INTO audits (started_at, duration_s, inventory, worst, exit_code, summary) VALUES (?,?,?,?,?,?)",
                (result.started_at, result.duration_s, result.inventory, summary["worst"], exit_code, json.dumps(summary)),
            )
            audit_id = int(cur.lastrowid or 0)
            self.db.executemany(
                "INSERT INTO snapshots (audit_id, node, reachable, error, collected_at, snapshot, schema)"
                " VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        audit_id,
                        n.name,
                        1 if n.snapshot is not None else 0,
                        n.error,
                        n.snapshot.collected_at if n.snapshot else None,
                        encode_snapshot(n.snapshot) if n.snapshot else None,
                        n.snapshot.schema if n.snapshot else None,
                    )
                    for n in result.nodes
                ],
            )
            self.db.executemany(
                "INSERT INTO findings (audit_id, node, key, severity, finding) VALUES (?,?,?,?,?)",
                [(audit_id, f.node, f.key, f.severity, json.dumps(f.to_dict())) for f in result.findings],
            )
        self.prune(now=time.time(), spare=audit_id)
        return audit_id

    def record_validation(self, run: dict[str, Any], gpus: list[dict[str, Any]]) -> int:
        """Write one ``fleetops validate`` run and each GPU's judged result in one transaction;
        returns the run id. ``run``: started_at, duration_s, inventory, level, status,
        exit_code, summary. Each GPU: node, uuid, bus_id, index, model, level, status,
        started_at, expires, result."""
        with self._transaction():
            cur = self.db.execute(
                "INSERT INTO validate_runs (started_at, duration_s, inventory, level, status, exit_code, summary)"
                " VALUES (?,?,?,?,?,?,?)",
                (run["started_at"], run["duration_s"], run.get("inventory"), run["level"], run["status"],
                 run["exit_code"], json.dumps(run.get("summary") or {})),
            )
            run_id = int(cur.lastrowid or 0)
            self.db.executemany(
                f"INSERT INTO validations ({VALIDATION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (run_id, g["node"], g["uuid"], g.get("bus_id"), g.get("index"), g.get("model"), g["level"],
                     g["status"], g.get("started_at"), g.get("expires"), json.dumps(g.get("result") or {}))
                    for g in gpus
                ],
            )
        self.prune(now=time.time(), spare_run=run_id)
        return run_id

    def record_drain(self, row: DrainRow) -> int:
        """Write one drain or resume; returns its id. Not pruned here: drains go with the audits'
        retention when an audit or validation is written (a drain must not prune a longer
        ``--keep`` than its own)."""
        if row.action not in DRAIN_ACTIONS:
            raise ValueError(f"drain action {row.action!r}: one of {', '.join(DRAIN_ACTIONS)}")
        with self._transaction():
            cur = self.db.execute(
                f"INSERT INTO drains ({DRAIN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.at, row.node, row.slurm_name, row.action, row.kind, row.run, row.purpose, row.outcome,
                 row.reason, row.previous_owner, row.message, row.source),
            )
        return int(cur.lastrowid or 0)

    def record_action(self, row: ActionRow) -> int:
        """Write one action taken from the TUI; returns its id. Not pruned here, as drains."""
        if row.outcome not in ACTION_OUTCOMES:
            raise ValueError(f"action outcome {row.outcome!r}: one of {', '.join(ACTION_OUTCOMES)}")
        with self._transaction():
            cur = self.db.execute(
                f"INSERT INTO actions ({ACTION_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                (row.at, row.node, row.gpu, row.action, row.outcome, row.why, row.source),
            )
        return int(cur.lastrowid or 0)

    def update_action(self, action_id: int, outcome: str, why: str) -> None:
        """What came of a sent action once it is known (verified, or unknown)."""
        if outcome not in ACTION_OUTCOMES:
            raise ValueError(f"action outcome {outcome!r}: one of {', '.join(ACTION_OUTCOMES)}")
        with self._transaction():
            self.db.execute("UPDATE actions SET outcome = ?, why = ? WHERE id = ?", (outcome, why, action_id))

    def actions(self, node: str | None = None, since: float | None = None, limit: int = 50) -> list[ActionRow]:
        """Actions taken from the TUI, newest first."""
        where: list[str] = []
        args: list[str | float | int] = []
        if node:
            where.append("node = ?")
            args.append(node)
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        sql = f"SELECT {ACTION_COLUMNS}, id FROM actions" + (" WHERE " + " AND ".join(where) if where else "")
        args.append(limit)
        rows = self.db.execute(sql + " ORDER BY at DESC, id DESC LIMIT ?", args).fetchall()
        return [ActionRow(at=r[0], node=r[1], gpu=r[2], action=r[3], outcome=r[4], why=r[5], source=r[6], id=r[7])
                for r in rows]

    def prune(self, now: float | None = None, spare: int | None = None, spare_run: int | None = None) -> int:
        """Delete audits older than the retention window (with their snapshots and findings), and
        the drains older than it, and hand the freed pages back to the file system; returns how
        many audits, validation runs and drains went. The audit ``spare`` and the run
        ``spare_run`` (the one just written) are kept whatever their start time."""
        if self.keep_s is None:
            return 0
        cutoff = (time.time() if now is None else now) - self.keep_s
        with self._transaction():
            cur = self.db.execute("DELETE FROM audits WHERE started_at < ? AND id != ?", (cutoff, spare or -1))
            gone = cur.rowcount
            # A run that holds some GPU's latest validation stays: the audit then reports that
            # validation as expired, with its date, rather than as missing.
            cur = self.db.execute(
                "DELETE FROM validate_runs WHERE started_at < ? AND id != ? AND id NOT IN "
                "(SELECT MAX(run_id) FROM validations GROUP BY node, gpu_uuid)",
                (cutoff, spare_run or -1),
            )
            gone += cur.rowcount
            cur = self.db.execute("DELETE FROM drains WHERE at < ?", (cutoff,))
            gone += cur.rowcount
            cur = self.db.execute("DELETE FROM actions WHERE at < ?", (cutoff,))
            gone += cur.rowcount
        if gone:
            # executescript steps the pragma to the end (execute() frees only its first page)
            self.db.executescript("PRAGMA incremental_vacuum;")
        return gone

    # --- reading ---------------------------------------------------------------------

    def previous_snapshots(self, nodes: list[str]) -> dict[str, model.Node]:
        """The latest snapshot of each node that had one. A node whose latest snapshot this
        release cannot read (another schema, damaged) is left out and named in ``unreadable``
        with the reason, so the caller can say its rate checks have no baseline this time."""
        out: dict[str, model.Node] = {}
        self.unreadable = {}
        # One indexed lookup per node, newest first: it stops at the first audit that reached the
        # node. A MAX(audit_id) ... WHERE snapshot IS NOT NULL over all nodes reads every stored
        # snapshot of every node instead (bench/store.py: tens of seconds at 30 days of 1000 nodes).
        query = (
            "SELECT snapshot FROM snapshots WHERE node = ? AND snapshot IS NOT NULL "
            "ORDER BY audit_id DESC LIMIT 1"
        )
        for node in nodes:
            row = self.db.execute(query, (node,)).fetchone()
            if row is None:
                continue
            try:
                out[node] = decode_snapshot(row[0])
            except model.SchemaError as exc:
                self.unreadable[node] = str(exc)
        return out

    def _newest_runs(self, select: str, node_filter: str, node: str | None, since: float | None,
                     limit: int) -> list[Any]:
        """Rows of a run table, newest first: ``node_filter`` selects the runs that hold ``node``."""
        where: list[str] = []
        args: list[str | float | int] = []
        if node:
            where.append(node_filter)
            args.append(node)
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        sql = select + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC LIMIT ?"
        args.append(limit)
        return self.db.execute(sql, args).fetchall()

    def audits(self, node: str | None = None, since: float | None = None, limit: int = 50) -> list[AuditRow]:
        rows = self._newest_runs(
            "SELECT id, started_at, duration_s, inventory, worst, exit_code, summary FROM audits",
            "id IN (SELECT audit_id FROM snapshots WHERE node = ?)", node, since, limit)
        return [AuditRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6])) for r in rows]

    def drains(self, node: str | None = None, since: float | None = None, limit: int = 50) -> list[DrainRow]:
        """Drains and resumes, newest first; ``node``: the inventory name or Slurm's name."""
        where: list[str] = []
        args: list[str | float | int] = []
        if node:
            where.append("(node = ? OR slurm_name = ?)")
            args += [node, node]
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        sql = f"SELECT {DRAIN_COLUMNS}, id FROM drains" + (" WHERE " + " AND ".join(where) if where else "")
        args.append(limit)
        rows = self.db.execute(sql + " ORDER BY at DESC, id DESC LIMIT ?", args).fetchall()
        return [
            DrainRow(at=r[0], node=r[1], slurm_name=r[2], action=r[3], kind=r[4], run=r[5], purpose=r[6],
                     outcome=r[7], reason=r[8], previous_owner=r[9], message=r[10], source=r[11], id=r[12])
            for r in rows
        ]

    def findings(self, audit_id: int, node: str | None = None) -> list[model.Finding]:
        sql = "SELECT finding FROM findings WHERE audit_id = ?"
        args: list[str | int] = [audit_id]
        if node:
            sql += " AND node = ?"
            args.append(node)
        return [model.Finding.from_dict(json.loads(r[0])) for r in self.db.execute(sql, args)]

    def findings_between(
        self,
        since: float | None,
        until: float | None,
        nodes: list[str] | None = None,
        containing: str | None = None,
        severities: tuple[str, ...] = ("unknown", "warn", "crit"),
    ) -> list[tuple[int, float, model.Finding]]:
        """(audit id, audit start, finding) of the audits started in [since, until] (None: no
        bound), oldest first: ``fleetops job``'s view of a job's span. ``nodes``: only theirs;
        ``containing``: only findings whose stored JSON holds that text, a cheap filter before the
        caller reads the field it means (a job id in ``jobs``)."""
        cond = [f"f.severity IN ({','.join('?' * len(severities))})"]
        args: list[str | float] = list(severities)
        if since is not None:
            cond.append("a.started_at >= ?")
            args.append(since)
        if until is not None:
            cond.append("a.started_at <= ?")
            args.append(until)
        if nodes is not None:
            cond.append(f"f.node IN ({','.join('?' * len(nodes))})")
            args += nodes
        if containing:
            cond.append("instr(f.finding, ?) > 0")
            args.append(containing)
        rows = self.db.execute(
            "SELECT a.id, a.started_at, f.finding FROM findings f JOIN audits a ON a.id = f.audit_id "
            f"WHERE {' AND '.join(cond)} ORDER BY a.id, f.rowid",
            args,
        ).fetchall()
        return [(int(r[0]), float(r[1]), model.Finding.from_dict(json.loads(r[2]))) for r in rows]

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

    def timelines(
        self, nodes: list[str] | None = None, since: float | None = None, until_audit: int | None = None
    ) -> dict[str, list[escalation.AuditPoint]]:
        """Each node's reachable audits, oldest first, as the escalation analysis reads them:
        warn/crit findings, uptime and each GPU's ``last_reset_at`` (the snapshot has no boot
        time: the analysis takes ``collected_at - uptime_s``). ``nodes`` None: every node audited
        since ``since``. A snapshot this release cannot read counts with its uptime unknown."""
        cond, args = ["s.snapshot IS NOT NULL"], []
        if since is not None:
            cond.append("a.started_at >= ?")
            args.append(since)
        if until_audit is not None:
            cond.append("s.audit_id <= ?")
            args.append(until_audit)
        where = " AND ".join(cond)
        if nodes is None:
            nodes = [
                r[0]
                for r in self.db.execute(
                    f"SELECT DISTINCT s.node FROM snapshots s JOIN audits a ON a.id = s.audit_id WHERE {where}",
                    args,
                )
            ]
        out: dict[str, list[escalation.AuditPoint]] = {}
        for node in nodes:
            rows = self.db.execute(
                "SELECT s.audit_id, s.collected_at, s.snapshot FROM snapshots s JOIN audits a ON a.id = s.audit_id "
                f"WHERE s.node = ? AND {where} ORDER BY s.audit_id",
                [node, *args],
            ).fetchall()
            if not rows:
                continue
            found: dict[int, list[model.Finding]] = {}
            for audit_id, text in self.db.execute(
                "SELECT audit_id, finding FROM findings WHERE node = ? AND audit_id >= ? AND audit_id <= ? "
                "AND severity IN ('warn', 'crit')",
                (node, rows[0][0], rows[-1][0]),
            ):
                found.setdefault(audit_id, []).append(model.Finding.from_dict(json.loads(text)))
            out[node] = [_audit_point(r[0], r[1], r[2], found.get(r[0], [])) for r in rows]
        return out

    def validate_runs(self, node: str | None = None, since: float | None = None, limit: int = 50) -> list[ValidateRunRow]:
        rows = self._newest_runs(
            "SELECT id, started_at, duration_s, inventory, level, status, exit_code, summary FROM validate_runs",
            "id IN (SELECT run_id FROM validations WHERE node = ?)", node, since, limit)
        return [ValidateRunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7])) for r in rows]

    def validations(self, run_id: int, node: str | None = None) -> list[ValidationRow]:
        sql = f"SELECT {VALIDATION_COLUMNS} FROM validations WHERE run_id = ?"
        args: list[str | int] = [run_id]
        if node:
            sql += " AND node = ?"
            args.append(node)
        sql += " ORDER BY node, gpu_index, gpu_uuid"
        return [validation_row(r) for r in self.db.execute(sql, args)]

    def latest_validations(self, nodes: list[str]) -> dict[str, dict[str, dict[str, ValidationRow]]]:
        """node -> GPU UUID -> level -> that GPU's latest validation at that level: what the
        audit's validation check reads (a full validation may satisfy a quick requirement, and
        the newest of all says whether the GPU last failed)."""
        out: dict[str, dict[str, dict[str, ValidationRow]]] = {}
        query = (
            f"SELECT {VALIDATION_COLUMNS} FROM validations WHERE node = ? AND run_id IN "
            "(SELECT MAX(run_id) FROM validations WHERE node = ? GROUP BY gpu_uuid, level)"
        )
        for node in nodes:
            per_gpu: dict[str, dict[str, ValidationRow]] = {}
            for r in self.db.execute(query, (node, node)):
                row = validation_row(r)
                current = per_gpu.setdefault(row.gpu_uuid, {}).get(row.level)
                if current is None or row.run_id > current.run_id:
                    per_gpu[row.gpu_uuid][row.level] = row
            out[node] = per_gpu
        return out

    def validations_for_audit(self, nodes: list[str]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        """``latest_validations`` as plain mappings, the form the checks read."""
        return {node: {uuid: {level: row.to_dict() for level, row in by_level.items()}
                       for uuid, by_level in per_gpu.items()}
                for node, per_gpu in self.latest_validations(nodes).items()}

    def node_history(self, node: str, limit: int = 20) -> list[tuple[int, float, bool, str | None]]:
        rows = self.db.execute(
            """SELECT s.audit_id, a.started_at, s.reachable, s.error FROM snapshots s JOIN audits a ON a.id = s.audit_id
               WHERE s.node = ? ORDER BY s.audit_id DESC LIMIT ?""",
            (node, limit),
        ).fetchall()
        return [(r[0], r[1], bool(r[2]), r[3]) for r in rows]

    def latest_results(self, nodes: list[str]) -> dict[str, NodeResultRow]:
        """Each node's newest result across every recorded audit (a --limit audit covers only
        some nodes: the fleet's state is the newest result of each), whatever its age; a node
        never audited is absent. One indexed lookup per node, as ``previous_snapshots``."""
        query = (
            "SELECT s.audit_id, a.started_at, s.reachable, s.error FROM snapshots s "
            "JOIN audits a ON a.id = s.audit_id WHERE s.node = ? ORDER BY s.audit_id DESC LIMIT 1"
        )
        out: dict[str, NodeResultRow] = {}
        for node in nodes:
            row = self.db.execute(query, (node,)).fetchone()
            if row is not None:
                out[node] = NodeResultRow(node, int(row[0]), float(row[1]), bool(row[2]), row[3])
        return out


class _Transaction:
    """BEGIN ... COMMIT on a connection in autocommit mode (the layout code needs that mode for
    PRAGMAs and VACUUM); rolls back on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def escalations(
    path: str | None,
    findings: Iterable[model.Finding],
    policy: escalation.Policy,
    now: float | None = None,
) -> escalation.Escalations:
    """The escalation analysis for a plan of ``findings``: the history of each node that has a
    warn or crit finding, read from the store at ``path`` (the analysis itself never opens it)."""
    current = list(findings)
    nodes = sorted({f.node for f in current if f.severity in model.FAULT_SEVERITIES})
    since = None if policy.lookback_s is None else (time.time() if now is None else now) - policy.lookback_s
    with Store(path) as store:
        timelines = store.timelines(nodes, since)
    return escalation.analyse(timelines, policy, current=current)


def parse_since(text: str) -> float:
    """``history --since``: a duration ago (the one grammar, ``2h``, ``7d``, ``2w``) or an ISO
    date/time, to epoch seconds."""
    from fleetops.catalog.durations import GRAMMAR, DurationError, parse_duration

    try:
        return time.time() - parse_duration(text, flag="--since", allow_zero=True)
    except DurationError:
        pass
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError as exc:
        raise StoreError(
            f"--since {text!r}: give a duration ago ({GRAMMAR}) or an ISO date like 2026-12-01T08:00"
        ) from exc
