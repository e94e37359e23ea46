"""One node's entry: ``summarize`` turns its snapshot and findings into a ``NodeEntry`` holding
every row it contributes to every view; ``mark_failed`` keeps the last good entry of a node
that stopped answering, with the failure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from fleetops import model
from fleetops.tui.data import fabric as fabric_data
from fleetops.tui.data import jobs as jobs_data
from fleetops.tui.data.columns import (
    COLUMNS,
    FAULT_SEVERITIES,
    HEALTH_RANK,
    STATUS_LABEL,
    STATUS_OK,
    STATUS_PENDING,
    STATUS_STALE,
    Row,
    finding_cells,
    fmt_finding,
    gpu_cells,
    health_label,
    make_row,
    natural_key,
    short_uuid,
)

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
    # The GPU by the event's bus id against the node's GPUs, lost ones included (after XID 79
    # the collector can no longer map the bus id, but the lost GPU keeps its index and slot).
    gpu_index: int | None = None
    bus_id: str | None = None
    count: int = 1  # events of this code on this GPU (bus id) in the snapshot
    escalated: str = "-"  # the repeat policy's verdict on this code and GPU: yes, no, - (none)


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
    # Since when the node's current bad state holds (controller clock): the first time it was
    # seen turn from OK to a fault state, or earlier where the data says (an XID's own time, the
    # start of a throttle the daemon holds); None while it is OK. See ``bad``.
    bad_since: float | None = None
    # The node's RDMA ports as the checks see them (compute or not, by its baseline).
    fabric: fabric_data.FabricView = fabric_data.UNKNOWN
    # Findings that come from comparing the node with the others on screen, not from its own
    # snapshot (the fleet's compute port count: ``FleetState``); they are in ``findings`` too.
    fleet_findings: tuple[model.Finding, ...] = ()

    @property
    def bad(self) -> bool | None:
        """True in a fault state (a warn or crit finding, or no answer: UNREACH, HUNG, NODATA),
        False when OK (or never polled), None when STALE: old data says nothing new about the
        node, so a bad period neither starts nor ends there (no flicker through a silent spell)."""
        if self.status == STATUS_STALE:
            return None
        if self.status == STATUS_PENDING:
            return False if self.snapshot is None else self.health in FAULT_SEVERITIES
        if self.status != STATUS_OK:
            return True
        return self.health in FAULT_SEVERITIES

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
        clock-bound ones (XIDs in the last hour, age, bad since) are placeholders here
        (FleetState fills them)."""
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
        fab_text, fab_style, fab_sort = fabric_data.node_cell(self.fabric, self.findings)
        job_text, job_style, job_sort = jobs_data.cell(self.running_jobs)
        cells = (
            self.name,
            self.mark or health_label(health),
            f"{ok}/{n}" if n else "-",
            fab_text,
            job_text,
            (snap.driver_version or "n/a") if snap else "-",
            "",
            "",
            "",
            worst_text,
        )
        styles = ("", health, "warn" if ok < n else "", fab_style, job_style, "", "", "", health, worst_style)
        sort = (
            natural_key(self.name),
            HEALTH_RANK.get(health, 0),
            (ok - n, ok),
            fab_sort,
            job_sort,
            natural_key(snap.driver_version or "") if snap else (),
            0,
            0.0,
            self.bad_since if self.bad_since is not None else float("inf"),  # the longest bad first
            (-model.SEVERITY_RANK.get(self.worst.severity, 0), self.worst.check) if self.worst else (1, ""),
        )
        return cells, styles, sort

    @cached_property
    def running_jobs(self) -> list[model.NodeJob] | None:
        """The jobs running on the node by its last good snapshot; None: it has no job records."""
        return jobs_data.running(self.snapshot)

    def gpu_jobs(self, uuid: str) -> list[model.NodeJob] | None:
        """The running jobs on the GPU (whole, or one of its MIG instances); None: not known."""
        gv = self.gpu(uuid)
        return jobs_data.on_gpu(self.running_jobs, uuid, gv.gpu if gv is not None else None)

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
    baseline: Any = None,
) -> NodeEntry:
    """The entry for a node that just answered. ``previous`` lets GPUs that vanished since
    show as lost rather than silently drop out of the count; ``baseline`` (the node's, as its
    findings were judged with) says which RDMA ports are compute ports."""
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
    by_bus = {_bus(g.bus_id): g for g in gpus}
    counts: dict[tuple[str, int], int] = {}
    for ev in snapshot.xids:
        counts[(_bus(ev.bus_id), ev.code)] = counts.get((_bus(ev.bus_id), ev.code), 0) + 1
    escalations = _escalations(found)
    for ev in snapshot.xids:
        xname, sev, action, sxid = _xid_info(ev)
        base = f"{name}:{ev.timestamp or ev.uptime_s or 0}:{ev.code}:{ev.bus_id or ''}"
        n = seen_keys.get(base, 0)
        seen_keys[base] = n + 1
        gv = by_bus.get(_bus(ev.bus_id))
        index = ev.gpu_index if ev.gpu_index is not None else (gv.index if gv is not None else None)
        xids.append(
            XidView(
                f"{base}#{n}" if n else base, ev, ev.code, xname, sev, action, sxid,
                gpu_index=index,
                bus_id=gv.bus_id if gv is not None else ev.bus_id,
                count=counts[(_bus(ev.bus_id), ev.code)],
                escalated=escalations.get((_bus(gv.bus_id if gv else ev.bus_id), ev.code), "-"),
            )
        )  # fmt: skip
    worst_f = next((f for f in found if f.severity not in ("ok", "info")), None)
    hay = _haystack(name, found, snapshot)
    bad_since = None
    if health in FAULT_SEVERITIES:
        kept = previous.bad_since if previous is not None and previous.bad is not False else None
        times = [seen_at, *_evidence_times(snapshot, found)] + ([kept] if kept is not None else [])
        bad_since = min(times)
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
        bad_since=bad_since,
        fabric=fabric_data.view(snapshot, baseline),
    )
    return replace(
        entry, gpu_rows=tuple(_gpu_row(entry, g) for g in entry.gpus), finding_rows=_finding_rows(entry)
    )


def _evidence_times(snapshot: model.Node, findings: Iterable[model.Finding]) -> list[float]:
    """When the node's faults began, where the data says so itself: the kernel's time of each
    XID behind an ``xid.`` fault (its code on its GPU, since that GPU's last reset), and the
    first sample of a throttle the daemon still holds."""
    times: list[float] = []
    resets = {_bus(g.bus_id): g.last_reset_at for g in snapshot.gpus}
    for f in findings:
        if f.severity not in FAULT_SEVERITIES:
            continue
        if f.check == "thermal_power.throttle" and isinstance(f.observed, dict):
            first = f.observed.get("first_seen")
            if isinstance(first, (int, float)) and not isinstance(first, bool):
                times.append(float(first))
        elif f.check.startswith("xid.") and isinstance(f.observed, list):
            codes = {c.get("code") for c in f.observed if isinstance(c, dict)}
            bus = _bus((f.gpu or {}).get("bus_id"))
            after = resets.get(bus) or 0.0
            times += [
                ev.timestamp for ev in snapshot.xids
                if ev.code in codes and _bus(ev.bus_id) == bus and ev.timestamp is not None and ev.timestamp >= after
            ]  # fmt: skip
    return times


def bad_since_shown(old: NodeEntry | None, new: NodeEntry, now: float) -> float | None:
    """``new``'s bad-since as the screen keeps it, given the entry shown before (``old``): a
    bad period goes on through STALE and through every answer that is still bad, whichever
    source built the entry; one that no entry dates (a node that stopped answering) starts
    ``now``, when the screen first sees it."""
    if new.bad is False:
        return None
    times = [t for t in (new.bad_since, old.bad_since if old is not None and old.bad is not False else None) if t is not None]
    if times:
        return min(times)
    return now if new.bad else None


def _bus(bus_id: str | None) -> str:
    """A bus id as one key: the kernel line may drop the function (``0000:ab:00``) and the case
    may differ from NVML's."""
    b = (bus_id or "").lower()
    return b[:-2] if len(b) == 12 and b[-2] == "." else b


def _escalations(findings: Iterable[model.Finding]) -> dict[tuple[str, int], str]:
    """(bus id, code) -> "yes"/"no" from the ``xid.recent`` findings' observed codes: what the
    repeat policy made of each code on each GPU ("-" where no policy covers the code)."""
    out: dict[tuple[str, int], str] = {}
    for f in findings:
        if f.check != "xid.recent" or not isinstance(f.observed, list):
            continue
        bus = _bus((f.gpu or {}).get("bus_id"))
        for c in f.observed:
            if isinstance(c, dict) and isinstance(c.get("escalated"), dict):
                out[(bus, c.get("code", -1))] = "yes" if c["escalated"].get("fired") else "no"
    return out


def _haystack(name: str, findings: Iterable[model.Finding], snapshot: model.Node | None = None) -> str:
    """What the ``/`` filter searches for a node: its name, every finding's check and message, and
    the jobs running on it (``job 1234 alice``: ``/job 1234`` finds its nodes, ``/alice`` a user's)."""
    jobs = [f"job {j.job_id} {j.user or ''}".rstrip() for j in jobs_data.running(snapshot) or []]
    return " ".join([name, *(f"{f.check} {f.message}" for f in findings), *jobs]).lower()


def with_fleet_findings(entry: NodeEntry, fleet: tuple[model.Finding, ...]) -> NodeEntry:
    """``entry`` with ``fleet`` in place of the fleet findings it had: its health, worst finding,
    search text and finding rows judged again with them, as ``summarize`` would have."""
    own = [f for f in entry.findings if not any(f is g for g in entry.fleet_findings)]
    found = tuple(sorted((*own, *fleet), key=_finding_sort))
    health = model.worst(f.severity for f in found)
    hay = _haystack(entry.name, (*found, *((entry.problem,) if entry.problem else ())), entry.snapshot)
    if entry.status != STATUS_OK:
        since = entry.bad_since  # bad for its missing answer, whatever its findings say
    elif health in FAULT_SEVERITIES:
        since = entry.bad_since if entry.bad_since is not None else entry.seen_at
    else:
        since = None
    changed = replace(
        entry, findings=found, fleet_findings=fleet, health=health, haystack=hay, version=entry.version + 1,
        worst=next((f for f in found if f.severity not in ("ok", "info")), None), bad_since=since,
    )
    return replace(changed, finding_rows=_finding_rows(changed))


def mark_failed(name: str, status: str, problem: model.Finding, previous: NodeEntry | None) -> NodeEntry:
    """The node did not give a snapshot: keep its last good state, add the mark and why."""
    base = previous or pending_entry(name)
    # built afresh from the kept findings and this problem: a node marked again and again (a
    # host down for a day, retried every backoff) must not grow its search text each time
    hay = _haystack(name, (*base.findings, problem), base.snapshot)
    # a bad period goes on (the screen dates one that starts here: ``bad_since_shown``)
    since = base.bad_since if base.bad is not False else None
    entry = replace(
        base, status=status, problem=problem, haystack=hay, version=base.version + 1, bad_since=since
    )
    return replace(
        entry, gpu_rows=tuple(_gpu_row(entry, g) for g in entry.gpus), finding_rows=_finding_rows(entry)
    )


def _gpu_row(entry: NodeEntry, g: GpuView) -> Row:
    cells = gpu_cells(g)
    cells["node"] = (entry.name, "", natural_key(entry.name))
    cells["uuid"] = (short_uuid(g.uuid), "", g.uuid)
    cells["jobs"] = jobs_data.cell(jobs_data.on_gpu(entry.running_jobs, g.uuid, g.gpu))
    cols = COLUMNS["gpus"]
    hay = " ".join([entry.name, g.uuid, g.bus_id, *(f"{f.check} {f.message}" for f in g.findings)]).lower()
    if entry.problem:
        hay += f" {entry.problem.check} {entry.problem.message}".lower()
    return make_row(
        f"{entry.name}:{g.uuid}", cells, cols, g.lost or g.health in FAULT_SEVERITIES, hay, entry.name, g.uuid
    )


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
