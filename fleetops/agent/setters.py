"""Idempotent GPU settings used by the Ansible modules: power cap, persistence mode, MIG mode.

Each setter reads the current value first, changes only GPUs that differ, honours dry-run,
and answers with what it found and what it did, per GPU. A power cap can come per GPU from a
baseline: each GPU takes its own model's limit (``Baseline.power_limit_for``, the audit's rule),
so a node of another model, or a mixed node, is never capped at the first model's limit. The change is the backend's
(``reset.backends``: the simulator's state file, or NVML on a real node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetops import model

if TYPE_CHECKING:
    from fleetops.baseline import Baseline

SET_KIND = "fleetops.set/v1"  # the report's kind (see agent.main's output contract)

SETTINGS = {
    # name -> (snapshot field, how to parse the requested value)
    "power": "power_limit_w",
    "persistence": "persistence_mode",
    "mig": "mig_mode_current",
}


class SetError(Exception):
    pass


def parse_value(setting: str, raw: str) -> Any:
    if setting == "power":
        try:
            watts = float(raw)
        except ValueError as exc:
            raise SetError(f"power: {raw!r} is not a number of watts") from exc
        if watts <= 0:
            raise SetError(f"power: {raw!r} must be positive")
        return watts
    lowered = raw.lower()
    if lowered in ("on", "enabled", "enable", "true", "1"):
        return True
    if lowered in ("off", "disabled", "disable", "false", "0"):
        return False
    raise SetError(f"{setting}: {raw!r} is not on/off")


def select(node: model.Node, selector: str) -> list[model.Gpu]:
    """``all``, or one GPU by UUID or bus id (the one selector rule); an unknown one is an error
    naming it and the GPUs present."""
    if selector == "all":
        return list(node.gpus)
    from fleetops.common import selectors

    try:
        sel = selectors.parse_identity(selector)
    except selectors.SelectorError as exc:
        raise SetError(f"{exc.message}; or 'all'") from None
    gpu = selectors.find(node, sel)
    if gpu is None:
        raise SetError(f"--gpu {selector!r}: no such GPU on this node (present: {selectors.present(node)})")
    return [gpu]


def wanted(setting: str, value: Any, gpu: model.Gpu, baseline: Baseline | None) -> Any:
    """The value for this GPU: its model's power limit in ``baseline`` when it gives one."""
    if setting == "power" and baseline is not None:
        own = baseline.power_limit_for(gpu.name)
        if own is not None:
            return float(own)
    return value


def apply(
    setting: str,
    raw_value: str,
    selector: str,
    dry_run: bool,
    backend: str,
    state_path: str | None,
    baseline: Baseline | None = None,
) -> dict[str, Any]:
    if setting not in SETTINGS:
        raise SetError(f"unknown setting {setting!r}; choose one of {', '.join(SETTINGS)}")
    if baseline is not None and setting != "power":
        raise SetError(f"{setting}: --baseline gives power caps only")
    field_name = SETTINGS[setting]
    fallback = parse_value(setting, raw_value)
    from fleetops.agent.reset.backends import ResetError, make_backend
    from fleetops.gpu.backend import NodeChangeError

    try:
        back = make_backend(backend, state_path, dry_run)
    except ResetError as exc:
        raise SetError(str(exc)) from exc
    node = back.snapshot()
    targets = select(node, selector)
    lost = [g for g in targets if model.gpu_lost(g)]
    if lost:  # NVML answers GPU_IS_LOST to every setter on it: refused before anything changes
        named = ", ".join(f"GPU {g.index} ({g.bus_id}{', ' + g.uuid if g.uuid else ''})" for g in lost)
        raise SetError(f"{setting}: {named} is lost (NVML answers GpuIsLost; fallen off the bus): nothing "
                       "changed; reboot the node, or name the other GPUs one at a time with --gpu")
    results = []
    for gpu in targets:
        before = getattr(gpu, field_name)
        value = wanted(setting, fallback, gpu, baseline)
        if setting == "power":
            lo, hi = gpu.power_min_limit_w, gpu.power_max_limit_w
            if lo is not None and hi is not None and not lo <= value <= hi:
                raise SetError(
                    f"power: {value:g} W is outside GPU {gpu.index} ({gpu.uuid}) limits {lo:g}-{hi:g} W; nothing changed"
                )
        result = {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "bus_id": gpu.bus_id,
            "before": before,
            "after": value,
            "changed": before != value,
        }
        if setting == "power":  # what the GPU comes back with after a reboot or driver reload
            result["default"] = gpu.power_default_limit_w
        results.append(result)
    changed = [r for r in results if r["changed"]]
    if changed and not dry_run:
        by_value: dict[Any, list[str]] = {}
        for r in changed:
            by_value.setdefault(r["after"], []).append(r["uuid"])
        try:
            for value, uuids in by_value.items():
                back.apply_setting(setting, field_name, value, uuids)
        except NodeChangeError as exc:
            raise SetError(str(exc)) from exc
    values = {r["after"] for r in results}
    return {
        "kind": SET_KIND,
        "setting": setting,
        "field": field_name,
        # the one value every GPU gets; None when they differ (each GPU's is its "after")
        "value": values.pop() if len(values) == 1 else (fallback if not results else None),
        "dry_run": dry_run,
        "changed": bool(changed),
        "gpus": results,
        "backend": node.backend,
    }
