"""nvlink.idle_link through ``fleetops audit`` over real SSH: two audits with history, the
baseline's window shortened so the test does not wait a minute."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

CLI = [sys.executable, "-m", "fleetops.cli"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")


@pytest.fixture(scope="module")
def simfleet(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root to start sshd")
    from fleetops.sim import fleet

    if not fleet.find_sshd():
        pytest.skip("sshd not installed (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("idlefleet"))
    with socket.socket() as sock:  # a port free at this address now: parallel runs do not collide
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(2, d, first_address=FIRST_ADDRESS, port=port)
    yield d
    fleet.down(d)


def _audit(d: str, baseline: str, db: str) -> tuple[int, dict]:
    args = [*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--format", "json", "-q", "--db", db,
            "--connect-timeout", "2", "--timeout", "10", "--baseline", baseline]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_second_audit_finds_the_idle_link_and_names_it(simfleet, tmp_path):
    from fleetops.sim import fleet

    with open(os.path.join(REPO, "examples", "baseline.yml"), encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc.setdefault("thresholds", {})["nvlink_idle_window_s"] = 5
    baseline = tmp_path / "baseline.yml"
    baseline.write_text(yaml.safe_dump(doc))
    db = str(tmp_path / "h.db")
    fleet.inject(simfleet, "node002", "nvlink-idle", 6)
    try:
        _, first = _audit(simfleet, str(baseline), db)
        assert [f for f in first["findings"] if f["check"] == "nvlink.idle_link"] == []  # no history yet
        time.sleep(6)
        rc, second = _audit(simfleet, str(baseline), db)
    finally:
        fleet.clear(simfleet, "node002", "nvlink-idle", 6)
    serious = [f for f in second["findings"] if f["severity"] in ("warn", "crit")]
    assert [(f["check"], f["node"], f["severity"]) for f in serious] == [("nvlink.idle_link", "node002", "warn")]
    [f] = serious
    uuid = sim.read_state(os.path.join(simfleet, "state", "node002.json"))["gpus"][6]["uuid"]
    assert f["gpu"]["uuid"] == uuid and list(f["observed"]["links"]) == ["5"]
    assert f["observed"]["links"]["5"]["moved_kib"] == 0 and f["observed"]["window_s"] >= 5
    assert rc == 1
