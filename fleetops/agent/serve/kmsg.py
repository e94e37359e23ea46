"""Kernel-log follower: ``/dev/kmsg`` records (``prio,seq,usec,flags;message``) or a file of the
same format (the simulator's), parsed with ``fleetops.gpu.xid``.

The sequence number is the cursor. The cursor, the per-XID counters and the recent events are
written together (one file, atomic rename) after every batch, so a kill between reading and
writing only re-reads records whose effect was never recorded: nothing is lost or counted twice.
A failed write (full disk) is reported and retried with the next batch.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable
from typing import Any

KEEP_EVENTS = 1000
DEDUP_WINDOW_S = 2.0


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


class XidBook:
    """Every XID seen this boot: counters per (GPU bus id, code), recent events, the cursor."""

    def __init__(self, path: str, boot: str) -> None:
        self.path = path
        self.boot = boot
        self.lock = threading.Lock()
        self.seq = -1
        self.counts: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
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

    def duplicate(self, source: str, bus_id: str | None, code: int, at: float | None) -> bool:
        """The same XID already came from the other source (same GPU and code, close in time).
        Repeats from one source are real repeats and are all counted."""
        if at is None:
            return False
        for ev in reversed(self.events[-64:]):
            t = ev.get("time")
            if (
                ev.get("source") != source
                and ev.get("bus_id") == bus_id
                and ev.get("code") == code
                and t is not None
                and abs(t - at) <= DEDUP_WINDOW_S
            ):
                return True
        return False

    def add(self, event: dict[str, Any]) -> bool:
        if self.duplicate(str(event.get("source")), event.get("bus_id"), int(event["code"]), event.get("time")):
            return False
        key = f"{event.get('bus_id') or 'unknown'}/{event['code']}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.events.append(event)
        del self.events[:-KEEP_EVENTS]
        return True

    def save(self) -> None:
        data = {"boot": self.boot, "seq": self.seq, "counts": self.counts, "events": self.events}
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
            return {"seq": self.seq, "counts": dict(self.counts), "events": list(self.events), "write_error": self.write_error}


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
        from fleetops.gpu import xid

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
                    "source": "kernel",
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
