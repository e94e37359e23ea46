"""The XID policy over real SSH: three XID 31 injected with ``fleetops sim inject`` on one GPU of
a simulated node escalate ``fleetops audit``'s finding from warn to crit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.root]

CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")


@pytest.fixture(scope="module")
def onenode(tmp_path_factory):
    from fleetops.sim import fleet

    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd")
    d = str(tmp_path_factory.mktemp("xidfleet"))
    with socket.socket() as sock:
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(1, d, first_address=FIRST_ADDRESS, port=port)
    yield d
    fleet.down(d)


def _inject(d: str, fault: str, gpu: int) -> None:
    done = subprocess.run([*CLI, "sim", "inject", "--dir", d, "node001", fault, "--gpu", str(gpu)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def _audit(d: str) -> tuple[int, list[dict]]:
    proc = subprocess.run([*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--format", "json", "-q",
                           "--no-history", "--connect-timeout", "2", "--timeout", "10"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    return proc.returncode, [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "xid.recent"]


def test_three_xid_31_on_one_gpu_escalate_the_audit_to_crit(onenode):
    _inject(onenode, "xid:31", 2)
    _inject(onenode, "xid:31", 2)
    rc, [f] = _audit(onenode)
    assert (f["severity"], f["gpu"]["index"], f["observed"][0]["count"]) == ("warn", 2, 2)
    assert rc == 1
    _inject(onenode, "xid:31", 2)
    rc, [f] = _audit(onenode)
    assert (f["severity"], f["observed"][0]["count"], f["observed"][0]["action"]) == ("crit", 3, "drain_and_inspect")
    assert "3 x XID 31 within 10 min (policy: 3)" in f["message"]
    assert rc == 2
