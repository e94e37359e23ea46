"""The validation's telemetry window: what a GPU went through while a test ran, from a scripted
NVML (each reading is the next of a list; the last one repeats)."""

from __future__ import annotations

import threading
import time
from typing import Any

from fleetops.validation.node import telemetry


class ScriptedNvml:
    """The four NVML reads ``telemetry.read`` makes, answering reading after reading from
    ``script``: (reasons mask, temperature C, power mW, SM clock MHz), or an exception."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.reads = 0
        self.lock = threading.Lock()

    def _current(self) -> Any:
        return self.script[min(self.reads, len(self.script) - 1)]

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        now = self._current()
        if isinstance(now, Exception):
            with self.lock:
                self.reads += 1
            raise now
        return int(now[0])

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return int(self._current()[1])

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._current()[2])

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        value = int(self._current()[3])
        with self.lock:
            self.reads += 1  # the last of the four reads of one reading
        return value


def wait_reads(nv: ScriptedNvml, n: int) -> None:
    deadline = time.monotonic() + 30
    while nv.reads < n:
        assert time.monotonic() < deadline, f"only {nv.reads} readings"
        time.sleep(0.005)


IDLE = (0x1, 35, 80_000, 345)
LOAD = (0x0, 52, 610_000, 1980)
CAPPED = (0x4, 61, 699_000, 1755)
BRAKE = (0x80 | 0x4, 63, 300_000, 1020)


def test_window_keeps_every_reason_seen_while_the_test_ran_with_its_extremes() -> None:
    nv = ScriptedNvml([LOAD, CAPPED, BRAKE, CAPPED, LOAD])
    window = telemetry.Window(nv, 0, period_s=0.001)
    window.begin("gemm_bf16_tflops")
    wait_reads(nv, 5)
    window.end()
    got = window.during["gemm_bf16_tflops"]
    assert got["readings"] == nv.reads >= 6  # one at each edge, the rest from the thread
    assert got["clocks_event_reasons"] == ["hw_power_brake_slowdown", "sw_power_cap"]
    assert got["clocks_event_readings"]["hw_power_brake_slowdown"] == 1
    assert got["clocks_event_readings"]["sw_power_cap"] == 3
    assert (got["temperature_c_max"], got["power_w_max"]) == (63, 699.0)
    assert (got["sm_clock_mhz_min"], got["sm_clock_mhz_max"]) == (1020, 1980)
    assert "errors" not in got


def test_each_test_has_its_own_window_and_nothing_is_read_between_them() -> None:
    nv = ScriptedNvml([CAPPED])
    window = telemetry.Window(nv, 0, period_s=0.001)
    window.begin("gemm_fp8_tflops")
    wait_reads(nv, 3)
    window.end()
    first = nv.reads
    assert window.during["gemm_fp8_tflops"]["clocks_event_reasons"] == ["sw_power_cap"]
    nv.script = [IDLE]  # between tests: the GPU idles, and nobody reads it
    time.sleep(0.05)
    assert nv.reads == first  # the thread stopped with the test
    nv.script = [LOAD]
    window.begin("h2d_gbps")
    window.end()
    assert window.during["h2d_gbps"]["clocks_event_reasons"] == []
    assert window.during["h2d_gbps"]["readings"] == 2
    assert window.during["gemm_fp8_tflops"]["clocks_event_reasons"] == ["sw_power_cap"]


def test_a_reading_that_fails_is_counted_and_sampling_goes_on() -> None:
    nv = ScriptedNvml([LOAD, RuntimeError("NVML_ERROR_GPU_IS_LOST"), CAPPED])
    window = telemetry.Window(nv, 0, period_s=0.001)
    window.begin("hbm_copy_gbps")
    wait_reads(nv, 4)
    window.end()
    got = window.during["hbm_copy_gbps"]
    assert got["errors"] == 1
    assert got["error"] == "RuntimeError: NVML_ERROR_GPU_IS_LOST"
    assert got["clocks_event_reasons"] == ["sw_power_cap"]
    assert got["readings"] == nv.reads - 1


def test_without_nvml_the_window_says_so_and_starts_no_thread() -> None:
    window = telemetry.Window(None, 0)
    window.begin("hbm_copy_gbps")
    window.end()
    assert window.during["hbm_copy_gbps"] == {
        "readings": 0, "seconds": window.during["hbm_copy_gbps"]["seconds"], "errors": 2,
        "error": "pynvml not available",
    }  # fmt: skip
