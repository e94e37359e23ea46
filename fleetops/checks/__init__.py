"""Checks: pure functions from snapshots (+ baseline + previous snapshot) to findings.

Entry points:
- ``run_node_checks(node, baseline, previous)``: findings for one node (only what is not ok).
- ``run_fleet_checks(nodes, baseline)``: cross-node drift (fleet majority) for what the baseline
  does not pin. Call it once per audit, after ``run_node_checks`` for each node.
- ``checks_run(node, baseline)``: ids of the checks that apply to that node, for renderers that
  list passing checks too (JUnit).
- ``REGISTRY``: every check (``CheckSpec``) by id, in family order; ``registry_dicts()`` for docs.

Families (one module each): versions, memory, pcie, nvlink, thermal_power, xid, config, topology,
validation, fabric.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fleetops import model
from fleetops.baseline import Baseline
from fleetops.checks import (
    config,
    fabric,
    memory,
    nvlink,
    pcie,
    thermal_power,
    topology,
    validation,
    versions,
    xid,
)
from fleetops.checks.base import FAMILIES, CheckSpec, Context, attribute_jobs, unreadable_spec

_MODULES = {
    "versions": versions,
    "memory": memory,
    "pcie": pcie,
    "nvlink": nvlink,
    "thermal_power": thermal_power,
    "xid": xid,
    "config": config,
    "topology": topology,
    "validation": validation,
    "fabric": fabric,
}
assert tuple(_MODULES) == FAMILIES

_FLEET_RUNNERS: tuple[Callable[[list[model.Node], Baseline | None], list[model.Finding]], ...] = (
    versions.run_fleet,
    thermal_power.run_fleet,
    config.run_fleet,
    topology.run_fleet,
    fabric.run_fleet,
)


def _build_registry() -> dict[str, CheckSpec]:
    reg: dict[str, CheckSpec] = {}
    for family, module in _MODULES.items():
        for spec in (*module.SPECS, unreadable_spec(family)):
            if spec.id in reg:
                raise AssertionError(f"check id {spec.id} registered twice")
            if spec.family != family or not spec.id.startswith(family + "."):
                raise AssertionError(f"check {spec.id} is not in family {family}")
            reg[spec.id] = spec
    return reg


REGISTRY: Mapping[str, CheckSpec] = _build_registry()


def registry_dicts() -> list[dict[str, Any]]:
    """Every check as a plain dict, in family order, for the docs generator."""
    return [spec.to_dict() for spec in REGISTRY.values()]


def run_node_checks(
    node: model.Node,
    baseline: Baseline | None = None,
    previous: model.Node | None = None,
    validations: Mapping[str, Any] | None = None,
) -> list[model.Finding]:
    """Findings for one node: faults (warn/crit), notes (info) and values that could not be
    read (at most one ``unknown`` per family). Checks that pass produce nothing.

    ``previous`` is the same node's earlier snapshot: it turns counters into rates (using
    ``collected_at``), marks XIDs as new, and names GPUs that disappeared. ``validations``
    (GPU UUID -> level -> the latest stored ``fleetops validate`` result) feeds the validation
    checks; without it they say nothing."""
    ctx = Context(node, baseline, previous, validations)
    for family, module in _MODULES.items():
        try:
            module.run(ctx)
        except Exception as exc:  # one bad value must not hide the other families  # noqa: BLE001
            ctx.unreadable(family, "check failed", f"{type(exc).__name__}: {exc}", "node")
    return ctx.finish()


def run_fleet_checks(nodes: list[model.Node], baseline: Baseline | None = None) -> list[model.Finding]:
    """Drift across nodes against the fleet majority: driver, CUDA and Fabric Manager per node;
    VBIOS and InfoROM per GPU model; the settings (power limit, persistence, ECC, compute and
    MIG mode) per GPU model, where only a strict majority of at least three GPUs judges (a tie
    reports nothing); NUMA placement per model and bus id. Values the baseline pins are left to
    the per-node checks. Each finding names one minority node (and GPU) and lists all minority
    nodes in its message."""
    out: list[model.Finding] = []
    for runner in _FLEET_RUNNERS:
        out.extend(runner(list(nodes), baseline))
    attribute_jobs(nodes, out)
    return out


def checks_run(node: model.Node, baseline: Baseline | None = None, fleet: bool = True) -> list[str]:
    """Ids of the checks that apply to ``node`` under ``baseline``: every id
    ``run_node_checks`` can report for it, plus (with ``fleet``) those ``run_fleet_checks``
    can. Every family's ``<family>.unreadable`` id is included: any family may find a value it
    cannot read."""
    ids: list[str] = []
    for family in FAMILIES:
        family_ids = []
        for spec in REGISTRY.values():
            if spec.family != family or spec.id.endswith(".unreadable"):
                continue
            node_ok = spec.scope != "fleet" and spec.applies(node, baseline)
            fleet_ok = fleet and spec.fleet_applies is not None and spec.fleet_applies(baseline)
            if node_ok or fleet_ok:
                family_ids.append(spec.id)
        ids.extend(family_ids)
        ids.append(f"{family}.unreadable")
    return ids


__all__ = [
    "FAMILIES",
    "REGISTRY",
    "CheckSpec",
    "checks_run",
    "registry_dicts",
    "run_fleet_checks",
    "run_node_checks",
]
