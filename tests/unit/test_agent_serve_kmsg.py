"""The kernel-log record parser and the XID book, without a daemon."""

from __future__ import annotations

from pathlib import Path

from fleetops.xid import follower as kmsg


def test_record_with_continuation_lines_keeps_the_message_only() -> None:
    raw = "3,1234,5012331000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    assert kmsg.parse_record(raw) == (1234, 5012.331, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    assert kmsg.parse_record("no separator here") is None
    assert kmsg.parse_record("3,x,1;text") is None


def test_book_dedups_across_sources_only_and_a_new_boot_starts_over(tmp_path: Path) -> None:
    path = str(tmp_path / "book.json")
    book = kmsg.XidBook(path, "boot-a")
    ev = {"source": "kernel", "bus_id": "0000:18:00.0", "code": 79, "time": 100.0}
    assert book.add(dict(ev, seq=0))
    assert book.add(dict(ev, seq=1))  # a repeat in the kernel log is a real repeat
    assert not book.add(dict(ev, source="nvml", time=101.5))  # the same XID seen by NVML
    # NVML's record of the kernel's second one, 10 s off: printk's clock drifts from wall time
    assert not book.add(dict(ev, source="nvml", time=110.0))
    assert book.add(dict(ev, source="nvml", time=112.0))  # a third XID: NVML saw it first
    book.seq = 1
    book.save()
    again = kmsg.XidBook(path, "boot-a")
    assert again.seq == 1 and again.counts == {"0000:18:00.0/79": 3}
    assert not again.add(dict(ev, seq=2, time=112.5))  # the kernel's record of the third, after a restart
    fresh = kmsg.XidBook(path, "boot-b")
    assert fresh.seq == -1 and fresh.counts == {} and fresh.events == []
