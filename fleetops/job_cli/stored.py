"""What the controller's history store knows of one job, beside what its nodes say.

A node's answer covers its daemon's window (about an hour of samples) and only while the node
keeps the job's record (``/run`` is cleared by a reboot). The store keeps every audit's findings
and the actions taken (resets, drains and resumes, remediation's drains), so ``fleetops job``
adds, for the job's span [start, end or now]:

- the faults (warn, crit, unknown) the audits found on the job's GPUs (by UUID) and the
  node-level ones of its nodes, and wherever they were found, every finding whose ``jobs``
  names the job (an XID seen by an audit after the job ended still names it). The same finding
  seen by several audits is one entry, with the first and last audit that saw it;
- the actions on its nodes (a GPU action only where it names one of the job's GPUs) and the
  drains and resumes of its nodes, in the span.

When no node holds the job's record any more, the findings that name the job tell its nodes,
GPUs and span (first to last audit that named it), and the same selection runs on those.

A store file that is not there is no error (the section says so); one that cannot be read is
named in ``error``, and the live diagnosis is shown all the same.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleetops import model

SEVERITIES = ("unknown", "warn", "crit")  # what ``fleetops history`` calls a finding too
ROWS_LIMIT = 100_000  # actions and drains per node in a span: far above any real count


@dataclass(frozen=True)
class Scope:
    """Where and when the job ran, as the store is asked: ``gpus`` by UUID."""

    job_id: str
    start: float
    end: float
    nodes: frozenset[str]
    gpus: frozenset[str]


def names_job(f: model.Finding, job_id: str) -> bool:
    return job_id in (f.jobs or [])


def in_scope(f: model.Finding, at: float, scope: Scope) -> bool:
    """A finding of an audit started at ``at``: one naming the job, whenever; else one inside
    the span on a job's GPU, or on a job's node and no GPU."""
    if names_job(f, scope.job_id):
        return True
    if not scope.start <= at <= scope.end or f.node not in scope.nodes:
        return False
    uuid = (f.gpu or {}).get("uuid")
    return uuid in scope.gpus if uuid else not f.gpu


def scope_from_findings(job_id: str, rows: Iterable[tuple[int, float, model.Finding]]) -> Scope | None:
    """The job as the findings naming it tell it (no node holds its record): their nodes, GPUs
    and the first to the last audit that named it; None when none does."""
    named = [(at, f) for _, at, f in rows if names_job(f, job_id)]
    if not named:
        return None
    times = [at for at, _ in named]
    gpus = {str((f.gpu or {}).get("uuid")) for _, f in named if (f.gpu or {}).get("uuid")}
    return Scope(job_id, min(times), max(times), frozenset(f.node for _, f in named), frozenset(gpus))


def merge(rows: Iterable[tuple[int, float, model.Finding]], scope: Scope) -> list[dict[str, Any]]:
    """The findings in scope, one entry per finding (``Finding.key``) whatever the number of
    audits that saw it: its latest message, its worst severity, the first and last audit that
    saw it and how many did; ordered by first seen."""
    seen: dict[str, dict[str, Any]] = {}
    audits: dict[str, set[int]] = {}
    for audit_id, at, f in sorted(rows, key=lambda r: (r[0], r[1])):
        if not in_scope(f, at, scope):
            continue
        entry = seen.get(f.key)
        if entry is None:
            entry = seen[f.key] = {"node": f.node, "gpu": f.gpu, "port": f.port, "check": f.check,
                                   "severity": f.severity, "first_seen": at, "first_audit": audit_id,
                                   "names_job": False}
        if model.SEVERITY_RANK[f.severity] > model.SEVERITY_RANK[entry["severity"]]:
            entry["severity"] = f.severity
        entry.update(message=f.message, action=f.action, last_seen=at, last_audit=audit_id)
        entry["names_job"] = entry["names_job"] or names_job(f, scope.job_id)
        audits.setdefault(f.key, set()).add(audit_id)
    for key, entry in seen.items():
        entry["audits"] = len(audits[key])
    return sorted(seen.values(), key=lambda e: (e["first_seen"], e["node"], e["check"]))


def actions_in(actions: Iterable[Any], drains: Iterable[Any], scope: Scope) -> list[dict[str, Any]]:
    """The TUI's actions (``ActionRow``) and the drains and resumes (``DrainRow``, by inventory or
    Slurm name) in the span on the job's nodes, oldest first; an action on a GPU only where it is
    one of the job's."""
    out: list[dict[str, Any]] = []
    for a in actions:
        if a.node in scope.nodes and scope.start <= a.at <= scope.end and (a.gpu is None or a.gpu in scope.gpus):
            out.append({"at": a.at, "node": a.node, "gpu": a.gpu, "action": a.action, "outcome": a.outcome,
                        "why": a.why, "source": a.source})
    for d in drains:
        if (d.node in scope.nodes or d.slurm_name in scope.nodes) and scope.start <= d.at <= scope.end:
            out.append({"at": d.at, "node": d.node, "gpu": None, "action": d.action, "outcome": d.outcome,
                        "why": d.purpose or d.reason or d.message, "source": f"{d.source} ({d.kind}/{d.run})"})
    return sorted(out, key=lambda e: (e["at"], e["node"], e["action"]))


def section(path: str, job_id: str, scope: Scope | None = None) -> dict[str, Any]:
    """The ``history`` part of ``fleetops.job/v1``: ``db``, ``span`` ([start, end] asked, None
    when nothing was), ``findings``, ``actions``, ``error`` (the store could not be read: why,
    naming the file), ``note``. ``scope`` None: no node holds the job's record; the findings that
    name the job tell where and when it ran (``scope_from_findings``)."""
    from fleetops.fleet.store.database import Store
    from fleetops.fleet.store.layout import StoreError

    out: dict[str, Any] = {"db": path, "span": None, "findings": [], "actions": [], "error": None, "note": None}
    if not os.path.exists(path):
        out["note"] = f"no history database at {path}"
        return out
    try:
        with Store(path) as store:
            # only an audit during or after the job can name it; ``jobs`` holds the id as a JSON string
            since = scope.start if scope is not None else None
            naming = [r for r in store.findings_between(since, None, containing=f'"{job_id}"', severities=SEVERITIES)
                      if names_job(r[2], job_id)]
            scope = scope or scope_from_findings(job_id, naming)
            if scope is None:
                out["note"] = f"no finding in {path} names job {job_id}"
                return out
            rows = store.findings_between(scope.start, scope.end, sorted(scope.nodes), severities=SEVERITIES)
            actions, drains = [], []
            for node in sorted(scope.nodes):
                actions += store.actions(node, scope.start, ROWS_LIMIT)
                drains += store.drains(node, scope.start, ROWS_LIMIT)
    except (StoreError, sqlite3.Error, OSError, ValueError, KeyError, TypeError) as exc:
        text = str(exc)
        out["error"] = text if text.startswith(path) else f"{path}: cannot read history database: {text}"
        return out
    out["span"] = [scope.start, scope.end]
    out["findings"] = merge(naming + rows, scope)
    out["actions"] = actions_in(actions, drains, scope)
    return out
