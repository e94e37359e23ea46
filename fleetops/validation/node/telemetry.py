"""What each GPU went through while a validation test ran: read-only NVML readings.

A figure is only as good as the conditions it was measured under: a GEMM that ran while the board
power-braked, or an HBM test on a GPU at its slowdown temperature, reads low for a reason the
result must carry. ``Window`` samples one GPU from a background thread every ``period_s`` from
``begin(test)`` (before the test's warm-up) to ``end()`` (after its last repeat), plus one
reading at each edge, and keeps per test: every clocks-event reason seen and in how many
readings, the highest temperature and power, the lowest and highest SM clock. Nothing here
changes a GPU setting.
"""

from __future__ import annotations

import threading
import time
from typing import Any

# nvmlClocksEventReasons bits (the names the snapshot's clocks_event_reasons use)
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
PERIOD_S = 0.05


def read(nv: Any, index: int) -> dict[str, Any]:
    """One reading of GPU ``index``: clocks-event reasons, temperature, power, SM clock."""
    if nv is None:
        return {"error": "pynvml not available"}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mask = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        return {
            "clocks_event_reasons": [name for bit, name in REASONS.items() if mask & bit],
            "temperature_c": nv.nvmlDeviceGetTemperature(h, 0),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, 1),
        }
    except Exception as exc:  # noqa: BLE001 - a missing reading is recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def summarize(readings: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The readings of one test folded into what the result keeps."""
    good = [r for r in readings if "error" not in r]
    out: dict[str, Any] = {"readings": len(good), "seconds": round(seconds, 3)}
    errors = [r["error"] for r in readings if "error" in r]
    if errors:
        out["errors"] = len(errors)
        out["error"] = errors[0]
    if not good:
        return out
    counts: dict[str, int] = {}
    for r in good:
        for name in r["clocks_event_reasons"]:
            counts[name] = counts.get(name, 0) + 1
    out["clocks_event_reasons"] = sorted(counts)
    out["clocks_event_readings"] = {name: counts[name] for name in sorted(counts)}
    out["temperature_c_max"] = max(r["temperature_c"] for r in good)
    out["power_w_max"] = max(r["power_w"] for r in good)
    out["sm_clock_mhz_min"] = min(r["sm_clock_mhz"] for r in good)
    out["sm_clock_mhz_max"] = max(r["sm_clock_mhz"] for r in good)
    return out


class Window:
    """Samples one GPU while a test runs; ``during`` maps each test to its summary."""

    def __init__(self, nv: Any, index: int, period_s: float = PERIOD_S) -> None:
        self.nv = nv
        self.index = index
        self.period_s = period_s
        self.during: dict[str, dict[str, Any]] = {}
        self._test: str | None = None
        self._readings: list[dict[str, Any]] = []
        self._started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, test: str) -> None:
        if self._test is not None:
            self.end()
        self._test = test
        self._readings = [read(self.nv, self.index)]
        self._started = time.monotonic()
        if self.nv is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"validate-telemetry-{self.index}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._readings.append(read(self.nv, self.index))

    def end(self) -> None:
        if self._test is None:
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._readings.append(read(self.nv, self.index))
        self.during[self._test] = summarize(self._readings, time.monotonic() - self._started)
        self._test = None
        self._readings = []


def nvml_sampler() -> tuple[Any, Any]:
    """Read-only NVML telemetry per test: clocks-event reasons, temperature, power, SM clock."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - telemetry is optional; the result says it is missing
        return None, None
    return pynvml, pynvml


def nvml_gpus() -> list[dict[str, Any]]:
    """Identity of each GPU (index, UUID, bus id, name) from NVML, read-only; empty where NVML
    does not start, so a backend that needs no NVML still runs."""
    nv, _ = nvml_sampler()
    if nv is None:
        return []
    out = []
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            out.append({"index": i, "uuid": nv.nvmlDeviceGetUUID(h), "bus_id": nv.nvmlDeviceGetPciInfo(h).busId,
                        "name": name.decode() if isinstance(name, bytes) else name})
    except Exception:  # noqa: BLE001 - identity is best effort; the backend's own ids remain
        return out
    return out
