"""Kernel-log follower: ``/dev/kmsg`` records (``prio,seq,usec,flags;message``) or a file of the
same format (the simulator's), parsed with ``fleetops.xid.kernlog``.

The sequence number is the cursor. The cursor, the per-XID counters and the recent events are
written together (one file, atomic rename) after every batch, so a kill between reading and
writing only re-reads records whose effect was never recorded: nothing is lost or counted twice.
A failed write (full disk) is reported and retried with the next batch.
"""

from __future__ import annotations

import bisect
import errno
import json
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from fleetops.common import stats

KEEP_EVENTS = 1000

# Matching the two sources of one XID. The kernel's record is stamped with the boot time plus
# the printk clock, which is not NTP-corrected and drifts from wall time by seconds a day (tens
# of seconds after a month of uptime); the NVML event is stamped with wall time when it is read.
# The same XID therefore arrives once from each source, on (GPU bus id, code), with stamps that
# differ by the printk clock's offset. The offset is measured from the pairs found (the median of
# the recent ones); until it is known, a pair may lie ``WIDE_WINDOW_S`` apart.
WIDE_WINDOW_S = 300.0
NARROW_WINDOW_S = 10.0  # around the measured offset, widened by its spread and by its age
MAX_DRIFT_PER_S = 1e-4  # how fast the offset may move since it was last measured (100 ppm)
OFFSET_PAIRS = 33  # pairs the offset's median is taken over
MIN_PAIRS = 3  # pairs before the offset is trusted
# An XID's record from the other source comes within this long or not at all: events still
# waiting for their pair are compared for this long (by the other source's newest stamp), and
# at most PENDING_MAX per (GPU, code) and source (a storm far beyond any seen).
RETAIN_S = 3600.0
PENDING_MAX = 5000
SIDES = ("kernel", "nvml")


def parse_record(raw: str) -> tuple[int, float, str] | None:
    """(seq, uptime seconds, message) of one kmsg record, None when it is not one."""
    head, sep, message = raw.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3:
        return None
    try:
        # /dev/kmsg continuation lines (" SUBSYSTEM=pci", " DEVICE=...") follow the message
        return int(parts[1]), int(parts[2]) / 1e6, message.split("\n", 1)[0]
    except ValueError:
        return None


class Pairing:
    """The XIDs of each source still waiting for the other source's record of them, by
    (GPU bus id, code), and the measured offset between the two sources' clocks.

    Each source reports its XIDs in order, so the k-th kernel record of a (GPU, code) is the
    k-th NVML event of it: a new event pairs with the earliest waiting one of the other source
    whose stamp, moved onto this source's clock by the offset, lies within the window (first the
    narrow one around the measured offset, then the wide one). Two XIDs of one code on one GPU
    are two records in each source and make two pairs; an XID that one source missed (NVML
    released for a reset, the kernel's ring overwritten) stays unpaired and counts once, as
    every XID does. ``offset`` is NVML's stamp minus the kernel's."""

    def __init__(self) -> None:
        # (bus id, code) -> source -> the stamps of its events still waiting, ascending
        self.pending: dict[tuple[str | None, int], dict[str, list[float]]] = {}
        self.deltas: deque[float] = deque(maxlen=OFFSET_PAIRS)
        self.measured_at: float | None = None  # the NVML stamp of the last pair
        self.newest: dict[str, float] = {}  # per source, the newest stamp seen
        self.paired = 0

    def offset(self) -> float | None:
        """NVML's stamp minus the kernel's for one XID, as the recent pairs measured it."""
        if len(self.deltas) < MIN_PAIRS:
            return None
        return stats.median(self.deltas)

    def _narrow(self, offset: float, nvml_time: float) -> float:
        spread = stats.median(abs(d - offset) for d in self.deltas)
        age = abs(nvml_time - self.measured_at) if self.measured_at is not None else RETAIN_S
        return float(min(WIDE_WINDOW_S, NARROW_WINDOW_S + 4.0 * spread + MAX_DRIFT_PER_S * age))

    def match(self, source: str, bus_id: str | None, code: int, at: float) -> bool:
        """Whether this event is the other source's record of an XID already counted. One that
        is not waits for its own pair."""
        other = SIDES[1] if source == SIDES[0] else SIDES[0]
        self.newest[source] = max(at, self.newest.get(source, at))
        sides = self.pending.setdefault((bus_id, code), {})
        waiting = sides.setdefault(other, [])
        offset = self.offset()
        self._prune(waiting, source, offset or 0.0)
        sign = 1.0 if source == "kernel" else -1.0  # onto the other source's clock
        windows: list[tuple[float, float]] = []
        if offset is not None:
            windows.append((offset, self._narrow(offset, at if source == "nvml" else at + offset)))
        windows.append((offset or 0.0, WIDE_WINDOW_S))
        found = None
        for off, window in windows if waiting else ():
            expect = at + sign * off
            i = bisect.bisect_left(waiting, expect - window)
            if i < len(waiting) and waiting[i] <= expect + window:
                found = i
                break
        if found is None:
            mine = sides.setdefault(source, [])
            bisect.insort(mine, at)
            # the other source reports in order: once its newest is RETAIN_S past one of these, that
            # one's record from it is not coming (without that source, this one's newest says so)
            if other in self.newest:
                horizon = self.newest[other] + (-(offset or 0.0) if source == "kernel" else (offset or 0.0))
            else:
                horizon = self.newest[source]
            del mine[:max(len(mine) - PENDING_MAX, bisect.bisect_left(mine, horizon - RETAIN_S))]
            return False
        theirs = waiting.pop(found)
        nvml_t, kernel_t = (at, theirs) if source == "nvml" else (theirs, at)
        self.deltas.append(round(nvml_t - kernel_t, 3))
        self.measured_at = nvml_t
        self.paired += 1
        return True

    def _prune(self, waiting: list[float], source: str, offset: float) -> None:
        """Drop the other source's events that ``source`` can no longer pair with: its records
        come in order, so none will be stamped near one ``RETAIN_S`` older than its newest."""
        newest = self.newest[source] + (offset if source == "kernel" else -offset)
        cut = bisect.bisect_left(waiting, newest - RETAIN_S)
        if cut:
            del waiting[:cut]

    def to_json(self) -> dict[str, Any]:
        return {
            "pending": [[bus, code, sides.get("kernel", []), sides.get("nvml", [])]
                        for (bus, code), sides in self.pending.items() if any(sides.values())],
            "deltas": list(self.deltas),
            "measured_at": self.measured_at,
            "newest": dict(self.newest),
            "paired": self.paired,
        }

    @classmethod
    def from_json(cls, data: Any) -> Pairing:
        """The pairing as ``to_json`` saved it; an empty one for anything unreadable."""
        out = cls()
        if not isinstance(data, dict):
            return out
        try:
            for bus, code, kernel, nvml in data.get("pending", []):
                out.pending[(None if bus is None else str(bus), int(code))] = {
                    "kernel": sorted(float(t) for t in kernel), "nvml": sorted(float(t) for t in nvml)}
            out.deltas.extend(float(d) for d in data.get("deltas", []))
            at = data.get("measured_at")
            out.measured_at = float(at) if at is not None else None
            out.newest = {str(k): float(v) for k, v in dict(data.get("newest", {})).items()}
            out.paired = int(data.get("paired", 0))
        except (TypeError, ValueError, AttributeError):
            return cls()
        return out


class XidBook:
    """Every XID seen this boot: counters per (GPU bus id, code), recent events, the cursor, and
    the pairing of the kernel's records with NVML's events, so each XID counts once."""

    def __init__(self, path: str, boot: str) -> None:
        self.path = path
        self.boot = boot
        self.lock = threading.Lock()
        self.seq = -1
        self.counts: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
        self.pairing = Pairing()
        self.write_error: str | None = None
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("boot") != self.boot:
            return  # a new boot: the kernel log starts again, so do the counters
        self.seq = int(data.get("seq", -1))
        self.counts = {str(k): int(v) for k, v in dict(data.get("counts", {})).items()}
        self.events = list(data.get("events", []))[-KEEP_EVENTS:]
        self.pairing = Pairing.from_json(data.get("pairing"))

    def duplicate(self, source: str, bus_id: str | None, code: int, at: float | None) -> bool:
        """The same XID already came from the other source (same GPU and code, its stamp within
        the window around the clocks' offset); an event that is not waits for its pair. Repeats
        from one source are real repeats and are all counted, and so is an event without a time.
        Every waiting event of the retention window is compared, through an index by (GPU, code)."""
        if at is None or source not in SIDES:
            return False
        return self.pairing.match(source, bus_id, int(code), float(at))

    def add(self, event: dict[str, Any]) -> bool:
        if self.duplicate(str(event.get("source")), event.get("bus_id"), int(event["code"]), event.get("time")):
            return False
        key = f"{event.get('bus_id') or 'unknown'}/{event['code']}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.events.append(event)
        del self.events[:-KEEP_EVENTS]
        return True

    def save(self) -> None:
        data = {"boot": self.boot, "seq": self.seq, "counts": self.counts, "events": self.events,
                "pairing": self.pairing.to_json()}
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh, separators=(",", ":"))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self.write_error = None
        except OSError as exc:
            self.write_error = f"XID cursor not saved: {exc.filename or self.path}: {exc.strerror or exc}"

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"seq": self.seq, "counts": dict(self.counts), "events": list(self.events), "write_error": self.write_error,
                    "paired": self.pairing.paired, "printk_offset_s": self.pairing.offset()}


class Follower(threading.Thread):
    """Reads kernel-log records after the book's cursor and records the XIDs among them.

    ``path`` is ``/dev/kmsg`` (blocking reads, one record each) or a file the simulator appends
    to (polled). ``boot_epoch`` turns the records' uptime into epoch seconds."""

    def __init__(
        self,
        path: str,
        book: XidBook,
        boot_epoch: Callable[[], float | None],
        on_event: Callable[[dict[str, Any]], None],
        stop: threading.Event,
        poll_s: float = 0.2,
    ) -> None:
        super().__init__(name=f"kmsg:{path}", daemon=True)
        self.path = path
        self.book = book
        self.boot_epoch = boot_epoch
        self.on_event = on_event
        self.stop_event = stop
        self.poll_s = poll_s
        self.error: str | None = None
        self._offset = 0  # a file's: how far it has been read, and the unfinished last line
        self._pending = ""

    def handle(self, records: list[str]) -> None:
        from fleetops.xid import kernlog as xid

        added: list[dict[str, Any]] = []
        with self.book.lock:
            for raw in records:
                rec = parse_record(raw)
                if rec is None or rec[0] <= self.book.seq:
                    continue
                seq, uptime, message = rec
                self.book.seq = seq
                ev = xid.parse_line(message, source="kernel")
                if ev is None:
                    continue
                boot = self.boot_epoch()
                event = {
                    "seq": seq,
                    "source": ev.source,  # "kernel", or "kernel:sxid" for an NVSwitch's SXid (never paired)
                    "bus_id": ev.bus_id,
                    "code": ev.code,
                    "uptime_s": uptime,
                    "time": round(boot + uptime, 3) if boot is not None else None,
                    "message": message[:300],
                }
                if self.book.add(event):
                    added.append(event)
            self.book.save()
        for event in added:
            self.on_event(event)

    def run(self) -> None:
        if self.path == "/dev/kmsg":
            self._run_kmsg()
        else:
            self._run_file()

    def _run_file(self) -> None:
        """A regular file is always readable, so ``select`` cannot wait on it: it is polled every
        ``poll_s`` (0.2 s keeps a line's way to the endpoint well under the 1 s asked)."""
        while not self.stop_event.is_set():
            self.poll_file()
            self.stop_event.wait(self.poll_s)

    def poll_file(self) -> None:
        """One look at the file: a poll that finds the size unchanged (or no file yet) costs one
        ``stat`` and opens nothing. ``loops`` calls this for every simulated node of a process
        from one thread, in place of one thread per node."""
        try:
            if os.stat(self.path).st_size == self._offset:
                self.error = None
                return
        except FileNotFoundError:
            return  # not written yet: the simulator creates it with the node's first record
        except OSError:
            pass  # the open below says why
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:  # rewritten from the start (a new simulated boot)
                    self._offset, self._pending = 0, ""
                fh.seek(self._offset)
                chunk = fh.read()
                self._offset = fh.tell()
            self.error = None
        except FileNotFoundError:
            chunk = ""
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            chunk = ""
        if chunk:
            text = self._pending + chunk
            lines = text.split("\n")
            self._pending = lines.pop()
            if lines:
                self.handle(lines)

    def _run_kmsg(self) -> None:
        while not self.stop_event.is_set():
            try:
                fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                self.error = f"/dev/kmsg: {exc.strerror or exc}"
                self.stop_event.wait(5.0)
                continue
            try:
                self._read_kmsg(fd)
            finally:
                os.close(fd)

    def _read_kmsg(self, fd: int) -> None:
        import select

        while not self.stop_event.is_set():
            batch: list[str] = []
            while True:
                try:
                    data = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten before we read them
                        continue
                    self.error = f"/dev/kmsg: {exc.strerror or exc}"
                    return
                batch.append(data.decode("utf-8", "replace"))
            if batch:
                self.handle(batch)
            select.select([fd], [], [], 1.0)
