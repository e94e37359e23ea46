"""Snapshot tests of the node screen at 80, 120 and 200 columns (pytest-textual-snapshot): its
header with "bad since" and the node's Slurm State, Reason and owner, the GPU table with the
processes column, the findings with every action in full, and the GPU tab's process list. Fed
snapshots at a frozen clock, and a fixed Slurm reading, so nothing drawn depends on when or
where they run (the Slurm reading itself is tested against a real slurmctld in
test_node_context.py).

Update after an intended change with ``pytest tests/tui/test_snapshots_node.py --snapshot-update``
and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops.catalog import slurm as rule
from fleetops.ops.slurm import NodeReading
from fleetops.tui.app import FleetApp
from fleetops.tui.widgets.fleet_table import FleetTable

from .conftest import NAMES, SIZE, FakeSource, fed_app, fed_entries, wait_for

ENTRIES = fed_entries()
REASON = "[fleetops] health/20270115T075830Z-2b7d-node011: xid.recent GPU 5 (0000:ab:00.0) XID 79"


class SlurmSource(FakeSource):
    """One fixed answer from Slurm, as ``SshSource.slurm_node`` gives it."""

    def slurm_node(self, name: str) -> NodeReading:
        return NodeReading(
            name, name, "the controller", "MIXED+DRAIN", REASON, rule.owner_of(REASON), "root", "2027-01-15T07:58:31"
        )


def app() -> FleetApp:
    fleet = fed_app(source=SlurmSource(NAMES))
    fleet.call_later(fleet.feed, ENTRIES)
    return fleet


def _open(node: str, keys: list[str], gpu: int | None = None) -> Any:
    async def run_before(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.screen.table().select_key(node)
        await pilot.press("enter")
        if gpu is not None:
            uuid = ENTRIES[NAMES.index(node)].gpus[gpu].uuid
            pilot.app.screen.query_one("#node-gpus", FleetTable).select_key(uuid)
        await pilot.press(*keys)
        await wait_for(pilot, lambda: "MIXED+DRAIN" in str(pilot.app.screen.query_one("#node-slurm").render()),
                       what="the Slurm line")  # fmt: skip
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("width", [80, 120, 200])
def test_snapshot_node_screen_findings(snap_compare: Any, width: int) -> None:
    """node011: GPU 5 lost after XID 79 (bad since the XID's time), drained by the health program."""
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), run_before=_open("node011", []))


@pytest.mark.parametrize("width", [80, 120, 200])
def test_snapshot_node_screen_gpu_processes(snap_compare: Any, width: int) -> None:
    """node008 GPU 6: the stray process with its user, on the GPU tab."""
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), run_before=_open("node008", ["2"], gpu=6))
