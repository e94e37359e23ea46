"""The TUI's data side, without Textual: entries, rows, filters, sorts, totals, marks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleetops import model
from fleetops.tui import data, simfeed

T0 = simfeed.T0


@pytest.fixture
def fleet() -> data.FleetState:
    """A fresh state per test: the tests set filters, sorts and faults-only on it."""
    state = data.FleetState(clock=lambda: T0 + 5)
    names = {f"node{i:03d}": [] for i in range(1, 11)}
    names["node003"] = ["ecc-dbe@3"]
    names["node007"] = ["pcie-downgrade@1"]
    names["node010"] = ["nvlink-down@6"]
    state.set_hosts(names)
    state.update(simfeed.fleet(names))
    return state


def unreachable(name: str, previous: data.NodeEntry | None) -> data.NodeEntry:
    problem = model.Finding(
        "transport.unreachable", "unknown", name, "unreachable: 127.0.0.9:22: connection refused"
    )
    return data.mark_failed(name, "unreachable", problem, previous)


def test_data_and_source_modules_import_without_textual() -> None:
    code = (
        "import sys; import fleetops.tui.data, fleetops.tui.source, fleetops.tui.simfeed; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_summarize_names_the_faulty_gpu_and_counts_healthy_gpus(fleet: data.FleetState) -> None:
    e = fleet.entries["node003"]
    assert e.health == "crit"
    bad = [g for g in e.gpus if g.health == "crit"]
    assert [g.index for g in bad] == [3]
    assert e.gpus_ok == 7 and len(e.gpus) == 8
    assert e.worst is not None and e.worst.gpu and e.worst.gpu["index"] == 3


def test_node_rows_show_health_gpus_driver_xids_and_worst_finding(fleet: data.FleetState) -> None:
    row = next(r for r in fleet.rows("nodes") if r.key == "node003")
    cells = dict(zip((c.key for c in data.COLUMNS["nodes"]), row.cells, strict=True))
    assert cells["health"] == "CRIT"
    assert cells["gpus"] == "7/8"
    assert cells["driver"] == "580.159.04"
    assert cells["xids"] == "1"  # the XID 48 the DBE wrote, 2 minutes before "now"
    assert cells["seen"] == "5s"
    assert "ecc" in cells["worst"]


def test_faults_only_keeps_exactly_the_unhealthy_nodes(fleet: data.FleetState) -> None:
    fleet.faults_only = True
    assert [r.key for r in fleet.rows("nodes")] == ["node003", "node007", "node010"]


def test_filter_is_a_regex_over_names_and_findings_and_bang_inverts(fleet: data.FleetState) -> None:
    fleet.filter = data.Filter.parse("node00[12]")
    assert [r.key for r in fleet.rows("nodes")] == ["node001", "node002"]
    fleet.filter = data.Filter.parse("nvlink")  # only node010's findings mention NVLink
    assert [r.key for r in fleet.rows("nodes")] == ["node010"]
    fleet.filter = data.Filter.parse("!node0(0[1-9])")
    assert [r.key for r in fleet.rows("nodes")] == ["node010"]


def test_a_bad_regex_is_matched_literally_and_says_so() -> None:
    flt = data.Filter.parse("gpu[3")
    assert flt.error and "literally" in flt.error
    assert flt.matches("x gpu[3 y") and not flt.matches("gpu3")


def test_sort_by_letter_then_again_reverses(fleet: data.FleetState) -> None:
    healthy = ["node001", "node002", "node004", "node005", "node006", "node008", "node009"]
    assert fleet.sort_letter("nodes", "H") == "health"
    # worst last; ties in inventory order
    assert [r.key for r in fleet.rows("nodes")] == [*healthy, "node007", "node003", "node010"]
    fleet.sort_letter("nodes", "H")
    # reversed: worst first, ties still in inventory order
    assert [r.key for r in fleet.rows("nodes")] == ["node003", "node010", "node007", *healthy]
    assert fleet.sort_letter("nodes", "?") is None


def test_views_have_stable_row_keys(fleet: data.FleetState) -> None:
    gpus = fleet.rows("gpus")
    assert len(gpus) == 80
    uuid = fleet.entries["node003"].gpus[3].uuid
    assert f"node003:{uuid}" in {r.key for r in gpus}
    findings = fleet.rows("findings")
    assert len({r.key for r in findings}) == len(findings)
    xids = fleet.rows("xids")
    assert [r.node for r in xids] == ["node003"]


def test_unreachable_node_keeps_last_state_with_age_and_mark(fleet: data.FleetState) -> None:
    before = fleet.entries["node003"]
    gone = unreachable("node003", before)
    assert gone.snapshot is before.snapshot and gone.findings == before.findings
    state = data.FleetState(clock=lambda: T0 + 95)
    state.update([gone])
    row = state.rows("nodes")[0]
    cells = dict(zip((c.key for c in data.COLUMNS["nodes"]), row.cells, strict=True))
    assert cells["health"] == "UNREACH"
    assert cells["gpus"] == "7/8" and cells["driver"] == "580.159.04"
    assert cells["seen"] == "1m35s"
    assert "connection refused" in cells["worst"] and "last state" in cells["worst"]
    assert row.fault
    assert state.totals().unreachable == 1


def test_a_node_marked_again_and_again_keeps_one_search_text(fleet: data.FleetState) -> None:
    """A host down for hours is marked at every retry: its search text holds its kept findings
    and the latest problem once, not one more copy per retry."""
    entry = fleet.entries["node003"]
    first = unreachable("node003", entry)
    for _ in range(200):
        entry = unreachable("node003", entry)
    assert entry.haystack == first.haystack
    assert entry.haystack.count("connection refused") == 1
    assert "ecc" in entry.haystack  # the last state's findings are still searchable
    fleet.update([entry])
    fleet.filter = data.Filter.parse("refused")
    assert [r.key for r in fleet.rows("nodes")] == ["node003"]


def test_a_node_never_reached_is_unreachable_without_data() -> None:
    e = unreachable("node099", None)
    assert e.snapshot is None and e.display_health == "unreach"
    state = data.FleetState(clock=lambda: T0)
    state.update([e])
    cells = state.rows("nodes")[0].cells
    assert cells[1] == "UNREACH" and cells[2] == "-" and cells[5] == "-"


def test_a_gpu_that_fell_off_the_bus_keeps_its_index_and_uuid_and_nobody_shifts() -> None:
    before = simfeed.entry("node001")
    after = simfeed.entry("node001", ["xid:79@5"], previous=before)
    lost = [g for g in after.gpus if g.lost]
    assert len(lost) == 1 and (lost[0].uuid, lost[0].index) == (before.gpus[5].uuid, 5)
    assert after.gpus_ok == 7 and after.gpus_total == 8 and len(after.gpus) == 8
    # one LOST GPU 5, no second GPU 5 with another UUID: every GPU keeps its index (as NVML)
    assert [(g.index, g.uuid) for g in after.gpus] == [(g.index, g.uuid) for g in before.gpus]
    assert lost[0].gpu is before.gpus[5].gpu  # its last known values, read before the loss
    assert after.node_row_parts[0][2] == "7/8"
    # without an earlier snapshot too: the lost GPU is in the snapshot itself
    alone = simfeed.entry("node001", ["xid:79@5"])
    assert [g.index for g in alone.gpus if g.lost] == [5] and alone.node_row_parts[0][2] == "7/8"


def test_totals_count_nodes_by_health_and_gpus(fleet: data.FleetState) -> None:
    t = fleet.totals()
    assert (t.nodes, t.ok, t.crit + t.warn, t.unreachable) == (10, 7, 3, 0)
    assert (t.gpus_ok, t.gpus) == (77, 80)


def test_gpu_cells_colour_the_value_at_fault() -> None:
    e = simfeed.entry("node001", ["pcie-downgrade@2"])
    row = next(r for r in e.gpu_rows if r.gpu == e.gpus[2].uuid)
    styles = dict(zip((c.key for c in data.COLUMNS["gpus"]), row.styles, strict=True))
    cells = dict(zip((c.key for c in data.COLUMNS["gpus"]), row.cells, strict=True))
    assert cells["pcie"] == "G4x8<G5x16"
    assert styles["pcie"] == "warn" and styles["temp"] == "" and styles["power"] == ""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "never"), (0, "0s"), (59.9, "59s"), (61, "1m01s"), (3700, "1h01m"), (90000, "1d01h")],
)
def test_format_age(seconds: float | None, text: str) -> None:
    assert data.format_age(seconds) == text
