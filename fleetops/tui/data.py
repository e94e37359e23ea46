"""What the fleet looks like to the TUI: per-node entries, view rows, filters, sorts, totals.

Pure Python with no Textual (or rich) import, so it is unit-testable and its heavy part runs in
the refresh thread: ``summarize`` turns one node's snapshot and findings into a ``NodeEntry``
holding every row that node contributes to every view, precomputed and immutable. The main
thread only swaps entries into ``FleetState`` and asks it for the rows of the current view,
which is cheap: it filters, sorts and fills in the few cells that depend on the clock (ages,
XIDs in the last hour).

A node that stops answering keeps its last good entry; ``mark_failed`` copies it with the
failure status and the transport finding, so the screen shows what the node looked like and
how long ago, with an unreachable mark.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from fleetops import model

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
    if seconds is None:
        return "never"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


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


COLUMNS: dict[str, tuple[Column, ...]] = {
    "nodes": (
        Column("node", "NODE", 16, "N"),
        Column("health", "HEALTH", 8, "H"),
        Column("gpus", "GPUS", 5, "G"),
        Column("driver", "DRIVER", 11, "D"),
        Column("xids", "XID/1H", 6, "X"),
        Column("seen", "SEEN", 7, "A", clock=True),
        Column("worst", "WORST FINDING", 88, "W"),
    ),
    "gpus": (
        Column("node", "NODE", 12, "N"),
        Column("idx", "GPU", 3, "I"),
        Column("uuid", "UUID", 12, "U"),
        Column("health", "HEALTH", 7, "H"),
        Column("temp", "TEMP", 4, "T"),
        Column("hbm", "HBM", 4, "M"),
        Column("power", "POWER", 9, "P"),
        Column("util", "UTIL", 4, "L"),
        Column("ecc", "ECC c/u", 9, "E"),
        Column("remap", "REMAP", 8, "R"),
        Column("pcie", "PCIE", 10, "C"),
        Column("replays", "REPLAY", 6, "Y"),
        Column("nvlink", "NVL", 5, "V"),
        Column("throttle", "THROTTLE", 13, "O"),
        Column("check", "WORST CHECK", 22, "W"),
    ),
    "findings": (
        Column("severity", "SEV", 7, "S"),
        Column("node", "NODE", 12, "N"),
        Column("gpu", "GPU", 3, "G"),
        Column("check", "CHECK", 28, "C"),
        Column("message", "MESSAGE", 62, "M"),
        Column("action", "ACTION", 30, "A"),
    ),
    "xids": (
        Column("age", "AGE", 7, "A", clock=True),
        Column("node", "NODE", 12, "N"),
        Column("gpu", "GPU", 3, "G"),
        Column("code", "XID", 5, "X"),
        Column("severity", "SEV", 5, "S"),
        Column("name", "MEANING", 32, "M"),
        Column("action", "ACTION", 18, "C"),
        Column("message", "LOG MESSAGE", 58, "L"),
    ),
}
# The GPU table of the node detail screen: every field the issue asks for.
DETAIL_GPU_COLUMNS: tuple[Column, ...] = (
    Column("idx", "GPU", 3),
    Column("uuid", "UUID", 40),
    Column("health", "HEALTH", 7),
    Column("temp", "TEMP", 4),
    Column("hbm", "HBM", 4),
    Column("power", "POWER", 9),
    Column("util", "UTIL", 4),
    Column("ecc", "ECC c/u", 9),
    Column("remap", "REMAP", 8),
    Column("pcie", "PCIE", 10),
    Column("replays", "REPLAY", 6),
    Column("nvlink", "NVL", 5),
    Column("throttle", "THROTTLE", 13),
    Column("mig", "MIG", 4),
)
DETAIL_XID_COLUMNS: tuple[Column, ...] = (
    Column("age", "AGE", 7, clock=True),
    Column("gpu", "GPU", 3),
    Column("code", "XID", 5),
    Column("severity", "SEV", 5),
    Column("name", "MEANING", 30),
    Column("action", "ACTION", 18),
    Column("message", "LOG MESSAGE", 70),
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


# --- per-node entries -------------------------------------------------------------------


@dataclass(frozen=True)
class GpuView:
    """One GPU as the TUI shows it; ``lost`` when an earlier snapshot had it and this one
    does not (fallen off the bus, or removed)."""

    uuid: str
    index: int
    bus_id: str
    health: str
    gpu: model.Gpu | None
    findings: tuple[model.Finding, ...]
    lost: bool = False


@dataclass(frozen=True)
class XidView:
    key: str
    event: model.XidEvent
    code: int
    name: str
    severity: str
    action: str
    sxid: bool


@dataclass(frozen=True)
class NodeEntry:
    name: str
    status: str  # "ok" | "pending" | "unreachable" | "timeout" | "error"
    snapshot: model.Node | None  # last good
    findings: tuple[model.Finding, ...]  # of the last good snapshot
    seen_at: float | None  # controller clock, when the last good snapshot arrived
    problem: model.Finding | None = None  # why the latest poll gave no snapshot
    health: str = "ok"  # worst finding severity of the last good state
    gpus: tuple[GpuView, ...] = ()
    xids: tuple[XidView, ...] = ()
    worst: model.Finding | None = None
    haystack: str = ""
    version: int = 0
    gpu_rows: tuple[Row, ...] = ()
    finding_rows: tuple[Row, ...] = ()

    @property
    def mark(self) -> str | None:
        """UNREACH / HUNG / NODATA / WAITING when the latest poll gave no snapshot."""
        return STATUS_LABEL.get(self.status, self.status.upper())

    @property
    def display_health(self) -> str:
        if self.status == STATUS_PENDING and self.snapshot is None:
            return "pending"
        if self.status == STATUS_STALE:
            return "stale"
        if self.status != STATUS_OK:
            return "unreach"
        return self.health

    @property
    def fault(self) -> bool:
        return self.status not in (STATUS_OK, STATUS_PENDING) or self.health in FAULT_SEVERITIES

    @cached_property
    def gpu_tally(self) -> tuple[int, int]:
        """(GPUs fit for work, GPUs the driver attached) by ``model.gpu_tally``, the audit
        table's rule: a lost GPU counts in the second, never in the first."""
        if self.snapshot is None:
            return 0, 0
        return model.gpu_tally(self.snapshot, self.findings)

    @property
    def gpus_ok(self) -> int:
        return self.gpu_tally[0]

    @property
    def gpus_total(self) -> int:
        return self.gpu_tally[1]

    @cached_property
    def node_row_parts(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
        """Cells, styles and sort values of the nodes-view row, computed once per entry; the
        clock-bound ones (XIDs in the last hour, age) are placeholders here (FleetState fills
        them)."""
        health = self.display_health
        snap = self.snapshot
        if self.problem is not None and self.status != STATUS_OK:
            worst_text, worst_style = self.problem.message, "unknown"
            if self.worst is not None:
                worst_text += f"  (last state: {fmt_finding(self.worst)})"
        elif self.worst is not None:
            worst_text, worst_style = fmt_finding(self.worst), self.worst.severity
        else:
            worst_text, worst_style = "", ""
        ok, n = self.gpu_tally
        cells = (
            self.name,
            self.mark or health_label(health),
            f"{ok}/{n}" if n else "-",
            (snap.driver_version or "n/a") if snap else "-",
            "",
            "",
            worst_text,
        )
        styles = ("", health, "warn" if ok < n else "", "", "", "", worst_style)
        sort = (
            natural_key(self.name),
            HEALTH_RANK.get(health, 0),
            (ok - n, ok),
            natural_key(snap.driver_version or "") if snap else (),
            0,
            0.0,
            (-model.SEVERITY_RANK.get(self.worst.severity, 0), self.worst.check) if self.worst else (1, ""),
        )
        return cells, styles, sort

    @property
    def all_findings(self) -> tuple[model.Finding, ...]:
        return ((self.problem,) if self.problem else ()) + self.findings

    def xids_since(self, since: float) -> int:
        return sum(1 for x in self.xids if not x.sxid and (x.event.timestamp or 0.0) >= since)

    def gpu(self, uuid: str) -> GpuView | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


def pending_entry(name: str) -> NodeEntry:
    return NodeEntry(
        name=name, status=STATUS_PENDING, snapshot=None, findings=(), seen_at=None, haystack=name.lower()
    )


def _xid_info(event: model.XidEvent) -> tuple[str, str, str, bool]:
    """(name, severity, action, is_sxid) from the XID catalog (it explains unknown codes too)."""
    from fleetops.xid import catalog as xid

    info = xid.info_for(event)
    return (info.name, info.severity, info.action, xid.is_sxid(event))


def _finding_sort(f: model.Finding) -> tuple[Any, ...]:
    return (-model.SEVERITY_RANK.get(f.severity, 0), (f.gpu or {}).get("index", -1), f.check)


_LINKS: dict[tuple[Any, ...], model.NvLink] = {}
_LINKS_MAX = 65536


def share_links(node: model.Node) -> None:
    """Make equal NVLink records one shared object. A fleet of healthy HGX nodes has the same
    18 links per GPU over and over: 144 000 objects at 1000 nodes, which Python's cyclic GC
    walks on every full collection (hundreds of ms on the main thread). Shared, they are a few
    dozen. Snapshots are never mutated after parsing, so sharing is safe."""
    for gpu in node.gpus:
        if not gpu.nvlinks:
            continue
        shared = []
        for link in gpu.nvlinks:
            key = (
                link.link,
                link.state,
                link.remote_bus_id,
                link.remote_type,
                link.crc_errors,
                link.replay_errors,
                link.recovery_errors,
                # the data counters too: a link is shared only with one that counted exactly the
                # same, or a rate base made of shared links would difference another link's KiB
                link.tx_kib,
                link.rx_kib,
                tuple(sorted(link.unavailable.items())),
            )
            one = _LINKS.get(key)
            if one is None:
                if len(_LINKS) >= _LINKS_MAX:
                    _LINKS.clear()
                one = _LINKS.setdefault(key, link)
            shared.append(one)
        gpu.nvlinks = shared


def summarize(
    name: str,
    snapshot: model.Node,
    findings: Iterable[model.Finding],
    seen_at: float,
    previous: NodeEntry | None = None,
) -> NodeEntry:
    """The entry for a node that just answered. ``previous`` lets GPUs that vanished since
    show as lost rather than silently drop out of the count."""
    share_links(snapshot)
    found = tuple(sorted(findings, key=_finding_sort))
    health = model.worst(f.severity for f in found)
    by_gpu: dict[str, list[model.Finding]] = {}
    for f in found:
        uuid = (f.gpu or {}).get("uuid")
        if uuid:
            by_gpu.setdefault(uuid, []).append(f)
    gpus: list[GpuView] = []
    present = set()
    for g in snapshot.gpus:
        present.add(g.uuid)
        fs = tuple(by_gpu.get(g.uuid, ()))
        if model.gpu_lost(g):  # at its index, answering GpuIsLost: show what was read before the loss
            known = previous.gpu(g.uuid) if previous else None
            shown = known.gpu if known is not None and known.gpu is not None else g
            sev = model.worst([*(f.severity for f in fs), "crit"])
            gpus.append(GpuView(g.uuid, g.index, g.bus_id, sev, shown, fs, lost=True))
            continue
        gpus.append(GpuView(g.uuid, g.index, g.bus_id, model.worst(f.severity for f in fs), g, fs))
    for old in previous.gpus if previous else ():
        if old.uuid not in present:
            fs = tuple(by_gpu.get(old.uuid, ()))
            sev = model.worst([*(f.severity for f in fs), "crit"])
            gpus.append(replace(old, gpu=old.gpu, health=sev, findings=fs, lost=True))
    # in bus order: a GPU's place does not move when another falls off the bus and the driver
    # renumbers the rest (a lost GPU keeps its slot)
    gpus.sort(key=lambda g: g.bus_id)
    xids = []
    seen_keys: dict[str, int] = {}
    for ev in snapshot.xids:
        xname, sev, action, sxid = _xid_info(ev)
        base = f"{name}:{ev.timestamp or ev.uptime_s or 0}:{ev.code}:{ev.bus_id or ''}"
        n = seen_keys.get(base, 0)
        seen_keys[base] = n + 1
        xids.append(XidView(f"{base}#{n}" if n else base, ev, ev.code, xname, sev, action, sxid))
    worst_f = next((f for f in found if f.severity not in ("ok", "info")), None)
    hay = _haystack(name, found)
    entry = NodeEntry(
        name=name,
        status=STATUS_OK,
        snapshot=snapshot,
        findings=found,
        seen_at=seen_at,
        problem=None,
        health=health,
        gpus=tuple(gpus),
        xids=tuple(xids),
        worst=worst_f,
        haystack=hay,
        version=(previous.version + 1) if previous else 1,
    )
    return replace(
        entry, gpu_rows=tuple(_gpu_row(entry, g) for g in entry.gpus), finding_rows=_finding_rows(entry)
    )


def _haystack(name: str, findings: Iterable[model.Finding]) -> str:
    """What the ``/`` filter searches for a node: its name and every finding's check and message."""
    return " ".join([name, *(f"{f.check} {f.message}" for f in findings)]).lower()


def mark_failed(name: str, status: str, problem: model.Finding, previous: NodeEntry | None) -> NodeEntry:
    """The node did not give a snapshot: keep its last good state, add the mark and why."""
    base = previous or pending_entry(name)
    # built afresh from the kept findings and this problem: a node marked again and again (a
    # host down for a day, retried every backoff) must not grow its search text each time
    hay = _haystack(name, (*base.findings, problem))
    entry = replace(base, status=status, problem=problem, haystack=hay, version=base.version + 1)
    return replace(
        entry, gpu_rows=tuple(_gpu_row(entry, g) for g in entry.gpus), finding_rows=_finding_rows(entry)
    )


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


def _gpu_row(entry: NodeEntry, g: GpuView) -> Row:
    cells = gpu_cells(g)
    cells["node"] = (entry.name, "", natural_key(entry.name))
    cells["uuid"] = (short_uuid(g.uuid), "", g.uuid)
    cols = COLUMNS["gpus"]
    hay = " ".join([entry.name, g.uuid, g.bus_id, *(f"{f.check} {f.message}" for f in g.findings)]).lower()
    if entry.problem:
        hay += f" {entry.problem.check} {entry.problem.message}".lower()
    return make_row(
        f"{entry.name}:{g.uuid}", cells, cols, g.lost or g.health in FAULT_SEVERITIES, hay, entry.name, g.uuid
    )


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


def _finding_rows(entry: NodeEntry) -> tuple[Row, ...]:
    """Keyed by ``Finding.key``; a check that reports the same GPU twice gets ``#1``, ``#2``."""
    rows = []
    counts: dict[str, int] = {}
    for f in entry.all_findings:
        n = counts.get(f.key, 0)
        counts[f.key] = n + 1
        fault = f.severity in FAULT_SEVERITIES or f.check.startswith("transport.")
        hay = f"{f.node} {f.check} {f.message} {f.action or ''}".lower()
        uuid = (f.gpu or {}).get("uuid")
        rows.append(
            make_row(
                f"{f.key}#{n}" if n else f.key,
                finding_cells(f),
                COLUMNS["findings"],
                fault,
                hay,
                entry.name,
                uuid,
            )
        )
    return tuple(rows)


def xid_cells(x: XidView, now: float) -> dict[str, tuple[str, str, Any]]:
    ev = x.event
    age = None if ev.timestamp is None else now - ev.timestamp
    return {
        "age": (format_age(age) if age is not None else "?", "", age if age is not None else float("inf")),
        "gpu": (
            "-" if ev.gpu_index is None else str(ev.gpu_index),
            "",
            -1 if ev.gpu_index is None else ev.gpu_index,
        ),
        "code": (("S" if x.sxid else "") + str(x.code), "", x.code),
        "severity": (x.severity.upper(), x.severity, -model.SEVERITY_RANK.get(x.severity, 0)),
        "name": (x.name, "", x.name),
        "action": (x.action, "dim", x.action),
        "message": (ev.message.strip(), "", ev.message),
    }


# --- filter ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """``/`` filter text: a case-insensitive regex; a leading ``!`` keeps what does NOT match.
    Text that is not a valid regex is matched literally (``error`` says why)."""

    text: str = ""
    pattern: re.Pattern[str] | None = None
    invert: bool = False
    error: str | None = None

    @classmethod
    def parse(cls, text: str) -> Filter:
        text = text.strip()
        invert = text.startswith("!")
        body = text[1:] if invert else text
        if not body:
            return cls(text=text, invert=False)
        try:
            pattern, error = re.compile(body, re.IGNORECASE), None
        except re.error as exc:
            pattern, error = (
                re.compile(re.escape(body), re.IGNORECASE),
                f"not a regex ({exc}); matched literally",
            )
        return cls(text=text, pattern=pattern, invert=invert, error=error)

    @property
    def active(self) -> bool:
        return self.pattern is not None

    def matches(self, haystack: str) -> bool:
        if self.pattern is None:
            return True
        return bool(self.pattern.search(haystack)) != self.invert


# --- the fleet ---------------------------------------------------------------------------


@dataclass
class Totals:
    nodes: int = 0
    ok: int = 0
    warn: int = 0
    crit: int = 0
    unknown: int = 0
    unreachable: int = 0
    stale: int = 0
    pending: int = 0
    gpus_ok: int = 0
    gpus: int = 0
    xids_1h: int = 0


@dataclass
class ViewState:
    sort_column: str
    reverse: bool = False


DEFAULT_SORT = {"nodes": "node", "gpus": "node", "findings": "severity", "xids": "age"}


@dataclass
class FleetState:
    """Every node's latest entry, in inventory order, and how the operator is looking at them."""

    clock: Callable[[], float] = time.time
    entries: dict[str, NodeEntry] = field(default_factory=dict)
    view: str = "nodes"
    filter: Filter = field(default_factory=Filter)
    faults_only: bool = False
    sorts: dict[str, ViewState] = field(
        default_factory=lambda: {v: ViewState(c) for v, c in DEFAULT_SORT.items()}
    )
    stale_after: float | None = None  # a reachable node's age beyond this is shown as stale
    last_total: int = 0  # rows of the last ``rows()`` view before filtering
    # name -> (entry, XIDs in the window, age text, age style, the row built from them)
    _node_rows: dict[str, tuple[NodeEntry, int, str, str, Row]] = field(default_factory=dict, repr=False)

    def set_hosts(self, names: Iterable[str]) -> None:
        for name in names:
            self.entries.setdefault(name, pending_entry(name))

    def update(self, entries: Iterable[NodeEntry]) -> list[str]:
        """Swap in new entries; returns the names whose entry changed."""
        changed = []
        for e in entries:
            if self.entries.get(e.name) is not e:
                self.entries[e.name] = e
                changed.append(e.name)
        return changed

    def sort_by(self, view: str, column: str) -> None:
        """Sorting by the column already sorted on flips the direction."""
        state = self.sorts[view]
        if state.sort_column == column:
            state.reverse = not state.reverse
        else:
            state.sort_column, state.reverse = column, False

    def sort_letter(self, view: str, letter: str) -> str | None:
        col = next((c for c in COLUMNS[view] if c.sort_key == letter), None)
        if col is None:
            return None
        self.sort_by(view, col.key)
        return col.key

    def totals(self, now: float | None = None) -> Totals:
        now = self.clock() if now is None else now
        t = Totals()
        for e in self.entries.values():
            t.nodes += 1
            h = e.display_health
            if h == "unreach":
                t.unreachable += 1
            elif h == "stale":
                t.stale += 1
            elif h == "pending":
                t.pending += 1
            elif h in ("warn", "crit", "unknown"):
                setattr(t, h, getattr(t, h) + 1)
            else:
                t.ok += 1
            t.gpus += e.gpus_total
            t.gpus_ok += e.gpus_ok
            t.xids_1h += e.xids_since(now - XID_WINDOW_S)
        return t

    # rows of each view, before filtering and sorting

    def _node_row(self, e: NodeEntry, now: float) -> Row:
        xids = e.xids_since(now - XID_WINDOW_S)
        age = None if e.seen_at is None else now - e.seen_at
        seen = format_age(age) if age is not None else "-"
        seen_style = self._seen_style(e, age)
        cached = self._node_rows.get(e.name)
        if cached is not None and cached[0] is e and cached[1:4] == (xids, seen, seen_style):
            return cached[4]  # the same object: the table skips it without looking inside
        cells, styles, sort = e.node_row_parts
        has_data = e.snapshot is not None
        cells = (*cells[:4], str(xids) if has_data else "-", seen, cells[6])
        styles = (*styles[:4], "warn" if xids else "dim", seen_style, styles[6])
        sort = (*sort[:4], xids, age if age is not None else float("inf"), sort[6])
        placeholder = e.status == STATUS_PENDING and not has_data
        row = Row(e.name, cells, styles, sort, e.fault, e.haystack, e.name, placeholder=placeholder)
        self._node_rows[e.name] = (e, xids, seen, seen_style, row)
        return row

    def _seen_style(self, e: NodeEntry, age: float | None) -> str:
        if e.status == STATUS_STALE:
            return "stale"
        if e.status not in (STATUS_OK, STATUS_PENDING):
            return "unreach"
        if age is not None and self.stale_after is not None and age > self.stale_after:
            return "stale"
        return ""

    def _xid_rows(self, e: NodeEntry, now: float, with_node: bool = True) -> list[Row]:
        cols = COLUMNS["xids"] if with_node else DETAIL_XID_COLUMNS
        rows = []
        for x in e.xids:
            cells = xid_cells(x, now)
            cells["node"] = (e.name, "", natural_key(e.name))
            hay = f"{e.name} xid {x.code} {x.name} {x.event.message}".lower()
            rows.append(
                make_row(x.key, cells, cols, x.severity in FAULT_SEVERITIES, hay, e.name, x.event.gpu_uuid)
            )
        return rows

    def all_rows(self, view: str, now: float | None = None) -> list[Row]:
        now = self.clock() if now is None else now
        entries = self.entries.values()
        if view == "nodes":
            return [self._node_row(e, now) for e in entries]
        if view == "gpus":
            return [r for e in entries for r in e.gpu_rows]
        if view == "findings":
            return [r for e in entries for r in e.finding_rows]
        if view == "xids":
            return [r for e in entries for r in self._xid_rows(e, now)]
        raise ValueError(f"unknown view {view!r}; views: {', '.join(VIEWS)}")

    def rows(self, view: str | None = None, now: float | None = None) -> list[Row]:
        """The rows of a view as the operator asked to see them: filtered, faults only or
        not, sorted (stable: ties keep inventory order)."""
        view = view or self.view
        rows = self.all_rows(view, now)
        self.last_total = len(rows)
        flt = self.filter
        if self.faults_only or flt.active:
            rows = [r for r in rows if (r.fault or not self.faults_only) and flt.matches(r.haystack)]
        state = self.sorts[view]
        idx = column_index(view, state.sort_column)
        rows.sort(key=lambda r: r.sort[idx], reverse=state.reverse)
        return rows

    def detail_xid_rows(self, name: str, now: float | None = None) -> list[Row]:
        e = self.entries.get(name)
        if e is None:
            return []
        rows = self._xid_rows(e, self.clock() if now is None else now, with_node=False)
        rows.sort(key=lambda r: r.sort[0])
        return rows


def detail_gpu_rows(entry: NodeEntry) -> list[Row]:
    """The node screen's GPU rows, in bus order like the entry (keyed by UUID)."""
    return [
        make_row(
            g.uuid,
            gpu_cells(g),
            DETAIL_GPU_COLUMNS,
            g.lost or g.health in FAULT_SEVERITIES,
            g.uuid.lower(),
            entry.name,
            g.uuid,
        )
        for g in entry.gpus
    ]
