"""Validation: whether each GPU has a current, passing ``fleetops validate`` result where the
baseline asks for one (``validation.require``).

The results live in the controller's history, not in the snapshot, so the audit hands each
node's latest stored validation per GPU and level to the checks (``Context.validations``).
Callers without the history (the node daemon, the Ansible modules) pass none, and these checks
stay silent rather than calling every GPU unvalidated.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fleetops import model
from fleetops.checks.base import CheckSpec, Context, gpu_label

FAMILY = "validation"
DAY_S = 86400.0

CMD_VALIDATE = "fleetops validate -i INVENTORY --limit {node} --level {level}"


def _requires(node: model.Node, baseline: Any) -> bool:
    return baseline is not None and baseline.validation.require is not None


SPECS = (
    CheckSpec(
        "validation.missing", FAMILY, "No validation of the GPU at the level the baseline requires",
        reads="the history's latest fleetops validate result of each GPU (by UUID), per level",
        threshold="a result at validation.require (a full one satisfies quick) that was judged, ok or not",
        severities=("warn",),
        action="Validate the node: fleetops validate -i INVENTORY --limit NODE --level LEVEL.",
        not_a_fault="A GPU validated under another node name (moved boards) has no result under this one.",
        requires="validation.require",
        applies=_requires,
    ),
    CheckSpec(
        "validation.expired", FAMILY, "The GPU's validation is older than it may be",
        reads="the history's latest fleetops validate result of each GPU: when it was measured and its expiry",
        threshold="measured more than validation.max_age_days ago, or (without it) past the result's own "
        "expiry (7 days for quick, 30 for full)",
        severities=("warn",),
        action="Validate the node again: fleetops validate -i INVENTORY --limit NODE --level LEVEL.",
        requires="validation.require",
        applies=_requires,
    ),
    CheckSpec(
        "validation.failed", FAMILY, "The GPU's last validation failed",
        reads="the judge's verdict stored with the GPU's latest fleetops validate result",
        threshold="crit: the newest result at any level fell below its model's floor; warn: the result "
        "the requirement rests on made it a straggler against its fleet peers",
        severities=("warn", "crit"),
        action="Keep the GPU out of jobs (drain the node), look at the failing figures with fleetops history "
        "--kind validate NODE, fix the cause (cooling, power brake, PCIe or NVLink training), then validate "
        "again: fleetops validate -i INVENTORY --limit NODE.",
        not_a_fault="A figure that never reached steady state is judged unknown, not failed.",
        requires="validation.require",
        applies=_requires,
    ),
)


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "an unknown time"
    return datetime.fromtimestamp(float(t), tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _started(row: Mapping[str, Any]) -> float:
    value = row.get("started_at")
    return float(value) if isinstance(value, (int, float)) else 0.0


def _newest(rows: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(rows, key=lambda r: (_started(r), int(r.get("run_id") or 0)), default=None)


def _expiry(row: Mapping[str, Any], max_age_days: float | None) -> float | None:
    if max_age_days is not None and isinstance(row.get("started_at"), (int, float)):
        return float(row["started_at"]) + max_age_days * DAY_S
    value = row.get("expires")
    return float(value) if isinstance(value, (int, float)) else None


def _observed(row: Mapping[str, Any], expires: float | None) -> dict[str, Any]:
    return {"level": row.get("level"), "status": row.get("status"), "measured": _when(row.get("started_at")),
            "expires": _when(expires), "run": row.get("run_id")}


def _why(row: Mapping[str, Any]) -> str:
    findings = (row.get("result") or {}).get("findings") or []
    parts = [f"{f.get('metric')}: {f.get('reason')}" for f in findings
             if isinstance(f, Mapping) and f.get("status") in ("warn", "crit")]
    return "; ".join(parts) or "no figure recorded"


def run(ctx: Context) -> None:
    baseline = ctx.baseline
    if baseline is None or baseline.validation.require is None or ctx.validations is None:
        return
    require = baseline.validation.require
    max_age = baseline.validation.max_age_days
    levels = ("quick", "full") if require == "quick" else ("full",)
    now = float(ctx.node.collected_at or time.time())
    node_rows: Mapping[str, Mapping[str, Mapping[str, Any]]] = ctx.validations
    for gpu in ctx.node.gpus:
        by_level = node_rows.get(gpu.uuid) or {}
        label = gpu_label(gpu)
        validate = CMD_VALIDATE.format(node=ctx.host, level=require)
        newest = _newest(list(by_level.values()))
        if newest is not None and newest.get("status") == "crit":
            expires = _expiry(newest, max_age)
            ctx.add("validation.failed", "crit",
                    f"{label}: its last validation ({newest.get('level')}, measured {_when(newest.get('started_at'))}, "
                    f"expires {_when(expires)}) failed: {_why(newest)}",
                    gpu, observed=_observed(newest, expires), expected=f"a passing {require} validation",
                    action=f"Keep the GPU out of jobs (drain the node), fix the cause, then validate again: {validate}.")
            continue
        basis = _newest([r for lv, r in by_level.items() if lv in levels])
        if basis is None:
            other = f"; it has only a {newest.get('level')} one ({_when(newest.get('started_at'))})" if newest else ""
            ctx.add("validation.missing", "warn",
                    f"{label}: no {require} validation recorded{other}", gpu,
                    observed=None, expected=f"a {require} validation",
                    action=f"Validate the node: {validate}.")
            continue
        expires = _expiry(basis, max_age)
        if expires is None or expires <= now:
            ctx.add("validation.expired", "warn",
                    f"{label}: its {basis.get('level')} validation, measured {_when(basis.get('started_at'))}, "
                    f"expired {_when(expires)}", gpu,
                    observed=_observed(basis, expires), expected=f"a {require} validation not past its expiry",
                    action=f"Validate the node again: {validate}.")
        elif basis.get("status") == "warn":
            ctx.add("validation.failed", "warn",
                    f"{label}: its {basis.get('level')} validation (measured {_when(basis.get('started_at'))}, "
                    f"expires {_when(expires)}) found it a straggler: {_why(basis)}",
                    gpu, observed=_observed(basis, expires), expected="figures in line with its fleet peers",
                    action=f"Look at the figures (fleetops history --kind validate {ctx.host}), fix the cause, "
                    f"then validate again: {validate}.")
        elif basis.get("status") != "ok":
            ctx.add("validation.missing", "warn",
                    f"{label}: its {basis.get('level')} validation (measured {_when(basis.get('started_at'))}) was "
                    f"inconclusive ({basis.get('status')}): a figure never reached steady state", gpu,
                    observed=_observed(basis, expires), expected=f"a judged {require} validation",
                    action=f"Validate the node again on an idle node: {validate}.")
