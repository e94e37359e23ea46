"""The views' columns and how a value reads in a cell: the formatters (ages, power, ECC, PCIe,
NVLink, throttle reasons, MIG), ``Column``, ``Row``, and the cells of a GPU, a finding, an XID."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetops import model
from fleetops.report.values import age_text

if TYPE_CHECKING:  # annotations only: entry builds on these columns
    from fleetops.tui.data.entry import GpuView, XidView

VIEWS = ("nodes", "gpus", "findings", "xids")
XID_WINDOW_S = 3600.0

# Node status: whether the latest poll gave a snapshot. Anything but "ok" is a fault mark.
STATUS_OK = "ok"
STATUS_PENDING = "pending"  # not polled yet
# Connected, but the node's stream has been silent past the source's limit: its last data is
# shown with its age. Never unreachable: only a failed connect makes a node UNREACH.
STATUS_STALE = "stale"
STATUS_LABEL = {
    "ok": None,
    "pending": "WAITING",
    "stale": "STALE",
    "unreachable": "UNREACH",
    "timeout": "HUNG",
    "error": "NODATA",
}
# Health ranks for sorting: an unreachable node sorts above a critical one.
HEALTH_RANK = {**model.SEVERITY_RANK, "pending": -1, "stale": 4.5, "unreach": 5}
FAULT_SEVERITIES = model.FAULT_SEVERITIES  # the one definition, which the n/m tally uses too

# Which cells of a GPU row a finding's check id points at, so the value at fault is coloured.
_CHECK_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("remap", ("remap",)),
    ("retired", ("ecc",)),
    ("ecc", ("ecc",)),
    ("pcie", ("pcie", "replays")),
    ("replay", ("replays",)),
    ("nvlink", ("nvlink",)),
    ("thermal", ("temp", "hbm", "throttle")),
    ("hbm", ("hbm",)),
    ("memory_temp", ("hbm",)),
    ("temp", ("temp",)),
    ("memory", ("ecc", "remap")),
    ("power", ("power",)),
    ("throttl", ("throttle",)),
    ("clock", ("throttle",)),
    ("mig", ("mig",)),
)

_THROTTLE_SHORT = {
    "gpu_idle": None,
    "applications_clocks_setting": "APPCLK",
    "sw_power_cap": "SWPWR",
    "hw_slowdown": "HWSLOW",
    "sync_boost": "SYNC",
    "sw_thermal_slowdown": "SWTHERM",
    "hw_thermal_slowdown": "HWTHERM",
    "hw_power_brake_slowdown": "PWRBRAKE",
    "display_clock_setting": "DISP",
}


# --- formatting -------------------------------------------------------------------------


def natural_key(text: str) -> tuple[Any, ...]:
    """``node2`` before ``node10``."""
    return tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"(\d+)", text))


def format_age(seconds: float | None) -> str:
    """An age as the findings' text renders it (``report.values.age_text``); ``never`` for none."""
    return "never" if seconds is None else age_text(seconds)


def bad_since_text(since: float, now: float) -> str:
    """``bad since 03:12:07 UTC (14m05s)``: the node header's words (UTC, as the XIDs' times)."""
    return f"bad since {time.strftime('%H:%M:%S', time.gmtime(since))} UTC ({age_text(now - since)})"


def bad_since_cell(since: float | None, now: float) -> str:
    """The nodes view's compact form: ``03:12 14m`` (UTC time, whole minutes, hours or days);
    past a day the date instead of the time (``12-05 2d``); empty while the node is OK."""
    if since is None:
        return ""
    age = max(0, int(now - since))
    if age < 60:
        short = f"{age}s"
    elif age < 3600:
        short = f"{age // 60}m"
    elif age < 86400:
        short = f"{age // 3600}h"
    else:
        short = f"{age // 86400}d"
    return time.strftime("%H:%M" if age < 86400 else "%m-%d", time.gmtime(since)) + " " + short


def short_uuid(uuid: str) -> str:
    """``GPU-`` and the first 8 hex digits: unique enough to read, the full one is in the detail."""
    return uuid[:12]


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def fmt_power(gpu: model.Gpu) -> str:
    if gpu.power_draw_w is None and gpu.power_limit_w is None:
        return "n/a"
    return f"{_num(gpu.power_draw_w)}/{_num(gpu.power_limit_w)}W"


def fmt_ecc(gpu: model.Gpu) -> str:
    """Volatile corrected/uncorrected (this boot), the counts that say "now"."""
    if gpu.ecc_corrected_volatile is None and gpu.ecc_uncorrected_volatile is None:
        return "n/a"
    return f"{_num(gpu.ecc_corrected_volatile, '{}')}/{_num(gpu.ecc_uncorrected_volatile, '{}')}"


def fmt_remap(gpu: model.Gpu) -> str:
    if gpu.remapped_rows_corrected is None and gpu.remapped_rows_uncorrected is None:
        return "n/a"
    text = f"{_num(gpu.remapped_rows_corrected, '{}')}/{_num(gpu.remapped_rows_uncorrected, '{}')}"
    if gpu.remapped_rows_failure:
        text += " FAIL"
    elif gpu.remapped_rows_pending:
        text += " PEND"
    return text


def fmt_pcie(gpu: model.Gpu) -> str:
    if gpu.pcie_gen_current is None or gpu.pcie_width_current is None:
        return "n/a"
    text = f"G{gpu.pcie_gen_current}x{gpu.pcie_width_current}"
    below = (gpu.pcie_gen_max is not None and gpu.pcie_gen_current < gpu.pcie_gen_max) or (
        gpu.pcie_width_max is not None and gpu.pcie_width_current < gpu.pcie_width_max
    )
    if below:
        text += f"<G{_num(gpu.pcie_gen_max, '{}')}x{_num(gpu.pcie_width_max, '{}')}"
    return text


def fmt_nvlink(gpu: model.Gpu) -> str:
    if gpu.nvlinks is None:
        return "n/a"
    if not gpu.nvlinks:
        return "none"
    if gpu.mig_mode_current:
        return "mig"  # NVML reports every link down under MIG, by design: not a count to read as a fault
    return f"{gpu.nvlinks_up}/{len(gpu.nvlinks)}"


def fmt_throttle(gpu: model.Gpu) -> str:
    if gpu.clocks_event_reasons is None:
        return "n/a"
    names = [_THROTTLE_SHORT.get(r, r) for r in gpu.clocks_event_reasons]
    shown = [n for n in names if n]
    if shown:
        return ",".join(shown)
    return "idle" if "gpu_idle" in gpu.clocks_event_reasons else "-"


def fmt_mig(gpu: model.Gpu) -> str:
    if gpu.mig_mode_current is None:
        return "n/a"
    if not gpu.mig_mode_current:
        return "off"
    text = f"on:{len(gpu.mig_instances or [])}"
    if gpu.mig_mode_pending is not None and gpu.mig_mode_pending != gpu.mig_mode_current:
        text += "*"
    return text


def fmt_util(gpu: model.Gpu) -> str:
    return "n/a" if gpu.utilization_gpu_pct is None else f"{gpu.utilization_gpu_pct}%"


def _largest_mib(gpu: model.Gpu) -> int | None:
    used = [p.used_memory_mib for p in gpu.processes or [] if p.used_memory_mib is not None]
    return max(used) if used else None


def fmt_procs(gpu: model.Gpu) -> str:
    """Compute processes on the GPU and the largest one's GPU memory: ``2 20G`` (``1.5G`` below
    10 GiB); ``0`` for none, ``n/a`` where the driver did not say."""
    if gpu.processes is None:
        return "n/a"
    n = len(gpu.processes)
    largest = _largest_mib(gpu)
    if not n or largest is None:
        return str(n)
    gib = largest / 1024
    return f"{n} {gib:.1f}G" if gib < 10 else f"{n} {gib:.0f}G"


def fmt_finding(f: model.Finding) -> str:
    """``check: message``; messages already name the GPU (index and bus id) they are about."""
    return f"{f.check}: {f.message}"


def health_label(health: str) -> str:
    return {"unreach": "UNREACH", "pending": "WAITING", "stale": "STALE"}.get(health, health.upper())


# --- rows -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    sort_key: str | None = None  # the shift-letter that sorts by this column
    clock: bool = False  # changes with time alone (ages): not highlighted when it does
    doc: str = ""  # what the column shows, for the legend (``?``): every column must say
    # Text columns that take the terminal's spare width (higher first), up to their longest
    # cell, and give width back down to ``min_width`` on a narrower terminal; 0: fixed width.
    grow: int = 0
    min_width: int = 0


@dataclass(frozen=True)
class Row:
    """One table row: cell texts, a style name per cell ("" for plain), a sort value per
    cell, whether it is a fault (for the faults-only toggle) and the text the filter sees."""

    key: str
    cells: tuple[str, ...]
    styles: tuple[str, ...]
    sort: tuple[Any, ...]
    fault: bool
    haystack: str
    node: str = ""  # the node the row is about (Enter drills down to it)
    gpu: str | None = None  # and the GPU's UUID when it is about one
    placeholder: bool = False  # no data yet: its first data is not a "change"


_NODE_DOC = "the node's inventory name"
_HEALTH_DOC = "the worst state of the node or GPU (see States below)"
_TEMP_DOC = "GPU temperature, degrees C"
_HBM_DOC = "HBM (GPU memory) temperature, degrees C"
_POWER_DOC = "power draw / power limit, watts"
_UTIL_DOC = "GPU utilisation, percent"
_ECC_DOC = "ECC errors since the driver loaded: c corrected (single-bit) / u uncorrected (double-bit)"
_REMAP_DOC = (
    "remapped memory rows: corrected / uncorrected errors; PEND a remap waits for a GPU reset, "
    "FAIL a remap failed"
)
_PCIE_DOC = "PCIe link now, G<gen>x<width>; '<G5x16' follows when it runs below the GPU's maximum"
_REPLAY_DOC = "PCIe replay counter (link-level retransmissions)"
_NVL_DOC = "NVLinks up / links; 'mig' under MIG (NVML reports the links down there), 'none' without NVLink"
_THROTTLE_DOC = "clock-event (throttle) reasons, abbreviated (see Abbreviations); idle or - when none"
_MIG_DOC = "MIG mode: off, or on:<instances>; * a change waits for the next GPU reset"
_FABRIC_DOC = (
    "RDMA compute ports ACTIVE / expected (the ports present, or the count fabric.port_count expects): IB "
    "InfiniBand, RoCE Ethernet, RDMA both; red when fewer are active, yellow for a fabric warning; none: no "
    "RDMA device (or no compute port), - the agent sent no fabric section (older agent), n/a not readable"
)
_JOBS_DOC = (
    "the Slurm jobs running on {what} (the daemon's job records): the lowest id and how many more (1234 +2); "
    "empty: none; - the node's snapshot has no job records (cold collect, older agent). Shown once a node "
    "reports jobs; j filters the fleet to one job"
)
_XID_DOC = "the XID code (S prefix: an NVSwitch SXid)"
_XSEV_DOC = "the catalog's severity of that XID"
_MEANING_DOC = "what the XID code means (the XID catalog)"
_XACTION_DOC = "what the catalog says to do about it"

COLUMNS: dict[str, tuple[Column, ...]] = {
    "nodes": (
        Column("node", "NODE", 16, "N", doc=_NODE_DOC),
        Column("health", "HEALTH", 8, "H", doc="the node's state (see States below)"),
        Column("gpus", "GPUS", 5, "G", doc="GPUs fit for work / GPUs the driver attached (a lost GPU counts in the second)"),
        Column("fabric", "FABRIC", 8, "F", doc=_FABRIC_DOC),
        Column("jobs", "JOBS", 9, "J", doc=_JOBS_DOC.format(what="the node")),
        Column("driver", "DRIVER", 11, "D", doc="NVIDIA driver version"),
        Column("xids", "XID/1H", 6, "X", doc="XIDs in the last hour"),
        Column("seen", "SEEN", 7, "A", clock=True, doc="how long ago the node's last good snapshot arrived"),
        Column("bad", "BAD SINCE", 9, "B", clock=True,
               doc="since when the node is in its fault state, UTC, and for how long (03:12 14m; the date past a "
               "day); kept through STALE, empty when OK"),
        # min 30: with FABRIC beside GPUS the whole row still fits 120 columns; with JOBS too,
        # min 19 (the JOBS column is shown only where some node reports jobs)
        Column("worst", "WORST FINDING", 88, "W", grow=1, min_width=19,
               doc="check: message of its worst finding, or why the latest poll gave no snapshot"),
    ),
    "gpus": (
        Column("node", "NODE", 12, "N", doc=_NODE_DOC),
        Column("idx", "GPU", 3, "I", doc="the GPU's index (as nvidia-smi numbers it)"),
        Column("uuid", "UUID", 12, "U", doc="the GPU's UUID, first 8 hex digits (in full on the node screen)"),
        Column("health", "HEALTH", 7, "H", doc=_HEALTH_DOC),
        Column("temp", "TEMP", 4, "T", doc=_TEMP_DOC),
        Column("hbm", "HBM", 4, "M", doc=_HBM_DOC),
        Column("power", "POWER", 9, "P", doc=_POWER_DOC),
        Column("util", "UTIL", 4, "L", doc=_UTIL_DOC),
        Column("ecc", "ECC c/u", 9, "E", doc=_ECC_DOC),
        Column("remap", "REMAP", 8, "R", doc=_REMAP_DOC),
        Column("pcie", "PCIE", 10, "C", doc=_PCIE_DOC),
        Column("replays", "REPLAY", 6, "Y", doc=_REPLAY_DOC),
        Column("nvlink", "NVL", 5, "V", doc=_NVL_DOC),
        Column("throttle", "THROTTLE", 13, "O", doc=_THROTTLE_DOC),
        Column("jobs", "JOBS", 9, "J", doc=_JOBS_DOC.format(what="the GPU or its MIG instances")),
        Column("check", "WORST CHECK", 22, "W", grow=1, min_width=22, doc="the check of the GPU's worst finding"),
    ),
    # The GPUs view filtered to one job (``j``): exactly the job's GPUs, across its nodes, side
    # by side; the header line above names the job (``jobs.JobView.header``).
    "job": (
        Column("node", "NODE", 12, "N", doc=_NODE_DOC),
        Column("idx", "GPU", 3, "I", doc="the GPU's index (as nvidia-smi numbers it)"),
        Column("health", "HEALTH", 7, "H", doc=_HEALTH_DOC),
        Column("util", "UTIL", 4, "L", doc=_UTIL_DOC),
        Column("sm", "SM MHZ", 6, "K", doc="SM clock now, MHz (its maximum on the node screen's GPU tab)"),
        Column("power", "POWER", 9, "P", doc=_POWER_DOC),
        Column("temp", "TEMP", 4, "T", doc=_TEMP_DOC),
        Column("xids", "XIDS", 8, "X",
               doc="XIDs on the GPU the daemon attributed to the job (their jobs name it): count (codes)"),
        Column("throttle", "THROTTLE", 13, "O", doc=_THROTTLE_DOC),
        Column("mig", "MIG", 6, "G", doc="the MIG instances of the GPU the job holds (GPU instance ids), - the whole GPU"),
        Column("check", "WORST CHECK", 22, "W", grow=1, min_width=12, doc="the check of the GPU's worst finding"),
    ),
    "findings": (
        Column("severity", "SEV", 7, "S", doc="the finding's severity (see States below)"),
        Column("node", "NODE", 12, "N", doc=_NODE_DOC),
        Column("gpu", "GPU", 3, "G", doc="the GPU's index, - for a node-wide finding"),
        Column("check", "CHECK", 28, "C", doc="the check that raised it (fleetops docs: the checks catalog)"),
        Column("message", "MESSAGE", 62, "M", grow=1, min_width=24, doc="what the check found"),
        Column("action", "ACTION", 30, "A", grow=2, min_width=30, doc="what to do about it (in full on the node screen)"),
    ),
    "xids": (
        Column("age", "AGE", 7, "A", clock=True, doc="how long ago the kernel logged it"),
        Column("node", "NODE", 12, "N", doc=_NODE_DOC),
        Column("gpu", "GPU", 3, "G", doc="the GPU's index, found by its bus id (also for a GPU lost since)"),
        Column("code", "XID", 5, "X", doc=_XID_DOC),
        Column("severity", "SEV", 5, "S", doc=_XSEV_DOC),
        Column("jobs", "JOBS", 9, "J", doc="the jobs on the GPU at the XID's time, as the daemon attributed them "
               "(shown once a node reports jobs; - not attributed: a cold collect, or no wall-clock time)"),
        Column("name", "MEANING", 32, "M", grow=1, min_width=20, doc=_MEANING_DOC),
        Column("action", "ACTION", 18, "C", doc=_XACTION_DOC),
        Column("message", "LOG MESSAGE", 58, "L", grow=2, min_width=30, doc="the driver's own words in the kernel log"),
    ),
}
# The GPU table of the node detail screen: every field the issue asks for.
DETAIL_GPU_COLUMNS: tuple[Column, ...] = (
    Column("idx", "GPU", 3, doc="the GPU's index (as nvidia-smi numbers it)"),
    Column("bus", "BUS ID", 12, doc="the GPU's PCI bus id (domain:bus:device.function), as the kernel log names it"),
    # gives way first on a narrow terminal (the GPU tab shows it in full), so MIG stays in view
    Column("uuid", "UUID", 40, grow=1, min_width=13, doc="the GPU's UUID"),
    Column("health", "HEALTH", 7, doc=_HEALTH_DOC),
    Column("temp", "TEMP", 4, doc=_TEMP_DOC),
    Column("hbm", "HBM", 4, doc=_HBM_DOC),
    Column("power", "POWER", 9, doc=_POWER_DOC),
    Column("util", "UTIL", 4, doc=_UTIL_DOC),
    Column("procs", "PROCS", 8, doc="compute processes on the GPU and the largest one's GPU memory, GiB (each "
           "process, with its user and MIG instance, on the GPU tab); n/a where the driver did not say"),
    Column("ecc", "ECC c/u", 9, doc=_ECC_DOC),
    Column("remap", "REMAP", 8, doc=_REMAP_DOC),
    Column("pcie", "PCIE", 10, doc=_PCIE_DOC),
    Column("replays", "REPLAY", 6, doc=_REPLAY_DOC),
    Column("nvlink", "NVL", 5, doc=_NVL_DOC),
    Column("throttle", "THROTTLE", 13, doc=_THROTTLE_DOC),
    Column("mig", "MIG", 4, doc=_MIG_DOC),
)
# The node screen's XIDs: as an engineer reads them in the kernel log, newest first.
DETAIL_XID_COLUMNS: tuple[Column, ...] = (
    Column("when", "WHEN (UTC)", 19, doc="when the kernel logged it, UTC"),
    Column("age", "AGE", 7, clock=True, doc="how long ago that is"),
    Column("gpu", "GPU", 3, doc="the GPU's index, found by its bus id (also for a GPU lost since)"),
    Column("bus", "BUS ID", 12, doc="the PCI bus id the kernel line names"),
    Column("code", "XID", 5, doc=_XID_DOC),
    Column("count", "N", 3, doc="how many times this code was logged for this GPU"),
    Column("severity", "SEV", 5, doc=_XSEV_DOC),
    Column("escalated", "ESCALATED", 9, doc="whether the repeat policy escalated the code (yes/no, - without a policy)"),
    Column("name", "MEANING", 30, grow=1, min_width=20, doc=_MEANING_DOC),
    Column("jobs", "JOBS", 9, doc="the jobs on the GPU at the XID's time, as the daemon attributed them (shown "
           "where the node reports jobs; - not attributed: no wall-clock time, or no records)"),
    Column("kernel", "KERNEL LINE", 70, grow=2, min_width=40, doc="the kernel's own line (NVRM: Xid (PCI:...): code, ...)"),
)
# The node screen's audit history (from the history database).
HISTORY_COLUMNS: tuple[Column, ...] = (
    Column("audit", "AUDIT", 6, doc="the audit's number in the history database (esc: a fault that survived reboots or resets)"),
    Column("when", "WHEN", 19, doc="when the audit ran (local time)"),
    Column("reach", "REACHED", 7, doc="whether the audit reached the node"),
    Column("worst", "WORST", 7, doc="its worst finding's severity"),
    Column("faults", "FAULTS", 6, doc="warn and crit findings (escalations: reboots and resets it survived)"),
    Column("note", "NOTE", 80, grow=1, min_width=30, doc="the worst finding, the escalation, or why the node was not reached"),
)
# The node screen's Fabric tab: one row per RDMA port (``data.fabric``). The link's health comes
# first and fits 120 columns in full; the inventory (PCI, NUMA, firmware) follows, read in full
# from 150 columns (narrower, the table scrolls sideways as the GPU table does).
_COUNTER_DOC = "counters/{name}: accumulated since the driver loaded (only growth is judged: fabric.{check})"
DETAIL_FABRIC_COLUMNS: tuple[Column, ...] = (
    Column("port", "PORT", 8, doc="the RDMA device and its port number (mlx5_3/1)"),
    Column("role", "ROLE", 7, doc="compute: a port the checks judge as the node's (its faults can be crit); mgmt: "
           "not a compute port (management, storage: the baseline's exclusions, else no GPU on its PCIe "
           "switch), never drains the node"),
    Column("state", "STATE", 13,
           doc="the port's state (ACTIVE, DOWN, INIT, ARMED) and, where it is not LinkUp, its physical state"),
    Column("rate", "RATE", 11, doc="rate in Gb/s, width (4X) and link layer (IB InfiniBand, Eth Ethernet: RoCE)"),
    Column("gpus", "GPUS", 14, grow=1, min_width=14,
           doc="the GPUs behind the same PCIe switch: index and bus id; - none, n/a not known"),
    Column("downed", "DOWNED", 6, doc=_COUNTER_DOC.format(name="link_downed", check="link_downed")),
    Column("symbol", "SYMERR", 6, doc=_COUNTER_DOC.format(name="symbol_error", check="link_errors")),
    Column("recovery", "RECOV", 5, doc=_COUNTER_DOC.format(name="link_error_recovery", check="link_errors")),
    Column("rcverr", "RCVERR", 6, doc="counters/port_rcv_errors: packets received with errors, since the driver loaded"),
    Column("fatal", "FATAL", 7, doc="the counters whose every increase is fatal (NVSentinel; fabric.error_counters), "
           "in order: excessive_buffer_overrun_errors / local_link_integrity_errors / rnr_nak_retry_err"),
    Column("netdev", "NETDEV", 13, doc="the network interface of the port (ip link)"),
    Column("pci", "PCI", 12, doc="the HCA's PCI address"),
    Column("numa", "NUMA", 4, doc="the HCA's NUMA node"),
    Column("fw", "FIRMWARE", 10, doc="the HCA's firmware version (fw_ver)"),
)
# Every word a HEALTH or SEV cell can show, for the legend: a state missing here fails its test.
STATE_WORDS: tuple[tuple[str, str], ...] = (
    ("OK", "no finding worse than info"),
    ("INFO", "worth knowing, nothing to do"),
    ("WARN", "a fault to plan for: degraded, or going to be"),
    ("CRIT", "a fault to act on now"),
    ("UNKNOWN", "a value could not be read, so the check could not tell"),
    ("LOST", "the GPU fell off the bus (NVML: GpuIsLost) or vanished since the last snapshot"),
    ("STALE", "the node's daemon stream has been silent past --stale-after; its last data is shown"),
    ("UNREACH", "the connection was refused or failed; the last good state is shown with its age"),
    ("HUNG", "the host took the TCP connection but sent no SSH banner, or the agent did not answer in time"),
    ("NODATA", "the node answered, but with no usable snapshot"),
    ("WAITING", "not polled yet"),
)
# The THROTTLE column's abbreviations, for the legend.
THROTTLE_WORDS: tuple[tuple[str, str], ...] = tuple(
    (short, reason) for reason, short in _THROTTLE_SHORT.items() if short
)


def make_row(
    key: str,
    cells: dict[str, tuple[str, str, Any]],
    cols: tuple[Column, ...],
    fault: bool,
    hay: str,
    node: str = "",
    gpu: str | None = None,
) -> Row:
    """A row from ``{column key: (text, style, sort value)}`` in the order of ``cols``."""
    picked = [cells[c.key] for c in cols]
    return Row(
        key,
        tuple(p[0] for p in picked),
        tuple(p[1] for p in picked),
        tuple(p[2] for p in picked),
        fault,
        hay,
        node,
        gpu,
    )


def column_index(view: str, key: str) -> int:
    return next(i for i, c in enumerate(COLUMNS[view]) if c.key == key)

def _cell_styles(findings: Iterable[model.Finding]) -> dict[str, str]:
    """Colour the cells a fault is about: the first needle found in the check's own name
    (``pcie_replays``), else in its family (``nvlink.``); so ``thermal_power.power_limit``
    colours POWER only."""
    out: dict[str, str] = {}
    for f in findings:
        if f.severity not in FAULT_SEVERITIES:
            continue
        family, _, name = f.check.rpartition(".")
        cols = next((cs for needle, cs in _CHECK_COLUMNS if needle in name), None)
        if cols is None:
            cols = next((cs for needle, cs in _CHECK_COLUMNS if needle in family), ())
        for col in cols:
            out[col] = model.worst([out.get(col, "ok"), f.severity])
    return out


def gpu_cells(g: GpuView) -> dict[str, tuple[str, str, Any]]:
    """Cell text, style and sort value for each GPU column (both GPU tables use these)."""
    gpu = g.gpu
    worst_f = next((f for f in g.findings if f.severity not in ("ok", "info")), None)
    check = worst_f.check if worst_f else ("(lost)" if g.lost else "")
    out: dict[str, tuple[str, str, Any]] = {
        "idx": (str(g.index), "", g.index),
        "bus": (g.bus_id, "", g.bus_id),
        "uuid": (g.uuid, "", g.uuid),
        "health": (
            "LOST" if g.lost else g.health.upper(),
            "crit" if g.lost else g.health,
            HEALTH_RANK.get(g.health, 0) + (1 if g.lost else 0),
        ),
        "check": (check, "crit" if g.lost else (worst_f.severity if worst_f else ""), check),
    }
    if gpu is None or g.lost:
        for key in (
            "temp",
            "hbm",
            "power",
            "util",
            "procs",
            "ecc",
            "remap",
            "pcie",
            "replays",
            "nvlink",
            "throttle",
            "mig",
        ):
            out[key] = ("-", "dim", -1)
        return out
    styles = _cell_styles(g.findings)
    out.update(
        {
            "temp": (_num(gpu.temp_gpu_c), styles.get("temp", ""), gpu.temp_gpu_c or -1),
            "hbm": (_num(gpu.temp_memory_c), styles.get("hbm", ""), gpu.temp_memory_c or -1),
            "power": (fmt_power(gpu), styles.get("power", ""), gpu.power_draw_w or -1),
            "util": (
                fmt_util(gpu),
                "",
                gpu.utilization_gpu_pct if gpu.utilization_gpu_pct is not None else -1,
            ),
            "procs": (fmt_procs(gpu), "", (len(gpu.processes or []), _largest_mib(gpu) or 0)),
            "ecc": (
                fmt_ecc(gpu),
                styles.get("ecc", ""),
                ((gpu.ecc_uncorrected_volatile or 0), (gpu.ecc_corrected_volatile or 0)),
            ),
            "remap": (
                fmt_remap(gpu),
                styles.get("remap", ""),
                (
                    bool(gpu.remapped_rows_failure),
                    bool(gpu.remapped_rows_pending),
                    gpu.remapped_rows_uncorrected or 0,
                ),
            ),
            "pcie": (
                fmt_pcie(gpu),
                styles.get("pcie", ""),
                ((gpu.pcie_gen_current or 0) * 100 + (gpu.pcie_width_current or 0)),
            ),
            "replays": (
                _num(gpu.pcie_replay_counter, "{}"),
                styles.get("replays", ""),
                gpu.pcie_replay_counter or 0,
            ),
            "nvlink": (
                fmt_nvlink(gpu),
                styles.get("nvlink", ""),
                gpu.nvlinks_up if gpu.nvlinks_up is not None else -1,
            ),
            "throttle": (fmt_throttle(gpu), styles.get("throttle", ""), fmt_throttle(gpu)),
            "mig": (fmt_mig(gpu), styles.get("mig", ""), fmt_mig(gpu)),
        }
    )
    return out


def finding_cells(f: model.Finding) -> dict[str, tuple[str, str, Any]]:
    idx = (f.gpu or {}).get("index")
    return {
        "severity": (f.severity.upper(), f.severity, -model.SEVERITY_RANK.get(f.severity, 0)),
        "node": (f.node, "", natural_key(f.node)),
        "gpu": ("-" if idx is None else str(idx), "", -1 if idx is None else idx),
        "check": (f.check, "", f.check),
        "message": (f.message, "", f.message),
        "action": (f.action or "", "dim", f.action or ""),
    }


def kernel_line(x: XidView) -> str:
    """The kernel's own line (``NVRM: Xid (PCI:0000:ab:00): 79, pid=..., GPU has fallen off the
    bus.``) without the log's timestamp or host prefix; built from the event's fields where the
    source gave no raw line."""
    raw = x.event.raw.strip()
    at = raw.find("NVRM:")
    if at >= 0:
        return raw[at:]
    if raw:
        return raw
    kind = "SXid" if x.sxid else "Xid"
    return f"NVRM: {kind} (PCI:{x.bus_id or '?'}): {x.code}, {x.event.message.strip()}"


def xid_cells(x: XidView, now: float) -> dict[str, tuple[str, str, Any]]:
    ev = x.event
    age = None if ev.timestamp is None else now - ev.timestamp
    when = "?" if ev.timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ev.timestamp))
    age_sort = age if age is not None else float("inf")
    return {
        "when": (when, "", age_sort),  # sorted as the age is: newest first
        "age": (format_age(age) if age is not None else "?", "", age_sort),
        "gpu": (
            "-" if x.gpu_index is None else str(x.gpu_index),
            "",
            -1 if x.gpu_index is None else x.gpu_index,
        ),
        "bus": (x.bus_id or "-", "", x.bus_id or ""),
        "code": (("S" if x.sxid else "") + str(x.code), "", x.code),
        "count": (str(x.count), "", x.count),
        "severity": (x.severity.upper(), x.severity, -model.SEVERITY_RANK.get(x.severity, 0)),
        "escalated": (x.escalated, "crit" if x.escalated == "yes" else "dim" if x.escalated == "-" else "", x.escalated),
        "name": (x.name, "", x.name),
        "action": (x.action, "dim", x.action),
        "message": (ev.message.strip(), "", ev.message),
        "kernel": (kernel_line(x), "", kernel_line(x)),
        "jobs": (
            "-" if ev.jobs is None else ", ".join(ev.jobs),
            "dim" if ev.jobs is None else "",
            tuple(ev.jobs or ()),
        ),
    }
