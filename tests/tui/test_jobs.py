"""The job view (issue 30): the JOBS columns, the job filter (``j``: the fleet filtered to one
job, the GPUs view listing exactly its GPUs side by side under a line naming it), the dialogs
naming the jobs an action would hit, and the node screen's GPU tab and XIDs naming their jobs.
Fed snapshots that carry jobs as the daemon tags them (``jobfleet``), at a frozen clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.widgets import Input, Static

from fleetops import model
from fleetops.ops import results
from fleetops.tui import data
from fleetops.tui.screens import help as help_screen
from fleetops.tui.screens.confirm import ConfirmScreen
from fleetops.tui.screens.drain import DrainScreen
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.widgets.fleet_table import PADDING, FleetTable

from .conftest import NAMES, FakeSource, drive, fed_app, fed_entries, screen_lines, wait_for
from .jobfleet import job_entries

ENTRIES = job_entries()
BY_NAME = {e.name: e for e in ENTRIES}


def uuid_of(node: str, index: int) -> str:
    return next(g.uuid for g in BY_NAME[node].gpus if g.index == index)


def cells(table: FleetTable, key: str) -> dict[str, str]:
    row = table.row(key)
    assert row is not None, key
    return dict(zip((c.key for c in table.spec), row.cells, strict=True))


def notes(app: Any) -> list[str]:
    return [str(n.message) for n in app._notifications]


class PlanSource(FakeSource):
    """Answers the capacity guard's plan: every node may be drained."""

    operator_run = "alice@ctl01"

    def drain_plan(self, names: Sequence[str], purpose: str) -> list[results.ActionResult]:
        return [results.ActionResult(n, "drain", results.DRY_RUN, f"{n}: would be drained") for n in names]


# --- the JOBS columns -------------------------------------------------------------------------


def test_jobs_column_names_running_jobs_dash_without_records_and_empty_for_none() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        table = app.screen.table()
        assert "jobs" in table.shown_columns
        got = {n: cells(table, n)["jobs"] for n in NAMES}
        assert got == {
            "node001": "1234", "node002": "-", "node003": "1250", "node004": "", "node005": "1234 +1",
            "node006": "1300 +1", "node007": "-", "node008": "-", "node009": "-", "node010": "-",
            "node011": "1260", "node012": "-",
        }  # fmt: skip
        assert table.row("node002").styles[4] == "dim"  # type: ignore[union-attr]
        header = next(line for line in screen_lines(app) if "NODE" in line and "HEALTH" in line)
        assert " GPUS   FABRIC    JOBS       DRIVER " in header, header
        await pilot.press("J")  # Shift+J: the most jobs first, nodes without records last
        assert table.keys[:2] == ["node005", "node006"]
        assert table.keys[-6:] == ["node002", "node007", "node008", "node009", "node010", "node012"]
        await pilot.press("2")
        gpus = app.screen.table()
        assert "jobs" in gpus.shown_columns
        assert cells(gpus, f"node006:{uuid_of('node006', 4)}")["jobs"] == "1300 +1"  # two MIG instances' jobs
        assert cells(gpus, f"node006:{uuid_of('node006', 3)}")["jobs"] == ""
        assert cells(gpus, f"node003:{uuid_of('node003', 3)}")["jobs"] == "1250"
        assert cells(gpus, f"node002:{uuid_of('node002', 0)}")["jobs"] == "-"

    drive(app, body, ENTRIES)


def test_at_120_columns_the_nodes_view_with_jobs_fits_without_scrolling_sideways() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        nodes = app.screen.table()
        widths = dict(zip((c.key for c in nodes.spec), nodes.widths, strict=True))
        assert sum(widths[k] + 2 * PADDING for k in nodes.shown_columns) <= nodes.scrollable_content_region.width
        assert (widths["jobs"], widths["worst"]) == (9, 19)

    drive(app, body, ENTRIES, size=(120, 45))


def test_the_xids_view_names_the_jobs_each_xid_hit() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("4")
        table = app.screen.table()
        assert "jobs" in table.shown_columns
        assert sorted((cells(table, k)["node"], cells(table, k)["code"], cells(table, k)["jobs"]) for k in table.keys) == [
            ("node003", "48", "1250"),
            ("node011", "79", "1260"),
        ]

    drive(app, body, ENTRIES)


def test_a_fleet_without_job_records_shows_no_jobs_column() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        assert "jobs" not in app.screen.table().shown_columns
        assert not any(" JOBS " in line for line in screen_lines(app))
        for view in ("2", "4"):
            await pilot.press(view)
            assert "jobs" not in app.screen.table().shown_columns
            assert not any(" JOBS " in line for line in screen_lines(app))

    drive(app, body, fed_entries())


# --- the job filter ---------------------------------------------------------------------------


def test_j_filters_the_fleet_to_the_job_under_the_cursor_and_lists_its_gpus_side_by_side() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node005")
        await pilot.press("j")
        prompt = app.screen.query_one("#prompt", Input)
        assert prompt.display and prompt.value == "1234"  # the lowest running job on node005
        await pilot.press("enter")
        assert app.state.job_id == "1234"
        assert app.screen.table().keys == ["node001", "node005"]
        header = str(app.screen.query_one("#job-header", Static).render())
        assert header == (
            " JOB  job 1234  user alice  started 2027-01-15 05:55:00 UTC (2h05m ago)  12 GPUs on 2 nodes   Esc clears"
        )
        await pilot.press("2")
        table = app.screen.table()
        assert table.id == "view-job"
        want = [f"job:node001:{uuid_of('node001', i)}" for i in range(8)]
        want += [f"job:node005:{uuid_of('node005', i)}" for i in range(4)]
        assert table.keys == want
        assert cells(table, want[0]) == {
            "node": "node001", "idx": "0", "mig": "-", "util": "97%", "sm": "1755", "power": "612/700W",
            "temp": "64", "throttle": "-", "xids": "0", "health": "OK", "check": "",
        }  # fmt: skip
        # the straggler: node005's GPU 2, held down by its temperature
        assert cells(table, want[10]) == {
            "node": "node005", "idx": "2", "mig": "-", "util": "97%", "sm": "1110", "power": "455/700W",
            "temp": "91", "throttle": "HWSLOW,SWTHERM,HWTHERM", "xids": "0", "health": "CRIT",
            "check": "thermal_power.temperature",
        }  # fmt: skip
        assert table.border_title == " gpus of job 1234 [12/12] "
        await pilot.press("3")  # the findings of the job's nodes only
        assert {app.screen.table().row(k).node for k in app.screen.table().keys} == {"node005"}  # type: ignore[union-attr]
        await pilot.press("escape")
        assert app.state.job_id is None
        assert not app.screen.query_one("#job-header", Static).display
        await pilot.press("2")
        assert app.screen.table().id == "view-gpus" and app.screen.table().row_count == 96

    drive(app, body, ENTRIES)


async def _job(pilot: Any, job_id: str) -> None:
    await pilot.press("j", "ctrl+u", *job_id, "enter")


def test_a_job_on_no_node_is_said_and_the_fleet_stays_as_it_was() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await _job(pilot, "9999")
        assert app.state.job_id is None
        assert notes(app)[-1] == "job 9999 is on no node"
        assert app.screen.table().row_count == 12

    drive(app, body, ENTRIES)


def test_a_job_asked_of_a_fleet_without_job_records_says_where_jobs_come_from() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await _job(pilot, "1234")
        assert app.state.job_id is None
        assert notes(app)[-1] == (
            "job 1234 is on no node (no node reports jobs: they come from the nodes' fleetops-agent daemons)"
        )

    drive(app, body, fed_entries())


def test_an_ended_job_says_when_it_ended_and_still_lists_its_gpus() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await _job(pilot, "1199")
        header = str(app.screen.query_one("#job-header", Static).render())
        assert header == (
            " JOB  job 1199  user erin  started 2027-01-15 05:00:00 UTC (3h00m ago)  8 GPUs on 1 node  "
            "ENDED 2027-01-15 07:50:00 UTC (10m05s ago)   Esc clears"
        )
        assert app.screen.table().keys == ["node004"]
        await pilot.press("2")
        assert [cells(app.screen.table(), k)["idx"] for k in app.screen.table().keys] == [str(i) for i in range(8)]

    drive(app, body, ENTRIES)


def test_a_mig_job_lists_the_gpu_with_its_instance_and_xids_name_the_job_they_hit() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await _job(pilot, "1300")
        await pilot.press("2")
        table = app.screen.table()
        assert table.keys == [f"job:node006:{uuid_of('node006', 4)}"]
        assert cells(table, table.keys[0])["mig"] == "GI 2"
        await pilot.press("escape")
        await _job(pilot, "1260")
        await pilot.press("2")
        table = app.screen.table()
        assert [(cells(table, k)["idx"], cells(table, k)["xids"], cells(table, k)["health"]) for k in table.keys] == [
            ("4", "0", "OK"),
            ("5", "1 (79)", "LOST"),
        ]
        await pilot.press("escape")
        await _job(pilot, "1250")
        await pilot.press("2")
        table = app.screen.table()
        assert [(cells(table, k)["idx"], cells(table, k)["xids"]) for k in table.keys] == [("2", "0"), ("3", "1 (48)")]

    drive(app, body, ENTRIES)


# --- what an action would hit -----------------------------------------------------------------


def test_the_reset_dialog_lists_the_jobs_on_the_gpu() -> None:
    app = fed_app()

    async def open_reset(pilot: Any, node: str, index: int) -> list[str]:
        app.screen.table().select_key(f"{node}:{uuid_of(node, index)}")
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        lines = list(app.screen.question.lines)
        await pilot.press("escape")
        return lines

    async def body(pilot: Any) -> None:
        await pilot.press("2")
        lines = await open_reset(pilot, "node005", 2)
        at = lines.index("Jobs it would hit (1):")
        assert lines[at + 1] == "  job 1234  user alice  started 2027-01-15 05:55:00 UTC (2h05m ago)"
        lines = await open_reset(pilot, "node006", 4)
        at = lines.index("Jobs it would hit (2):")
        assert lines[at + 1 : at + 3] == [
            "  job 1300  user frank  started 2027-01-15 07:40:00 UTC (20m05s ago)  MIG GI 2 2g.35gb",
            "  job 1301  user grace  started 2027-01-15 07:40:00 UTC (20m05s ago)  MIG GI 1 3g.71gb",
        ]
        assert "Jobs:     none running on it (as of the snapshot 5s ago)" in await open_reset(pilot, "node004", 0)
        assert (
            "Jobs:     unknown (the node's snapshot has no job records: no daemon, or an older agent)"
            in await open_reset(pilot, "node002", 0)
        )

    drive(app, body, ENTRIES)


def test_a_confirmed_reset_carries_exactly_the_jobs_the_dialog_named() -> None:
    """The jobs the dialog named go with the reset (as --expect-jobs), so a job started since
    refuses it on the node; a node without job records sends None (nothing to confirm)."""
    source = FakeSource(NAMES)
    app = fed_app(source=source)

    async def reset(pilot: Any, node: str, uuid: str) -> None:
        app.screen.table().select_key(f"{node}:{uuid}")
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("tab", "enter")  # No has the focus: Tab to Yes
        await wait_for(pilot, lambda: len(source.resets) == len(source.reset_jobs) and source.resets
                       and source.resets[-1][:2] == (node, uuid), 30, f"the reset of {node}")

    async def body(pilot: Any) -> None:
        await pilot.press("2")
        await reset(pilot, "node006", uuid_of("node006", 4))
        await reset(pilot, "node004", uuid_of("node004", 0))
        assert source.reset_jobs == [("1300", "1301"), ()]

    drive(app, body, ENTRIES)


def test_the_reset_dialog_of_a_fleet_without_job_records_reads_as_before() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("2")
        app.screen.table().select_key(f"node002:{fed_entries()[1].gpus[0].uuid}")
        await pilot.press("r")
        assert isinstance(app.screen, ConfirmScreen)
        assert not any(line.startswith("Jobs") for line in app.screen.question.lines)

    drive(app, body, fed_entries())


def test_the_drain_dialog_lists_the_running_jobs_on_the_node() -> None:
    app = fed_app(source=FakeSource(NAMES))

    async def open_drain(pilot: Any, node: str) -> list[str]:
        app.screen.table().select_key(node)
        await pilot.press("d")
        assert isinstance(app.screen, DrainScreen)
        lines = list(app.screen.lines)
        await pilot.press("escape")
        return lines

    async def body(pilot: Any) -> None:
        lines = await open_drain(pilot, "node005")
        assert lines[-3:] == [
            "Running jobs (2), which a drain lets finish:",
            "  job 1234  user alice  started 2027-01-15 05:55:00 UTC (2h05m ago)  4 GPUs",
            "  job 1240  user bob  started 2027-01-15 07:30:00 UTC (30m05s ago)  4 GPUs",
        ]
        assert (await open_drain(pilot, "node004"))[-1] == "Running jobs: none"
        assert (await open_drain(pilot, "node002"))[-1] == (
            "Running jobs: unknown (its snapshot carries no job records: no daemon, or an older agent)"
        )

    drive(app, body, ENTRIES)


def test_the_drain_of_a_job_filtered_set_lists_the_jobs_on_each_node_before_anything_is_sent() -> None:
    source = PlanSource(NAMES)
    app = fed_app(source=source)

    async def body(pilot: Any) -> None:
        await _job(pilot, "1234")
        await pilot.press("ctrl+d")
        dialog = app.screen
        assert isinstance(dialog, DrainScreen)
        assert dialog.lines[0] == "Filter job 1234: 2 nodes (node001, node005)"
        assert dialog.lines[-4:] == [
            "",
            "Running jobs on these nodes: 2, which a drain lets finish:",
            "  node001: 1234 (alice)",
            "  node005: 1234 (alice), 1240 (bob)",
        ]
        await wait_for(pilot, lambda: dialog.plan is not None, 10, "the guard's answer")
        assert source.drains == []  # nothing sent before the confirmation
        await pilot.press("escape")
        assert source.drains == []

    drive(app, body, ENTRIES)


# --- the node screen --------------------------------------------------------------------------


def test_the_gpu_tab_names_the_gpus_jobs_and_the_jobs_its_xids_hit() -> None:
    app = fed_app()
    gpu5 = uuid_of("node011", 5)

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node011", select_gpu=gpu5))
        await pilot.pause()
        await pilot.press("2")
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert "\njobs 1 running\n  job 1260  user dave  started 2027-01-15 07:10:00 UTC (50m00s ago)\n" in detail, detail
        assert "\nXIDs on this GPU 1, with the jobs each hit\n  07:58:00 UTC  XID 79  job 1260" in detail, detail
        header = str(app.screen.query_one("#node-header", Static).render())
        assert "  fabric IB 8/8  jobs 1260  " in header, header
        xids = app.screen.query_one("#node-xids", FleetTable)
        assert "jobs" in xids.shown_columns
        assert [cells(xids, k)["jobs"] for k in xids.keys] == ["1260"]
        app.pop_screen()
        app.push_screen(NodeScreen("node004", select_gpu=uuid_of("node004", 0)))
        await pilot.pause()
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert "\njobs 0 running, 1 ended within the hour\n  job 1199  user erin  started 2027-01-15 05:00:00 UTC " in detail

    drive(app, body, ENTRIES)


def test_a_node_without_job_records_keeps_its_gpu_tab_and_xids_table_as_before() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen("node008"))
        await pilot.pause()
        detail = str(app.screen.query_one("#node-gpu-detail", Static).render())
        assert "jobs " not in detail and "XIDs on this GPU" not in detail
        assert " jobs " not in str(app.screen.query_one("#node-header", Static).render())
        assert "jobs" not in app.screen.query_one("#node-xids", FleetTable).shown_columns

    drive(app, body, ENTRIES)


def test_the_legend_explains_the_jobs_columns_the_job_view_and_the_j_key() -> None:
    text = help_screen.help_text(False).plain
    assert "  j            job filter: a Slurm job id" in text
    assert "gpus view of one job (j)" in text
    assert "  job       N=NODE  I=GPU  H=HEALTH  L=UTIL  K=SM MHZ  P=POWER  T=TEMP  X=XIDS  O=THROTTLE  G=MIG  W=WORST CHECK" in text
    for cols in (data.COLUMNS["nodes"], data.COLUMNS["gpus"], data.DETAIL_XID_COLUMNS):
        jobs = next(c for c in cols if c.key == "jobs")
        assert f"    JOBS          {jobs.doc}" in text


def test_on_a_narrow_screen_the_job_line_wraps_between_phrases_never_inside_one() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await _job(pilot, "1199")
        # (the screenshot's text drops runs of blanks at style changes: compared word by word)
        lines = [" ".join(line.split()) for line in screen_lines(app)[1:4]]
        assert lines[:2] == [
            "JOB job 1199 user erin started 2027-01-15 05:00:00 UTC (3h00m ago)",
            "8 GPUs on 1 node ENDED 2027-01-15 07:50:00 UTC (10m05s ago) Esc clears",
        ]
        assert lines[2].startswith("╭─ nodes [1/1]")

    drive(app, body, ENTRIES, size=(80, 45))


def test_the_job_tables_rows_are_kept_while_nothing_they_show_changed() -> None:
    state = data.FleetState(clock=lambda: ENTRIES[0].seen_at or 0.0)
    state.set_hosts(NAMES)
    state.update(ENTRIES)
    state.view, state.job_id = "gpus", "1234"
    first = state.rows()
    assert [r.key for r in first] == [r.key for r in state.rows()]
    assert all(a is b for a, b in zip(first, state.rows(), strict=True))
    # a new snapshot of node005 (its GPU 2 cooled down): its rows are built again
    state.update([data.summarize("node005", BY_NAME["node005"].snapshot, [], BY_NAME["node005"].seen_at or 0.0)])  # type: ignore[arg-type]
    again = state.rows()
    assert again[0].cells == first[0].cells
    assert cells_of(again[10])["health"] == "OK" and cells_of(first[10])["health"] == "CRIT"


def cells_of(row: data.Row) -> dict[str, str]:
    return dict(zip((c.key for c in data.COLUMNS["job"]), row.cells, strict=True))


def test_a_slash_filter_takes_the_letter_j_as_text() -> None:
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("slash", "j", "enter")
        assert app.state.filter.text == "j" and app.state.job_id is None

    drive(app, body, ENTRIES)


def test_a_slash_filter_finds_the_nodes_of_a_running_job_and_of_a_user() -> None:
    """``/job 1234`` keeps the nodes running job 1234, ``/bob`` those of bob's jobs; an ended job
    (1199 on node004) is not on a node any more, so it finds nothing."""
    app = fed_app()

    async def body(pilot: Any) -> None:
        await pilot.press("slash", *"job 1234", "enter")
        assert app.screen.table().keys == ["node001", "node005"]
        await pilot.press("slash", *["backspace"] * 8, *"bob", "enter")
        assert app.state.filter.text == "bob"
        assert app.screen.table().keys == ["node005"]
        await pilot.press("slash", *["backspace"] * 3, *"job 1199", "enter")
        assert app.state.filter.text == "job 1199"
        assert app.screen.table().keys == []

    drive(app, body, ENTRIES)


def test_a_node_running_many_jobs_lists_the_first_twelve_in_the_drain_dialog() -> None:
    node = BY_NAME["node001"].snapshot
    assert node is not None
    many = [model.NodeJob(str(2000 + i), 1000, "alice", 0.0, None, [node.gpus[0].uuid]) for i in range(14)]
    lines = data.jobs.running_lines(model.Node("node001", jobs=many, gpus=node.gpus), 0.0)
    assert len(lines) == 14
    assert lines[0] == "Running jobs (14), which a drain lets finish:"
    assert lines[1].startswith("  job 2000  user alice  started 1970-01-01 00:00:00 UTC (0s ago)  1 GPU")
    assert lines[-1] == "  and 2 more"
