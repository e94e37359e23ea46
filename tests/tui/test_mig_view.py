"""The node view of a GPU split into MIG instances: each instance (profile, GPU and compute
instance ids, UUID) with the processes in it, through the real app and its Pilot."""

from __future__ import annotations

from typing import Any

from fleetops.sim import gpu as sim
from fleetops.tui import simfeed
from fleetops.tui.screens.node import NodeScreen
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, drive, fed_app, fed_entries, screen_lines, wait_for

NODE = "node002"
GPU = 4
TALL = (160, 90)  # the GPU tab below the GPU table, without scrolling


def _split_state() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    state = simfeed.sim_state(NODE)
    state["gpus"][GPU]["mig_mode_current"] = True
    state["gpus"][GPU]["mig_mode_pending"] = True
    # the third instance runs a job whose process this user cannot see (NVML says "in use" only)
    made = sim.set_mig_instances(state, GPU, ["3g.71gb", "2g.35gb", "1g.18gb"], in_use=[2])
    sim.add_process(state, GPU, 4242, "vllm", 30720)
    state["processes"][str(GPU)][-1].update({"gpu_instance_id": made[1]["gpu_instance_id"], "compute_instance_id": 0})
    return state, [dict(m) for m in made]


def _line_with(lines: list[str], text: str) -> int:
    hits = [i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, f"{text!r} on {len(hits)} lines"
    return hits[0]


def test_the_gpu_tab_lists_each_instance_and_the_processes_in_it() -> None:
    state, made = _split_state()
    entries = fed_entries({})
    entries[NAMES.index(NODE)] = simfeed.entry(NODE, state=state)
    uuid = state["gpus"][GPU]["uuid"]
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen(NODE, select_gpu=uuid))
        await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen) and app.screen.ready, what="the node view")
        await pilot.press("2")
        await wait_for(pilot, lambda: any("instance(s)" in line for line in screen_lines(app)), what="the GPU tab")
        lines = screen_lines(app)
        assert "MIG on   3 instance(s)" in lines[_line_with(lines, "instance(s)")]
        rows = [_line_with(lines, m["uuid"]) for m in made]
        assert rows == sorted(rows) and rows[1] - rows[0] == 1 and rows[2] - rows[1] == 2  # one process under GI 2
        for row, m in zip(rows, made, strict=True):
            assert f"GI {m['gpu_instance_id']}" in lines[row] and "CI 0" in lines[row] and m["profile"] in lines[row]
        assert lines[rows[0]].rstrip().endswith("idle")
        assert "pid 4242 vllm 30720 MiB" in lines[rows[1] + 1]
        assert "in use (processes not visible)" in lines[rows[2]]
        assert "NVLink unused in MIG mode" in lines[_line_with(lines, "NVLink")]
        assert "processes 1" in lines[rows[2] + 1]  # and none outside the instances
        gpus = app.screen.query_one("#node-gpus", FleetTable)
        row = gpus.row(uuid)
        assert row is not None
        cells = dict(zip((c.key for c in gpus.spec), row.cells, strict=True))
        assert (cells["nvlink"], cells["mig"]) == ("mig", "on:3")

    drive(app, body, entries, size=TALL)


def test_a_gpu_without_mig_still_lists_its_processes_and_links() -> None:
    state = simfeed.sim_state(NODE, ["stray-process@1"])
    entries = fed_entries({})
    entries[NAMES.index(NODE)] = simfeed.entry(NODE, state=state)
    uuid = state["gpus"][1]["uuid"]
    app = fed_app()

    async def body(pilot: Any) -> None:
        app.push_screen(NodeScreen(NODE, select_gpu=uuid))
        await wait_for(pilot, lambda: isinstance(app.screen, NodeScreen) and app.screen.ready, what="the node view")
        await pilot.press("2")
        await wait_for(pilot, lambda: any(line.strip().startswith("MIG off") for line in screen_lines(app)),
                       what="the GPU tab")
        lines = screen_lines(app)
        assert "instance" not in lines[_line_with(lines, "MIG off")]
        assert "NVLink 18/18 up" in lines[_line_with(lines, "NVLink")]
        row = _line_with(lines, "processes 1")
        assert f"pid {sim.STRAY_PID} python3 train.py 20480 MiB" in lines[row + 1]

    drive(app, body, entries, size=TALL)
