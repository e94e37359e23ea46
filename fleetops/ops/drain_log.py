"""Every drain and resume fleetops makes from the controller, written to the history store.

Slurm keeps a drain's Reason (``[fleetops] KIND/RUN: PURPOSE``) only while the node is drained;
once it is lifted nobody can say who drained it, for what, or who lifted it. Each front end
(``fleetops drain``/``resume``, the TUI, remediate) hands its ``ActionResult`` to ``record``,
which writes one row: the owner (kind, run, purpose), the outcome, the Reason Slurm keeps after
it and the owner of a drain it met (held, taken over, lifted or forced over), read from the
result's ``detail`` as ``fleetops.ops.slurm`` fills it.

The action has already happened when it is recorded: a store that cannot be written is a
warning on stderr, never a failed drain. A dry run, and a host the inventory says is not a Slurm
node, record nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from fleetops.catalog import slurm as rule
from fleetops.ops.results import DONE, DRY_RUN, UNKNOWN, ActionResult

SOURCES = ("cli", "tui", "remediate", "rollout", "mig")


def row_of(
    result: ActionResult,
    *,
    kind: str,
    run: str,
    purpose: str | None = None,
    source: str,
    now: float | None = None,
) -> Any:
    """The ``DrainRow`` for one drain or resume result, or None where nothing is recorded."""
    from fleetops.fleet.store.rows import DrainRow

    detail = result.detail or {}
    if result.outcome == DRY_RUN or detail.get("slurm_managed") is False:
        return None
    current = detail.get("reason")
    met = rule.owner_of(current).describe() if detail.get("owner") else None
    if result.action == "drain":
        sent = result.outcome in (DONE, UNKNOWN) and detail.get("decision") in ("drain", "adopt")
        reason = detail.get("new_reason") if sent else current
    else:
        reason = None if result.outcome == DONE else current
        if purpose is None and detail.get("owner"):
            purpose = detail["owner"].get("purpose")  # the purpose of the drain it lifts (or would)
    return DrainRow(
        at=time.time() if now is None else now,
        node=result.node,
        slurm_name=detail.get("slurm_name"),
        action=result.action,
        kind=kind,
        run=run,
        purpose=" ".join((purpose or "").split()) or None,
        outcome=result.outcome,
        reason=reason,
        previous_owner=met,
        message=result.message,
        source=source,
    )


def record(
    db_path: str | None,
    result: ActionResult,
    *,
    kind: str,
    run: str,
    purpose: str | None = None,
    source: str,
    warn: TextIO | None = None,
) -> int | None:
    """Write the row for ``result`` to the store at ``db_path`` (None: the default path); its id,
    or None when nothing was written (a dry run, not a Slurm node, or the store failed: then a
    warning goes to ``warn``, stderr by default)."""
    ids = record_all(db_path, [result], kind=kind, run=run, purpose=purpose, source=source, warn=warn)
    return ids[0] if ids else None


def record_all(
    db_path: str | None,
    done: list[ActionResult],
    *,
    kind: str,
    run: str,
    purpose: str | None = None,
    source: str,
    warn: TextIO | None = None,
) -> list[int]:
    """``record`` for each result of one command, through one open store; the ids written."""
    import sqlite3

    from fleetops.fleet.store.database import Store
    from fleetops.fleet.store.layout import StoreError

    rows = [row_of(r, kind=kind, run=run, purpose=purpose, source=source) for r in done]
    rows = [row for row in rows if row is not None]
    if not rows:
        return []
    try:
        # keep_s None: writing a drain never prunes (an audit with a longer --keep owns that)
        with Store(db_path, keep_s=None) as store:
            return [store.record_drain(row) for row in rows]
    except (StoreError, sqlite3.Error, OSError) as exc:
        for row in rows:
            (warn or sys.stderr).write(
                f"fleetops: warning: {row.node}: {row.action} {row.outcome}, but not recorded in the "
                f"history ({db_path or 'the default database'}): {exc}\n"
            )
        return []
