"""XID events from the kernel log, judged with the XID catalog (``fleetops.catalog.xid``), and the
driver's GPU recovery action."""

from __future__ import annotations

from typing import Any

from fleetops import model
from fleetops.catalog import xid as xid_catalog
from fleetops.checks.base import (
    CMD_RESET,
    CheckSpec,
    Context,
    gpu_label,
    reset_action,
)

FAMILY = "xid"
_RANK = model.SEVERITY_RANK

SPECS = (
    CheckSpec(
        "xid.recent", FAMILY, "XID events",
        reads="kernel log (journalctl -k / dmesg) NVRM: Xid and SXid lines",
        threshold="events new since the previous snapshot or within thresholds.xid_window_hours (24 h); "
        "severity and action from the XID catalog",
        severities=("info", "warn", "crit"),
        action="As the XID catalog says for the worst code (restart the application, reset the GPU, reboot "
        "the node, drain and inspect).",
        not_a_fault="Application XIDs (13, 31, 43, 45, ...) say the job failed, not the GPU; the catalog "
        "rates them info/warn.",
    ),
    CheckSpec(
        "xid.storm", FAMILY, "XID storm",
        reads="kernel log XID events",
        threshold="at least thresholds.xid_storm_count (10) events of one code on one GPU within the window",
        severities=("warn", "crit"),
        action="Find what repeats (one job crashing in a loop, or a failing GPU); drain the GPU or node "
        "until it stops.",
    ),
    CheckSpec(
        "xid.recovery_action", FAMILY, "GPU recovery action the driver asks for",
        reads="NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
        threshold="anything but none",
        severities=("warn", "crit"),
        action="gpu_reset / drain_and_reset / drain_p2p: drain the GPU's jobs and reset it (fleetops reset "
        "NODE GPU-UUID); node_reboot: drain the node and reboot it.",
    ),
)

_RECOVERY = {
    "gpu_reset": ("crit", "the driver requires a GPU reset"),
    "drain_and_reset": ("warn", "the driver asks to drain the GPU and reset it"),
    "drain_p2p": ("crit", "the driver asks to drain peer-to-peer (NVLink) traffic, then reset the GPU"),
    "node_reboot": ("crit", "the driver requires a node reboot"),
}


def _catalog() -> Any:
    return xid_catalog


def _info(catalog: Any, event: model.XidEvent) -> tuple[str, str, str]:
    """(severity, action key, name) for an event."""
    if catalog is None:
        return "warn", "unknown", f"XID {event.code}"
    info_for = getattr(catalog, "info_for", None)
    try:
        info = info_for(event) if info_for is not None else catalog.lookup(event.code)
    except Exception:  # an unknown code must not break the audit  # noqa: BLE001
        info = None
    if info is None:
        return "warn", "unknown", f"XID {event.code}"
    sev = info.severity if info.severity in ("info", "warn", "crit") else "warn"
    return sev, info.action, info.name


def _action_text(catalog: Any, action: str, host: str, uuid: str | None) -> str:
    text = None
    if catalog is not None:
        text = getattr(catalog, "ACTION_TEXT", {}).get(action)
    if text is None:
        text = "Look the code up in NVIDIA's XID catalog for the installed driver."
    cmd = CMD_RESET.format(node=host, gpu=uuid or "GPU-UUID")
    text = text.replace("fleetops reset NODE GPU-UUID", cmd).replace("fleetops reset NODE GPU", cmd)
    if action == "reset_gpu" and "fleetops reset" not in text:
        text += f" ({cmd})"
    return text


def _is_sxid(catalog: Any, event: model.XidEvent) -> bool:
    fn = getattr(catalog, "is_sxid", None) if catalog is not None else None
    return bool(fn(event)) if fn is not None else event.source.endswith(":sxid")


def _age_s(node: model.Node, event: model.XidEvent) -> float | None:
    if event.timestamp is not None and node.collected_at:
        return max(0.0, node.collected_at - event.timestamp)
    if event.uptime_s is not None and node.uptime_s is not None:
        return max(0.0, node.uptime_s - event.uptime_s)
    return None


def _identity(event: model.XidEvent) -> tuple[Any, ...]:
    if event.raw:
        return (event.raw,)
    return (event.code, event.bus_id, event.timestamp, event.uptime_s, event.message)


def _gpu_for(ctx: Context, event: model.XidEvent) -> tuple[str, model.Gpu | dict[str, Any] | None, str]:
    """(group key, GPU or complete GPU reference or None, where) for an event. A GPU gone from
    the bus is named from the previous snapshot; without one the finding is node-level and
    names the bus id (a reference needs index and UUID, which only a snapshot knows)."""
    node = ctx.node
    gpu = node.gpu_by_uuid(event.gpu_uuid) if event.gpu_uuid else None
    if gpu is None and event.bus_id:
        gpu = node.gpu_by_bus_id(event.bus_id)
    if gpu is not None:
        return gpu.uuid, gpu, gpu_label(gpu)
    if event.bus_id:
        prev = ctx.previous.gpu_by_bus_id(event.bus_id) if ctx.previous is not None else None
        if prev is None and event.gpu_uuid and ctx.previous is not None:
            prev = ctx.previous.gpu_by_uuid(event.gpu_uuid)
        if prev is not None:
            return prev.uuid, model.gpu_ref(prev), f"GPU {prev.index} ({prev.bus_id}, no longer on the bus)"
        return event.bus_id, None, f"GPU at {event.bus_id} (no longer on the bus)"
    return "", None, "the node"


def run(ctx: Context) -> None:
    _recovery(ctx)
    node = ctx.node
    if not node.xids:
        reason = node.unavailable.get("xids")
        if reason is not None:
            ctx.unreadable(FAMILY, "xids", reason, "node")
        return
    catalog = _catalog()
    window_s = ctx.th.xid_window_hours * 3600.0
    seen_before = {_identity(e) for e in ctx.previous.xids} if ctx.previous is not None else set()
    groups: dict[str, dict[str, Any]] = {}
    for event in node.xids:
        age = _age_s(node, event)
        new = ctx.previous is not None and _identity(event) not in seen_before
        if not (new or age is None or age <= window_s):
            continue
        sxid = _is_sxid(catalog, event)
        key, gpu, where = ("sxid", None, "NVSwitch") if sxid else _gpu_for(ctx, event)
        sev, action, name = _info(catalog, event)
        g = groups.setdefault(key, {"gpu": gpu, "where": where, "codes": {}})
        c = g["codes"].setdefault((sxid, event.code), {
            "code": event.code, "name": name, "severity": sev, "action": action, "count": 0, "new": 0,
            "last_age_s": None, "sxid": sxid,
        })
        c["count"] += 1
        c["new"] += int(new)
        if _RANK[sev] > _RANK[c["severity"]]:  # info_for can differ per event (Xid 154)
            c["severity"], c["action"], c["name"] = sev, action, name
        if age is not None and (c["last_age_s"] is None or age < c["last_age_s"]):
            c["last_age_s"] = round(age, 1)
    # One finding per GPU (and one for the node): a finding's key is node|check|gpu.
    merged: dict[str, dict[str, Any]] = {}
    for g in groups.values():
        slot = _ref_key(g["gpu"])
        if slot not in merged:
            merged[slot] = g
            continue
        into = merged[slot]
        into["where"] += f"; {g['where']}"
        for code_key, c in g["codes"].items():
            have = into["codes"].get(code_key)
            if have is None:
                into["codes"][code_key] = c
                continue
            have["count"] += c["count"]
            have["new"] += c["new"]
            if _RANK[c["severity"]] > _RANK[have["severity"]]:
                have["severity"], have["action"], have["name"] = c["severity"], c["action"], c["name"]
            ages = [a for a in (have["last_age_s"], c["last_age_s"]) if a is not None]
            have["last_age_s"] = min(ages) if ages else None
    for g in merged.values():
        _report(ctx, catalog, g["gpu"], g["where"], list(g["codes"].values()))


def _ref_key(gpu: model.Gpu | dict[str, Any] | None) -> str:
    if isinstance(gpu, model.Gpu):
        return gpu.uuid
    return (gpu or {}).get("uuid") or ""


def _report(ctx: Context, catalog: Any, gpu: Any, where: str, codes: list[dict[str, Any]]) -> None:
    codes.sort(key=lambda c: (-_RANK[c["severity"]], -c["count"], c["code"]))
    worst = codes[0]
    uuid = gpu.uuid if isinstance(gpu, model.Gpu) else (gpu or {}).get("uuid")

    def label(c: dict[str, Any]) -> str:
        kind = "SXid" if c["sxid"] else "XID"
        extra = f", {c['new']} new" if c["new"] else ""
        return f"{kind} {c['code']} {c['name']} x{c['count']}{extra}"

    observed = [{k: c[k] for k in ("code", "name", "severity", "count", "new", "last_age_s", "sxid")} for c in codes]
    action = _action_text(catalog, worst["action"], ctx.host, uuid)
    ctx.add("xid.recent", worst["severity"],
            f"{where}: " + "; ".join(label(c) for c in codes),
            gpu=gpu, observed=observed, expected=[], action=action)
    storms = [c for c in codes if c["count"] >= ctx.th.xid_storm_count]
    if storms:
        sev = max((c["severity"] for c in storms), key=lambda s: _RANK[s])
        sev = sev if _RANK[sev] >= _RANK["warn"] else "warn"
        window = f"{ctx.th.xid_window_hours:g} h"
        ctx.add("xid.storm", sev,
                f"{where}: XID storm: " + "; ".join(f"{c['count']} x XID {c['code']} ({c['name']})" for c in storms)
                + f" within {window} (storm at {ctx.th.xid_storm_count})",
                gpu=gpu, observed={str(c["code"]): c["count"] for c in storms},
                expected=f"< {ctx.th.xid_storm_count} per code",
                action="Find what repeats: one job crashing in a loop (stop it) or a failing GPU (drain it). "
                + action)


def _recovery(ctx: Context) -> None:
    for gpu in ctx.node.gpus:
        wanted = ctx.get(FAMILY, gpu, "recovery_action")
        if wanted is None or wanted == "none":
            continue
        sev, why = _RECOVERY.get(wanted, ("warn", f"the driver asks for recovery action {wanted!r}"))
        if wanted == "node_reboot":
            action = f"Drain {ctx.host} and reboot it: a GPU reset is not enough."
        else:
            action = reset_action(ctx.host, gpu.uuid)
        ctx.add("xid.recovery_action", sev, f"{gpu_label(gpu)}: {why} (recovery action {wanted})",
                gpu=gpu, observed=wanted, expected="none", action=action)

