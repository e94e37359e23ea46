"""The node-side gate (``fleetops-agent validate --judge``): judge one node's fresh results
against the floors alone.

Mid-rollout there is no fleet to compare with, so the straggler rule cannot apply; each GPU is
judged on its own (the judge needs three peers for a median), which leaves floors and steady
state. The floors are the shipped ones with the baseline's ``validation.floors`` applied, parsed
by the baseline's own validator so a bad override reads the same here as in ``fleetops audit``.
"""

from __future__ import annotations

import json
from typing import Any

from fleetops.validation.judge import judge, overall


class GateError(Exception):
    pass


def parse_floors(text: str | None) -> dict[str, dict[str, float]] | None:
    """``--floors`` JSON (the baseline's ``validation.floors`` mapping) as judge overrides."""
    if not text:
        return None
    from fleetops import baseline

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateError(f"--floors: not JSON ({exc})") from exc
    try:
        parsed = baseline.from_mapping({"validation": {"floors": data}}, "--floors")
    except baseline.BaselineError as exc:
        raise GateError(str(exc)) from exc
    return {model: dict(metrics) for model, metrics in parsed.validation.floors.items()} or None


def judge_node(doc: dict[str, Any], overrides: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    """``doc`` (the agent's validate answer) with ``gate``: status ok/crit/unknown, whether it
    passed, and one line per GPU that did not pass naming it and the failing figures."""
    failed: list[str] = []
    verdicts = []
    for g in doc.get("gpus") or []:
        [v] = judge([g], overrides)
        verdicts.append(v)
        if v.status != "ok":
            why = "; ".join(f"{x.metric}: {x.reason}" for x in v.verdicts if x.status != "ok")
            failed.append(f"GPU {g.get('index')} {g.get('uuid')} ({g.get('bus_id')}) {v.status}: {why}")
    status = overall(verdicts) if verdicts else "unknown"
    if not verdicts:
        failed.append("no GPU was validated")
    return {**doc, "gate": {"status": status, "passed": status == "ok", "judged_by": "floors",
                            "failed": failed, "gpus": [v.to_dict() for v in verdicts]}}
