"""Configuration: persistence, ECC and compute mode, MIG, stray processes, services, GPU count,
GPUs that vanished since the previous snapshot, and the NVLink fabric state.

Persistence, ECC, compute and MIG mode are judged against the baseline where it sets them, and
otherwise against the majority of the same GPU model across the fleet (``run_fleet``): a fleet
that agrees on a setting is its own baseline for the one GPU that does not."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from typing import Any

from fleetops import model
from fleetops.baseline import SERVICE_FABRICMANAGER, Baseline
from fleetops.catalog import mig as mig_catalog
from fleetops.checks.base import (
    CMD_APPLY_MIG,
    CMD_APPLY_PERSISTENCE,
    DEMAND_BASELINE,
    SETTING_MIN_VOTERS,
    CheckSpec,
    Context,
    Item,
    gpu_label,
    reset_action,
    reset_cmd,
    setting_drift,
)

FAMILY = "config"

LOST_GPU_ACTION = (
    "Drain the node and reboot it: a GPU that fell off the bus only comes back after a reboot; if it "
    "is still missing, open a hardware case."
)

FLEET_RULE = (
    "; without it, the strict majority of the same GPU model's GPUs across the fleet (no finding "
    f"on a tie, without a value held by more than half, or with fewer than {SETTING_MIN_VOTERS} "
    "GPUs of the model)"
)

SPECS = (
    CheckSpec(
        "config.persistence_mode", FAMILY, "Persistence mode",
        reads="nvmlDeviceGetPersistenceMode",
        threshold="equal to persistence_mode" + FLEET_RULE,
        severities=("warn",),
        action=f"Set persistence mode (nvidia-persistenced): {CMD_APPLY_PERSISTENCE}.",
        scope="node+fleet",
        requires="persistence_mode (node check)",
        applies=lambda n, b: b is not None and b.persistence_mode is not None,
        fleet_applies=lambda b: b is None or b.persistence_mode is None,
    ),
    CheckSpec(
        "config.ecc_mode", FAMILY, "ECC mode",
        reads="nvmlDeviceGetEccMode (current, pending)",
        threshold="current ECC mode equal to ecc_mode (the message says when the change only waits for a reset)"
        + FLEET_RULE,
        severities=("warn",),
        action="Set ECC mode (nvidia-smi -e) and reset the GPU to apply it: fleetops reset NODE GPU-UUID -i INVENTORY.",
        scope="node+fleet",
        requires="ecc_mode (node check)",
        applies=lambda n, b: b is not None and b.ecc_mode is not None,
        fleet_applies=lambda b: b is None or b.ecc_mode is None,
    ),
    CheckSpec(
        "config.compute_mode", FAMILY, "Compute mode",
        reads="nvmlDeviceGetComputeMode",
        threshold="equal to compute_mode" + FLEET_RULE,
        severities=("warn",),
        action="Set the compute mode (nvidia-smi -c) as the baseline (or the fleet) says.",
        scope="node+fleet",
        requires="compute_mode (node check)",
        applies=lambda n, b: b is not None and b.compute_mode is not None,
        fleet_applies=lambda b: b is None or b.compute_mode is None,
    ),
    CheckSpec(
        "config.mig_mode", FAMILY, "MIG mode",
        reads="nvmlDeviceGetMigMode (current, pending)",
        threshold="current MIG mode equal to mig.mode (the message says when the change only waits for a reset)"
        + FLEET_RULE,
        severities=("warn",),
        action=f"Set MIG mode as the baseline (or the fleet) says: {CMD_APPLY_MIG}.",
        scope="node+fleet",
        requires="mig.mode (node check)",
        applies=lambda n, b: b is not None and b.mig.mode is not None,
        fleet_applies=lambda b: b is None or b.mig.mode is None,
    ),
    CheckSpec(
        "config.mig_profile", FAMILY, "MIG instance profiles",
        reads="nvmlDeviceGetGpuInstances / GPU instance profile info",
        threshold="with mig.mode true: at least one instance, every one of profile mig.profile",
        severities=("warn",),
        action=f"Recreate the MIG instances with the baseline profile: {CMD_APPLY_MIG}.",
        requires="mig.mode: true and mig.profile",
        applies=lambda n, b: b is not None and bool(b.mig.mode) and b.mig.profile is not None,
    ),
    CheckSpec(
        "config.mig_layout", FAMILY, "MIG layout",
        reads="nvmlDeviceGetMigMode, nvmlDeviceGetGpuInstances / GPU instance profile info",
        threshold="the GPU's MIG instances (profiles, counted) equal to its layout: gpu_models.*.mig.layout, "
        "else mig.layout, else the mig.config_file entry covering its index; MIG mode as the layout "
        "needs it where mig.mode does not already say",
        severities=("warn",),
        action=f"Apply the layout (drain first): {CMD_APPLY_MIG}, or on the node fleetops-agent mig apply.",
        requires="mig.layout, gpu_models.*.mig or mig.config_file",
        applies=lambda n, b: b is not None and b.has_mig_layout(),
    ),
    CheckSpec(
        "config.stray_processes", FAMILY, "Processes on GPUs",
        reads="nvmlDeviceGetComputeRunningProcesses",
        threshold="every process name matches stray_process_allowlist",
        severities=("warn",),
        action="Stop the process (it holds GPU memory outside the scheduler) or add its name to "
        "stray_process_allowlist.",
        requires="stray_process_allowlist",
        applies=lambda n, b: b is not None and b.stray_process_allowlist is not None,
    ),
    CheckSpec(
        "config.services", FAMILY, "Required services active",
        reads="systemctl is-active <unit>",
        threshold="every unit of services active (default nvidia-persistenced, plus nvidia-fabricmanager "
        "when nvlinks_per_gpu > 0)",
        severities=("warn", "crit"),
        action="Start and enable the unit (systemctl enable --now UNIT); nvidia-fabricmanager down on an "
        "NVSwitch system stops CUDA: drain the node until it runs.",
        requires="a baseline (services has a default)",
        applies=lambda n, b: b is not None and bool(b.services),
    ),
    CheckSpec(
        "config.gpu_count", FAMILY, "GPU count",
        reads="nvmlDeviceGetCount, less the GPUs NVML answers GpuIsLost for",
        threshold="equal to gpu_count",
        severities=("warn", "crit"),
        action=LOST_GPU_ACTION,
        requires="gpu_count",
        applies=lambda n, b: b is not None and b.gpu_count is not None,
    ),
    CheckSpec(
        "config.gpu_missing", FAMILY, "GPU lost, or gone since the previous snapshot",
        reads="GPU UUIDs and bus ids in this and the previous snapshot; NVML's GpuIsLost",
        threshold="no GPU lost (fallen off the bus: it keeps its index and answers GpuIsLost), and every "
        "GPU of the previous snapshot still present",
        severities=("crit",),
        action=LOST_GPU_ACTION,
    ),
    CheckSpec(
        "config.fabric_state", FAMILY, "NVLink fabric registration",
        reads="nvmlDeviceGetGpuFabricInfoV (state, status)",
        threshold="state completed with status success, where supported",
        severities=("warn", "crit"),
        action="Check nvidia-fabricmanager (running, same version as the driver, its log), restart it, then "
        "audit again; a GPU that never completes needs a reset.",
        not_a_fault="GPUs without NVSwitch and passthrough VMs report the fabric as not supported.",
        applies=lambda n, b: any(g.fabric_state not in (None, "not_supported") for g in n.gpus),
    ),
)


def process_allowed(name: str | None, allowlist: tuple[str, ...]) -> bool:
    """A process is allowed when its name, its first word or that word's basename matches an
    entry (entries may be shell-style patterns)."""
    if not name:
        return False
    words = name.split()
    first = words[0] if words else name
    candidates = {name, first, os.path.basename(first)}
    return any(fnmatch.fnmatchcase(c, pat) for c in candidates for pat in allowlist)


def _unit(name: str) -> str:
    return name.removesuffix(".service")


def run(ctx: Context) -> None:
    b = ctx.baseline
    if b is not None:
        for gpu in ctx.node.gpus:
            _per_gpu(ctx, gpu)
        _services(ctx)
        _gpu_count(ctx)
    _gpu_missing(ctx)
    for gpu in ctx.node.gpus:
        _fabric(ctx, gpu)


def _per_gpu(ctx: Context, gpu: model.Gpu) -> None:
    b = ctx.baseline
    assert b is not None
    label = gpu_label(gpu)
    if b.persistence_mode is not None:
        have = ctx.get(FAMILY, gpu, "persistence_mode", DEMAND_BASELINE)
        if have is not None and have != b.persistence_mode:
            ctx.add("config.persistence_mode", "warn",
                    f"{label}: persistence mode {'on' if have else 'off'}, baseline "
                    f"{'on' if b.persistence_mode else 'off'}",
                    gpu=gpu, observed=have, expected=b.persistence_mode,
                    action=f"Set persistence mode on {ctx.host}: {CMD_APPLY_PERSISTENCE}.")
    if b.ecc_mode is not None:
        have = ctx.get(FAMILY, gpu, "ecc_mode_current", DEMAND_BASELINE)
        pending = gpu.ecc_mode_pending
        if have is not None and have != b.ecc_mode:
            on = "on" if b.ecc_mode else "off"
            if pending == b.ecc_mode:  # already requested: only the reset is missing
                msg = f"{label}: ECC is {'on' if have else 'off'}, baseline {on}; the change is pending a GPU reset"
                action = reset_action(ctx.host, gpu.uuid, "to apply the pending ECC mode")
            else:
                msg = f"{label}: ECC is {'on' if have else 'off'}, baseline {on}"
                action = (f"Set ECC {on} (nvidia-smi -i {gpu.bus_id} -e {int(b.ecc_mode)}), then reset the GPU "
                          f"to apply it: {reset_cmd(ctx.host, gpu.uuid)}.")
            ctx.add("config.ecc_mode", "warn", msg, gpu=gpu, observed={"current": have, "pending": pending},
                    expected=b.ecc_mode, action=action)
    if b.compute_mode is not None:
        have = ctx.get(FAMILY, gpu, "compute_mode", DEMAND_BASELINE)
        if have is not None and have != b.compute_mode:
            ctx.add("config.compute_mode", "warn", f"{label}: compute mode {have}, baseline {b.compute_mode}",
                    gpu=gpu, observed=have, expected=b.compute_mode,
                    action=f"Set the compute mode: nvidia-smi -i {gpu.bus_id} -c {b.compute_mode}.")
    if b.mig.mode is not None:
        _mig(ctx, gpu, label)
    if b.has_mig_layout():
        _mig_layout(ctx, gpu, label)
    if b.stray_process_allowlist is not None:
        _processes(ctx, gpu, label, b.stray_process_allowlist)


def _mig(ctx: Context, gpu: model.Gpu, label: str) -> None:
    b = ctx.baseline
    assert b is not None and b.mig.mode is not None
    have = ctx.get(FAMILY, gpu, "mig_mode_current", DEMAND_BASELINE)
    if have is None:
        return
    want = b.mig.mode
    if have != want:
        word = "enabled" if want else "disabled"
        msg = f"{label}: MIG is {'enabled' if have else 'disabled'}, baseline {word}"
        if gpu.mig_mode_pending == want:  # already requested: only the reset is missing
            msg += "; the change is pending a GPU reset"
            action = reset_action(ctx.host, gpu.uuid, "to apply the pending MIG mode")
        else:
            action = f"Set MIG mode on {ctx.host}: {CMD_APPLY_MIG}."
        ctx.add("config.mig_mode", "warn", msg, gpu=gpu,
                observed={"current": have, "pending": gpu.mig_mode_pending}, expected=want, action=action)
        return
    if want and b.mig.profile is not None:
        instances = ctx.get(FAMILY, gpu, "mig_instances", DEMAND_BASELINE)
        if instances is None:
            return
        wrong = sorted({i.profile or "?" for i in instances if i.profile != b.mig.profile})
        if not instances or wrong:
            what = "no MIG instances" if not instances else f"MIG instances of profile {', '.join(wrong)}"
            ctx.add("config.mig_profile", "warn", f"{label}: {what}; baseline {b.mig.profile}",
                    gpu=gpu, observed=[i.profile for i in instances], expected=b.mig.profile,
                    action=f"Recreate the MIG instances as {b.mig.profile}: {CMD_APPLY_MIG}.")


def _mig_layout(ctx: Context, gpu: model.Gpu, label: str) -> None:
    """Instances that differ from the layout. A mode that differs is config.mig_mode's finding
    where mig.mode says the same; this check reports it only where the layout alone asks it."""
    b = ctx.baseline
    assert b is not None
    want = b.mig_want(gpu.name, gpu.index)
    if want is None:
        return
    have = ctx.get(FAMILY, gpu, "mig_mode_current", DEMAND_BASELINE)
    if have is None:
        return
    # A profile the model lacks (a group's layout for another model, a typo in a mig-parted file)
    # comes first, whatever the mode: no apply can make it, so "apply the layout" would be wrong.
    table = mig_catalog.table_for(gpu.name) if want.mode else None
    foreign = [n for n in want.layout if table is not None and table.get(n) is None]
    if table is not None and foreign:
        ctx.add("config.mig_layout", "warn", f"{label}: {want.key} wants {', '.join(want.layout)}; "
                + mig_catalog.unknown_profile_message(foreign[0], table), gpu=gpu,
                observed=[i.profile for i in gpu.mig_instances or []], expected=list(want.layout),
                action=f"Give {gpu.name} a layout of its own profiles (gpu_models.*.mig.layout).")
        return
    action = f"Apply the MIG layout on {ctx.host} (drain the GPU first): {CMD_APPLY_MIG}."
    if have != want.mode:
        if b.mig.mode == want.mode:
            return  # config.mig_mode reports it
        word = "enabled" if want.mode else "disabled"
        ctx.add("config.mig_layout", "warn", f"{label}: MIG is {'enabled' if have else 'disabled'}; {want.key} "
                f"wants it {word}" + (f" with {', '.join(want.layout)}" if want.layout else ""), gpu=gpu,
                observed={"mode": have}, expected={"mode": want.mode, "layout": list(want.layout)}, action=action)
        return
    if not want.mode:
        return
    instances = ctx.get(FAMILY, gpu, "mig_instances", DEMAND_BASELINE)
    if instances is None:
        return
    got = sorted(i.profile or "?" for i in instances)
    if got != sorted(want.layout):
        missing = _minus(list(want.layout), got)
        extra = _minus(got, list(want.layout))
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"extra {', '.join(extra)}"] if extra else [])
        ctx.add("config.mig_layout", "warn",
                f"{label}: MIG instances {', '.join(got) or 'none'}; {want.key} wants {', '.join(want.layout)} "
                f"({'; '.join(parts)})", gpu=gpu, observed=got, expected=sorted(want.layout), action=action)


def _minus(a: list[str], b: list[str]) -> list[str]:
    rest = list(b)
    out = []
    for x in a:
        if x in rest:
            rest.remove(x)
        else:
            out.append(x)
    return out


def _processes(ctx: Context, gpu: model.Gpu, label: str, allow: tuple[str, ...]) -> None:
    procs = ctx.get(FAMILY, gpu, "processes", DEMAND_BASELINE)
    if procs is None:
        return
    stray = [p for p in procs if not process_allowed(p.name, allow)]
    if not stray:
        return
    listed = ", ".join(
        f"pid {p.pid} {p.name or '?'}" + (f" ({p.used_memory_mib} MiB)" if p.used_memory_mib is not None else "")
        for p in stray
    )
    ctx.add("config.stray_processes", "warn", f"{label}: processes not in the allowlist: {listed}",
            gpu=gpu, observed=[{"pid": p.pid, "name": p.name, "used_memory_mib": p.used_memory_mib} for p in stray],
            expected=list(allow),
            action=f"Stop them on {ctx.host} (kill {' '.join(str(p.pid) for p in stray)}) or add their names to "
            "stray_process_allowlist.")


def _services(ctx: Context) -> None:
    b = ctx.baseline
    assert b is not None
    if not b.services:
        return
    have = {_unit(k): v for k, v in ctx.node.services.items()}
    if not have:
        reason = ctx.node.unavailable.get("services") or "not collected"
        ctx.unreadable(FAMILY, "services", reason, "node")
        return
    for unit in b.services:
        if _unit(unit) not in have:  # the agent did not ask systemd about it: not "inactive"
            ctx.unreadable(FAMILY, f"services[{unit}]", "not collected by the agent", "node")
            continue
        state = have[_unit(unit)]
        if state is None:
            ctx.unreadable(FAMILY, f"services[{unit}]", ctx.node.unavailable.get("services") or "unknown", "node")
            continue
        if state == "active":
            continue
        fm = _unit(unit) == SERVICE_FABRICMANAGER
        ctx.add("config.services", "crit" if fm else "warn",
                f"{unit} is {state}" + ("; CUDA fails on NVSwitch systems until it runs" if fm else ""),
                observed={unit: state}, expected={unit: "active"},
                action=f"Start it on {ctx.host}: systemctl enable --now {unit}"
                + (" (check that its version matches the driver first)." if fm else "."))


def _gpu_count(ctx: Context) -> None:
    b = ctx.baseline
    assert b is not None
    if b.gpu_count is None:
        return
    count = ctx.get(FAMILY, ctx.node, "gpu_count", DEMAND_BASELINE)
    if count is not None:  # a lost GPU is still counted by the driver, but it runs nothing
        count -= sum(1 for g in ctx.node.gpus if model.gpu_lost(g))
    if count is None or count == b.gpu_count:
        return
    if count < b.gpu_count:
        ctx.add("config.gpu_count", "crit",
                f"{count} GPUs visible, baseline {b.gpu_count}: {b.gpu_count - count} missing "
                "(fallen off the bus, or not enumerated)",
                observed=count, expected=b.gpu_count, action=LOST_GPU_ACTION)
    else:
        ctx.add("config.gpu_count", "warn", f"{count} GPUs visible, baseline {b.gpu_count}",
                observed=count, expected=b.gpu_count, action="Fix the baseline's gpu_count or the node's group.")


def _gpu_missing(ctx: Context) -> None:
    for gpu in ctx.node.gpus:
        if model.gpu_lost(gpu):
            ctx.add("config.gpu_missing", "crit",
                    f"{gpu_label(gpu)} {gpu.uuid} is lost: NVML answers GpuIsLost (fallen off the bus); it keeps "
                    "its index until the node reboots",
                    gpu=gpu, observed=model.GPU_IS_LOST, expected="answering", action=LOST_GPU_ACTION)
    if ctx.previous is None:
        return
    present_uuids = {g.uuid for g in ctx.node.gpus}
    present_bus = {g.bus_id for g in ctx.node.gpus}
    for prev in ctx.previous.gpus:
        if prev.uuid in present_uuids or prev.bus_id in present_bus:
            continue
        ctx.add("config.gpu_missing", "crit",
                f"GPU {prev.index} ({prev.bus_id}, {prev.uuid}) was in the previous snapshot and is gone: "
                "fallen off the bus or no longer enumerated",
                gpu=model.gpu_ref(prev), observed=None, expected=prev.uuid, action=LOST_GPU_ACTION)


def _fabric(ctx: Context, gpu: model.Gpu) -> None:
    state = ctx.get(FAMILY, gpu, "fabric_state")
    if state is None or state == "not_supported":
        return
    status = gpu.fabric_status
    label = gpu_label(gpu)
    action = ("Check nvidia-fabricmanager (running, same version as the driver, its log) and restart it; "
              f"if the GPU never registers, reset it: {reset_cmd(ctx.host, gpu.uuid)}.")
    if state == "completed":
        if status not in (None, "success"):
            ctx.add("config.fabric_state", "crit", f"{label}: fabric registration completed with error {status}",
                    gpu=gpu, observed={"state": state, "status": status},
                    expected={"state": "completed", "status": "success"}, action=action)
        return
    sev = "warn" if state == "in_progress" else "crit"
    ctx.add("config.fabric_state", sev,
            f"{label}: fabric registration {state.replace('_', ' ')}"
            + ("" if sev == "warn" else ": CUDA will not start on this GPU"),
            gpu=gpu, observed={"state": state, "status": status},
            expected={"state": "completed", "status": "success"}, action=action)


# --- fleet -----------------------------------------------------------------------------


def _on_off(value: Any) -> str:
    return "on" if value else "off"


def _enabled(value: Any) -> str:
    return "enabled" if value else "disabled"


def _per_model(nodes: list[model.Node], attr: str) -> dict[str, list[Item]]:
    groups: dict[str, list[Item]] = {}
    for n in nodes:
        for g in n.gpus:
            if g.name is not None:
                groups.setdefault(g.name, []).append(Item(n.hostname, getattr(g, attr), g))
    return groups


def _persistence_action(i: Item, want: Any) -> str:
    return f"Set persistence mode {_on_off(want)} on {i.node}: {CMD_APPLY_PERSISTENCE}."


def _ecc_action(i: Item, want: Any) -> str:
    assert i.gpu is not None
    if i.gpu.ecc_mode_pending == want:
        return reset_action(i.node, i.gpu.uuid, "to apply the pending ECC mode")
    return (f"Set ECC {_on_off(want)} on {i.node} (nvidia-smi -i {i.gpu.bus_id} -e {int(bool(want))}), then "
            f"reset the GPU to apply it: {reset_cmd(i.node, i.gpu.uuid)}; or pin ecc_mode in the baseline.")


def _compute_action(i: Item, want: Any) -> str:
    assert i.gpu is not None
    return (f"Set the compute mode on {i.node}: nvidia-smi -i {i.gpu.bus_id} -c {want}; or pin compute_mode "
            "in the baseline.")


def _mig_action(i: Item, want: Any) -> str:
    assert i.gpu is not None
    if i.gpu.mig_mode_pending == want:
        return reset_action(i.node, i.gpu.uuid, "to apply the pending MIG mode")
    return f"Set MIG mode {_enabled(want)} on {i.node}: {CMD_APPLY_MIG} (or pin mig.mode in the baseline)."


def _current_pending(pending: str) -> Callable[[Item], Any]:
    def observed(i: Item) -> Any:
        return {"current": i.value, "pending": getattr(i.gpu, pending, None)}

    return observed


def run_fleet(nodes: list[model.Node], b: Baseline | None) -> list[model.Finding]:
    """Settings the baseline leaves open, voted per GPU model across ``nodes``."""
    rules: list[tuple[str, str, str, bool, Callable[[Item, Any], str], Callable[[Any], str],
                      Callable[[Item], Any] | None]] = [
        ("config.persistence_mode", "persistence_mode", "persistence_mode",
         b is not None and b.persistence_mode is not None, _persistence_action, _on_off, None),
        ("config.ecc_mode", "ecc_mode_current", "ECC mode",
         b is not None and b.ecc_mode is not None, _ecc_action, _on_off, _current_pending("ecc_mode_pending")),
        ("config.compute_mode", "compute_mode", "compute mode",
         b is not None and b.compute_mode is not None, _compute_action, str, None),
        ("config.mig_mode", "mig_mode_current", "MIG mode",
         b is not None and b.mig.mode is not None, _mig_action, _enabled, _current_pending("mig_mode_pending")),
    ]
    out: list[model.Finding] = []
    for check, attr, what, pinned, action, fmt, observed in rules:
        if pinned:
            continue  # the baseline wins: checked per node
        for model_name, items in _per_model(nodes, attr).items():
            out += setting_drift(check, what, model_name, items, action, fmt=fmt, observed=observed)
    return out
