"""Snapshot tests of the fabric in the TUI at 80, 120 and 200 columns (pytest-textual-snapshot):
the nodes view with its FABRIC column (node002 one compute port down and one at 2X: IB 7/8,
red), and node002's Fabric tab (a row per port, the management port's role, the fabric findings
with their actions). Fed snapshots at a frozen clock, so nothing drawn depends on when or where
they run.

Update after an intended change with ``pytest tests/tui/test_snapshots_fabric.py --snapshot-update``
and look at the SVGs in ``__snapshots__`` before committing them."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops.tui.app import FleetApp

from .conftest import FAULTS, SIZE, fed_app, fed_entries

ENTRIES = fed_entries({**FAULTS, "node002": ["ib-port-down@3", "ib-degraded@5"]})


def app() -> FleetApp:
    fleet = fed_app()
    fleet.call_later(fleet.feed, ENTRIES)
    return fleet


async def _fabric_tab(pilot: Any) -> None:
    await pilot.pause()
    pilot.app.screen.table().select_key("node002")
    await pilot.press("enter", "6")
    await pilot.pause()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_snapshot_nodes_view_with_the_fabric_column(snap_compare: Any, width: int) -> None:
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), press=["_"])


@pytest.mark.parametrize("width", [80, 120, 200])
def test_snapshot_node_fabric_tab(snap_compare: Any, width: int) -> None:
    assert snap_compare(app(), terminal_size=(width, SIZE[1]), run_before=_fabric_tab)
