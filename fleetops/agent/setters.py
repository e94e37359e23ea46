"""Idempotent GPU settings used by the Ansible modules: power cap, persistence mode, MIG mode.

Each setter reads the current value first, changes only GPUs that differ, honours dry-run,
and answers with what it found and what it did, per GPU. On the simulator the values live in
the node's state file; on a real node the change goes through NVML.
"""

from __future__ import annotations

from typing import Any

from fleetops import model

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


def select(gpus: list[model.Gpu], selector: str) -> list[model.Gpu]:
    """``all``, a UUID, a bus id, or an index; an unknown one is an error naming it."""
    if selector == "all":
        return list(gpus)
    if selector.upper().startswith("GPU-"):
        hit = [g for g in gpus if g.uuid == selector]
    elif selector.isdigit():
        hit = [g for g in gpus if g.index == int(selector)]
    else:
        try:
            key = model.normalize_bus_id(selector)
        except ValueError as exc:
            raise SetError(f"--gpu {selector!r}: not 'all', a UUID, a bus id or an index") from exc
        hit = [g for g in gpus if g.bus_id == key]
    if not hit:
        present = ", ".join(f"{g.index}={g.uuid}@{g.bus_id}" for g in gpus) or "none"
        raise SetError(f"--gpu {selector!r}: no such GPU on this node (present: {present})")
    return hit


def apply(
    setting: str, raw_value: str, selector: str, dry_run: bool, backend: str, state_path: str | None
) -> dict[str, Any]:
    if setting not in SETTINGS:
        raise SetError(f"unknown setting {setting!r}; choose one of {', '.join(SETTINGS)}")
    field_name = SETTINGS[setting]
    value = parse_value(setting, raw_value)
    from fleetops.agent.collect import collect

    node = collect(backend, state_path)
    targets = select(node.gpus, selector)
    results = []
    for gpu in targets:
        before = getattr(gpu, field_name)
        if setting == "power":
            lo, hi = gpu.power_min_limit_w, gpu.power_max_limit_w
            if lo is not None and hi is not None and not lo <= value <= hi:
                raise SetError(
                    f"power: {value:g} W is outside GPU {gpu.index} ({gpu.uuid}) limits {lo:g}-{hi:g} W; nothing changed"
                )
        results.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "bus_id": gpu.bus_id,
                "before": before,
                "after": value,
                "changed": before != value,
            }
        )
    changed = [r for r in results if r["changed"]]
    if changed and not dry_run:
        if node.backend == "sim":
            _apply_sim(field_name, value, changed, state_path)
        else:
            _apply_nvml(setting, value, changed)
    return {
        "kind": SET_KIND,
        "setting": setting,
        "field": field_name,
        "value": value,
        "dry_run": dry_run,
        "changed": bool(changed),
        "gpus": results,
        "backend": node.backend,
    }


def _apply_sim(field_name: str, value: Any, changed: list[dict[str, Any]], state_path: str | None) -> None:
    import os

    from fleetops.gpu import sim

    path = state_path or os.environ[sim.STATE_ENV]
    with sim.locked_state(path) as state:
        for result in changed:
            pos = next(i for i, g in enumerate(state["gpus"]) if g["uuid"] == result["uuid"])
            state["gpus"][pos][field_name] = value
            if field_name == "mig_mode_current":
                state["gpus"][pos]["mig_mode_pending"] = value
            sim.retire_setting_fault(state, field_name, pos)


def _apply_nvml(setting: str, value: Any, changed: list[dict[str, Any]]) -> None:
    import pynvml as nv

    nv.nvmlInit()
    try:
        for result in changed:
            handle = nv.nvmlDeviceGetHandleByUUID(result["uuid"])
            if setting == "power":
                nv.nvmlDeviceSetPowerManagementLimit(handle, int(value * 1000))
            elif setting == "persistence":
                nv.nvmlDeviceSetPersistenceMode(handle, 1 if value else 0)
            elif setting == "mig":
                nv.nvmlDeviceSetMigMode(handle, 1 if value else 0)
    except nv.NVMLError as exc:
        raise SetError(f"{setting}: NVML refused the change: {exc}") from exc
    finally:
        nv.nvmlShutdown()
