"""XID events from the kernel log, judged with the XID catalog (``fleetops.xid.catalog``), and the
driver's GPU recovery action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.checks.base import (
    CMD_RESET,
    CheckSpec,
    Context,
    gpu_label,
    reset_action,
)
from fleetops.xid import catalog as xid_catalog
from fleetops.xid import policy as xid_policy

FAMILY = "xid"
_RANK = model.SEVERITY_RANK

SPECS = (
    CheckSpec(
        "xid.recent", FAMILY, "XID events",
        reads="kernel log (journalctl -k / dmesg) NVRM: Xid and SXid lines",
        threshold="severity and action per code from the XID catalog, the shipped policy and the "
        "baseline's xid_policy; escalated when a code repeats on one GPU (e.g. 3 x XID 31 within "
        "10 min). An event counts while it is new since the previous snapshot or within "
        "thresholds.xid_window_hours (24 h); a reboot_node one until the boot changes; a reset_gpu "
        "one until a reset of its GPU is recorded after it (at most thresholds.xid_hold_hours "
        "(168 h)); XID 154 until NVML reads recovery action none",
        severities=("info", "warn", "crit"),
        action="As the policy says for the worst code (restart the application, reset the GPU, reboot "
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
        "NODE GPU-UUID -i INVENTORY); node_reboot: drain the node and reboot it.",
    ),
)

_RECOVERY = {
    "gpu_reset": ("crit", "the driver requires a GPU reset"),
    "drain_and_reset": ("warn", "the driver asks to drain the GPU and reset it"),
    "drain_p2p": ("crit", "the driver asks to drain peer-to-peer (NVLink) traffic, then reset the GPU"),
    "node_reboot": ("crit", "the driver requires a node reboot"),
}


# An event stamped this long before the boot the snapshot reports belongs to an earlier boot
# (the boot time is collected_at - uptime_s, which moves by the rounding of both).
_BOOT_SLACK_S = 30.0


def _action_text(action: str, host: str, uuid: str | None) -> str:
    text = xid_catalog.ACTION_TEXT.get(action)
    if text is None:
        text = "Look the code up in NVIDIA's XID catalog for the installed driver."
    cmd = CMD_RESET.format(node=host, gpu=uuid or "GPU-UUID")
    text = text.replace("fleetops reset NODE GPU-UUID -i INVENTORY", cmd).replace("fleetops reset NODE GPU -i INVENTORY", cmd)
    if action == "reset_gpu" and "fleetops reset" not in text:
        text += f" ({cmd})"
    return text


def _boot_epoch(node: model.Node) -> float | None:
    if node.uptime_s is None or not node.collected_at:
        return None
    return node.collected_at - node.uptime_s


def _event_time(event: model.XidEvent, boot: float | None) -> float | None:
    """The event's epoch seconds: its wall-clock stamp, else its uptime stamp on this boot."""
    if event.timestamp is not None:
        return event.timestamp
    if event.uptime_s is not None and boot is not None:
        return boot + event.uptime_s
    return None


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


@dataclass
class _Seen:
    """One event of this boot, with what the policy says about it."""

    event: model.XidEvent
    judged: xid_policy.Judgement
    name: str
    at: float | None  # epoch seconds, when known
    age: float | None
    new: bool


class _Holds:
    """Which events still count: the evidence that ends each kind of hold (``xid.policy.HOLDS``)."""

    def __init__(self, ctx: Context) -> None:
        self.window_s = ctx.th.xid_window_hours * 3600.0
        self.hold_s = max(ctx.th.xid_hold_hours * 3600.0, self.window_s)

    def counts(self, seen: _Seen, hold: str, gpu: Any) -> bool:
        if hold == "boot":
            return True  # an event of an earlier boot never gets this far
        if hold == "reset":
            reset_at = gpu.last_reset_at if isinstance(gpu, model.Gpu) else None
            if reset_at is not None and seen.at is not None and reset_at >= seen.at:
                return False  # a reset of this GPU was recorded after the event
            return seen.new or seen.age is None or seen.age <= self.hold_s
        return seen.new or seen.age is None or seen.age <= self.window_s


def _judge(ctx: Context, event: model.XidEvent, sxid: bool) -> tuple[xid_policy.Judgement, str]:
    info = xid_catalog.info_for(event)
    policy = ctx.baseline.xid_policy if ctx.baseline is not None else {}
    judged = xid_policy.judgement(info, None if sxid else policy.get(event.code))
    if judged.severity not in ("info", "warn", "crit"):
        judged = xid_policy.Judgement("warn", judged.action, judged.escalate, judged.hold)
    return judged, info.name


def run(ctx: Context) -> None:
    _recovery(ctx)
    node = ctx.node
    if not node.xids:
        reason = node.unavailable.get("xids")
        if reason is not None:
            ctx.unreadable(FAMILY, "xids", reason, "node")
        return
    boot = _boot_epoch(node)
    seen_before = {_identity(e) for e in ctx.previous.xids} if ctx.previous is not None else set()
    # (group key) -> GPU, where, and (sxid, code) -> this boot's events of that code
    groups: dict[str, dict[str, Any]] = {}
    for event in node.xids:
        at = _event_time(event, boot)
        if at is not None and boot is not None and at < boot - _BOOT_SLACK_S:
            continue  # logged before this boot: the reboot ended it
        sxid = xid_catalog.is_sxid(event)
        key, gpu, where = ("sxid", None, "NVSwitch") if sxid else _gpu_for(ctx, event)
        if (event.code == 154 and not sxid and isinstance(gpu, model.Gpu)
                and gpu.recovery_action == "none"):
            continue  # NVML reads no recovery action pending any more: the driver is satisfied
        judged, name = _judge(ctx, event, sxid)
        new = ctx.previous is not None and _identity(event) not in seen_before
        g = groups.setdefault(key, {"gpu": gpu, "where": where, "codes": {}})
        g["codes"].setdefault((sxid, event.code), []).append(
            _Seen(event, judged, name, at, _age_s(node, event), new))
    holds = _Holds(ctx)
    merged: dict[str, dict[str, Any]] = {}  # one finding per GPU and one for the node: node|check|gpu
    for g in groups.values():
        codes = [c for (sxid, _), events in g["codes"].items()
                 if (c := _code_entry(holds, g["gpu"], sxid, events)) is not None]
        if not codes:
            continue
        slot = _ref_key(g["gpu"])
        into = merged.get(slot)
        if into is None:
            merged[slot] = {"gpu": g["gpu"], "where": g["where"], "codes": {(c["sxid"], c["code"]): c for c in codes}}
            continue
        into["where"] += f"; {g['where']}"
        for c in codes:
            have = into["codes"].get((c["sxid"], c["code"]))
            if have is None:
                into["codes"][(c["sxid"], c["code"])] = c
                continue
            for k in ("count", "new", "in_window"):
                have[k] += c[k]
            have["jobs"] = _union(have["jobs"], c["jobs"])
            if _RANK[c["severity"]] > _RANK[have["severity"]]:
                for k in ("severity", "action", "name", "hold", "escalated"):
                    have[k] = c[k]
            ages = [a for a in (have["last_age_s"], c["last_age_s"]) if a is not None]
            have["last_age_s"] = min(ages) if ages else None
    for m in merged.values():
        _report(ctx, m["gpu"], m["where"], list(m["codes"].values()))


def _code_entry(holds: _Holds, gpu: Any, sxid: bool, events: list[_Seen]) -> dict[str, Any] | None:
    """One code's events on one GPU under the policy: the ones that still count, severity and
    action (the worst event's; Xid 154 differs per event), and the escalation when it fires.
    An escalation holds as its own action does: three XID 68 escalated to reset_gpu hold until
    the reset, not only for the window."""
    escalate = next((s.judged.escalate for s in events if s.judged.escalate is not None), None)
    kept = [s for s in events if holds.counts(s, s.judged.hold, gpu)]
    fired: dict[str, Any] | None = None
    if escalate is not None:
        esc_hold = xid_policy.hold_for(escalate.action)
        candidates = [s for s in events if holds.counts(s, esc_hold, gpu)]
        peak = xid_policy.peak_count([s.at for s in candidates if s.at is not None], escalate.within_s)
        fired = {"peak": peak, "count": escalate.count, "within_s": escalate.within_s,
                 "fired": peak >= escalate.count}
        if fired["fired"]:
            kept = candidates
    if not kept:
        return None
    worst_seen = max(kept, key=lambda s: _RANK[s.judged.severity])
    sev, action, hold = worst_seen.judged.severity, worst_seen.judged.action, worst_seen.judged.hold
    if escalate is not None and fired is not None and fired["fired"] and _RANK[escalate.severity] >= _RANK[sev]:
        sev, action, hold = escalate.severity, escalate.action, xid_policy.hold_for(escalate.action)
    ages = [s.age for s in kept if s.age is not None]
    return {
        "code": kept[0].event.code, "name": worst_seen.name, "severity": sev, "action": action,
        "hold": hold, "count": len(kept), "new": sum(1 for s in kept if s.new),
        "last_age_s": round(min(ages), 1) if ages else None, "sxid": sxid, "escalated": fired,
        "in_window": sum(1 for s in kept if holds.counts(s, "window", gpu)),
        "jobs": _union(*(s.event.jobs for s in kept)),
    }


def _union(*lists: list[str] | None) -> list[str] | None:
    """The job ids of events (or codes) together, by number; None when none was attributed (a
    cold collect's events), [] when every one was and no job held the GPU."""
    known = [ids for ids in lists if ids is not None]
    if not known:
        return None
    return sorted({i for ids in known for i in ids}, key=lambda i: (len(i), i))


def _ref_key(gpu: model.Gpu | dict[str, Any] | None) -> str:
    if isinstance(gpu, model.Gpu):
        return gpu.uuid
    return (gpu or {}).get("uuid") or ""


def _escalation_text(c: dict[str, Any]) -> str:
    e = c["escalated"]
    return f"{e['peak']} x XID {c['code']} within {xid_policy.span_text(e['within_s'])} (policy: {e['count']})"


def _report(ctx: Context, gpu: Any, where: str, codes: list[dict[str, Any]]) -> None:
    codes.sort(key=lambda c: (-_RANK[c["severity"]], -c["count"], c["code"]))
    worst = codes[0]
    uuid = gpu.uuid if isinstance(gpu, model.Gpu) else (gpu or {}).get("uuid")

    def label(c: dict[str, Any]) -> str:
        kind = "SXid" if c["sxid"] else "XID"
        extra = f", {c['new']} new" if c["new"] else ""
        text = f"{kind} {c['code']} {c['name']} x{c['count']}{extra}"
        if c["escalated"] is not None and c["escalated"]["fired"]:
            text += f" ({_escalation_text(c)})"
        return text

    keys = ("code", "name", "severity", "action", "hold", "count", "new", "last_age_s", "sxid", "escalated")
    observed = [{k: c[k] for k in keys} for c in codes]
    action = _action_text(worst["action"], ctx.host, uuid)
    if worst["escalated"] is not None and worst["escalated"]["fired"]:
        action = f"{_escalation_text(worst)}: {action}"
    # the jobs the XIDs hit: each event's own (on the GPU at its time), also a job ended since
    ctx.add("xid.recent", worst["severity"],
            f"{where}: " + "; ".join(label(c) for c in codes),
            gpu=gpu, observed=observed, expected=[], action=action, jobs=_union(*(c["jobs"] for c in codes)))
    storms = [c for c in codes if c["in_window"] >= ctx.th.xid_storm_count]
    if storms:
        sev = max((c["severity"] for c in storms), key=lambda s: _RANK[s])
        sev = sev if _RANK[sev] >= _RANK["warn"] else "warn"
        window = f"{ctx.th.xid_window_hours:g} h"
        ctx.add("xid.storm", sev,
                f"{where}: XID storm: " + "; ".join(f"{c['in_window']} x XID {c['code']} ({c['name']})" for c in storms)
                + f" within {window} (storm at {ctx.th.xid_storm_count})",
                gpu=gpu, observed={str(c["code"]): c["in_window"] for c in storms},
                expected=f"< {ctx.th.xid_storm_count} per code", jobs=_union(*(c["jobs"] for c in storms)),
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

