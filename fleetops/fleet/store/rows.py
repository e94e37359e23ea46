"""The rows the history database gives back and takes: one dataclass per kind of record (an
audit, a node's result in one, a validation run and each GPU's result, a drain or resume, an
action from the TUI), the words a drain or action row may hold, and each table's column list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DRAIN_ACTIONS = ("drain", "resume")
# the outcomes of an action row: ops.results' done/refused/failed/unknown, with done split into
# sent (the command went out; nothing seen after it yet) and verified (a snapshot taken after it);
# cancelled: the operator said no at the action's own dialog (nothing was sent)
ACTION_OUTCOMES = ("sent", "refused", "failed", "unknown", "verified", "cancelled")


@dataclass
class AuditRow:
    id: int
    started_at: float
    duration_s: float
    inventory: str | None
    worst: str
    exit_code: int
    summary: dict[str, Any]


@dataclass(frozen=True)
class NodeResultRow:
    """One node's result in one audit: what ``latest_results`` gives per node."""

    node: str
    audit_id: int
    started_at: float  # the audit's start
    reachable: bool
    error: str | None


@dataclass
class ValidateRunRow:
    id: int
    started_at: float
    duration_s: float
    inventory: str | None
    level: str
    status: str
    exit_code: int
    summary: dict[str, Any]


@dataclass
class ValidationRow:
    """One GPU's judged result of one ``fleetops validate`` run. ``result`` holds the figures,
    provenance, telemetry and the judge's findings as the run saw them."""

    run_id: int
    node: str
    gpu_uuid: str
    bus_id: str | None
    gpu_index: int | None
    model: str | None
    level: str
    status: str
    started_at: float | None
    expires: float | None
    result: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class DrainRow:
    """One drain or resume fleetops made (or was refused) in Slurm. ``reason``: the Reason Slurm
    keeps after it (None once a resume lifted it); ``previous_owner``: the drain it met, as
    ``Owner.describe()`` says it (held, taken over, lifted or forced over); ``source``: the
    front end (cli, tui, remediate, rollout, mig, ...)."""

    at: float
    node: str
    action: str  # drain | resume
    kind: str
    run: str
    outcome: str  # done | refused | failed | unknown (ops.results)
    message: str
    source: str
    slurm_name: str | None = None
    purpose: str | None = None
    reason: str | None = None
    previous_owner: str | None = None
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ActionRow:
    """One action taken from the TUI. ``gpu``: the GPU it named (a reset's UUID), None for a
    node action; ``outcome``: one of ``ACTION_OUTCOMES``; ``why``: the refusal, the verdict
    after it, or the action's own message; ``source``: the front end (tui)."""

    at: float
    node: str
    action: str  # reset | drain | resume | re-audit
    outcome: str
    why: str
    source: str = "tui"
    gpu: str | None = None
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


ACTION_COLUMNS = "at, node, gpu, action, outcome, why, source"


DRAIN_COLUMNS = (
    "at, node, slurm_name, action, kind, run, purpose, outcome, reason, previous_owner, message, source"
)


VALIDATION_COLUMNS = "run_id, node, gpu_uuid, bus_id, gpu_index, model, level, status, started_at, expires, result"


def validation_row(r: Any) -> ValidationRow:
    return ValidationRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], json.loads(r[10]))
