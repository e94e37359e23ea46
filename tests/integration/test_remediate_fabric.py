"""``fleetops remediate`` on the simulated fleet over real SSH, for the HCAs: a compute port down
drains the node for inspection and names the port (device, port, netdev, PCI address) and the
technician's action; firmware drift is an update to look at, never a GPU reset; the Ethernet
management port down drains nothing. Faults injected as ``fleetops sim inject`` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]


def remediate(f: Any, db: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "remediate", "-i", f.inventory_path, "--db", db, "--fresh", *extra],
                          capture_output=True, text=True, check=False, timeout=300, cwd=REPO,
                          stdin=subprocess.DEVNULL)


def hca(f: Any, node: str, index: int) -> dict[str, Any]:
    """The simulated HCA as the node's state keeps it: its netdev and PCI function."""
    dev: dict[str, Any] = sim.read_state(str(Path(f.directory) / "state" / f"{node}.json"))["fabric"][index]
    return dev


def test_remediate_drains_for_a_compute_port_and_names_it_but_not_for_firmware_or_the_management_port(
    clean_fleet: Any, tmp_path: Path
) -> None:
    f = clean_fleet
    fleet.inject(f.directory, "node001", "ib-port-down", 3)
    fleet.inject(f.directory, "node002", "ib-fw-drift", 2)
    fleet.inject(f.directory, "node003", "ib-port-down", 8)  # mlx5_8: the Ethernet management port
    down, drift, mgmt = hca(f, "node001", 3), hca(f, "node002", 2), hca(f, "node003", 8)
    assert mgmt["link_layer"] == "Ethernet" and down["link_layer"] == "InfiniBand"
    db = str(tmp_path / "history.db")

    proc = remediate(f, db, "--format", "json")
    assert proc.stdout.strip().startswith("{"), proc.stderr
    doc = json.loads(proc.stdout)
    plan = {n["node"]: n for n in doc["plan"]["nodes"]}
    assert sorted(plan) == ["node001", "node002", "node003"], plan
    everything = [i for n in plan.values() for i in n["items"]]
    assert [i for i in everything if i["action"] == "reset_gpu"] == []

    assert plan["node001"]["action"] == "drain_and_inspect"
    [item] = plan["node001"]["items"]
    assert item["gpu"] is None and item["action"] == "drain_and_inspect"
    [reason] = item["reasons"]
    assert (reason["check"], reason["severity"]) == ("fabric.port_down", "crit")
    assert reason["hca"] == {"device": "mlx5_3", "port": 1, "netdev": down["netdev"], "pci_address": down["path"][-1]}
    assert "replace the cable or transceiver" in reason["action"]

    assert plan["node002"]["action"] == "none"
    assert [(i["action"], [r["check"] for r in i["reasons"]]) for i in plan["node002"]["items"]] == [
        ("inspect", ["fabric.firmware"])]
    fw = plan["node002"]["items"][0]["reasons"][0]
    assert fw["hca"] == {"device": "mlx5_2", "pci_address": drift["path"][-1]}
    assert "Update the HCA's firmware" in fw["action"]

    assert plan["node003"]["action"] == "none"
    assert [(i["action"], i["severity"], [(r["check"], r["hca"]["device"]) for r in i["reasons"]])
            for i in plan["node003"]["items"]] == [("inspect", "warn", [("fabric.port_down", "mlx5_8")])]

    text = remediate(f, db).stdout
    assert "Drain and send for inspection: node001\n" in text
    assert f"at: mlx5_3 port 1, netdev {down['netdev']}, PCI {down['path'][-1]}" in text
    assert "reseat them, then replace the cable or transceiver" in text
    assert "node003: inspect" in text and "GPU resets: 0" in text
