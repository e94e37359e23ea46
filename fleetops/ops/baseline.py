"""Which baseline each host is audited against: one rule for the audit, ``remediate`` and the TUI,
so the same host is never judged by two different baselines depending on the front end."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def _layers_key(layers: Iterable[Any]) -> str:
    return json.dumps([(la.level, la.source, la.data) for la in layers], sort_keys=True, default=str)


def host_baseline(host: Any, inventory: str) -> Any:
    """The effective baseline of one inventory host (or None when no level sets one): every
    level's ``fleetops_baseline`` layered parent to child (``fleetops.baseline.layer``), or, for
    a host without layers (a host list), its ``fleetops_baseline`` variable as it is."""
    from fleetops import baseline as bl

    layers = getattr(host, "baseline_layers", ())
    if layers:
        return bl.layer([(la.level, la.source, la.data) for la in layers])
    data = host.vars.get("fleetops_baseline")
    if data is None:
        return None
    return bl.from_mapping(data, source=f"{inventory}: fleetops_baseline of host {host.name}")


def resolve_baselines(hosts: Iterable[Any], baseline_path: str | None, inventory: str) -> dict[str, Any]:
    """Host name -> ``Baseline`` (or None): ``baseline_path`` for every host when given, else each
    host's layered ``fleetops_baseline`` (``host_baseline``). Hosts with the same layers share one
    parsed baseline, which keeps fleet-wide checks grouped by baseline and parses each once."""
    from fleetops import baseline as bl

    hosts = list(hosts)
    if baseline_path:
        one = bl.load_file(baseline_path)
        return {h.name: one for h in hosts}
    cache: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for host in hosts:
        layers = getattr(host, "baseline_layers", ())
        if layers:
            key = "layers:" + _layers_key(layers)
        elif host.vars.get("fleetops_baseline") is not None:
            key = "var:" + json.dumps(host.vars["fleetops_baseline"], sort_keys=True, default=str)
        else:
            out[host.name] = None
            continue
        if key not in cache:
            cache[key] = host_baseline(host, inventory)
        out[host.name] = cache[key]
    return out


def explain(host: Any, inventory: str) -> dict[str, Any]:
    """The effective baseline of ``host`` key by key, with the inventory level (and file:line)
    each key came from: what ``fleetops baseline show`` prints. Keys no level sets are absent
    (not checked, or a threshold at its default)."""
    from fleetops import baseline as bl

    b = host_baseline(host, inventory)
    layers = [{"level": la.level, "source": la.source} for la in getattr(host, "baseline_layers", ())]
    if b is None:
        return {"host": host.name, "inventory": inventory, "layers": layers, "keys": [], "baseline": None}
    if not layers:
        layers = [{"level": f"host {host.name}", "source": b.source}]
    keys = []
    for path, value in bl.flatten(b):
        source, line = b.origin(path) or (b.source, None)
        keys.append({
            "path": path,
            "value": value,
            "level": b.level_of(path) or f"host {host.name}",
            "source": source,
            "line": line,
        })
    return {
        "host": host.name,
        "inventory": inventory,
        "layers": layers,
        "keys": keys,
        "baseline": dict(b.raw),
        "ansible_differs": _ansible_differs(host, b, inventory),
    }


def _ansible_differs(host: Any, effective: Any, inventory: str) -> list[str]:
    """Key paths where the ``fleetops_baseline`` Ansible hands a playbook (the most specific
    level's mapping: Ansible replaces dicts) differs from the layered baseline fleetops audits
    with: what the roles do not see."""
    from fleetops import baseline as bl

    data = host.vars.get("fleetops_baseline")
    try:
        seen = dict(bl.flatten(bl.from_mapping(data, f"{inventory}: fleetops_baseline of host {host.name}")))
    except bl.BaselineError:  # e.g. warn above crit in the child alone: every key differs
        seen = {}
    want = dict(bl.flatten(effective))
    return sorted(p for p in set(seen) | set(want) if seen.get(p, ...) != want.get(p, ...))


# The extra variable ``fleetops rollout`` / ``fleetops apply`` hand every playbook run, and that
# ``playbooks/group_vars/all.yml`` turns into each host's ``fleetops_effective_baseline``.
PLAYBOOK_VAR = "fleetops_baseline_layered"


def _plain(value: Any) -> Any:
    """Ansible's tagged scalars as plain JSON values (an extra variable goes through a file)."""
    return json.loads(json.dumps(value, default=str))


def playbook_vars(hosts: Iterable[Any], inventory: str) -> dict[str, Any] | None:
    """``{"hosts": {name: index}, "baselines": [mapping, ...]}``: each host's layered baseline
    (``host_baseline``) for the roles, which would otherwise see Ansible's value of
    ``fleetops_baseline`` (the most specific level's mapping alone). Hosts with the same layers
    share one entry, so a thousand hosts in a few groups cost a few mappings. None when no host
    has a baseline. A level that does not validate raises ``BaselineError`` naming its file and
    line: a run must not start on a baseline the audit would refuse."""
    resolved = resolve_baselines(hosts, None, inventory)
    index: dict[int, int] = {}
    out: dict[str, Any] = {"hosts": {}, "baselines": []}
    for name, b in sorted(resolved.items()):
        if b is None:
            continue
        if id(b) not in index:
            index[id(b)] = len(out["baselines"])
            out["baselines"].append(_plain(dict(b.raw)))
        out["hosts"][name] = index[id(b)]
    return out if out["hosts"] else None
