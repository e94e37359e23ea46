"""The simulated kernel log's printk clock drifts from wall time as a real one does (never
NTP-corrected): a node's ``printk_drift_ppm`` puts its XID records ahead of or behind wall time,
in the state's kernel log, in its kmsg file and in what the daemon's follower stamps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from fleetops.sim import gpu as sim
from fleetops.xid import follower as kmsg

MONTH_S = 30 * 86400.0


@pytest.mark.parametrize("drift_s", [30.0, -30.0, 0.0])
def test_a_months_printk_drift_puts_simulated_xid_stamps_off_wall_time(tmp_path: Path, drift_s: float) -> None:
    state = tmp_path / "n1.json"
    ppm = drift_s / MONTH_S * 1e6  # about 11.6 ppm: 30 s after a month up
    sim.init_state(str(state), "n1", {"uptime_s": MONTH_S, "node": {"printk_drift_ppm": ppm}})
    boot = float(sim.read_state(str(state))["node"]["boot_time"])
    assert sim.inject(str(state), "xid:79", 2)
    now = time.time()
    line = sim.read_state(str(state))["kernel_log"][-1]["line"]
    stamp = float(line[1:].split("]", 1)[0])
    assert boot + stamp - now == pytest.approx(drift_s, abs=1.0)
    record = kmsg.parse_record(Path(sim.kmsg_path(str(state))).read_text().splitlines()[-1])
    assert record is not None and "Xid (PCI:0000:3a:00): 79" in record[2]
    assert boot + record[1] - now == pytest.approx(drift_s, abs=1.0)
    # the daemon's follower stamps the record with the boot time plus printk: off by the drift
    book = kmsg.XidBook(str(tmp_path / "book.json"), "sim")
    got: list[dict[str, object]] = []
    kmsg.Follower(sim.kmsg_path(str(state)), book, lambda: boot, got.append, threading.Event()).poll_file()
    assert len(got) == 1 and float(str(got[0]["time"])) - now == pytest.approx(drift_s, abs=1.0)


def test_printk_clock_without_a_drift_setting_is_wall_time() -> None:
    node = {"boot_time": 1000.0}
    assert sim.printk_uptime(node, 1000.0 + MONTH_S) == MONTH_S
    assert sim.printk_uptime({**node, "printk_drift_ppm": 10.0}, 1000.0 + 1e6) == pytest.approx(1e6 + 10.0)
