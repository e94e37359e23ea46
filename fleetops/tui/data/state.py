"""The fleet as the TUI shows it: ``FleetState`` (every node's entry, the view, the sort, the
``Filter``, the ``Totals``) and the node screen's GPU rows."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from fleetops.tui.data import fabric, jobs
from fleetops.tui.data.columns import (
    COLUMNS,
    DETAIL_GPU_COLUMNS,
    DETAIL_XID_COLUMNS,
    FAULT_SEVERITIES,
    HEALTH_RANK,
    STATUS_OK,
    STATUS_PENDING,
    STATUS_STALE,
    VIEWS,
    XID_WINDOW_S,
    Row,
    bad_since_cell,
    column_index,
    format_age,
    gpu_cells,
    health_label,
    make_row,
    natural_key,
    xid_cells,
)
from fleetops.tui.data.entry import NodeEntry, bad_since_shown, pending_entry, with_fleet_findings

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
    unreachable: int = 0  # every node without an answer, HUNG ones included
    hung: int = 0  # of those, HUNG: the host takes connections but answers nothing
    stale: int = 0
    pending: int = 0
    gpus_ok: int = 0
    gpus: int = 0
    xids_1h: int = 0


@dataclass
class ViewState:
    sort_column: str
    reverse: bool = False


DEFAULT_SORT = {"nodes": "node", "gpus": "node", "findings": "severity", "xids": "age", "job": "node"}


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
    # The job filter (``j``): the fleet shows only this job's nodes, and the GPUs view exactly
    # its GPUs (the "job" table); None: no job filter.
    job_id: str | None = None
    # the job table's rows and what they were built from (the job, each of its nodes' entry)
    _job_rows_cache: tuple[tuple[object, ...], list[Row]] | None = field(default=None, repr=False)
    # name -> (entry, XIDs in the window, age text, age style, bad-since text, the row built from them)
    _node_rows: dict[str, tuple[NodeEntry, int, str, str, str, Row]] = field(default_factory=dict, repr=False)

    def set_hosts(self, names: Iterable[str]) -> None:
        for name in names:
            self.entries.setdefault(name, pending_entry(name))

    def update(self, entries: Iterable[NodeEntry]) -> list[str]:
        """Swap in new entries, except one whose snapshot is older than the one shown; returns
        the names whose entry changed."""
        changed = []
        for e in entries:
            old = self.entries.get(e.name)
            if (
                old is not None and old.snapshot is not None and e.snapshot is not None
                and e.status == STATUS_OK and e.snapshot.collected_at < old.snapshot.collected_at
            ):  # fmt: skip
                # an answer that took longer than a later one (a poll begun before an action,
                # delivered after the action's own snapshot): never shown over newer data
                continue
            if old is not e:
                since = bad_since_shown(old, e, self.clock())
                if since != e.bad_since:
                    e = replace(e, bad_since=since)
                self.entries[e.name] = e
                changed.append(e.name)
        if changed:
            changed += [n for n in self._judge_fleet() if n not in changed]
        return changed

    def _judge_fleet(self) -> list[str]:
        """The fleet findings of every entry after a change (a node's port count against its
        peers', as the audit's fleet check judges it); returns the names whose entry changed.
        One pass over the entries, only when some entry changed."""
        found = fabric.fleet_port_counts(
            (e.name, e.fabric) for e in self.entries.values() if e.snapshot is not None
        )
        changed = []
        for name, e in list(self.entries.items()):
            want = found.get(name, ())
            if e.fleet_findings != want:
                self.entries[name] = with_fleet_findings(e, want)
                changed.append(name)
        return changed

    @property
    def table_view(self) -> str:
        """The table the current view draws: the GPUs view under a job filter is the job's table."""
        return "job" if self.view == "gpus" and self.job_id is not None else self.view

    @property
    def jobs_known(self) -> bool:
        """Whether any node's snapshot carries job records: the JOBS columns are shown only then,
        so a fleet without them (cold collects, older agents) looks as it did."""
        return any(e.snapshot is not None and e.snapshot.jobs is not None for e in self.entries.values())

    def job(self, job_id: str | None = None) -> jobs.JobView | None:
        """The job (the filter's, by default) as the nodes' latest snapshots tell it."""
        job_id = self.job_id if job_id is None else job_id
        if job_id is None:
            return None
        return jobs.find(job_id, ((e.name, e.snapshot) for e in self.entries.values()))

    def _job_rows(self, job: jobs.JobView | None) -> list[Row]:
        """The job's GPUs side by side, in node then bus order: a row per (node, GPU)."""
        rows: list[Row] = []
        if job is None:
            return rows
        # the same row objects while nothing they show changed: the table skips them unread
        stamp = (job, *(self.entries.get(n) for n in job.nodes))  # entries held: compared by identity
        cached = self._job_rows_cache
        same = (
            cached is not None and len(cached[0]) == len(stamp) and cached[0][0] == job
            and all(a is b for a, b in zip(cached[0][1:], stamp[1:], strict=True))
        )  # fmt: skip
        if same and cached is not None:
            return list(cached[1])
        cols = COLUMNS["job"]
        for jg in job.gpus:
            e = self.entries.get(jg.node)
            gv = e.gpu(jg.uuid) if e is not None else None
            if e is None or gv is None:  # a device no GPU of the snapshot reports
                cells: dict[str, tuple[str, str, Any]] = {c.key: ("?", "dim", -1) for c in cols}
                cells["check"] = (f"no GPU {jg.uuid} in the snapshot", "unknown", "")
                cells["idx"] = ("?", "dim", -1)
                fault, hay = True, f"{jg.node} {jg.uuid}".lower()
            else:
                cells = gpu_cells(gv)
                g = gv.gpu if not gv.lost else None
                sm = g.clock_sm_mhz if g is not None else None
                cells["sm"] = ("-" if g is None else "n/a" if sm is None else str(sm), "dim" if g is None else "", sm or -1)
                insts = [jobs.mig_instance(gv.gpu, d) for d in jg.mig]
                mig = ",".join(str(m.gpu_instance_id) for m in insts if m is not None)
                cells["mig"] = (f"GI {mig}" if mig else "-", "" if mig else "dim", mig)
                xids = jobs.xids_of(job.job_id, e.snapshot, gv.gpu, gv.uuid, gv.bus_id)
                codes = ",".join(str(c) for c in sorted({x.code for x in xids}))
                cells["xids"] = (f"{len(xids)} ({codes})" if xids else "0", "crit" if xids else "dim", len(xids))
                fault = gv.lost or gv.health in FAULT_SEVERITIES or bool(xids)
                hay = " ".join([e.name, gv.uuid, gv.bus_id, *(f"{f.check} {f.message}" for f in gv.findings)]).lower()
            cells["node"] = (jg.node, "", natural_key(jg.node))
            rows.append(make_row(f"job:{jg.node}:{jg.uuid}", cells, cols, fault, hay, jg.node, jg.uuid))
        self._job_rows_cache = (stamp, rows)
        return list(rows)

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
            h = self.health_at(e, now)
            if h == "unreach":
                t.unreachable += 1
                t.hung += e.status == "timeout"
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

    def health_at(self, e: NodeEntry, now: float) -> str:
        """The entry's health as shown at ``now``: an answer older than ``stale_after`` is
        "stale" the moment it is, whether or not its source has marked it yet (no row and no
        "ok" count shows data older than the threshold as current)."""
        h = e.display_health
        if (
            e.status == STATUS_OK
            and self.stale_after is not None
            and e.seen_at is not None
            and now - e.seen_at > self.stale_after
        ):
            return "stale"
        return h

    # rows of each view, before filtering and sorting

    def _node_row(self, e: NodeEntry, now: float) -> Row:
        xids = e.xids_since(now - XID_WINDOW_S)
        age = None if e.seen_at is None else now - e.seen_at
        seen = format_age(age) if age is not None else "-"
        seen_style = self._seen_style(e, age)
        bad = bad_since_cell(e.bad_since, now)
        cached = self._node_rows.get(e.name)
        if cached is not None and cached[0] is e and cached[1:5] == (xids, seen, seen_style, bad):
            return cached[5]  # the same object: the table skips it without looking inside
        cells, styles, sort = e.node_row_parts
        has_data = e.snapshot is not None
        aged = self.health_at(e, now) == "stale" and e.status == STATUS_OK  # old data its source kept as OK
        health_cell = health_label("stale") if aged else cells[1]
        # NODE HEALTH | GPUS FABRIC JOBS DRIVER | XID/1H SEEN BAD SINCE (the clock's) | WORST FINDING
        cells = (cells[0], health_cell, *cells[2:6], str(xids) if has_data else "-", seen, bad, cells[9])
        styles = (styles[0], "stale" if aged else styles[1], *styles[2:6], "warn" if xids else "dim", seen_style,
                  styles[8], styles[9])  # fmt: skip
        sort = (sort[0], HEALTH_RANK["stale"] if aged else sort[1], *sort[2:6], xids,
                age if age is not None else float("inf"), sort[8], sort[9])  # fmt: skip
        placeholder = e.status == STATUS_PENDING and not has_data
        row = Row(e.name, cells, styles, sort, e.fault or aged, e.haystack, e.name, placeholder=placeholder)
        self._node_rows[e.name] = (e, xids, seen, seen_style, bad, row)
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
        if view == "job":
            return self._job_rows(self.job())
        raise ValueError(f"unknown view {view!r}; views: {', '.join(VIEWS)}")

    def rows(self, view: str | None = None, now: float | None = None) -> list[Row]:
        """The rows of a view as the operator asked to see them: filtered, faults only or
        not, sorted (stable: ties keep inventory order)."""
        view = view or self.table_view
        if view == "gpus" and self.job_id is not None:
            view = "job"
        rows = self.all_rows(view, now)
        if self.job_id is not None and view != "job":  # the job's nodes only
            job = self.job()
            on = set(job.nodes) if job is not None else set()
            rows = [r for r in rows if r.node in on]
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
