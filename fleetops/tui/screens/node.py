"""One node: its GPUs (every health field), its findings with the action each calls for, the
selected GPU in full, charts of the selected GPU's last hour from the node's daemon, its recent
XIDs, its audit history from the store, and its RDMA fabric (a row per port, the fabric findings
under it). Esc goes back."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Footer, Static, TabbedContent, TabPane

from fleetops import model
from fleetops.gpu import instances
from fleetops.report import values
from fleetops.tui import data
from fleetops.tui.refusals import reset_refusal
from fleetops.tui.screens.gates import GatedScreen, note_widget
from fleetops.tui.widgets.charts import GpuCharts, gpu_xids
from fleetops.tui.widgets.fleet_table import STYLES, FleetTable
from fleetops.tui.widgets.summary import SummaryBar

HISTORY_COLUMNS = data.HISTORY_COLUMNS  # with the other tables' columns, which the legend reads


def node_header(entry: data.NodeEntry, now: float) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {entry.name} ", style="bold reverse")
    health = entry.display_health
    t.append(" ")
    t.append(f" {entry.mark or data.health_label(health)} ", style=STYLES.get(health, STYLES[""]))
    age = data.format_age(now - entry.seen_at) if entry.seen_at is not None else "never"
    if entry.status != data.STATUS_OK and entry.snapshot is not None:
        t.append(f"  last good state {age} ago ({data.health_label(entry.health)})", style=STYLES["warn"])
    else:
        t.append(f"  seen {age} ago", style=STYLES["dim"])
    if entry.bad_since is not None:
        bad_style = STYLES.get(entry.health if entry.status == data.STATUS_OK else health, STYLES["warn"])
        t.append(f"  {data.bad_since_text(entry.bad_since, now)}", style=bad_style)
    snap = entry.snapshot
    if entry.problem is not None:
        t.append("\n ")
        t.append(data.fmt_finding(entry.problem), style=STYLES["unknown"])
    if snap is not None:
        t.append("\n ")
        up = data.format_age(snap.uptime_s) if snap.uptime_s is not None else "?"
        t.append(
            f"driver {snap.driver_version or 'n/a'}  CUDA {snap.cuda_driver_version or 'n/a'}  "
            f"kernel {snap.kernel or 'n/a'}  {snap.os or ''}  up {up}  backend {snap.backend}"
        )
        t.append("\n ")
        t.append(
            f"GPUs ok {entry.gpus_ok}/{entry.gpus_total}  XIDs/1h {entry.xids_since(now - data.XID_WINDOW_S)}  "
        )
        fab_text, fab_style, _ = data.fabric.node_cell(entry.fabric, entry.findings)
        t.append("fabric ")
        t.append(fab_text, style=STYLES.get(fab_style, STYLES[""]))
        t.append("  ")
        running = entry.running_jobs
        if running is not None:  # only where the node has job records: a cold collect's reads as before
            t.append("jobs ")
            t.append(", ".join(j.job_id for j in running) or "none", style="bold" if running else STYLES["dim"])
            t.append("  ")
        services = "  ".join(
            f"{k.removeprefix('nvidia-')} {v or 'n/a'}" for k, v in sorted(snap.services.items())
        )
        t.append(services, style=STYLES["dim"])
    return t


def slurm_text(reading: Any, note: str | None = None) -> Text:
    """The node's Slurm lines: State (drained, or draining while jobs still run), the drain's
    owner as the catalog's rule reads the Reason (kind, run), who set the Reason and when
    (slurmctld's stamp), then the Reason itself; or why it is not a Slurm node, or why Slurm was
    not read. ``reading``: an ``ops.slurm.NodeReading``, None with ``note`` while none is."""
    t = Text(" ")
    t.append("Slurm ", style="bold")
    if reading is None:
        t.append(note or "reading ...", style=STYLES["dim"])
        return t
    if not reading.managed:
        t.append(f"not a Slurm node ({reading.problem})", style=STYLES["dim"])
        return t
    if reading.problem is not None or reading.state is None:
        t.append(f"not read: {reading.problem or 'scontrol gave no State'}", style=STYLES["unknown"])
        return t
    drained = reading.drained
    t.append(reading.state, style=STYLES["warn"] if drained or "DOWN" in reading.state else "")
    if reading.draining:
        t.append(" (draining: jobs still run)", style=STYLES["warn"])
    elif drained:
        t.append(" (drained)", style=STYLES["warn"])
    owner = reading.owner
    if owner is not None:
        if not owner.ours:
            t.append("  owner: not fleetops")
        else:
            t.append(f"  owner: {owner.kind}")
            t.append(f", run {owner.run}" if owner.run else (" (before owners were recorded)" if owner.legacy else ""))
    if reading.reason:
        t.append("\n ")
        t.append("Reason ", style="bold")
        t.append(reading.reason)
    if reading.set_by or reading.set_at:
        t.append(f"  (set by {reading.set_by or '?'}" + (f" at {reading.set_at})" if reading.set_at else ")"), style=STYLES["dim"])
    return t


def _finding_lines(t: Text, findings: Any, at: float | None) -> None:
    """``at``: when the snapshot was taken, the clock an XID finding's age is read against."""
    for f in findings:
        t.append(f"{f.severity.upper():7}", style=STYLES.get(f.severity, STYLES[""]))
        t.append(f.check, style="bold")
        t.append(f"  {f.message}\n")
        shown = values.values_text(f, at)
        if shown is not None:
            t.append(f"       {shown}\n", style="dim")
        if f.action:
            t.append(f"       -> {f.action}\n", style="italic")


def _taken_at(entry: data.NodeEntry) -> float | None:
    return entry.snapshot.collected_at if entry.snapshot is not None and entry.snapshot.collected_at else None


def findings_text(entry: data.NodeEntry) -> Text:
    """Every finding in full (messages and actions are too long for table cells)."""
    t = Text()
    if not entry.all_findings:
        t.append("no findings" if entry.snapshot is not None else "no data yet", style="dim")
        return t
    _finding_lines(t, entry.all_findings, _taken_at(entry))
    return t


def fabric_text(entry: data.NodeEntry) -> Text:
    """Under the ports: why there are none, each field the agent could not read with its reason,
    and the node's fabric findings with their actions."""
    fv = entry.fabric
    t = Text()
    if entry.snapshot is None:
        t.append("no data yet", style="dim")
        return t
    if not fv.known or not fv.readable:
        t.append(f"fabric {'not read' if not fv.readable else 'not reported'}: {fv.note}\n", style=STYLES["unknown"])
    elif not fv.ports:
        t.append(f"{fv.note or 'no RDMA port'}\n", style="dim")
    else:
        # of those expected, as the FABRIC column counts them (the baseline's or the fleet's number)
        want = data.fabric.expected_ports(fv, entry.findings)
        t.append(f"compute ports {fv.active}/{want} active; {len(fv.ports) - len(fv.compute)} other\n", style="bold")
    missing = data.fabric.unavailable_lines(fv)
    if missing:
        t.append("unavailable (n/a in the table), with the reason\n", style="bold")
        for line in missing:
            t.append(f"  {line}\n", style=STYLES["unknown"])
    found = data.fabric.fabric_findings(entry.findings)
    if found:
        t.append("\n")
        _finding_lines(t, found, _taken_at(entry))
    elif fv.known and fv.readable:
        t.append("no fabric findings\n", style="dim")
    return t


def gpu_detail(entry: data.NodeEntry, uuid: str | None) -> Text:
    gv = entry.gpu(uuid) if uuid else None
    if gv is None:
        return Text("no GPU selected", style="dim")
    t = Text()
    t.append(f"GPU {gv.index}  {gv.uuid}  bus {gv.bus_id}", style="bold")
    if gv.lost:
        t.append("  LOST: NVML answers GpuIsLost (fallen off the bus); it keeps its index until a reboot "
                 "(last known values below)", style=STYLES["crit"])
    refusal = reset_refusal(entry, gv.uuid)
    if refusal:
        t.append(f"\nr Reset GPU: disabled: {refusal}", style=STYLES["warn"])
    g = gv.gpu
    if g is not None:

        def n(v: Any, unit: str = "") -> str:
            return "n/a" if v is None else f"{v}{unit}"

        t.append(
            f"\n{g.name or '?'}  serial {n(g.serial)}  VBIOS {n(g.vbios_version)}  InfoROM {n(g.inforom_image)}  GSP {n(g.gsp_firmware)}"
        )
        t.append(
            f"\npower {n(g.power_draw_w, 'W')} / limit {n(g.power_limit_w, 'W')} (default {n(g.power_default_limit_w, 'W')},"
            f" enforced {n(g.power_enforced_limit_w, 'W')})   persistence {n(g.persistence_mode)}   compute {n(g.compute_mode)}"
        )
        t.append(
            f"\ntemp GPU {n(g.temp_gpu_c, 'C')} HBM {n(g.temp_memory_c, 'C')} (slowdown {n(g.temp_slowdown_c, 'C')}, shutdown {n(g.temp_shutdown_c, 'C')})"
            f"   clocks SM {n(g.clock_sm_mhz)}/{n(g.clock_sm_max_mhz)} MHz, mem {n(g.clock_mem_mhz)}/{n(g.clock_mem_max_mhz)} MHz"
        )
        t.append(f"   throttle {', '.join(g.clocks_event_reasons or []) or '-'}")
        t.append(
            f"\nECC volatile corr {n(g.ecc_corrected_volatile)} uncorr {n(g.ecc_uncorrected_volatile)}; aggregate corr {n(g.ecc_corrected_aggregate)}"
            f" uncorr {n(g.ecc_uncorrected_aggregate)}   remapped rows corr {n(g.remapped_rows_corrected)} uncorr {n(g.remapped_rows_uncorrected)}"
            f" pending {n(g.remapped_rows_pending)} failure {n(g.remapped_rows_failure)}   retired pages sbe {n(g.retired_pages_sbe)} dbe {n(g.retired_pages_dbe)}"
        )
        t.append(
            f"\nPCIe gen {n(g.pcie_gen_current)}/{n(g.pcie_gen_max)} width x{n(g.pcie_width_current)}/x{n(g.pcie_width_max)} replays {n(g.pcie_replay_counter)}"
        )
        if g.nvlinks is None:
            t.append(f"   NVLink n/a ({g.unavailable.get('nvlinks', 'not reported')})")
        elif g.mig_mode_current:
            t.append("   NVLink unused in MIG mode (NVML reports the links down; not a fault)", style="dim")
        else:
            down = [str(link.link) for link in g.nvlinks if link.state != "up"]
            crc = sum(link.crc_errors or 0 for link in g.nvlinks)
            t.append(
                f"   NVLink {g.nvlinks_up}/{len(g.nvlinks)} up"
                + (f", down: {','.join(down)}" if down else "")
                + f", CRC {crc}"
            )
        t.append(f"   fabric {n(g.fabric_state)}/{n(g.fabric_status)}   recovery {n(g.recovery_action)}")
        _mig_lines(t, g)
    _job_lines(t, entry, gv)
    if gv.findings:
        t.append("\n\n")
        _finding_lines(t, gv.findings, _taken_at(entry))
    return t


def _job_lines(t: Text, entry: data.NodeEntry, gv: data.GpuView) -> None:
    """The jobs on the GPU (running, then those ended within the daemon's window) and the XIDs
    on it with the jobs each hit (``XidEvent.jobs``); only where the node's snapshot has job
    records (a cold collect has none: the tab reads as it did)."""
    snap = entry.snapshot
    if snap is None or snap.jobs is None:
        return
    now = snap.collected_at or time.time()
    on = data.jobs.on_gpu(snap.jobs, gv.uuid, gv.gpu) or []
    on.sort(key=lambda j: (j.ended_at is not None, data.jobs.job_order(j.job_id)))
    running = [j for j in on if j.ended_at is None]
    t.append(f"\njobs {len(running)} running" + (f", {len(on) - len(running)} ended within the hour" if len(on) > len(running) else ""))
    for j in on:
        t.append(f"\n  {data.jobs.job_line(j, now, gv.gpu)}", style="dim" if j.ended_at is not None else "")
    bus = data.jobs.bus_key(gv.bus_id)
    xids = [ev for ev in snap.xids if ev.gpu_uuid == gv.uuid or data.jobs.bus_key(ev.bus_id) == bus]
    if xids:
        t.append(f"\nXIDs on this GPU {len(xids)}, with the jobs each hit")
        for ev in sorted(xids, key=lambda e: e.timestamp or 0.0, reverse=True):
            when = time.strftime("%H:%M:%S", time.gmtime(ev.timestamp)) + " UTC" if ev.timestamp is not None else "?"
            hit = "jobs not attributed" if ev.jobs is None else ("no job" if not ev.jobs else "job " + ", ".join(ev.jobs))
            t.append(f"\n  {when}  XID {ev.code}  ")
            t.append(hit, style=STYLES["warn"] if ev.jobs else "dim")


def _process_text(p: model.GpuProcess, mig: bool = False) -> str:
    """PID, command name, GPU memory, user, and under MIG the instance the driver places it in."""
    text = f"pid {p.pid} {p.name or '?'} {'n/a' if p.used_memory_mib is None else f'{p.used_memory_mib} MiB'}"
    text += f"  user {p.user or 'n/a'}"
    if mig:
        gi = "-" if p.gpu_instance_id is None else p.gpu_instance_id
        ci = "-" if p.compute_instance_id is None else p.compute_instance_id
        text += f"  GI {gi} CI {ci}"
    return text


def _mig_lines(t: Text, g: model.Gpu) -> None:
    """MIG mode, then each instance (profile, GPU/compute instance ids, UUID) with the processes
    the driver places in it, then the GPU's other processes: the incident question on a split
    GPU is which tenant's instance a process belongs to."""
    mig = "n/a" if g.mig_mode_current is None else ("on" if g.mig_mode_current else "off")
    pending = ""
    if g.mig_mode_pending is not None and g.mig_mode_pending != g.mig_mode_current:
        pending = f" (pending {'on' if g.mig_mode_pending else 'off'}: applied at the next GPU reset)"
    procs = list(g.processes or [])
    if g.mig_instances is None:
        reason = g.unavailable.get("mig_instances")
        t.append(f"\nMIG {mig}{pending}" + (f"   instances n/a ({reason})" if g.mig_mode_current and reason else ""))
    else:
        t.append(f"\nMIG {mig}{pending}   {len(g.mig_instances)} instance(s)")
        entry = instances.gpu_table(model.to_dict(g)) or {"instances": []}
        by_pid = {p.pid: p for p in procs}
        shown: set[int] = set()
        for inst, row in zip(g.mig_instances, entry["instances"], strict=True):
            ci = "-" if inst.compute_instance_id is None else str(inst.compute_instance_id)
            t.append(f"\n  GI {inst.gpu_instance_id:<2} CI {ci:<2} {inst.profile or '?':<9} {inst.uuid or 'no compute instance'}")
            pids: list[int] = row["pids"]
            if not pids:
                t.append("  in use (processes not visible)" if inst.in_use else "  idle", style="dim")
            for pid in pids:
                shown.add(pid)
                t.append(f"\n      {_process_text(by_pid[pid], mig=True)}")
        procs = [p for p in procs if p.pid not in shown]
    t.append(f"\nprocesses {len(g.processes or [])}" + (" (outside the instances above)" if g.mig_instances and procs else ""))
    for p in procs:
        t.append(f"\n  {_process_text(p, mig=bool(g.mig_mode_current))}")


class NodeScreen(GatedScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("a", "reaudit", "Re-audit"),
        Binding("r", "reset", "Reset GPU"),
        Binding("d", "drain", "Drain"),
        Binding("u", "resume", "Resume"),
        Binding("c", "copy_command", "Copy cmd"),
        Binding("C", "copy_command('node')", "Copy drain cmd", show=False),
        Binding("1", "tab('tab-findings')", "Findings", show=False),
        Binding("2", "tab('tab-gpu')", "GPU", show=False),
        Binding("3", "tab('tab-xids')", "XIDs", show=False),
        Binding("4", "tab('tab-history')", "History", show=False),
        Binding("5", "tab('tab-charts')", "Charts", show=False),
        Binding("6", "tab('tab-fabric')", "Fabric", show=False),
    ]
    CHARTS_REFRESH_S = 10.0

    def __init__(self, name: str, select_gpu: str | None = None) -> None:
        super().__init__()
        self.node = name
        self.select_gpu = select_gpu
        self.stale = False
        self.ready = False  # set once mounted: data may arrive between push and mount
        self.charts_for: str | None = None  # the GPU the charts show (or are being fetched for)
        self.charts_live = False
        self.slurm: Any = None  # the node as Slurm showed it (ops.slurm.NodeReading), once read
        self.slurm_note: str | None = None  # what the header says while there is none

    @property
    def state(self) -> data.FleetState:
        return self.app.state  # type: ignore[attr-defined, no-any-return]

    @property
    def entry(self) -> data.NodeEntry:
        return self.state.entries.get(self.node) or data.pending_entry(self.node)

    def compose(self) -> ComposeResult:
        yield SummaryBar(id="summary")
        yield Static(id="node-header")
        yield Static(id="node-slurm")
        yield FleetTable(data.DETAIL_GPU_COLUMNS, id="node-gpus", highlight_s=self.app.highlight_s)  # type: ignore[attr-defined]
        with TabbedContent(id="node-tabs"):
            with TabPane("Findings", id="tab-findings"), VerticalScroll():
                yield Static(id="node-findings")
            with TabPane("GPU", id="tab-gpu"), VerticalScroll():
                yield Static(id="node-gpu-detail")
            with TabPane("XIDs", id="tab-xids"):
                yield FleetTable(data.DETAIL_XID_COLUMNS, id="node-xids", highlight_s=0)
            with TabPane("History", id="tab-history"):
                yield FleetTable(HISTORY_COLUMNS, id="node-history", highlight_s=0)
            with TabPane("Charts", id="tab-charts"), VerticalScroll():
                yield GpuCharts(id="node-charts")
            with TabPane("Fabric", id="tab-fabric"), Vertical():
                yield FleetTable(data.DETAIL_FABRIC_COLUMNS, id="node-fabric", highlight_s=0)
                with VerticalScroll(id="node-fabric-notes"):
                    yield Static(id="node-fabric-text")
        yield note_widget()
        yield Footer()

    # what refresh_data writes to: the tab panes' contents are mounted by the panes themselves, and
    # under load the screen's Mount can come before the deepest of them is in the DOM
    FILLED = ("#node-findings", "#node-gpu-detail", "#node-xids", "#node-history", "#node-charts",
              "#node-fabric", "#node-fabric-text")

    def on_mount(self) -> None:
        self._start()

    def _start(self) -> None:
        if not all(self.query(selector) for selector in self.FILLED):
            self.set_timer(0.05, self._start)  # again once the panes have mounted what they hold
            return
        self.query_one("#node-gpus", FleetTable).border_title = f" {self.node}: GPUs "
        self.ready = True
        self.refresh_data(None)
        gpus = self.query_one("#node-gpus", FleetTable)
        if self.select_gpu:
            gpus.select_key(self.select_gpu)
        gpus.focus()
        self.load_history()
        self.load_slurm()
        self.charts_live = True
        self.load_charts()
        self.set_interval(self.CHARTS_REFRESH_S, self.load_charts)

    def on_screen_resume(self) -> None:
        if self.ready:
            self.load_history()
        if self.stale:
            self.stale = False
            self.refresh_data(None)

    def refresh_data(self, changed: list[str] | None) -> None:
        if not self.ready or (changed is not None and self.node not in changed):
            return
        entry, now = self.entry, self.state.clock()
        self.query_one(SummaryBar).show(self.state, self.app)
        self.query_one("#node-header", Static).update(node_header(entry, now))
        self.query_one("#node-slurm", Static).update(slurm_text(self.slurm, self.slurm_note))
        self.query_one("#node-gpus", FleetTable).apply(data.detail_gpu_rows(entry))
        self.query_one("#node-findings", Static).update(findings_text(entry))
        xids = self.query_one("#node-xids", FleetTable)
        # the XIDs' JOBS only where the node has job records: a cold collect's table reads as it did
        xids.set_hidden(() if entry.snapshot is not None and entry.snapshot.jobs is not None else ("jobs",))
        xids.apply(self.state.detail_xid_rows(self.node, now))
        self.query_one("#node-fabric", FleetTable).apply(
            data.fabric.port_rows(entry.snapshot, entry.fabric, entry.findings)
        )
        self.query_one("#node-fabric-text", Static).update(fabric_text(entry))
        self._show_gpu()

    def _show_gpu(self) -> None:
        key = self.query_one("#node-gpus", FleetTable).cursor_key
        self.query_one("#node-gpu-detail", Static).update(gpu_detail(self.entry, key))
        self.selection_moved()  # the disabled actions of this GPU and node, and why
        if self.charts_live and key != self.charts_for:
            self.load_charts()

    def on_fleet_table_row_highlighted(self, event: FleetTable.RowHighlighted) -> None:
        if event.table.id == "node-gpus" and self.ready:
            self._show_gpu()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "tab-history":  # the store as it is now: audits written since count
            self.load_history()

    @work(thread=True, exclusive=True, group="history", exit_on_error=False)
    def load_history(self) -> None:
        store = getattr(self.app, "store", None)
        opened = None
        if store is None:
            # no database when the TUI started: the path its drains go to (--db, or the default)
            # may have one by now, written by an audit since
            path = getattr(getattr(self.app, "source", None), "drain_db", None)
            if isinstance(path, str) and os.path.exists(path):
                from fleetops.fleet.store.database import Store
                from fleetops.fleet.store.layout import StoreError

                try:
                    store = opened = Store(path)
                except StoreError as exc:
                    self.app.from_worker(self._history_show, [_note_row(str(exc))])  # type: ignore[attr-defined]
                    return
        try:
            if store is None:
                rows = [_note_row("no history database (fleetops tui --db PATH, or run fleetops audit first)")]
            else:
                try:
                    rows = history_rows(store, self.node)
                except sqlite3.Error as exc:
                    rows = [_note_row(f"cannot read history: {exc}")]
        finally:
            if opened is not None:
                opened.close()
        self.app.from_worker(self._history_show, rows)  # type: ignore[attr-defined]

    def _history_show(self, rows: list[data.Row]) -> None:
        if self.is_running:  # not popped (or the app quit) while the store was read
            self.query_one("#node-history", FleetTable).apply(rows)

    def load_slurm(self) -> None:
        """Read the node's Slurm State and Reason off the UI thread (scontrol, maybe over SSH):
        when the screen opens, and after a drain or resume from this TUI (``FleetApp``)."""
        source = getattr(self.app, "source", None)
        if source is None or not hasattr(source, "slurm_node"):
            self._slurm_show(None, "not read: no live source to ask Slurm through")
            return
        if self.slurm is None:
            self._slurm_show(None, "reading ...")
        self._read_slurm(source)

    @work(thread=True, exclusive=True, group="slurm", exit_on_error=False)
    def _read_slurm(self, source: Any) -> None:
        try:
            reading, note = source.slurm_node(self.node), None
        except Exception as exc:  # noqa: BLE001 - a header line says it; the screen goes on
            reading, note = None, f"not read: {type(exc).__name__}: {exc}"
        self.app.from_worker(self._slurm_show, reading, note)  # type: ignore[attr-defined]

    def show_slurm(self, reading: Any) -> None:
        """A reading made elsewhere (the app's, after a drain or resume from here)."""
        self._slurm_show(reading, None)

    def _slurm_show(self, reading: Any, note: str | None) -> None:
        self.slurm, self.slurm_note = reading, note
        if self.ready and self.is_running:
            self.query_one("#node-slurm", Static).update(slurm_text(reading, note))

    def load_charts(self) -> None:
        """Ask for the selected GPU's history off the UI thread (SSH takes its time)."""
        key = self.query_one("#node-gpus", FleetTable).cursor_key
        self.charts_for = key
        charts = self.query_one("#node-charts", GpuCharts)
        source = getattr(self.app, "source", None)
        if key is None:
            charts.show_message("no GPU selected", style="dim")
        elif source is None or not hasattr(source, "gpu_history"):
            charts.show_message("no live source: charts come from the node's fleetops-agent daemon", style="dim")
        else:
            self._fetch_charts(source, key)

    @work(thread=True, exclusive=True, group="charts", exit_on_error=False)
    def _fetch_charts(self, source: Any, uuid: str) -> None:
        from fleetops.agent.serve.history_cli import HistoryError

        gv = self.entry.gpu(uuid)
        label = f"GPU {gv.index} {uuid}" if gv is not None else uuid
        try:
            history = source.gpu_history(self.node, uuid)
        except HistoryError as exc:
            if exc.kind == "no-daemon":
                text = f"no fleetops-agent daemon on {self.node}: no history to chart (start it with fleetops-agent serve)"
            else:
                text = f"history of {label} unavailable: {exc}"
            self.app.from_worker(self._charts_message, uuid, text)  # type: ignore[attr-defined]
            return
        self.app.from_worker(self._charts_show, uuid, f"{label}: daemon history", history)  # type: ignore[attr-defined]

    def _charts_show(self, uuid: str, title: str, history: dict[str, list[tuple[float, float | None]]]) -> None:
        """The history against the node's latest snapshot: the GPU's thresholds (a lost GPU's
        last known) and its XIDs, by UUID or bus id."""
        if uuid == self.charts_for and self.is_running:
            entry = self.entry
            gv = entry.gpu(uuid)
            xids = gpu_xids(entry.xids, uuid, gv.bus_id if gv is not None else None)
            self.query_one("#node-charts", GpuCharts).show(
                title, history, gv.gpu if gv is not None else None, xids, self.state.clock()
            )

    def _charts_message(self, uuid: str, text: str) -> None:
        if uuid == self.charts_for and self.is_running:
            self.query_one("#node-charts", GpuCharts).show_message(text)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.gate(action)  # None: shown disabled, the reason above the footer (read-only too)

    def selection(self) -> tuple[str | None, str | None]:
        key = self.query_one("#node-gpus", FleetTable).cursor_key if self.ready else None
        return self.node, key

    def on_key(self, event: events.Key) -> None:
        self.press_disabled(event)  # a disabled action's key says why at once

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_reaudit(self) -> None:
        self.app.request_reaudit(self.node)  # type: ignore[attr-defined]

    def action_reset(self) -> None:
        key = self.query_one("#node-gpus", FleetTable).cursor_key
        if not key:
            self.notify("no GPU selected", severity="warning")
            return
        self.app.request_reset(self.node, key)  # type: ignore[attr-defined]

    def action_drain(self) -> None:
        self.app.request_drain(self.node)  # type: ignore[attr-defined]

    def action_copy_command(self, what: str = "selected") -> None:
        """``c``: the command for the GPU under the cursor (``fleetops reset``; the node's drain
        where the GPU cannot be reset); ``C``: the node's drain."""
        from fleetops.tui import commands

        key = self.query_one("#node-gpus", FleetTable).cursor_key if what == "selected" else None
        inventory = getattr(self.app, "inventory", None)
        self.app.copy_command(*commands.for_selection(self.entry, key, inventory))  # type: ignore[attr-defined]

    def action_resume(self) -> None:
        self.app.request_resume(self.node)  # type: ignore[attr-defined]


def _note_row(text: str) -> data.Row:
    return data.Row("note", ("", "", "", "", "", text), ("", "", "", "", "", "dim"), ("",) * 6, False, "")


def escalation_rows(store: Any, node: str, now: float | None = None) -> list[data.Row]:
    """The node's faults that survived reboots or GPU resets (``fleet.escalation``, the default
    policy over its lookback), above its audits: read-only, what ``fleetops remediate`` weighs."""
    from fleetops.fleet import escalation

    policy = escalation.Policy()
    since = (time.time() if now is None else now) - (policy.lookback_s or 0.0)
    result = escalation.analyse(store.timelines([node], since), policy)
    rows = []
    for h in result.for_node(node):
        if not (h.reboots or h.resets):
            continue
        where = f"GPU {h.gpu.get('index')} " if h.gpu else ""
        note = f"{where}{h.fault}: {h.text(policy)}" + ("" if h.current else " (not seen in the latest audit)")
        sev = "crit" if h.escalated(policy) and h.current else "warn"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.first_seen))
        rows.append(
            data.Row(
                f"esc:{(h.gpu or {}).get('uuid') or ''}:{h.fault}",
                ("esc", when, "", "INSPECT" if sev == "crit" else "", str(len(h.reboots) + len(h.resets)), note),
                ("dim", "", "", sev, sev, ""),
                (0, h.first_seen, True, sev, len(h.reboots) + len(h.resets), note),
                True,
                note.lower(),
                node,
            )
        )
    return rows


def history_rows(store: Any, node: str, limit: int = 20) -> list[data.Row]:
    rows = escalation_rows(store, node) if hasattr(store, "timelines") else []
    for audit_id, started, reached, error in store.node_history(node, limit):
        found = [f for f in store.findings(audit_id, node) if f.severity != "ok"]
        worst = model.worst(f.severity for f in found)
        faults = sum(1 for f in found if f.severity in data.FAULT_SEVERITIES)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        top = next((f for f in sorted(found, key=lambda f: -model.SEVERITY_RANK.get(f.severity, 0))), None)
        note = error or (data.fmt_finding(top) if top else "")
        rows.append(
            data.Row(
                f"audit:{audit_id}",
                (f"#{audit_id}", when, "yes" if reached else "NO", worst.upper(), str(faults), note),
                ("", "", "" if reached else "unreach", worst, "warn" if faults else "dim", ""),
                (audit_id, started, reached, worst, faults, note),
                faults > 0,
                note.lower(),
                node,
            )
        )
    return rows or [_note_row(f"no audits of {node} in the history database")]
