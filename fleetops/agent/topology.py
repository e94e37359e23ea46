"""Check a node's GPU topology against an expected description.

Expected file (JSON, or YAML when PyYAML is installed)::

    gpu_count: 8          # GPUs the driver must enumerate
    link: NV18            # link type expected between every pair of GPUs
    links: [[X, NV18, ...], ...]   # or a full matrix, in bus-id order
    numa: {"0000:18:00.0": 0, ...} # GPU -> NUMA node

A value the node cannot report (passthrough VMs report NUMA as Not Supported) is listed under
``unknown``, not as a mismatch.
"""

from __future__ import annotations

import json
from typing import Any

from fleetops import model


class TopologyError(Exception):
    pass


def load_expected(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read expected topology: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError as exc:
            raise TopologyError(f"{path}: not JSON, and PyYAML is not installed to read YAML") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TopologyError(f"{path}: not valid JSON or YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: expected topology must be a mapping")
    unknown = set(data) - {"gpu_count", "link", "links", "numa"}
    if unknown:
        raise TopologyError(f"{path}: unknown keys {sorted(unknown)} (allowed: gpu_count, link, links, numa)")
    return data


def compare(topo: model.Topology | None, gpu_count: int | None, expected: dict[str, Any]) -> dict[str, Any]:
    mismatches: list[str] = []
    unknown: list[str] = []
    if "gpu_count" in expected:
        if gpu_count is None:
            unknown.append("gpu_count")
        elif gpu_count != expected["gpu_count"]:
            mismatches.append(f"gpu_count: {gpu_count} GPUs, expected {expected['gpu_count']}")
    if topo is None:
        unknown.append("topology")
        return {"mismatches": mismatches, "unknown": unknown}
    n = len(topo.gpus)
    want = expected.get("links")
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            got = topo.links[i][j] if i < len(topo.links) and j < len(topo.links[i]) else None
            if want is not None:
                exp = want[i][j] if i < len(want) and j < len(want[i]) else None
            else:
                exp = expected.get("link")
            if exp is None:
                continue
            if got is None:
                unknown.append(f"link {topo.gpus[i]}-{topo.gpus[j]}")
            elif got != exp and i < j:
                mismatches.append(f"link {topo.gpus[i]} <-> {topo.gpus[j]}: {got}, expected {exp}")
    for bus, numa in (expected.get("numa") or {}).items():
        key = model.normalize_bus_id(bus)
        if key not in topo.numa:
            mismatches.append(f"numa: GPU {key} not present")
        elif topo.numa[key] is None:
            unknown.append(f"numa {key}")
        elif topo.numa[key] != numa:
            mismatches.append(f"numa: GPU {key} on node {topo.numa[key]}, expected {numa}")
    return {"mismatches": mismatches, "unknown": unknown}


def report(node: model.Node, expected_path: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"hostname": node.hostname, "topology": model.to_dict(node.topology), "ok": True}
    if expected_path:
        # a lost GPU is still counted by the driver, but its links are gone with it
        usable = None if node.gpu_count is None else node.gpu_count - sum(1 for g in node.gpus if model.gpu_lost(g))
        result = compare(node.topology, usable, load_expected(expected_path))
        doc.update(result)
        doc["ok"] = not result["mismatches"]
    return doc
