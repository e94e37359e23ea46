"""NVIDIA XID events: parse kernel log lines and read the running kernel's log.

Two parts (what a code means lives in the XID catalog, ``fleetops.xid.catalog``; its names are
re-exported here for callers that read events and explain them in one place):

- ``parse_line`` / ``parse_lines`` turn the lines the NVIDIA driver writes to the kernel log
  (``NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., text``) into ``model.XidEvent``. They
  accept the line as ``dmesg``, ``dmesg -T``, ``dmesg --time-format iso``, ``/dev/kmsg``,
  ``journalctl -k`` (``short``, ``short-precise``, ``short-iso``, ``short-iso-precise``,
  ``short-unix``) and classic syslog files print it. They never raise: a line that is not an
  XID, or is cut before its code is complete, gives ``None``.
- ``read_kernel_log`` fetches this boot's XID lines with ``journalctl`` or else ``dmesg``.

SXid lines (``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``) come from
NVSwitch, not from a GPU. They ARE parsed, into an event whose ``source`` ends in ``":sxid"``
(``"kernel:sxid"``) and whose ``bus_id`` is the switch's. Their codes live in a different
number space from GPU XIDs: callers that reason about GPU XIDs must skip them with
``fleetops.xid.catalog.is_sxid(event)``; its ``info_for(event)`` already explains them as NVSwitch errors rather than
looking their code up in the GPU catalog.

Standard library only: this module is on the agent's import path.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from datetime import datetime

from fleetops.model import XidEvent, normalize_bus_id
from fleetops.xid.catalog import SXID_SUFFIX

# --- parsing ---------------------------------------------------------------------------

# The XID itself: marker, bus id, code followed by its comma, then the rest of the line.
# A code not followed by a comma may be a truncated longer code, so it is not accepted.
# Every pattern is ASCII-only so that non-ASCII digits in junk lines never parse as numbers.
_BUS = r"(?:PCI:)?(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID_RE = re.compile(
    r"(?:(?P<gpu>NVRM: Xid)|(?P<sxid>(?:nvidia-nvswitch[0-9]*: )?SXid)) "
    r"\((?P<bus>" + _BUS + r")\):\s*(?P<code>[0-9]{1,6}),(?P<rest>.*)$",
    re.ASCII,
)
# pid=1234 | pid='<unknown>' | pid=<unknown>, then name=COMM; each field is only trusted when
# the comma after it shows that it is complete.
_PID_RE = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|'?[0-9]+'?),(?:\s|$)", re.ASCII)
_NAME_RE = re.compile(r"name=(?P<name>[^,]*),(?:\s|$)")

_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, 1)}
_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"

# Prefixes that carry wall-clock time, tried at the start of the line.
_ISO_RE = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)\s", re.ASCII
)
_UNIX_RE = re.compile(r"(?P<ts>\d{9,11}(?:\.\d{1,9})?)\s", re.ASCII)
_SYSLOG_RE = re.compile(
    r"(?P<mon>" + _MON + r") +(?P<day>\d{1,2}) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?P<frac>\.\d{1,9})?\s",
    re.ASCII,
)
_DMESG_T_RE = re.compile(
    r"\[(?:" + _DAY + r") (?P<mon>" + _MON + r") +(?P<day>\d{1,2}) "
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d) (?P<year>\d{4})\]",
    re.ASCII,
)
# Monotonic uptime: "[  123.456789]" (dmesg, kern.log) or "/dev/kmsg" "4,1234,5012331000,-;".
_UPTIME_RE = re.compile(r"\[\s*(?P<up>\d{1,10}\.\d{1,9})\]", re.ASCII)
_KMSG_RE = re.compile(r"\d+,\d+,(?P<usec>\d+),[^;]*;", re.ASCII)
# After a syslog/journal time stamp: "HOST IDENT[PID]: ". Only the kernel writes XIDs.
_IDENT_RE = re.compile(r"\S+\s+(?P<ident>[^\s:\[]+)(?:\[\d+\])?:\s", re.ASCII)


def _local_epoch(year: int, mon: int, day: int, h: int, m: int, s: int) -> float | None:
    try:
        return time.mktime((year, mon, day, h, m, s, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _syslog_epoch(m: re.Match[str], now: float) -> float | None:
    """Local time without a year (``short``, ``short-precise``, syslog files): the latest
    year that does not put the stamp more than a day in the future."""
    mon = _MONTHS[m["mon"].lower()]
    args = (mon, int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"]))
    if not 1 <= args[1] <= 31 or args[2] > 23 or args[3] > 59 or args[4] > 60:
        return None
    year = time.localtime(now).tm_year
    stamp = _local_epoch(year, *args)
    if stamp is not None and stamp > now + 86400:
        stamp = _local_epoch(year - 1, *args)
    if stamp is None:
        return None
    return stamp + (float(m["frac"]) if m["frac"] else 0.0)


def _wall_clock(text: str) -> tuple[float | None, str | None]:
    """(epoch seconds, text after the stamp) for a journal/syslog/ISO/unix stamp at the start
    of ``text``; the text after is None for ``dmesg -T`` (it has no host/ident) and when no
    stamp is there."""
    m = _ISO_RE.match(text)
    if m:
        try:
            stamp: float | None = datetime.fromisoformat(
                m["ts"].replace(",", ".").replace(" ", "T")
            ).timestamp()
        except (ValueError, OverflowError, OSError):
            stamp = None
        return stamp, text[m.end() :]
    m = _UNIX_RE.match(text)
    if m:
        return float(m["ts"]), text[m.end() :]
    m = _SYSLOG_RE.match(text)
    if m:
        return _syslog_epoch(m, time.time()), text[m.end() :]
    m = _DMESG_T_RE.match(text)
    if m:
        mon = _MONTHS[m["mon"].lower()]
        return _local_epoch(int(m["year"]), mon, int(m["day"]), int(m["h"]), int(m["m"]), int(m["s"])), None
    return None, None


def _prefix_time(prefix: str) -> tuple[float | None, float | None, bool]:
    """(epoch timestamp, uptime seconds, ok) from the text before the XID marker. ``ok`` is
    False when a journal/syslog prefix names a writer other than the kernel (a daemon quoting
    an XID line must not count as a second XID)."""
    text = prefix.lstrip()
    timestamp, after = _wall_clock(text)
    if after is not None:
        ident = _IDENT_RE.match(after)
        if ident and ident["ident"] != "kernel":
            return None, None, False
    uptime: float | None = None
    ups = _UPTIME_RE.findall(prefix)
    if ups:
        uptime = float(ups[-1])
    else:
        k = _KMSG_RE.match(text)
        if k:
            uptime = int(k["usec"]) / 1e6
    return timestamp, uptime, True


def _split_fields(rest: str) -> tuple[int | None, str | None, str]:
    """``pid=..., name=..., message`` -> (pid, process name, message). Fields the line does
    not carry, carries as ``<unknown>``, or carries cut short are None."""
    text = rest.strip()
    pid: int | None = None
    name: str | None = None
    if text.startswith("pid="):
        m = _PID_RE.match(text)
        if m is None:
            return None, None, ""  # cut inside the pid field
        value = m["pid"].strip("'")
        pid = int(value) if value.isdigit() else None
        text = text[m.end() :]
    if text.startswith("name="):
        n = _NAME_RE.match(text)
        if n is None:
            return pid, None, ""  # cut inside the name field
        name = n["name"].strip()
        if name in ("<unknown>", "'<unknown>'", ""):
            name = None
        text = text[n.end() :]
    return pid, name, text.strip()


def parse_line(line: str, source: str = "kernel") -> XidEvent | None:
    """One kernel log line -> ``XidEvent``, or None when it is not a (complete) XID/SXid line.

    ``source`` is recorded as given (``"dmesg"``, ``"journal"``, ``"sim"``, ``"kernel"``); SXid
    events get ``source + ":sxid"``. ``uptime_s`` is filled from a ``[  123.4]`` stamp,
    ``timestamp`` (epoch seconds) from an ISO, unix, ``dmesg -T`` or syslog stamp (local time
    where the stamp has no zone; the current year where it has none). Never raises."""
    try:
        return _parse(line, source)
    except Exception:  # a log line must never break a collect  # noqa: BLE001
        return None


def _parse(line: str, source: str) -> XidEvent | None:
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", errors="replace")
    if not isinstance(line, str) or "Xid (" not in line:
        return None
    text = line.rstrip("\r\n")
    m = _XID_RE.search(text)
    if m is None:
        return None
    code = int(m["code"])
    if code == 0:
        return None
    try:
        bus_id = normalize_bus_id(m["bus"])
    except ValueError:
        return None
    timestamp, uptime, ok = _prefix_time(text[: m.start()])
    if not ok:
        return None
    sxid = m["sxid"] is not None
    if sxid:
        pid, name, message = None, None, m["rest"].strip()
    else:
        pid, name, message = _split_fields(m["rest"])
    return XidEvent(
        code=code,
        bus_id=bus_id,
        pid=pid,
        process_name=name,
        message=message,
        timestamp=timestamp,
        uptime_s=uptime,
        source=f"{source}{SXID_SUFFIX}" if sxid else source,
        raw=text.strip(),
    )


def parse_lines(lines: Iterable[str], source: str = "kernel") -> list[XidEvent]:
    """Every XID/SXid event among ``lines``, in order; other lines are skipped."""
    events = []
    for line in lines:
        event = parse_line(line, source)
        if event is not None:
            events.append(event)
    return events


# --- reading the running kernel's log --------------------------------------------------

_JOURNAL_CMD = ["journalctl", "-k", "-b", "-o", "short-unix", "--no-pager", "-g", "NVRM: Xid|SXid"]
_DMESG_CMD = ["dmesg"]
# journalctl prints these (on stderr) when it could not see the kernel's messages, yet may
# still exit 0, or 1 as if nothing matched.
_JOURNAL_UNUSABLE = ("no journal files", "insufficient permission", "not seeing messages")


def _run(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    import subprocess  # only on a real node's collect; not on the simulator's path

    env = dict(os.environ, LC_ALL="C", SYSTEMD_COLORS="0")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError:
        return None, "", "not installed"
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout_s:g} s"
    except OSError as exc:
        return None, "", exc.strerror or str(exc)
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", errors="replace"),
        proc.stderr.decode("utf-8", errors="replace"),
    )


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _xid_lines(stdout: str, max_lines: int) -> list[str]:
    lines = [line for line in stdout.splitlines() if "Xid" in line]
    return lines[-max_lines:] if max_lines > 0 else []


def read_kernel_log(max_lines: int = 20000, timeout_s: float = 2.0) -> tuple[list[str], str | None]:
    """This boot's kernel log lines that mention an XID or SXid (the latest ``max_lines``).

    Tries ``journalctl -k -b -o short-unix -g ...`` (wall-clock stamps, survives ring-buffer
    wrap), then ``dmesg`` (``[uptime]`` stamps). When the journal was readable but holds no
    XID, ``dmesg`` is asked too, because a journal that does not capture kernel messages
    looks exactly like one with nothing to report. Returns ``(lines, None)`` when one of them
    could be read (possibly no lines: no XIDs), or ``([], reason)`` when neither could.
    Each command gets ``timeout_s``; no shell is involved."""
    reasons = []
    journal_ok = False
    rc, out, err = _run(_JOURNAL_CMD, timeout_s)
    if rc is None:
        reasons.append(f"journalctl: {err}")
    elif any(marker in err.lower() for marker in _JOURNAL_UNUSABLE):
        reasons.append(f"journalctl: {_first_line(err)}")
    elif rc == 0 or (rc == 1 and "-- No entries --" in out):  # -g exits 1 when nothing matched
        lines = _xid_lines(out, max_lines)
        if lines:
            return lines, None
        journal_ok = True
    else:
        reasons.append(f"journalctl: exit {rc}" + (f": {_first_line(err)}" if err.strip() else ""))
    rc, out, err = _run(_DMESG_CMD, timeout_s)
    if rc == 0:
        return _xid_lines(out, max_lines), None
    if journal_ok:
        return [], None
    if rc is None:
        reasons.append(f"dmesg: {err}")
    else:
        reasons.append(f"dmesg: {_first_line(err) or f'exit {rc}'}")
    return [], "; ".join(reasons)


__all__ = ["parse_line", "parse_lines", "read_kernel_log"]
