"""XID policy: what the checks do with a code beyond its catalog entry: severity and action
overrides (the shipped ``DEFAULT_POLICY`` for codes the references disagree on, and a baseline's
``xid_policy``), escalation when a code repeats on one GPU, and how long an event's finding holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetops.xid.catalog import (
    ACTION_TEXT,
    ACTIONS,
    CATALOG,
    CATEGORIES,
    NON_CRITICAL,
    RECOVERY_ACTIONS,
    SEVERITIES,
    SXID_SUFFIX,
    XidInfo,
    info_for,
    is_sxid,
    lookup,
    recovery_action,
)

# How long an event's finding holds. "window": while it is within thresholds.xid_window_hours (or
# new since the previous snapshot). "boot": until the node reboots (the collectors read this boot's
# kernel log only), however old it is: nothing short of a reboot brings such a GPU back. "reset":
# until a reset of that GPU is recorded after the event (``fleetops-agent reset``'s log), or the boot
# changes; a reset made outside fleetops is not seen, so the hold also ends after
# thresholds.xid_hold_hours.
HOLDS = ("window", "boot", "reset")
_HOLD_FOR_ACTION = {"reboot_node": "boot", "reset_gpu": "reset"}


@dataclass(frozen=True)
class Escalation:
    """``count`` events of the code on one GPU within ``within_s`` make it ``severity``/``action``."""

    count: int
    within_s: float
    severity: str
    action: str


@dataclass(frozen=True)
class XidPolicy:
    """What the checks do with one code. ``None`` fields fall back to the catalog entry."""

    severity: str | None = None
    action: str | None = None
    escalate: Escalation | None = None
    decision: str = ""  # why, for the codes the references disagree on


# The shipped policy for the codes on which operators' references contradict each other: each
# decision says which way and why. The baseline's ``xid_policy`` overrides any of it per code.
DEFAULT_POLICY: dict[int, XidPolicy] = {
    13: XidPolicy(
        escalate=Escalation(3, 600.0, "crit", "drain_and_inspect"),
        decision="An application fault (warn, restart the job), as most references treat it; but "
        "three on one GPU within 10 minutes is crit (drain and inspect): one job in a crash loop "
        "or a GPU that corrupts every job, and either way the GPU should take no new work.",
    ),
    31: XidPolicy(
        escalate=Escalation(3, 600.0, "crit", "drain_and_inspect"),
        decision="As 13: an application page fault (warn) that escalates to crit at three on one "
        "GPU within 10 minutes (operators ask for exactly this rule).",
    ),
    63: XidPolicy(
        severity="warn",
        action="reset_gpu",
        decision="Not fatal (two references call it fatal, one ignores it): the row remap "
        "succeeded and takes effect at the next reset; warn, reset when idle, and hold until that "
        "reset. A failed remap is XID 64 (crit), and the row-remap checks judge the counters.",
    ),
    68: XidPolicy(
        severity="warn",
        action="restart_app",
        escalate=Escalation(3, 3600.0, "crit", "reset_gpu"),
        decision="Neither ignored (two references) nor fatal (one): a video-decoder fault fails the "
        "job using it (warn); three within an hour on one GPU is crit (reset the GPU, held until "
        "the reset), an engine that keeps faulting.",
    ),
    92: XidPolicy(
        severity="warn",
        action="none",
        decision="Not fatal (one reference drains on it, one ignores it): corrected errors arriving fast are a "
        "warning; the ECC checks judge the counters and their growth, and a DBE or remap failure "
        "that follows is crit on its own.",
    ),
    109: XidPolicy(
        severity="warn",
        action="reset_gpu",
        escalate=Escalation(2, 3600.0, "crit", "reset_gpu"),
        decision="A context-switch timeout alone is warn (reset the GPU if its work does not "
        "recover; one reference calls it fatal, two ignore it); a second within an hour on one "
        "GPU is crit, since repeated timeouts can precede a GSP hang.",
    ),
}


@dataclass(frozen=True)
class Judgement:
    """The effective treatment of one code: catalog entry, shipped policy, baseline override."""

    severity: str
    action: str
    escalate: Escalation | None
    hold: str  # one of HOLDS


def judgement(info: XidInfo, override: XidPolicy | None = None) -> Judgement:
    """``info`` (from ``info_for``) under the shipped policy and a baseline's ``override``: each
    field the override sets wins; an override's ``escalate`` replaces the shipped one whole."""
    shipped = DEFAULT_POLICY.get(info.code) if info.category != "nvswitch" else None
    severity, action, escalate = info.severity, info.action, None
    for layer in (shipped, override):
        if layer is None:
            continue
        severity = layer.severity or severity
        action = layer.action or action
        escalate = layer.escalate if layer.escalate is not None else escalate
    if info.code == 154 and info.category != "nvswitch" and info.action != "none":
        severity, action = info.severity, info.action  # Xid 154 says itself what it wants
    return Judgement(severity, action, escalate, hold_for(action))


def hold_for(action: str) -> str:
    """How long a finding with this action holds (one of ``HOLDS``): what it asks for is the
    evidence that ends it."""
    return _HOLD_FOR_ACTION.get(action, "window")


def span_text(seconds: float) -> str:
    """An escalation's span as people write it: 600 -> "10 min", 3600 -> "1 h", 90 -> "90 s"."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def peak_count(times: list[float], within_s: float) -> int:
    """The most events that fall within any ``within_s`` span of ``times`` (epoch seconds)."""
    ordered = sorted(times)
    best = start = 0
    for end, t in enumerate(ordered):
        while t - ordered[start] > within_s:
            start += 1
        best = max(best, end - start + 1)
    return best

__all__ = [
    "ACTIONS",
    "ACTION_TEXT",
    "CATALOG",
    "CATEGORIES",
    "DEFAULT_POLICY",
    "HOLDS",
    "NON_CRITICAL",
    "RECOVERY_ACTIONS",
    "SEVERITIES",
    "SXID_SUFFIX",
    "Escalation",
    "Judgement",
    "XidInfo",
    "XidPolicy",
    "info_for",
    "is_sxid",
    "hold_for",
    "judgement",
    "lookup",
    "peak_count",
    "recovery_action",
    "span_text",
]
