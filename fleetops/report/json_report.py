"""The audit as one JSON document (schema ``fleetops.audit/v1``)."""

from __future__ import annotations

import json
from typing import Any

from fleetops import model


def document(result: Any, exit_code: int) -> dict[str, Any]:
    return {
        "schema": model.FINDINGS_SCHEMA_ID,
        "summary": {**result.summary(), "exit_code": exit_code},
        "nodes": [
            {
                "name": n.name,
                "reachable": n.reachable,
                "error": n.error,
                "source": n.source,
                "snapshot_age_s": n.age_s,
                "rates": n.rates,
                "snapshot": model.to_dict(n.snapshot) if n.snapshot else None,
            }
            for n in result.nodes
        ],
        "findings": [f.to_dict() for f in result.findings],
    }


def render(result: Any, exit_code: int) -> str:
    # compact: an indented dump goes through json's pure-Python encoder, seconds for a large
    # fleet; pipe through `jq .` to read it
    return json.dumps(document(result, exit_code), separators=(",", ":")) + "\n"
