"""The fabric in the TUI: the nodes view's FABRIC column (compute ports active / expected, the
row's health the fabric finding's) and the node screen's Fabric tab (a row per port with its
state, rate, role and counters, fields the agent could not read with their reason, the fabric
findings with their actions): fed snapshots from the simulator with ``ib-*`` faults injected,
and once over real SSH against a simulated fleet."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any

import pytest
from textual.widgets import Static

from fleetops.baseline import load as baseline_load
from fleetops.fabric import sysfs
from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import data, simfeed
from fleetops.tui.screens import help as help_screen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.widgets.fleet_table import PADDING, FleetTable

from .conftest import NAMES, drive, fed_app, fed_entries, screen_lines, wait_for
from .test_live import NODES, all_seen, fleet_table, live_app, sim_fleet  # noqa: F401 - the fleet fixture

FAULTS = {"node002": ["ib-port-down@3", "ib-degraded@5"], "node003": ["ecc-dbe@3"]}


def entries_with_unreadable(tmp: str) -> list[data.NodeEntry]:
    """The fed fleet, node002's fabric read by the agent's own sysfs reader from the simulator's
    tree of that node, where mlx5_2's symbol_error counter cannot be read (a directory in its
    place) and mlx5_6's port_rcv_errors is not there at all."""
    entries = fed_entries(FAULTS)
    i = NAMES.index("node002")
    state = simfeed.sim_state("node002", FAULTS["node002"])
    path = os.path.join(tmp, "node002.json")
    sim.sync_fabric_tree(path, state, simfeed.T0)
    root = sim.fabric_sys_root(path)
    counters = os.path.join(root, sysfs.CLASS_DIR, "{}", "ports", "1", "counters", "{}")
    os.unlink(counters.format("mlx5_2", "symbol_error"))
    os.mkdir(counters.format("mlx5_2", "symbol_error"))
    os.unlink(counters.format("mlx5_6", "port_rcv_errors"))
    snap = copy.deepcopy(entries[i].snapshot)
    assert snap is not None
    snap.fabric = sysfs.read(root, [g.bus_id for g in snap.gpus], now=simfeed.T0)
    entries[i] = data.summarize("node002", snap, simfeed.findings(snap), simfeed.T0)
    return entries


def cells(table: FleetTable, key: str) -> dict[str, str]:
    row = table.row(key)
    assert row is not None, key
    return dict(zip((c.key for c in table.spec), row.cells, strict=True))


def styles(table: FleetTable, key: str) -> dict[str, str]:
    row = table.row(key)
    assert row is not None, key
    return dict(zip((c.key for c in table.spec), row.styles, strict=True))


def test_fabric_column_counts_active_compute_ports_and_the_row_takes_the_findings_health(tmp_path: Any) -> None:
    app = fed_app()
    entries = entries_with_unreadable(str(tmp_path))

    async def body(pilot: Any) -> None:
        table = app.screen.table()
        row, style = cells(table, "node002"), styles(table, "node002")
        assert (row["fabric"], style["fabric"]) == ("IB 7/8", "crit")
        assert row["health"] == "CRIT" and style["health"] == "crit"
        assert row["worst"].startswith("fabric.port_down: compute port mlx5_3 port 1 (ibp94s0, 0000:5e:00.0) is 1: DOWN")
        # a healthy node: its 8 compute ports (the Ethernet management port is not one)
        assert (cells(table, "node001")["fabric"], styles(table, "node001")["fabric"]) == ("IB 8/8", "")
        # a GPU fault leaves the fabric cell as it is
        assert (cells(table, "node003")["fabric"], cells(table, "node003")["health"]) == ("IB 8/8", "CRIT")
        assert any(line.lstrip("│ ").startswith("NODE") and " FABRIC " in line for line in screen_lines(app))
        await pilot.press("F")  # Shift+F sorts by it: the node short of a port first
        await pilot.pause()
        assert table.keys[0] == "node002"

    drive(app, body, entries)


def test_fabric_cell_without_a_fabric_section_or_without_rdma_devices() -> None:
    entry = fed_entries({"node001": []})[0]
    snap = copy.deepcopy(entry.snapshot)
    assert snap is not None and snap.fabric is not None
    snap.fabric = None  # an agent older than the fabric
    old = data.summarize("node001", snap, [], simfeed.T0)
    assert old.node_row_parts[0][3] == "-"
    none = copy.deepcopy(snap)
    none.fabric = sysfs.read("/nonexistent-sysfs-root", [])
    bare = data.summarize("node001", none, [], simfeed.T0)
    assert bare.node_row_parts[0][3] == "none"
    assert data.fabric.port_rows(none, bare.fabric, []) == []


def test_fabric_cell_where_the_device_class_could_not_be_listed() -> None:
    entry = fed_entries({"node001": []})[0]
    snap = copy.deepcopy(entry.snapshot)
    assert snap is not None and snap.fabric is not None
    snap.fabric.hcas, snap.fabric.unavailable = None, {"hcas": "/sys/class/infiniband: unreadable: Permission denied"}
    e = data.summarize("node001", snap, simfeed.findings(snap), simfeed.T0)
    assert e.node_row_parts[0][3] == "n/a" and e.node_row_parts[1][3] == "unknown"


def _judged(faults: list[str], baseline: Any) -> data.NodeEntry:
    snap = simfeed.snapshot(simfeed.sim_state("node004", faults))
    return data.summarize("node004", snap, simfeed.findings(snap, baseline), simfeed.T0, baseline=baseline)


def test_a_missing_hca_counts_against_the_baselines_compute_ports() -> None:
    pinned = baseline_load.from_mapping({"fabric": {"compute_ports": 8, "exclude_devices": ["mlx5_8"]}}, "test")
    e = _judged(["ib-missing-hca@2"], pinned)
    assert e.node_row_parts[0][3] == "IB 7/8" and e.node_row_parts[1][3] == "crit"
    assert [f.check for f in e.findings if f.severity == "crit"] == ["fabric.port_count"]
    rows = data.fabric.port_rows(e.snapshot, e.fabric, e.findings)
    assert [r.key for r in rows] == [f"mlx5_{i}/1" for i in (0, 1, 3, 4, 5, 6, 7, 8)]
    # without a number to expect, the count is of the ports there (the missing HCA's GPU warns)
    alone = _judged(["ib-missing-hca@2"], None)
    assert (alone.node_row_parts[0][3], alone.node_row_parts[1][3]) == ("IB 7/7", "warn")
    assert [f.check for f in alone.findings if f.severity == "warn"] == ["fabric.gpu_without_hca"]


SHORT = "7 compute ports on node004, the fleet's majority has 8 (11 of 12 nodes)"


def test_without_a_baseline_a_node_missing_an_hca_reads_7_of_its_peers_8_and_is_flagged() -> None:
    """The audit's fleet check of the port count, in the TUI: node004 lost mlx5_2, its peers have
    8 compute ports; alone it would read IB 7/7 (test above)."""
    app = fed_app()
    entries = fed_entries({"node004": ["ib-missing-hca@2"]})

    async def body(pilot: Any) -> None:
        table = app.screen.table()
        row, style = cells(table, "node004"), styles(table, "node004")
        assert (row["fabric"], style["fabric"]) == ("IB 7/8", "crit")
        assert (row["health"], style["health"]) == ("WARN", "warn")
        assert row["worst"].startswith(f"fabric.port_count: {SHORT}")
        assert [(n, cells(table, n)["fabric"], styles(table, n)["fabric"]) for n in ("node001", "node012")] == [
            ("node001", "IB 8/8", ""), ("node012", "IB 8/8", "")]
        e = app.state.entries["node004"]
        assert [(f.check, f.severity, f.observed, f.expected) for f in e.fleet_findings] == [
            ("fabric.port_count", "warn", {"compute_ports": 7}, 8)]
        assert sorted(f.check for f in e.findings if f.severity == "warn") == [
            "fabric.gpu_without_hca", "fabric.port_count"]
        table.select_key("node004")
        await pilot.press("enter", "6")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        assert "fabric IB 7/8  " in str(screen.query_one("#node-header", Static).render())
        text = str(screen.query_one("#node-fabric-text", Static).render())
        assert "compute ports 7/8 active; 1 other" in text
        assert f"fabric.port_count  {SHORT}" in text
        # mlx5_2 comes back: the node reads 8/8 again, its fleet finding gone
        app.feed([simfeed.entry("node004", (), simfeed.T0 + 2, previous=e)])
        await pilot.pause()
        back = app.state.entries["node004"]
        assert (back.fleet_findings, back.health) == ((), "ok")
        assert "compute ports 8/8 active; 1 other" in str(screen.query_one("#node-fabric-text", Static).render())
        await pilot.press("escape")
        await pilot.pause()
        assert (cells(app.screen.table(), "node004")["fabric"], cells(app.screen.table(), "node004")["health"]) == (
            "IB 8/8", "OK")

    drive(app, body, entries, size=(200, 60))


def _under(name: str, base: Any) -> data.NodeEntry:
    snap = simfeed.snapshot(simfeed.sim_state(name))
    return data.summarize(name, snap, simfeed.findings(snap, base), simfeed.T0, baseline=base)


def test_the_port_count_is_compared_within_the_nodes_of_one_baseline_as_the_audit_groups_them() -> None:
    """Nine nodes without a baseline (8 compute ports), three under one that excludes mlx5_0 (7
    each: none short among their own), one whose baseline pins 8 (judged by its own check)."""
    storage = baseline_load.from_mapping({"fabric": {"exclude_devices": ["mlx5_0", "mlx5_8"]}}, "storage")
    pinned = baseline_load.from_mapping({"fabric": {"compute_ports": 8, "exclude_devices": ["mlx5_8"]}}, "pinned")
    state = data.FleetState()
    names = [f"node{i:03d}" for i in range(1, 14)]
    entries = [_under(n, None) for n in names[:9]] + [_under(n, storage) for n in names[9:12]]
    entries.append(_under(names[12], pinned))
    state.update(entries)
    assert [n for n, e in state.entries.items() if e.fleet_findings] == []
    assert {n: e.node_row_parts[0][3] for n, e in state.entries.items() if n in ("node001", "node010", "node013")} == {
        "node001": "IB 8/8", "node010": "IB 7/7", "node013": "IB 8/8"}
    # one of the nine loses an HCA: it alone is short, against 8 of 9; the other groups stay silent
    changed = state.update([_under_faults("node002", ["ib-missing-hca@4"])])
    assert changed == ["node002"]
    short = state.entries["node002"]
    assert [(f.check, f.severity, f.message) for f in short.fleet_findings] == [
        ("fabric.port_count", "warn", "7 compute ports on node002, the fleet's majority has 8 (8 of 9 nodes)")]
    assert (short.node_row_parts[0][3], short.node_row_parts[1][3]) == ("IB 7/8", "crit")
    assert [n for n, e in state.entries.items() if e.fleet_findings] == ["node002"]


def _under_faults(name: str, faults: list[str]) -> data.NodeEntry:
    snap = simfeed.snapshot(simfeed.sim_state(name, faults))
    return data.summarize(name, snap, simfeed.findings(snap), simfeed.T0 + 1)


def test_the_role_of_a_port_is_the_checks_rule_with_the_nodes_baseline() -> None:
    """The baseline's exclusions decide, as for the checks: mlx5_0 excluded by name, the
    Ethernet port then a compute port (no layer excluded)."""
    odd = baseline_load.from_mapping({"fabric": {"exclude_devices": ["mlx5_0"]}}, "test")
    e = _judged([], odd)
    roles = {r.key: r.cells[1] for r in data.fabric.port_rows(e.snapshot, e.fabric, e.findings)}
    assert roles["mlx5_0/1"] == "mgmt" and roles["mlx5_8/1"] == "compute" and roles["mlx5_3/1"] == "compute"
    assert e.node_row_parts[0][3] == "RDMA 8/8"


def test_fabric_tab_shows_each_port_role_state_rate_and_why_a_field_is_unavailable(tmp_path: Any) -> None:
    app = fed_app()
    entries = entries_with_unreadable(str(tmp_path))

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node002")
        await pilot.press("enter", "6")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        ports = screen.query_one("#node-fabric", FleetTable)
        assert ports.keys == [f"mlx5_{i}/1" for i in range(9)]
        down = cells(ports, "mlx5_3/1")
        assert (down["role"], down["state"], down["rate"]) == ("compute", "DOWN Polling", "10G 4X IB")
        assert down["gpus"] == "3 0000:5d:00.0" and down["netdev"] == "ibp94s0"
        assert styles(ports, "mlx5_3/1")["state"] == "crit"
        slow = cells(ports, "mlx5_5/1")
        assert (slow["state"], slow["rate"]) == ("ACTIVE", "200G 2X IB")
        assert styles(ports, "mlx5_5/1")["rate"] == "warn"
        mgmt = cells(ports, "mlx5_8/1")
        assert (mgmt["role"], mgmt["rate"], mgmt["gpus"]) == ("mgmt", "200G 4X Eth", "-")
        unread = cells(ports, "mlx5_2/1")
        assert unread["symbol"] == "n/a" and unread["downed"] != "n/a"
        assert "GPUs ok 8/8  XIDs/1h 0  fabric IB 7/8  " in str(screen.query_one("#node-header", Static).render())
        text = str(screen.query_one("#node-fabric-text", Static).render())
        assert "mlx5_2 port 1 counters.symbol_error: unreadable: a directory where a file belongs" in text
        assert cells(ports, "mlx5_6/1")["rcverr"] == "n/a"
        assert "mlx5_6 port 1 counters.port_rcv_errors: not in sysfs (the driver does not provide it)" in text
        assert "fabric.port_down  compute port mlx5_3 port 1" in text
        assert "fabric.port_degraded  compute port mlx5_5 port 1" in text
        assert "-> Inspect the port: check the cable and transceiver" in text
        shown = "\n".join(screen_lines(app))
        assert "mlx5_3/1" in shown and "DOWN Polling" in shown

    drive(app, body, entries, size=(200, 60))


def test_at_120_columns_the_fabric_column_and_the_ports_link_health_are_not_cut() -> None:
    """The nodes view fits 120 columns with FABRIC (no sideways scroll, WORST FINDING keeps 30
    cells); the Fabric tab shows every column through NETDEV in full there, the inventory (PCI,
    NUMA, firmware) after it."""
    app = fed_app()

    async def body(pilot: Any) -> None:
        nodes = app.screen.table()
        width = nodes.scrollable_content_region.width
        shown = [w + 2 * PADDING for c, w in zip(nodes.spec, nodes.widths, strict=True) if c.key in nodes.shown_columns]
        assert sum(shown) <= width  # (JOBS is not drawn: no node of this fleet reports jobs)
        assert dict(zip((c.key for c in nodes.spec), nodes.widths, strict=True))["worst"] >= 30
        assert "IB 7/8" in "\n".join(screen_lines(app))
        nodes.select_key("node002")
        await pilot.press("enter", "6")
        await pilot.pause()
        ports = app.screen.query_one("#node-fabric", FleetTable)
        keys = [c.key for c in ports.spec]
        through_netdev = sum(w + 2 * PADDING for w in ports.widths[: keys.index("netdev") + 1])
        assert through_netdev <= ports.scrollable_content_region.width
        line = next(x for x in screen_lines(app) if "mlx5_3/1" in x)
        assert line.split()[:9] == ["mlx5_3/1", "compute", "DOWN", "Polling", "10G", "4X", "IB", "3", "0000:5d:00.0"]
        assert "ibp94s0" in line

    drive(app, body, fed_entries(FAULTS), size=(120, 45))


def test_legend_explains_the_fabric_column_and_the_fabric_tab() -> None:
    text = help_screen.help_text(readonly=False).plain
    assert "  node screen: Fabric\n" in text
    assert "F=FABRIC" in text
    for c in (*data.DETAIL_FABRIC_COLUMNS, next(c for c in data.COLUMNS["nodes"] if c.key == "fabric")):
        assert c.doc and f"    {c.label:<14}{c.doc}\n" in text


# --- live: real SSH, a real simulated fleet ---------------------------------------------------


@pytest.fixture
def fleet_dir(sim_fleet: str) -> Iterator[str]:  # noqa: F811 - the imported module fixture
    yield sim_fleet
    for name in NODES:
        fleet.clear(sim_fleet, name, "all")


@pytest.mark.root
def test_live_an_ib_port_down_turns_the_column_and_shows_in_the_fabric_tab(fleet_dir: str) -> None:
    app = live_app(fleet_dir)

    async def body(pilot: Any) -> None:
        await all_seen(pilot, app)
        assert cells(fleet_table(app), "node004")["fabric"] == "IB 8/8"
        fleet.inject(fleet_dir, "node004", "ib-port-down", 3)
        await wait_for(
            pilot, lambda: cells(fleet_table(app), "node004")["fabric"] == "IB 7/8", 90, "the column to turn"
        )
        assert app.state.entries["node004"].health == "crit"
        assert all(cells(fleet_table(app), n)["fabric"] == "IB 8/8" for n in NODES if n != "node004")
        fleet_table(app).select_key("node004")
        await pilot.press("enter", "6")
        await pilot.pause()
        ports = app.screen.query_one("#node-fabric", FleetTable)
        row = cells(ports, "mlx5_3/1")
        assert (row["state"], row["role"]) == ("DOWN Polling", "compute")
        assert [k for k in ports.keys if cells(ports, k)["state"] != "ACTIVE"] == ["mlx5_3/1"]

    drive(app, body)
