"""Thermal and power: clock-event (throttle) reasons, GPU and HBM temperature, power limits."""

from __future__ import annotations

import time
from collections.abc import Iterable

from fleetops import model
from fleetops.baseline import Baseline
from fleetops.catalog import throttle
from fleetops.checks.base import (
    CMD_APPLY_POWER,
    DEMAND_BASELINE,
    DEMAND_EXPECTED,
    CheckSpec,
    Context,
    Item,
    gpu_label,
    setting_drift,
)

FAMILY = "thermal_power"

# Clock-event reasons that mean something is wrong, and those that are normal operation.
FAULT_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
NORMAL_REASONS = ("gpu_idle", "sw_power_cap", "applications_clocks_setting", "sync_boost", "display_clock_setting")

COOLING_ACTION = (
    "Check the node's cooling (BMC fan and inlet sensors, airflow, liquid loop); drain the node if the "
    "GPU stays hot."
)
POWER_BRAKE_ACTION = (
    "The baseboard asserted power brake: check the node's power supplies and feeds (BMC SEL, PSU "
    "status); drain the node if it persists."
)
POWER_ACTION = f"Set the baseline power limit: {CMD_APPLY_POWER}."

SPECS = (
    CheckSpec(
        "thermal_power.throttle", FAMILY, "Clock-event (throttle) reasons",
        reads="nvmlDeviceGetCurrentClocksEventReasons",
        threshold="any of " + ", ".join(FAULT_REASONS) + "; the resident agent holds the finding until "
        "--clear-after consecutive clean samples (default 30)",
        severities=("warn",),
        action="Thermal reasons: " + COOLING_ACTION + " Power brake: " + POWER_BRAKE_ACTION,
        not_a_fault="gpu_idle, sw_power_cap (running at the power limit), applications_clocks_setting, "
        "sync_boost and display_clock_setting are normal operation.",
    ),
    CheckSpec(
        "thermal_power.temperature", FAMILY, "GPU temperature against its slowdown temperature",
        reads="nvmlDeviceGetTemperature(GPU), nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
        threshold="warn within thresholds.temp_slowdown_margin_c (5 C) of slowdown, crit at or above it",
        severities=("warn", "crit"),
        action=COOLING_ACTION,
        unit="C",
    ),
    CheckSpec(
        "thermal_power.memory_temperature", FAMILY, "HBM temperature",
        reads="NVML_FI_DEV_MEMORY_TEMP, nvmlDeviceGetTemperatureThreshold(MEM_MAX)",
        threshold="warn at thresholds.temp_memory_warn_c (85 C), crit at the GPU's maximum memory temperature",
        severities=("warn", "crit"),
        action=COOLING_ACTION,
        unit="C",
    ),
    CheckSpec(
        "thermal_power.power_limit", FAMILY, "Power limit per GPU model",
        reads="nvmlDeviceGetPowerManagementLimit",
        threshold="gpu_models.<model>.power_limit_w, else power_limit_w, within "
        "thresholds.power_limit_tolerance_w (1 W); without either, the strict majority of that model's GPUs "
        "across the fleet (no finding on a tie or with fewer than 3 GPUs of the model)",
        severities=("warn",),
        action=POWER_ACTION,
        scope="node+fleet", requires="gpu_models.<model>.power_limit_w or power_limit_w (node check)",
        applies=lambda n, b: b is not None and (
            b.power_limit_w is not None or any(m.power_limit_w is not None for m in b.gpu_models.values())
        ),
        fleet_applies=lambda b: b is None or b.power_limit_w is None,
        unit="W",
    ),
    CheckSpec(
        "thermal_power.power_enforced", FAMILY, "Enforced power limit below the set limit",
        reads="nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementLimit",
        threshold="enforced limit lower than the set limit by more than thresholds.power_limit_tolerance_w",
        severities=("warn",),
        action="Another cap is in force (out-of-band/BMC power capping, a chassis power budget): check the "
        "BMC's power policy.",
        unit="W",
    ),
)


def _reasons(ctx: Context, gpu: model.Gpu) -> list[str] | None:
    if gpu.clocks_event_reasons is not None:
        return list(gpu.clocks_event_reasons)
    if gpu.clocks_event_mask is not None:
        return throttle.decode(gpu.clocks_event_mask)
    ctx.get(FAMILY, gpu, "clocks_event_reasons", DEMAND_EXPECTED)
    return None


def _throttle_action(faults: Iterable[str]) -> str:
    faults = list(faults)
    brake = "hw_power_brake_slowdown" in faults
    thermal = any(r in faults for r in ("hw_thermal_slowdown", "sw_thermal_slowdown"))
    return " ".join(([POWER_BRAKE_ACTION] if brake else []) + ([COOLING_ACTION] if thermal or not brake else []))


# --- throttle hold (the resident agent) -------------------------------------------------

DEFAULT_CLEAR_AFTER = 30  # clean samples: one minute at the agent's default 2 s interval


class ThrottleHold:
    """Evidence-based clearing of a slowdown seen between audits: fed every light sample's
    clocks-event mask, it stays active from the first faulty sample until ``clear_after``
    consecutive clean ones, so a GPU that throttled and recovered is still reported for that
    hold (a snapshot taken after the recovery shows nothing). A sample whose mask could not be
    read is no evidence either way: it neither clears nor extends the hold."""

    __slots__ = ("reasons", "first_seen", "last_seen", "clean", "samples")

    def __init__(self) -> None:
        self.reasons: list[str] = []  # fault reasons seen in the current episode, first seen first
        self.first_seen: float | None = None
        self.last_seen: float | None = None
        self.clean = 0  # consecutive clean samples since last_seen
        self.samples = 0  # faulty samples in the current episode

    def observe(self, t: float, mask: float | int | None, clear_after: int) -> None:
        if mask is None or mask != mask:  # None or NaN: not read
            return
        faults = [r for r in throttle.decode(int(mask)) if r in FAULT_REASONS]
        if not faults:
            if self.last_seen is not None:
                self.clean += 1
            return
        if not self.active(clear_after):  # a new episode
            self.reasons, self.first_seen, self.samples = [], t, 0
        for r in faults:
            if r not in self.reasons:
                self.reasons.append(r)
        self.last_seen, self.clean = t, 0
        self.samples += 1

    def active(self, clear_after: int) -> bool:
        return self.last_seen is not None and self.clean < max(1, clear_after)


def throttle_hold(samples: Iterable[tuple[float, float | int | None]], clear_after: int) -> ThrottleHold:
    """The hold over ``(time, clocks_event_mask)`` samples, oldest first (a ring's history)."""
    hold = ThrottleHold()
    for t, mask in samples:
        hold.observe(t, mask, clear_after)
    return hold


def held_throttle_findings(
    node: model.Node, holds: dict[str, ThrottleHold], current: Iterable[model.Finding], clear_after: int
) -> list[model.Finding]:
    """``thermal_power.throttle`` findings for GPUs whose hold is active and whose snapshot
    shows no slowdown (any more, or not yet): a GPU the snapshot itself finds throttling keeps
    that finding instead."""
    already = {(f.gpu or {}).get("uuid") for f in current if f.check == "thermal_power.throttle"}
    out: list[model.Finding] = []
    for gpu in node.gpus:
        hold = holds.get(gpu.uuid)
        if hold is None or not hold.active(clear_after) or gpu.uuid in already or hold.last_seen is None:
            continue
        seen = time.strftime("%H:%M:%S UTC", time.gmtime(hold.last_seen))
        out.append(model.Finding(
            check="thermal_power.throttle", severity="warn", node=node.hostname,
            message=f"{gpu_label(gpu)}: clocks were held down by {', '.join(hold.reasons)} "
            f"(last seen {seen}, {hold.samples} sample(s)); held until {clear_after} consecutive clean samples, "
            f"{hold.clean} so far",
            gpu=model.gpu_ref(gpu),
            observed={"reasons": list(hold.reasons), "first_seen": hold.first_seen, "last_seen": hold.last_seen,
                      "faulty_samples": hold.samples, "clean_samples": hold.clean},
            expected=[], action=_throttle_action(hold.reasons),
        ))
    return out


def run(ctx: Context) -> None:
    th = ctx.th
    b = ctx.baseline
    for gpu in ctx.node.gpus:
        label = gpu_label(gpu)
        reasons = _reasons(ctx, gpu)
        if reasons is not None:
            faults = [r for r in reasons if r in FAULT_REASONS]
            if faults:
                clocks = ""
                if gpu.clock_sm_mhz is not None and gpu.clock_sm_max_mhz:
                    clocks = f"; SM clock {gpu.clock_sm_mhz}/{gpu.clock_sm_max_mhz} MHz"
                action = _throttle_action(faults)
                ctx.add("thermal_power.throttle", "warn",
                        f"{label}: clocks held down by {', '.join(faults)}{clocks}",
                        gpu=gpu, observed=faults, expected=[], action=action)

        temp = ctx.get(FAMILY, gpu, "temp_gpu_c", DEMAND_EXPECTED)
        slowdown = ctx.get(FAMILY, gpu, "temp_slowdown_c")
        if temp is not None and slowdown is not None:
            margin = th.temp_slowdown_margin_c
            if temp >= slowdown:
                ctx.add("thermal_power.temperature", "crit",
                        f"{label}: {temp:g} C, at or above its slowdown temperature {slowdown:g} C",
                        gpu=gpu, observed=temp, expected=f"< {slowdown - margin:g} C", action=COOLING_ACTION)
            elif temp >= slowdown - margin:
                ctx.add("thermal_power.temperature", "warn",
                        f"{label}: {temp:g} C, within {margin:g} C of its slowdown temperature {slowdown:g} C",
                        gpu=gpu, observed=temp, expected=f"< {slowdown - margin:g} C", action=COOLING_ACTION)

        mem = ctx.get(FAMILY, gpu, "temp_memory_c")
        if mem is not None:
            mem_max = gpu.temp_memory_max_c
            if mem_max is not None and mem >= mem_max:
                ctx.add("thermal_power.memory_temperature", "crit",
                        f"{label}: HBM at {mem:g} C, at or above its maximum {mem_max:g} C",
                        gpu=gpu, observed=mem, expected=f"< {th.temp_memory_warn_c:g} C", action=COOLING_ACTION)
            elif mem >= th.temp_memory_warn_c:
                ctx.add("thermal_power.memory_temperature", "warn",
                        f"{label}: HBM at {mem:g} C (warn at {th.temp_memory_warn_c:g} C"
                        + (f", maximum {mem_max:g} C)" if mem_max is not None else ")"),
                        gpu=gpu, observed=mem, expected=f"< {th.temp_memory_warn_c:g} C", action=COOLING_ACTION)

        _power(ctx, gpu, b, label)


def _power(ctx: Context, gpu: model.Gpu, b: Baseline | None, label: str) -> None:
    tol = ctx.th.power_limit_tolerance_w
    wanted = b.power_limit_for(gpu.name) if b is not None else None
    limit = ctx.get(FAMILY, gpu, "power_limit_w", DEMAND_BASELINE if wanted is not None else DEMAND_EXPECTED)
    if wanted is not None and limit is not None and abs(limit - wanted) > tol:
        note = ""
        lo, hi = gpu.power_min_limit_w, gpu.power_max_limit_w
        if lo is not None and hi is not None and not lo <= wanted <= hi:
            note = f"; the baseline's {wanted:g} W is outside this GPU's range {lo:g}-{hi:g} W, fix the baseline"
        ctx.add("thermal_power.power_limit", "warn",
                f"{label}: power limit {limit:g} W, baseline {wanted:g} W for {gpu.name}{note}",
                gpu=gpu, observed=limit, expected=wanted, action=POWER_ACTION)
    enforced = ctx.get(FAMILY, gpu, "power_enforced_limit_w")
    if limit is not None and enforced is not None and enforced < limit - tol:
        ctx.add("thermal_power.power_enforced", "warn",
                f"{label}: enforced power limit {enforced:g} W is below the set {limit:g} W: another cap is "
                "in force",
                gpu=gpu, observed=enforced, expected=limit,
                action="Check the BMC's power capping / chassis power budget for the node.")


def run_fleet(nodes: list[model.Node], b: Baseline | None) -> list[model.Finding]:
    out: list[model.Finding] = []
    groups: dict[str, list[Item]] = {}
    for n in nodes:
        for g in n.gpus:
            if g.name is not None:
                groups.setdefault(g.name, []).append(Item(n.hostname, g.power_limit_w, g))
    for model_name, items in groups.items():
        if b is not None and b.power_limit_for(model_name) is not None:
            continue  # pinned: checked per node
        out += setting_drift("thermal_power.power_limit", "power limit", model_name, items,
                             lambda i, want: POWER_ACTION + " (pin power_limit_w in the baseline first)",
                             fmt=lambda v: f"{v:g} W")
    return out
