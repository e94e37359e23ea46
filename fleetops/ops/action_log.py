"""Every action taken from the TUI (reset, drain, resume, re-audit) and its outcome, written to
the history store (``actions`` table), read back by the TUI's action log at start and listed by
``fleetops history --kind actions``.

Outcomes (``fleetops.fleet.store.rows.ACTION_OUTCOMES``): ``sent`` (the command went out and did what
was asked; nothing seen after it yet), ``refused`` (nothing was done: the refusal is the why),
``failed``, ``unknown`` (sent, no answer: check the node), ``verified`` (a snapshot taken after it
was read: the verdict is the why), ``cancelled`` (the operator said no at the action's own dialog,
the drain's reason prompt: nothing was sent). A sent action is updated in place once it is verified.

As with drains: the action has already happened when it is recorded, so a store that cannot be
written is a warning (to ``warn``, stderr by default), never a failed action.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from typing import Any, TextIO

from fleetops.fleet.store.database import Store
from fleetops.fleet.store.layout import StoreError
from fleetops.fleet.store.rows import ActionRow
from fleetops.ops import results

SENT, VERIFIED, CANCELLED = "sent", "verified", "cancelled"


def outcome_of(result: Any) -> str:
    """The action-log outcome of an action's result: ``ops.results`` outcomes (``detail`` holds
    it for the TUI's drain/resume result), done as sent; ``ok`` alone where none is said."""
    outcome = getattr(result, "outcome", None) or (getattr(result, "detail", None) or {}).get("outcome")
    if outcome in (results.DONE, results.DRY_RUN):
        return SENT
    if outcome in (results.REFUSED, results.FAILED, results.UNKNOWN):
        return str(outcome)
    return SENT if getattr(result, "ok", False) else results.FAILED


def why_of(result: Any) -> str:
    """The action's message, with the command that tells what happened where it is unknown."""
    message = " ".join(str(getattr(result, "message", "") or "").split())
    check = getattr(result, "check", None) or (getattr(result, "detail", None) or {}).get("check")
    if check and outcome_of(result) == results.UNKNOWN and str(check) not in message:
        message += f"; check: {check}"
    return message


def _warn(warn: TextIO | None, db_path: str | None, row: ActionRow, exc: Exception) -> None:
    (warn or sys.stderr).write(
        f"fleetops: warning: {row.node}: {row.action} {row.outcome}, but not recorded in the "
        f"history ({db_path or 'the default database'}): {exc}\n"
    )


def record(
    db_path: str | None,
    node: str,
    action: str,
    outcome: str,
    why: str,
    *,
    gpu: str | None = None,
    source: str = "tui",
    now: float | None = None,
    warn: TextIO | None = None,
) -> tuple[ActionRow, int | None]:
    """Write one action; the row and its id (None where the store could not be written)."""
    row = ActionRow(at=time.time() if now is None else now, node=node, gpu=gpu, action=action, outcome=outcome,
                    why=" ".join(why.split()), source=source)
    try:
        with Store(db_path, keep_s=None) as store:
            row_id = store.record_action(row)
    except (StoreError, sqlite3.Error, OSError) as exc:
        _warn(warn, db_path, row, exc)
        return row, None
    return ActionRow(**{**row.to_dict(), "id": row_id}), row_id


def update(db_path: str | None, row: ActionRow, outcome: str, why: str, *, warn: TextIO | None = None) -> ActionRow:
    """What came of a sent action, now known; the row as it now reads."""
    new = ActionRow(**{**row.to_dict(), "outcome": outcome, "why": " ".join(why.split())})
    if row.id is None:
        return new
    try:
        with Store(db_path, keep_s=None) as store:
            store.update_action(row.id, outcome, new.why)
    except (StoreError, sqlite3.Error, OSError) as exc:
        _warn(warn, db_path, new, exc)
    return new


def recent(db_path: str | None, limit: int = 200, *, warn: TextIO | None = None) -> list[ActionRow]:
    """The latest actions, newest first (none where the store cannot be read)."""
    try:
        with Store(db_path, keep_s=None) as store:
            return store.actions(limit=limit)
    except (StoreError, sqlite3.Error, OSError) as exc:
        (warn or sys.stderr).write(f"fleetops: warning: action log: cannot read {db_path}: {exc}\n")
        return []
