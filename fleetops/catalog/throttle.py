"""Clocks-event (throttle) reason bits as NVML defines them, decoded to stable names.

Which of them are faults is the checks' business (``checks/thermal_power.py``); here they are
only named, for the NVML reader, the simulator and the checks alike.
"""

from __future__ import annotations

REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NAME_BITS = {name: bit for bit, name in REASON_BITS.items()}


def decode(mask: int) -> list[str]:
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS)
    if rest:
        names.append(f"unknown_0x{rest:x}")
    return names


def encode(names: list[str]) -> int:
    return sum(NAME_BITS[n] for n in names if n in NAME_BITS)
