"""One XID reported by both sources (the kernel log and NVML's events) counts once, whatever the
printk clock's drift from wall time, in a storm, across the whole retention window; two XIDs of
one code on one GPU count twice. The kernel side goes through the follower's record parser,
the NVML side as the daemon's events callback adds it."""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fleetops.xid import follower as kmsg

BUSES = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
BOOT = 1_760_000_000.0  # the boot's wall time (what /proc/uptime gives, NTP-corrected)


class Sources:
    """A book fed by both sources as the daemon feeds it: kernel records through
    ``Follower.handle`` (stamped boot time + printk uptime), NVML events stamped with wall time."""

    def __init__(self, tmp_path: Path, name: str = "book.json") -> None:
        self.book = kmsg.XidBook(str(tmp_path / name), "boot-a")
        self.follower = kmsg.Follower(str(tmp_path / "kmsg"), self.book, lambda: BOOT, lambda ev: None,
                                      threading.Event())
        self.seq = self.book.seq + 1

    def kernel(self, xids: list[tuple[float, str, int]]) -> None:
        """Kernel records for (printk uptime, bus, code), one batch as the follower reads it."""
        records = []
        for uptime, bus, code in xids:
            pci = "PCI:" + bus.rsplit(".", 1)[0]
            records.append(f"3,{self.seq},{round(uptime * 1e6)},-;NVRM: Xid ({pci}): {code}, pid='<unknown>', "
                           f"name=<unknown>, Graphics SM Warp Exception")
            self.seq += 1
        self.follower.handle(records)

    def nvml(self, at: float, bus: str | None, code: int) -> bool:
        with self.book.lock:
            return self.book.add({"seq": None, "source": "nvml", "bus_id": bus, "code": code, "uptime_s": None,
                                  "time": round(at, 3), "message": f"NVML critical XID event {code}"})

    def total(self) -> int:
        return sum(self.book.counts.values())


def _truth(xids: list[tuple[float, str, int]]) -> dict[str, int]:
    return dict(Counter(f"{bus}/{code}" for _, bus, code in xids))


def _run(src: Sources, xids: list[tuple[float, str, int]], drift: Any, rng: random.Random,
         kernel_lag_s: float = 3.0, nvml_lag: Any = lambda i: 0.0) -> None:
    """Feed ``xids`` (wall time, bus, code) from both sources in the order the daemon sees them:
    NVML events as they happen (stamped ``nvml_lag(i)`` late), kernel records in the batches the
    follower reads, ``kernel_lag_s`` behind. ``drift(t)``: how far the printk clock runs ahead of
    wall time at ``t``."""
    arrivals: list[tuple[float, int, str, int]] = []  # (when handled, order, source index, xid index)
    for i, (t, _bus, _code) in enumerate(xids):
        arrivals.append((t + nvml_lag(i), 1, "nvml", i))
        arrivals.append((t + rng.uniform(0.0, kernel_lag_s), 0, "kernel", i))
    arrivals.sort()
    batch: list[tuple[float, str, int]] = []
    read_at = 0.0  # when the follower reads the records that came since its last read
    for when, _order, source, i in arrivals:
        t, bus, code = xids[i]
        if batch and when >= read_at:
            src.kernel(batch)
            batch = []
        if source == "kernel":
            if not batch:
                read_at = when + rng.uniform(0.0, 1.0)
            batch.append((t + drift(t) - BOOT, bus, code))
        else:
            src.nvml(t + nvml_lag(i), bus, code)
    if batch:
        src.kernel(batch)


@pytest.mark.parametrize("drift_s", [30.0, -30.0])
def test_1000_xids_with_30s_printk_drift_through_both_sources_count_once_each(tmp_path: Path, drift_s: float) -> None:
    rng = random.Random(7)
    start = BOOT + 25 * 86400.0  # 25 days up
    t = start
    xids = []
    for _ in range(1000):
        # bursts and quiet hours: XIDs of one code on one GPU often closer together than the drift
        t += rng.choice([rng.uniform(0.2, 3.0), rng.uniform(5.0, 60.0), rng.uniform(600.0, 3600.0)])
        xids.append((t, rng.choice(BUSES[:3]), rng.choice([13, 31, 43, 79])))
    span = t - start

    def drift(at: float) -> float:  # the printk clock drifts steadily, reaching drift_s at the end
        return drift_s * (at - start) / span

    src = Sources(tmp_path)
    _run(src, xids, drift, rng)
    assert src.total() == 1000
    assert src.book.counts == _truth(xids)
    assert src.book.pairing.paired == 1000
    offset = src.book.pairing.offset()
    assert offset is not None and abs(offset + drift_s) < 3.0  # NVML minus kernel: the drift, measured
    assert len(src.book.events) == 1000


def test_a_storm_of_500_xids_in_10s_counts_once_each(tmp_path: Path) -> None:
    rng = random.Random(11)
    start = BOOT + 30 * 86400.0
    xids = sorted((start + rng.uniform(0.0, 10.0), rng.choice(BUSES[:2]), rng.choice([13, 43])) for _ in range(500))
    src = Sources(tmp_path)
    # printk 30 s behind wall time; the NVML events are stamped late by a growing queue (up to 5 s)
    _run(src, xids, lambda at: -30.0, rng, kernel_lag_s=8.0, nvml_lag=lambda i: 5.0 * i / 500)
    assert src.total() == 500 and src.book.counts == _truth(xids)
    assert src.book.pairing.paired == 500


def test_a_storm_read_from_the_kernel_log_in_one_batch_after_all_its_nvml_events(tmp_path: Path) -> None:
    """The follower's worst case: NVML has every event of the storm before the kernel log is read,
    then all 500 records come in one batch (more than the 64 the check once looked back over)."""
    start = BOOT + 30 * 86400.0
    xids = [(start + i * 0.02, BUSES[0], 13) for i in range(500)]
    src = Sources(tmp_path)
    for t, bus, code in xids:
        assert src.nvml(t, bus, code)
    src.kernel([(t + 30.0 - BOOT, bus, code) for t, bus, code in xids])
    assert src.book.counts == {f"{BUSES[0]}/13": 500}


def test_two_xids_of_one_code_on_one_gpu_count_twice(tmp_path: Path) -> None:
    start = BOOT + 20 * 86400.0
    bus = BUSES[0]
    src = Sources(tmp_path)
    # both sources report both, a second apart, with printk 30 s ahead
    src.kernel([(start + 30.0 - BOOT, bus, 31), (start + 31.0 - BOOT, bus, 31)])
    assert not src.nvml(start, bus, 31) and not src.nvml(start + 1.0, bus, 31)
    assert src.book.counts == {f"{bus}/31": 2}
    # NVML released for a reset: the kernel alone reports one; the next is seen by both
    src.kernel([(start + 630.0 - BOOT, bus, 31)])
    src.kernel([(start + 640.0 - BOOT, bus, 31)])
    assert not src.nvml(start + 610.0, bus, 31)
    assert src.book.counts == {f"{bus}/31": 4}
    # the same code on another GPU, and another code on this one, are other XIDs
    assert src.nvml(start + 700.0, BUSES[1], 31) and src.nvml(start + 700.0, bus, 43)
    assert src.book.counts == {f"{bus}/31": 4, f"{BUSES[1]}/31": 1, f"{bus}/43": 1}


def test_the_pairing_survives_a_restart_of_the_daemon(tmp_path: Path) -> None:
    """An NVML event saved before a kill -9 still finds its kernel record read after the restart."""
    start = BOOT + 20 * 86400.0
    src = Sources(tmp_path)
    for i in range(5):  # the offset measured: printk 40 s ahead
        src.kernel([(start + i * 100.0 + 40.0 - BOOT, BUSES[2], 48)])
        assert not src.nvml(start + i * 100.0, BUSES[2], 48)
    assert src.nvml(start + 900.0, BUSES[2], 48)  # its kernel record not read before the kill
    src.book.save()
    again = Sources(tmp_path)
    assert again.book.pairing.offset() == pytest.approx(-40.0)
    again.kernel([(start + 940.0 - BOOT, BUSES[2], 48)])
    assert again.book.counts == {f"{BUSES[2]}/48": 6}


def test_an_unreadable_pairing_starts_over_and_counts_on(tmp_path: Path) -> None:
    src = Sources(tmp_path)
    src.kernel([(100.0, BUSES[0], 79)])
    src.book.save()
    text = (tmp_path / "book.json").read_text().replace('"pairing":{"pending":[', '"pairing":{"pending":[7,')
    (tmp_path / "book.json").write_text(text)
    again = Sources(tmp_path)
    assert again.book.counts == {f"{BUSES[0]}/79": 1} and again.book.pairing.pending == {}


def test_an_nvswitch_sxid_keeps_its_source_and_is_never_paired(tmp_path: Path) -> None:
    src = Sources(tmp_path)
    src.follower.handle([f"3,{src.seq},5000000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, "
                         "Link 44 egress non-posted PRIV error"])
    assert [(e["source"], e["code"]) for e in src.book.events] == [("kernel:sxid", 12028)]
    assert src.book.pairing.pending == {}  # no NVML event will ever come for it
    assert src.nvml(BOOT + 5.0, "0000:05:00.0", 12028)  # not its pair: counted as its own


def test_xids_only_one_source_saw_wait_for_their_pair_one_hour_and_no_longer(tmp_path: Path) -> None:
    """NVML released (or not reporting) for one GPU while it reports another's: the kernel's
    records of the first wait an hour of NVML's stamps for a pair, then are let go."""
    start = BOOT + 10 * 86400.0
    src = Sources(tmp_path)
    for i in range(240):  # two hours; each GPU's XIDs a minute apart
        t = start + i * 30.0
        if i % 2:
            src.kernel([(t - BOOT, BUSES[0], 13)])
        else:
            src.kernel([(t - BOOT, BUSES[1], 43)])
            assert not src.nvml(t, BUSES[1], 43)
    waiting = src.book.pairing.pending[(BUSES[0], 13)]["kernel"]
    # the hour before NVML's newest stamp (start + 238 * 30 s): from start + 3540 s on
    assert len(waiting) == 61 and waiting[0] == start + 119 * 30.0
    assert src.book.counts == {f"{BUSES[0]}/13": 120, f"{BUSES[1]}/43": 120}
