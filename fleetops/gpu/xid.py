"""NVIDIA XID events: parse kernel log lines, explain codes, read the running kernel's log.

Three parts:

- ``parse_line`` / ``parse_lines`` turn the lines the NVIDIA driver writes to the kernel log
  (``NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., text``) into ``model.XidEvent``. They
  accept the line as ``dmesg``, ``dmesg -T``, ``dmesg --time-format iso``, ``/dev/kmsg``,
  ``journalctl -k`` (``short``, ``short-precise``, ``short-iso``, ``short-iso-precise``,
  ``short-unix``) and classic syslog files print it. They never raise: a line that is not an
  XID, or is cut before its code is complete, gives ``None``.
- ``CATALOG`` / ``lookup`` / ``info_for`` say what a code means, how bad it is and what to do,
  following the resolution buckets of NVIDIA's published XID catalog (texts are our own).
- ``read_kernel_log`` fetches this boot's XID lines with ``journalctl`` or else ``dmesg``.

SXid lines (``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``) come from
NVSwitch, not from a GPU. They ARE parsed, into an event whose ``source`` ends in ``":sxid"``
(``"kernel:sxid"``) and whose ``bus_id`` is the switch's. Their codes live in a different
number space from GPU XIDs: callers that reason about GPU XIDs must skip them with
``is_sxid(event)``; ``info_for(event)`` already explains them as NVSwitch errors rather than
looking their code up in the GPU catalog.

Standard library only: this module is on the agent's import path.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from fleetops.model import XidEvent, normalize_bus_id

# --- parsing ---------------------------------------------------------------------------

SXID_SUFFIX = ":sxid"

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
    except Exception:  # noqa: BLE001 - a log line must never break a collect
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


def is_sxid(event: XidEvent) -> bool:
    """True for an NVSwitch SXid event (its code is not a GPU XID code)."""
    return event.source.endswith(SXID_SUFFIX)


# --- catalog ---------------------------------------------------------------------------

SEVERITIES = ("info", "warn", "crit")
ACTIONS = (
    "none",
    "restart_app",
    "reset_gpu",
    "reboot_node",
    "drain_and_inspect",
    "check_nvlink",
    "check_cooling_power",
    "follow_other_xid",
)
ACTION_TEXT: dict[str, str] = {
    "none": "Nothing to do on the GPU; look again only if it keeps repeating.",
    "restart_app": "The GPU is fine; the job that hit it failed and must be restarted. "
    "If it recurs, debug the application (compute-sanitizer, cuda-gdb).",
    "reset_gpu": "Drain the GPU's jobs, then reset it: fleetops reset NODE GPU. "
    "If the XID returns after the reset, drain the node and have it inspected.",
    "reboot_node": "Drain the node and reboot it: a GPU reset cannot reach a GPU that stopped "
    "answering. If the GPU is still missing after the reboot, open a hardware case.",
    "drain_and_inspect": "Drain the node and keep it out of service until the hardware has been "
    "checked (field diagnostics, vendor case).",
    "check_nvlink": "Check NVLink state and error counters (nvidia-smi nvlink -s / -e) and that "
    "Fabric Manager is running, then reset the GPU; links still down or erroring after that "
    "point at the baseboard or NVSwitch: drain and inspect.",
    "check_cooling_power": "Check the GPU's power feed and cooling (BMC sensors, PSUs, cables, "
    "fans); the GPU runs slowed or unprotected until that is fixed.",
    "follow_other_xid": "Find the other XIDs logged for this GPU at about the same time and act "
    "on those; this one reports a consequence or a summary, not a cause.",
}
CATEGORIES = (
    "application",
    "engine",
    "memory",
    "nvlink",
    "nvswitch",
    "pcie",
    "firmware",
    "power_thermal",
    "recovery",
    "unknown",
)


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    severity: str  # one of SEVERITIES
    action: str  # one of ACTIONS
    category: str  # one of CATEGORIES


def _entries() -> dict[int, XidInfo]:
    rows: list[tuple[int, str, str, str, str, str]] = [
        # (code, name, severity, action, category, meaning)
        (
            8,
            "GPU stopped processing (channel idle timeout)",
            "warn",
            "restart_app",
            "engine",
            (
                "A channel stopped making progress and the driver timed it out; the job using it is "
                "lost. Often follows a hung kernel; look for 109/119 at the same time."
            ),
        ),
        (
            13,
            "Graphics engine exception",
            "warn",
            "restart_app",
            "application",
            (
                "A kernel did something illegal (out-of-bounds access, bad instruction, bad register). "
                "Almost always an application bug; the GPU stays usable."
            ),
        ),
        (
            31,
            "GPU memory page fault",
            "warn",
            "restart_app",
            "application",
            (
                "The GPU's MMU caught an access to an address the context does not map. Usually an "
                "application bug, rarely a driver or hardware fault."
            ),
        ),
        (
            32,
            "Invalid or corrupted push buffer stream",
            "warn",
            "restart_app",
            "pcie",
            (
                "The DMA engine feeding the GPU received a bad command stream, most often from poor "
                "PCIe signal quality rather than the application."
            ),
        ),
        (
            38,
            "Driver firmware error (engine watchdog timeout)",
            "warn",
            "none",
            "firmware",
            (
                "The graphics-engine firmware's watchdog fired. No immediate action; if it repeats, "
                "collect a bug report for NVIDIA."
            ),
        ),
        (
            43,
            "GPU stopped processing (application fault)",
            "info",
            "none",
            "application",
            "An application hit a software-induced fault and was terminated; the GPU remains healthy.",
        ),
        (
            44,
            "Graphics engine fault during context switch",
            "warn",
            "none",
            "engine",
            (
                "The engine faulted while switching contexts. No immediate action; repeated events on "
                "one GPU deserve a look."
            ),
        ),
        (
            45,
            "Preemptive cleanup after earlier errors",
            "info",
            "follow_other_xid",
            "application",
            (
                "The driver tore down a GPU context because of an earlier error, a reset, or the "
                "process being killed (Ctrl-C, SIGKILL). A consequence, not a cause."
            ),
        ),
        (
            46,
            "GPU stopped processing (GPU timeout)",
            "crit",
            "reset_gpu",
            "engine",
            "The GPU stopped responding to work; it must be reset before it is trusted again.",
        ),
        (
            48,
            "Double-bit (uncorrectable) ECC error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "An uncorrectable memory error hit the GPU and the application was told. A GPU reset "
                "clears it; repeated DBEs, or SRAM DBEs past the threshold, mean hardware service."
            ),
        ),
        (
            54,
            "Auxiliary power not connected",
            "crit",
            "check_cooling_power",
            "power_thermal",
            "The board reports its auxiliary power feed missing and runs at reduced clocks.",
        ),
        (
            56,
            "Display engine error",
            "warn",
            "drain_and_inspect",
            "engine",
            (
                "Legacy code for a display channel exception; not expected on data-center Hopper GPUs, "
                "so treat it as suspicious hardware."
            ),
        ),
        (
            57,
            "Framebuffer link training failure",
            "crit",
            "drain_and_inspect",
            "memory",
            (
                "Legacy code: the link between the GPU and its memory failed to train. Not expected on "
                "current GPUs; a hardware problem if seen."
            ),
        ),
        (
            58,
            "Framebuffer memory error",
            "crit",
            "drain_and_inspect",
            "memory",
            (
                "Legacy code for an unstable memory interface. Not expected on current GPUs; a hardware"
                " problem if seen."
            ),
        ),
        (
            61,
            "Internal micro-controller breakpoint",
            "warn",
            "reset_gpu",
            "firmware",
            (
                "Legacy code: an on-GPU micro-controller hit a breakpoint or warning. Reset the GPU if "
                "the GPU misbehaves; collect a bug report if it repeats."
            ),
        ),
        (
            62,
            "Internal micro-controller halt",
            "crit",
            "reset_gpu",
            "firmware",
            "An on-GPU micro-controller halted; the GPU needs a reset.",
        ),
        (
            63,
            "Row remap recorded",
            "warn",
            "reset_gpu",
            "memory",
            (
                "ECC handling marked a memory row for remapping; the replacement row takes effect at "
                "the next GPU reset. Not urgent: reset when the GPU is next idle."
            ),
        ),
        (
            64,
            "Row remap failure",
            "crit",
            "reset_gpu",
            "memory",
            (
                "A memory row could not be remapped (no spare rows or a remapper error). Reset the GPU;"
                " if the failure persists after a reset, drain and inspect the hardware."
            ),
        ),
        (
            68,
            "Video decoder (NVDEC0) exception",
            "warn",
            "restart_app",
            "engine",
            "The video decode engine faulted on the job using it.",
        ),
        (
            69,
            "Graphics engine class error",
            "warn",
            "restart_app",
            "application",
            "The application sent a method the engine does not accept; an application or CUDA library bug.",
        ),
        (
            74,
            "NVLink error",
            "crit",
            "check_nvlink",
            "nvlink",
            (
                "A fatal error on an NVLink to another GPU or to an NVSwitch. The link stays down until"
                " a GPU reset or reboot; the fault may be at either end of the link."
            ),
        ),
        (
            79,
            "GPU has fallen off the bus",
            "crit",
            "reboot_node",
            "pcie",
            (
                "The GPU no longer answers on PCIe: link failure, board failure, power, or a driver "
                "fault. Only a node reboot brings it back."
            ),
        ),
        (
            92,
            "High single-bit ECC error rate",
            "warn",
            "none",
            "memory",
            (
                "Corrected memory errors are arriving unusually fast. No immediate action; watch the "
                "ECC and row-remap counters."
            ),
        ),
        (
            94,
            "Contained memory error",
            "warn",
            "restart_app",
            "memory",
            (
                "An uncorrectable error was contained to one application, which must be restarted; "
                "other work is unaffected. Reset the GPU when convenient."
            ),
        ),
        (
            95,
            "Uncontained memory error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "An uncorrectable error could not be contained and may have corrupted several "
                "applications; the GPU must be reset before it runs work again."
            ),
        ),
        (
            109,
            "Context switch timeout",
            "warn",
            "reset_gpu",
            "engine",
            (
                "A context did not switch out in time, often a kernel spinning forever; can also "
                "precede a GSP hang. Reset the GPU if its work does not recover."
            ),
        ),
        (
            110,
            "Security fault",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "The GPU's security engine reported a fault; rare without a hardware problem. Reset the"
                " GPU; if it returns, cold-reset the node and open a hardware case."
            ),
        ),
        (
            119,
            "GSP RPC timeout",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "The GPU System Processor did not answer the driver in time. The GPU needs a reset (or "
                "a power cycle if that fails); recurring events point at driver or firmware."
            ),
        ),
        (
            120,
            "GSP error",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "Code running on the GPU System Processor raised an error. Reset the GPU; recurring "
                "events point at driver or firmware."
            ),
        ),
        (
            121,
            "C2C link corrected error",
            "info",
            "none",
            "nvlink",
            (
                "Corrected errors on the chip-to-chip link to a Grace CPU; no impact. A GPU reset in a "
                "service window retrains the link."
            ),
        ),
        (
            122,
            "SPI read failure via PMU",
            "warn",
            "drain_and_inspect",
            "firmware",
            (
                "The GPU could not read its SPI flash (VBIOS/InfoROM storage). Not expected on current "
                "GPUs; inspect the board."
            ),
        ),
        (
            123,
            "SPI write failure via PMU",
            "warn",
            "drain_and_inspect",
            "firmware",
            (
                "The GPU could not write its SPI flash (VBIOS/InfoROM storage). Not expected on current"
                " GPUs; inspect the board."
            ),
        ),
        (
            136,
            "NVLink training failed",
            "crit",
            "check_nvlink",
            "nvlink",
            (
                "An NVLink did not come up during link training; the GPU runs with fewer links. Reset "
                "the GPU and check signal integrity of the link if it fails again."
            ),
        ),
        (
            137,
            "NVLink privilege error",
            "warn",
            "restart_app",
            "application",
            (
                "A peer-to-peer access over NVLink was refused by the remote side, usually an "
                "application bug (like a page fault, but across GPUs)."
            ),
        ),
        (
            140,
            "Unrecovered ECC error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "Uncorrectable memory errors arrived in a way that stopped the driver from retiring or "
                "remapping the memory. Reset the GPU; if it repeats, open a hardware case."
            ),
        ),
        (
            143,
            "GPU initialization error",
            "crit",
            "reset_gpu",
            "firmware",
            "The GPU failed to initialise. Reset it; a GPU that keeps failing needs service.",
        ),
        (
            154,
            "GPU recovery action changed",
            "info",
            "follow_other_xid",
            "recovery",
            (
                "Informational summary the driver prints alongside other XIDs, stating the recovery it "
                "now requires (None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot "
                "Required). info_for() reads that requirement from the message."
            ),
        ),
        (
            155,
            "NVLink software-defined error",
            "warn",
            "reset_gpu",
            "nvlink",
            (
                "A link went down on purpose (for example into sleep) and was reported. Blackwell "
                "systems; reset the GPU if the link is needed."
            ),
        ),
        (
            156,
            "Resource retirement event",
            "warn",
            "reset_gpu",
            "memory",
            "The GPU retired a faulty internal resource; the change takes effect at the next GPU reset.",
        ),
        (
            157,
            "Resource retirement failure",
            "warn",
            "drain_and_inspect",
            "memory",
            (
                "The GPU could not retire a faulty resource because no spares are left. Work may "
                "continue but the error can recur; plan hardware service."
            ),
        ),
        (
            158,
            "GPU fatal timeout",
            "crit",
            "reset_gpu",
            "engine",
            "The GPU hit a fatal internal timeout and must be reset.",
        ),
    ]
    nvlink5 = {144: "SAW", 145: "RLW", 146: "TLW", 147: "TREX", 148: "NVLPW_CTRL", 149: "NETIR", 150: "MSE"}
    for code, unit in nvlink5.items():
        meaning = (
            f"A fatal error in the NVLink {unit} unit (fifth-generation NVLink, Blackwell; not "
            "expected on H100/H200). The affected links are down until the GPU is reset."
        )
        rows.append((code, f"NVLink {unit} error", "crit", "check_nvlink", "nvlink", meaning))
    return {
        code: XidInfo(code=code, name=name, meaning=meaning, severity=sev, action=action, category=cat)
        for code, name, sev, action, cat, meaning in sorted(rows)
    }


CATALOG: dict[int, XidInfo] = _entries()

# Codes that reflect on the application (or are bookkeeping), not on the GPU's health; the
# GPU stays usable. For callers that want to alert only on GPU/node faults.
NON_CRITICAL: frozenset[int] = frozenset({13, 31, 43, 45, 63, 68, 69, 92, 94, 109, 137})

# NVML's recovery actions as Xid 154 names them, in the vocabulary of model.Gpu.recovery_action.
RECOVERY_ACTIONS = {
    "none": "none",
    "gpu reset required": "gpu_reset",
    "pf flr": "gpu_reset",
    "node reboot required": "node_reboot",
    "drain p2p": "drain_p2p",
    "drain and reset": "drain_and_reset",
}
_RECOVERY_CODES = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}
_RECOVERY_TO_ACTION = {
    "none": "none",
    "gpu_reset": "reset_gpu",
    "node_reboot": "reboot_node",
    "drain_p2p": "reset_gpu",
    "drain_and_reset": "reset_gpu",
}
_RECOVERY_SEVERITY = {
    "none": "info",
    "gpu_reset": "crit",
    "node_reboot": "crit",
    "drain_p2p": "crit",
    "drain_and_reset": "warn",
}
_TO_RE = re.compile(r"\bto\s+0x(?P<num>[0-9a-fA-F]+)(?:\s*\((?P<label>[^)]*)\))?", re.IGNORECASE | re.ASCII)


def lookup(code: int) -> XidInfo:
    """The catalog entry for ``code``; a generic 'unknown XID' entry (warn, drain_and_inspect)
    for codes the catalog does not list."""
    info = CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        name="unknown XID",
        meaning="A code this catalog does not list: look it up in NVIDIA's XID catalog for "
        "the installed driver before returning the GPU to service.",
        severity="warn",
        action="drain_and_inspect",
        category="unknown",
    )


def recovery_action(message: str) -> str | None:
    """The recovery an Xid 154 message asks for ("GPU recovery action changed from 0x0 (None)
    to 0x2 (Node Reboot Required)"), as ``model.Gpu.recovery_action`` names it, or None."""
    m = None
    for m in _TO_RE.finditer(message or ""):
        pass  # the last "to ..." is the new action
    if m is None:
        return None
    label = (m["label"] or "").strip().lower()
    if label in RECOVERY_ACTIONS:
        return RECOVERY_ACTIONS[label]
    return _RECOVERY_CODES.get(int(m["num"], 16))


def info_for(event: XidEvent) -> XidInfo:
    """``lookup`` made event-aware: an SXid is explained as an NVSwitch error (crit when the
    switch calls it fatal), and an Xid 154 takes the severity and action its message asks
    for."""
    if is_sxid(event):
        fatal = bool(re.match(r"\s*fatal\b", event.message, re.IGNORECASE))
        return XidInfo(
            code=event.code,
            name="NVSwitch SXid" + (" (fatal)" if fatal else ""),
            meaning="An error reported by an NVSwitch, not by a GPU; fatal ones take the "
            "switch's links (and the fabric's bandwidth) down until the node is reset.",
            severity="crit" if fatal else "warn",
            action="check_nvlink",
            category="nvswitch",
        )
    info = lookup(event.code)
    if event.code == 154:
        wanted = recovery_action(event.message)
        if wanted is not None and wanted != "none":
            return XidInfo(
                code=154,
                name=f"{info.name}: {wanted}",
                meaning=info.meaning,
                severity=_RECOVERY_SEVERITY[wanted],
                action=_RECOVERY_TO_ACTION[wanted],
                category=info.category,
            )
    return info


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


__all__ = [
    "ACTIONS",
    "ACTION_TEXT",
    "CATALOG",
    "CATEGORIES",
    "NON_CRITICAL",
    "RECOVERY_ACTIONS",
    "SEVERITIES",
    "SXID_SUFFIX",
    "XidInfo",
    "info_for",
    "is_sxid",
    "lookup",
    "parse_line",
    "parse_lines",
    "read_kernel_log",
    "recovery_action",
]
