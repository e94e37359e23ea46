"""``fleetops-agent mig apply`` end to end over real SSH, on a simulated fleet of its own (real
sshd on loopback): a layout applied on every node, ``fleetops audit`` clean against the layout
after it, a rerun that changes nothing, a busy instance refused, and a layout drift that the
audit finds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.fleet import inventory as fleet_inventory
from fleetops.fleet import transport
from fleetops.gpu import sim
from fleetops.ops.reset import agent_argv

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
NODES = 2
# an address block of its own (audit 127.0.20.x, reset 127.0.31.x, Ansible 127.0.46.x)
FIRST_ADDRESS = os.environ.get("FLEETOPS_MIG_TEST_ADDRESS", "127.0.36.1")
LAYOUT = ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    from fleetops.sim import fleet

    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetops.sim import fleet

    directory = str(tmp_path_factory.mktemp("migfleet"))
    with socket.socket() as sock:
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(NODES, directory, first_address=FIRST_ADDRESS, port=port)
    try:
        yield directory
    finally:
        fleet.down(directory)


def inventory(d: str) -> str:
    return os.path.join(d, "inventory.yml")


def state(d: str, node: str) -> Path:
    return Path(d) / "state" / f"{node}.json"


def mig_apply(d: str, *args: str, limit: str | None = None) -> dict[str, Any]:
    """``fleetops-agent mig apply ARGS --json`` over SSH on every node (or ``limit``); node -> (exit, report)."""
    out = {}
    for host in fleet_inventory.load(inventory(d), limit):
        got = transport.run_all([host], agent_argv(host, "mig", "apply", *args, "--json"), command_timeout=120)
        res = got[host.name]
        assert res.exit_status is not None, res.error
        out[host.name] = (res.exit_status, json.loads(res.stdout))
    return out


def audit(d: str, baseline: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([*CLI, "audit", "-i", inventory(d), "--baseline", str(baseline), "--format", "json",
                           "--no-history", "-q", "--connect-timeout", "5"],
                          capture_output=True, text=True, check=False, timeout=180, cwd=REPO)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)["findings"]
    return [f for f in found if f["check"].startswith("config.mig")]


def test_a_layout_over_ssh_audited_clean_rerun_unchanged_busy_refused_drift_found(d: str, tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(json.dumps({"mig": {"mode": True, "layout": LAYOUT}}))
    assert {f["check"] for f in audit(d, baseline)} == {"config.mig_mode"}

    applied = mig_apply(d, "--layout", ",".join(LAYOUT))
    for node, (code, doc) in applied.items():
        assert code == 0, doc["message"]
        assert doc["node"] == node and doc["result"] == "applied" and len(doc["gpus"]) == 8
    assert audit(d, baseline) == []

    before = {n: state(d, n).read_bytes() for n in applied}
    again = mig_apply(d, "--layout", ",".join(LAYOUT))
    assert {n: (code, doc["result"], doc["changed"]) for n, (code, doc) in again.items()} == {
        n: (0, "unchanged", False) for n in applied}
    assert {n: state(d, n).read_bytes() for n in applied} == before

    with sim.locked_state(str(state(d, "node002"))) as st:
        busy = next(m for m in st["gpus"][5]["mig_instances"] if m["profile"] == "2g.35gb")
        busy["in_use"] = True
    before = state(d, "node002").read_bytes()
    code, doc = mig_apply(d, "--layout", "7g.141gb", limit="node002")["node002"]
    assert code == 1 and doc["result"] == "refused"
    assert [g["index"] for g in doc["gpus"] if g["status"] == "refused"] == [5]
    assert busy["uuid"] in doc["message"]
    assert state(d, "node002").read_bytes() == before

    with sim.locked_state(str(state(d, "node001"))) as st:
        sim.mig_reset(st, 3, ["3g.71gb", "3g.71gb"])
    found = audit(d, baseline)
    assert [(f["check"], f["node"], f["gpu"]["index"]) for f in found] == [("config.mig_layout", "node001", 3)]
    assert found[0]["message"] == ("GPU 3 (0000:5d:00.0): MIG instances 3g.71gb, 3g.71gb; mig.layout wants 3g.71gb, "
                                   "2g.35gb, 1g.18gb, 1g.18gb (missing 2g.35gb, 1g.18gb, 1g.18gb; extra 3g.71gb)")
