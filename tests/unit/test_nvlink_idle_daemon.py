"""NVLink traffic in the daemon: the NVML light read's cost per tick (fake NVML, calls counted),
and ``nvlink.idle_link`` raised by a real ``fleetops-agent serve`` process on a simulated node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_serve import _ask, _until

from fleetops.agent.serve.ring import LINK_FIELDS
from fleetops.gpu import nvml as gpu_nvml
from fleetops.gpu.nvml import access as nvml_access
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")

# What one tick asks of NVML per GPU: temperature, power, SM clock, clocks-event reasons,
# utilisation, PCIe TX and RX, and ONE field-values call, whatever the number of NVLinks.
PER_GPU_TICK = {
    "nvmlDeviceGetTemperature": 1,
    "nvmlDeviceGetPowerUsage": 1,
    "nvmlDeviceGetClockInfo": 1,
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetUtilizationRates": 1,
    "nvmlDeviceGetPcieThroughput": 2,
    "nvmlDeviceGetFieldValues": 1,
}


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Path]]:
    """The fake NVML module in place of pynvml for this test only (load_module installs it in
    sys.modules; the real one comes back afterwards)."""
    control = tmp_path / "control.json"
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(control))
    monkeypatch.setenv(gpu_nvml.NVML_MODULE_ENV, "fake_nvml")
    saved = sys.modules.get("pynvml")
    try:
        module = gpu_nvml.load_module()
        module.fresh()
        yield module, control
    finally:
        if saved is not None:
            sys.modules["pynvml"] = saved
        else:
            sys.modules.pop("pynvml", None)


def _tick_calls(module: Any) -> tuple[dict[str, int], dict[str, dict[str, float | None]]]:
    backend = nvml_access.NvmlAccess()
    backend.light()  # the first tick initialises NVML (and reads each GPU's link count once)
    module.reset_calls()
    values, lost = backend.light()
    assert lost == {}
    return module.calls(), values


def test_light_read_samples_18_links_in_the_same_one_field_call_per_gpu(fake: tuple[Any, Path]) -> None:
    module, control = fake
    # counters of a node that has run for months: TX past float32's 2**24, RX past float64's 2**53
    tx0, rx0 = 8_700_000_000_000, 2**53 + 1
    kib = {f"{g}/{n}": [tx0 + 1000 * g + n, rx0 + 2000 * g + n] for g in range(2) for n in range(18)}
    control.write_text(json.dumps({"mode": "ok", "temp": 40, "nvlinks": 18, "link_kib": kib}))
    calls, values = _tick_calls(module)
    assert calls == {name: 2 * n for name, n in PER_GPU_TICK.items()}  # 2 GPUs
    row = values["GPU-fake-1"]
    assert {k for k in row if k.startswith("nvlink")} == {f"nvlink{n}_{f}" for n in range(18) for f in LINK_FIELDS}
    tx, rx = row["nvlink17_tx_kib"], row["nvlink17_rx_kib"]
    assert (tx, rx) == (tx0 + 1017, rx0 + 2017) and type(tx) is int and type(rx) is int  # NVML's exact value
    assert row["nvlink3_crc_errors"] == 0 and type(row["nvlink3_crc_errors"]) is int and row["temp_memory_c"] == 40.0


def test_light_read_without_nvlink_costs_the_same_calls_and_asks_for_no_link(fake: tuple[Any, Path]) -> None:
    module, control = fake
    control.write_text(json.dumps({"mode": "ok", "temp": 40}))  # NVLink Not Supported (a passthrough VM)
    calls, values = _tick_calls(module)
    assert calls == {name: 2 * n for name, n in PER_GPU_TICK.items()}
    assert not any(k.startswith("nvlink") for row in values.values() for k in row)


def test_link_count_is_read_again_after_a_driver_reload(fake: tuple[Any, Path]) -> None:
    module, control = fake
    control.write_text(json.dumps({"mode": "ok", "temp": 40}))
    backend = nvml_access.NvmlAccess()
    backend.light()
    assert backend.link_counts == {"GPU-fake-0": 0, "GPU-fake-1": 0}
    # the driver does not unload under a process that holds NVML: this one, through the backend
    with pytest.raises(module.InUse, match=f"pid {os.getpid()} "):
        module.unload(str(control))
    backend.release()  # what the daemon's quiesce does: NVML shut down, nothing held
    assert module.holders(str(control)) == []
    module.unload(str(control))
    with pytest.raises(RuntimeError, match="nvmlInit: DriverNotLoaded"):
        backend.light()
    control.write_text(json.dumps({"mode": "ok", "temp": 40, "nvlinks": 4}))
    values, _ = backend.light()
    assert backend.link_counts == {"GPU-fake-0": 4, "GPU-fake-1": 4}
    assert "nvlink3_tx_kib" in values["GPU-fake-0"] and "nvlink4_tx_kib" not in values["GPU-fake-0"]


# --- a real daemon on a simulated node ---------------------------------------------------------


def _findings(state: Path, check: str) -> list[dict[str, Any]]:
    doc = _ask(state, "snapshot") or {}
    return [f for f in (doc.get("daemon") or {}).get("findings", []) if f["check"] == check]


@pytest.mark.slow
def test_daemon_finds_the_idle_link_of_a_gpu_whose_other_links_carry_a_job(tmp_path: Path) -> None:
    """The window is the default 60 s: the daemon needs a minute of its own history first."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    uuid = sim.read_state(str(state))["gpus"][2]["uuid"]
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--full-interval", "1", "--states", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _until("the daemon's first snapshot", lambda: (_ask(state, "snapshot") or {}).get("daemon"), 60)
        assert sim.inject(str(state), "nvlink-idle", 2)
        injected_by = time.time()
        # every full snapshot read until the verdict: (seconds of the daemon's own history at
        # its collect, collected with the job running, its idle-link findings)
        seen: list[tuple[float, bool, list[dict[str, Any]]]] = []

        def verdict() -> list[dict[str, Any]]:
            doc = _ask(state, "snapshot") or {}
            daemon = doc.get("daemon")
            if not daemon or not doc.get("gpus"):
                return []
            found = [f for f in daemon["findings"] if f["check"] == "nvlink.idle_link"]
            seen.append((doc["collected_at"] - daemon["started_at"], doc["collected_at"] > injected_by, found))
            return found

        [f] = _until("nvlink.idle_link among the daemon's findings", verdict, 150)
        # no verdict before the daemon holds a 60 s window of its own history...
        assert [span for span, _, found in seen if found and span < 60] == []
        # ...though it had the job in view earlier: snapshots with the job running and no verdict
        assert [span for span, job, found in seen if job and not found and span < 60] != []
        assert f["severity"] == "warn" and f["gpu"]["uuid"] == uuid
        assert list(f["observed"]["links"]) == ["5"] and f["observed"]["window_s"] >= 60
        assert f["observed"]["links"]["5"]["moved_kib"] == 0
        # the ring keeps the cumulative counters: link 5 flat, link 4 growing
        idle = (_ask(state, f"history {uuid} nvlink5_tx_kib 3600") or {})["samples"]
        busy = (_ask(state, f"history {uuid} nvlink4_tx_kib 3600") or {})["samples"]
        assert len({v for _, v in idle}) == 1 and busy[-1][1] > busy[0][1]
        sim.clear(str(state), "nvlink-idle", 2)  # the job ends: every link idle, an idle GPU
        _until("the finding cleared", lambda: _findings(state, "nvlink.idle_link") == [], 150)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
