"""Whether the recorded audits are fit to act on: ``fleetops remediate --yes`` resets GPUs because
an audit said so, and an old result, or none at all, says nothing about a node now.

The plan is made from each node's newest recorded result across every audit (a ``--limit``
audit covers only some nodes: the fleet's state is the newest result of each), taken only when
it is younger than a limit (default 15 minutes). ``--yes`` is refused while any node in
remediate's scope (the inventory and ``--limit``) has no such result, and every one of them is
named; ``--dry-run`` and the plain plan still show, with the same words as a warning."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetops.common.errors import Refused

DEFAULT_MAX_AUDIT_AGE_S = 15 * 60.0


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
class NodeResult:
    """The newest recorded result of one node: which audit, and how old it is."""

    node: str
    audit_id: int
    age_s: float
    reachable: bool = True

    def describe(self) -> str:
        return f"audit #{self.audit_id}, {format_age(self.age_s)} ago"


@dataclass(frozen=True)
class Coverage:
    """Which nodes of remediate's scope have a recent result to plan from, and which do not."""

    max_age_s: float
    window: str  # the limit as the operator wrote it (``15m``), for messages
    recent: Mapping[str, NodeResult]  # node -> its newest result, within the limit
    stale: Mapping[str, NodeResult]  # node -> its newest result, older than the limit
    never: tuple[str, ...]  # nodes no recorded audit covered

    @property
    def unplanned(self) -> dict[str, str]:
        """node -> why there is no result to plan from, by node name."""
        out = {n: f"last result {r.describe()}" for n, r in self.stale.items()}
        out.update({n: "never audited" for n in self.never})
        return dict(sorted(out.items()))

    @property
    def audit_ids(self) -> list[int]:
        return sorted({r.audit_id for r in self.recent.values()})

    @property
    def ok(self) -> bool:
        return not self.stale and not self.never

    def problems(self) -> list[str]:
        missing = self.unplanned
        if not missing:
            return []
        listed = ", ".join(f"{n} ({why})" for n, why in missing.items())
        return [
            f"{len(missing)} node(s) have no audit within {self.window} (--max-audit-age), nothing is planned "
            f"for them: {listed}"
        ]

    def to_dict(self) -> dict[str, Any]:
        def one(r: NodeResult) -> dict[str, Any]:
            return {"audit_id": r.audit_id, "age_s": round(r.age_s, 1), "reachable": r.reachable}

        return {
            "max_age_s": self.max_age_s,
            "audits": self.audit_ids,
            "nodes": {n: one(r) for n, r in sorted(self.recent.items())},
            "stale": {n: one(r) for n, r in sorted(self.stale.items())},
            "never": list(self.never),
            "missing": list(self.unplanned),
        }


def coverage(
    latest: Mapping[str, Any],
    scope: Iterable[str],
    max_age_s: float = DEFAULT_MAX_AUDIT_AGE_S,
    window: str | None = None,
    now: float | None = None,
) -> Coverage:
    """Sort the nodes of ``scope`` by their newest result (``latest``: node -> a row with
    ``audit_id``, ``started_at`` and ``reachable``, as ``Store.latest_results`` gives): recent,
    stale or never audited. A result's age is its audit's start."""
    at = time.time() if now is None else now
    recent: dict[str, NodeResult] = {}
    stale: dict[str, NodeResult] = {}
    never: list[str] = []
    for node in scope:
        row = latest.get(node)
        if row is None:
            never.append(node)
            continue
        result = NodeResult(
            node, int(row.audit_id), at - float(row.started_at), bool(getattr(row, "reachable", True))
        )
        (stale if result.age_s > max_age_s else recent)[node] = result
    return Coverage(max_age_s, window or format_age(max_age_s), recent, stale, tuple(sorted(set(never))))


def require_fit(cov: Coverage) -> None:
    """Refuse to act while nodes of the scope have no recent result, naming each of them."""
    if cov.ok:
        return
    names = ",".join(cov.unplanned)
    raise Refused(
        "refusing --yes: " + "; ".join(cov.problems()) + ". Nothing was reset or drained. Audit them "
        f"(fleetops audit -i INVENTORY --limit {names}), or remediate --fresh, or narrow remediate with "
        "--limit, or raise --max-audit-age."
    )
