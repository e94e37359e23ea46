"""Whether an audit is fit to act on: ``fleetops remediate --yes`` resets GPUs because an audit
said so, and an old audit, or one that never looked at a host, says nothing about that host now.

The rule: every host the plan acts on must be covered by the audit the plan comes from, and
that audit must be younger than a limit (default 15 minutes). ``--yes`` is refused otherwise;
``--dry-run`` and the plain plan still show, with the same words as a warning."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fleetops.ops.errors import Refused, UsageError

DEFAULT_MAX_AUDIT_AGE_S = 15 * 60.0
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_age(text: str, flag: str = "--max-audit-age") -> float:
    """Seconds from ``900``, ``900s``, ``15m``, ``1h`` or ``1d``; a UsageError naming the flag."""
    m = _AGE.match(str(text))
    if not m:
        raise UsageError(f"{flag} {text!r}: give a duration like 900s, 15m or 1h")
    seconds = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if seconds <= 0:
        raise UsageError(f"{flag} {text!r}: must be more than 0")
    return seconds


def format_age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


@dataclass(frozen=True)
class AuditFitness:
    audit_id: int
    age_s: float
    max_age_s: float
    missing: tuple[str, ...]  # hosts in remediate's scope (-i, --limit) that the audit did not cover

    @property
    def stale(self) -> bool:
        return self.age_s > self.max_age_s

    @property
    def ok(self) -> bool:
        return not self.stale and not self.missing

    def problems(self) -> list[str]:
        out = []
        if self.stale:
            out.append(
                f"audit #{self.audit_id} is {format_age(self.age_s)} old, older than the limit of "
                f"{format_age(self.max_age_s)} (--max-audit-age)"
            )
        if self.missing:
            out.append(
                f"audit #{self.audit_id} did not cover {', '.join(self.missing)} "
                "(hosts of this inventory and --limit, which the plan would act on)"
            )
        return out


def fitness(
    audit_id: int,
    started_at: float,
    covered: Iterable[str],
    acting_on: Iterable[str],
    max_age_s: float = DEFAULT_MAX_AUDIT_AGE_S,
    now: float | None = None,
) -> AuditFitness:
    have = set(covered)
    missing = tuple(sorted({h for h in acting_on if h not in have}))
    age = (time.time() if now is None else now) - started_at
    return AuditFitness(audit_id, age, max_age_s, missing)


def require_fit(fit: AuditFitness) -> None:
    """Refuse to act on an unfit audit, saying why and what to do instead."""
    if fit.ok:
        return
    raise Refused(
        "refusing --yes: " + "; ".join(fit.problems()) + ". Nothing was reset. Audit again "
        "(fleetops audit -i INVENTORY, or remediate --fresh), or raise --max-audit-age."
    )
