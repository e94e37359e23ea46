"""What an action did, said so an operator can act on it; one type for every front end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# outcome of an action on one node
DONE = "done"  # it ran and did what was asked
REFUSED = "refused"  # a precondition failed; nothing was sent or the agent changed nothing
FAILED = "failed"  # it ran and failed
UNKNOWN = "unknown"  # the command was sent but no answer came back: check the node
DRY_RUN = "dry-run"  # evaluated only
OUTCOMES = (DONE, REFUSED, FAILED, UNKNOWN, DRY_RUN)


@dataclass(frozen=True)
class ActionResult:
    node: str
    action: str  # reset | drain | resume | apply
    outcome: str  # one of OUTCOMES
    message: str
    check: str | None = None  # the command that tells what happened, when the outcome is unknown
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome in (DONE, DRY_RUN)
