"""A flapping RDMA port found by the resident agent and reported by the audit over real SSH: a
simulated fleet started with its daemon (``sim up --daemon``), ``ib-flap`` injected on node001's
mlx5_3 (GPU 3's rail) while the daemon runs, so every fall is one it saw. The simulator's flap is
down 30 s of every 60 s (``sim.gpu.fabric.FLAP_PERIOD_S``, ``FLAP_DOWN_S``); gpud's rule, the
catalog's ``fabric.flap``, counts a fall of at least 25 s that came back, and three make a flap.
So the finding comes with the third return (150 s after the injection) and not with the second
(90 s): after two, the audit has the counter's growth only; after three, the flap, crit (a
compute port), naming node001 and mlx5_3 port 1, and nothing on the management port (mlx5_8)
nor on the other node. About three minutes of real time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent.serve import client
from fleetops.sim import fleet
from fleetops.sim.gpu import fabric as sim_fabric

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
BASELINE = os.path.join(REPO, "examples", "baseline.yml")
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")
NODES = ["node001", "node002"]
FLAPPING, GPU, PORT = "node001", 3, "mlx5_3/1"
SERIOUS = ("warn", "crit", "unknown")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def answer(d: str, node: str) -> dict[str, Any] | None:
    """The node's daemon answer, read on its socket as the node's own collect reads it."""
    state = os.path.join(d, "state", f"{node}.json")
    text = client.fetch_snapshot(client.socket_for("sim", state, None), max_age_s=3600)
    return json.loads(text) if text else None


def port_reading(doc: dict[str, Any], device: str) -> tuple[str, int]:
    """(state, link_downed) of the device's port 1 in a snapshot."""
    hca = next(h for h in doc["fabric"]["hcas"] if h["name"] == device)
    port = hca["ports"][0]
    return port["state"], int(port["counters"]["link_downed"])


def wait_answer(d: str, what: str, until: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = answer(d, FLAPPING)
        if doc is not None and until(doc):
            return doc
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def daemon_checks(doc: dict[str, Any]) -> list[str]:
    return [f["check"] for f in doc["daemon"]["findings"]]


@pytest.fixture(scope="module")
def flap_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("flapfleet"))
    fleet.up(len(NODES), d, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
             metrics_port=free_port(FIRST_ADDRESS))
    try:
        for node in NODES:
            deadline = time.monotonic() + 90
            while answer(d, node) is None:
                assert time.monotonic() < deadline, f"{node}'s daemon never answered"
                time.sleep(0.5)
        yield d
    finally:
        fleet.down(d)


def audit(d: str, tmp: Path) -> dict[str, Any]:
    stamp = time.monotonic_ns()
    report = tmp / f"report-{stamp}.json"
    proc = subprocess.run(
        [*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--baseline", BASELINE, "--format", "json",
         "-o", str(report), "--db", str(tmp / f"history-{stamp}.db"), "-q", "--connect-timeout", "5",
         "--timeout", "30"],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO, stdin=subprocess.DEVNULL,
    )
    assert report.exists(), proc.stderr
    doc: dict[str, Any] = json.loads(report.read_text())
    assert [(n["name"], n["source"]) for n in doc["nodes"]] == [(n, "daemon") for n in NODES], proc.stderr
    return doc


def serious(doc: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    return sorted((f["node"], f["check"], f["severity"], f.get("port")) for f in doc["findings"]
                  if f["severity"] in SERIOUS)


def test_a_flap_is_found_at_the_third_return_of_the_port_by_the_daemon_and_the_audit(
    flap_fleet: str, tmp_path: Path
) -> None:
    d = flap_fleet
    assert (sim_fabric.FLAP_PERIOD_S, sim_fabric.FLAP_DOWN_S) == (60.0, 30.0)  # the timeline below
    before = wait_answer(d, "a clean start", lambda doc: not any(c.startswith("fabric.") for c in daemon_checks(doc)), 60)
    assert port_reading(before, "mlx5_3")[0] == "4: ACTIVE"
    downed = port_reading(before, "mlx5_3")[1]
    fleet.inject(d, FLAPPING, "ib-flap", GPU)
    injected = time.time()

    # two falls of 30 s and two returns: no flap yet, in the daemon or in the audit
    two = wait_answer(d, "the second return",
                      lambda doc: port_reading(doc, "mlx5_3") == ("4: ACTIVE", downed + 2), 150)
    assert "fabric.flap" not in daemon_checks(two)
    assert serious(audit(d, tmp_path)) == [(FLAPPING, "fabric.link_downed", "crit", PORT)]
    assert time.time() - injected < 120, "the audit came after the port's third fall: the timeline is off"

    # the third return: the daemon has the flap, and the audit takes it from the daemon's answer
    three = wait_answer(d, "the flap", lambda doc: "fabric.flap" in daemon_checks(doc), 150)
    assert time.time() - injected >= 150  # not before the third return
    assert port_reading(three, "mlx5_3") == ("4: ACTIVE", downed + 3)
    doc = audit(d, tmp_path)
    assert time.time() - injected < 180, "the audit came after the port's fourth fall: the timeline is off"
    assert serious(doc) == [(FLAPPING, "fabric.flap", "crit", PORT), (FLAPPING, "fabric.link_downed", "crit", PORT)]
    [flap] = [f for f in doc["findings"] if f["check"] == "fabric.flap"]
    assert (flap["gpu"], flap["observed"]["device"], flap["observed"]["port"], flap["observed"]["flaps"]) == (
        None, "mlx5_3", 1, 3)
    assert flap["observed"]["netdev"] == "ibp94s0" and flap["action_code"] == "drain_and_inspect"
    assert flap["message"].startswith("mlx5_3 port 1 went down for 25 s or more and came back 3 times since ")
    assert [f for f in doc["findings"] if isinstance(f["observed"], dict) and f["observed"].get("device") == "mlx5_8"] == []
