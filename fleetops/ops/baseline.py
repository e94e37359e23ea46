"""Which baseline each host is audited against: one rule for the audit, ``remediate`` and the TUI,
so the same host is never judged by two different baselines depending on the front end."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def resolve_baselines(hosts: Iterable[Any], baseline_path: str | None, inventory: str) -> dict[str, Any]:
    """Host name -> ``Baseline`` (or None): ``baseline_path`` for every host when given, else each
    host's ``fleetops_baseline`` inventory variable. Hosts whose variable is the same mapping share
    one parsed baseline, which keeps fleet-wide checks grouped by baseline and parses each once."""
    from fleetops import baseline as bl

    hosts = list(hosts)
    if baseline_path:
        one = bl.load_file(baseline_path)
        return {h.name: one for h in hosts}
    cache: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for host in hosts:
        data = host.vars.get("fleetops_baseline")
        if data is None:
            out[host.name] = None
            continue
        key = json.dumps(data, sort_keys=True, default=str)
        if key not in cache:
            cache[key] = bl.from_mapping(data, source=f"{inventory}: fleetops_baseline of host {host.name}")
        out[host.name] = cache[key]
    return out
