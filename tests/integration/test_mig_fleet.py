"""``fleetops-agent mig apply`` end to end over real SSH, on a simulated fleet of its own (real
sshd on loopback): a layout applied on every node, ``fleetops audit`` clean against the layout
after it, a rerun that changes nothing, a busy instance refused, and a layout drift that the
audit finds; and a MIG mode change that waits for a GPU reset, applied through the safe reset
flow in one run (a dry run first, a busy GPU left mode-pending, ``--no-reset``)."""

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
from fleetops.ops.reset import agent_argv
from fleetops.sim import gpu as sim

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


def journal(d: str, node: str) -> list[dict[str, Any]]:
    path = Path(d) / "state" / f"{node}.reset.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_mode_change_that_needs_a_reset_goes_through_the_reset_flow_over_ssh(d: str, tmp_path: Path) -> None:
    """node001 applies a MIG mode change only at a GPU reset: a dry run that says the reset would
    run and changes nothing; a busy GPU left mode-pending by the reset's refusal; --no-reset left
    pending as before; one apply from MIG off to the layout through the reset; the audit clean;
    a rerun unchanged with nothing journalled again."""
    off = mig_apply(d, "--layout", "off", limit="node001")["node001"]
    assert off[0] == 0, off[1]["message"]
    with sim.locked_state(str(state(d, "node001"))) as st:
        st["node"][sim.MIG_NEEDS_RESET_FIELD] = True
        uuids = [g["uuid"] for g in st["gpus"]]
    layout = ",".join(LAYOUT)
    journalled = len(journal(d, "node001"))

    before = state(d, "node001").read_bytes()
    code, doc = mig_apply(d, "--layout", layout, "--gpu", f"{uuids[0]},{uuids[1]}", "--dry-run", limit="node001")["node001"]
    assert code == 0 and doc["result"] == "would-change" and doc["changed"] is False
    assert [(g["status"], g["reset"], g["reset_report"]["result"]) for g in doc["gpus"]] == [
        ("mode-change", True, "would-reset")] * 2
    assert all("reset the GPU through the safe reset flow" in g["detail"] for g in doc["gpus"])
    assert state(d, "node001").read_bytes() == before and len(journal(d, "node001")) == journalled

    with sim.locked_state(str(state(d, "node001"))) as st:
        sim.add_process(st, 2, 7373, "vllm", 8192)  # a job still runs on GPU 2
    code, doc = mig_apply(d, "--layout", layout, "--gpu", uuids[2], limit="node001")["node001"]
    assert code == 1 and doc["result"] == "mode-pending"
    (gpu,) = doc["gpus"]
    assert gpu["status"] == "mode-pending" and "pid 7373 (vllm)" in gpu["detail"]
    assert gpu["remedy"].startswith("drain the GPU's jobs first")
    assert "pid 7373" in doc["message"]
    assert not sim.read_state(str(state(d, "node001")))["gpus"][2].get("mig_instances")
    assert [(r["gpu"]["uuid"], r["result"]) for r in journal(d, "node001")[journalled:]] == [(uuids[2], "refused")]

    code, doc = mig_apply(d, "--layout", layout, "--gpu", uuids[1], "--no-reset", limit="node001")["node001"]
    assert code == 1 and doc["result"] == "mode-pending" and doc["reset"] is False
    assert doc["gpus"][0]["remedy"] == f"fleetops-agent reset --gpu {uuids[1]}"
    assert len(journal(d, "node001")) == journalled + 1  # no reset attempted

    with sim.locked_state(str(state(d, "node001"))) as st:
        sim.end_process(st, 2, 7373)  # the node was drained
    applied = mig_apply(d, "--layout", layout)  # node002 as the first test left it, or from MIG off
    assert (applied["node001"][0], applied["node001"][1]["result"]) == (0, "applied")
    assert applied["node002"][0] == 0, applied["node002"][1]["message"]
    node001 = applied["node001"][1]["gpus"]
    assert [g["status"] for g in node001] == ["mode-change"] * 8
    assert [g["mode"]["send"] for g in node001] == [True, False, False] + [True] * 5  # 1 and 2 were pending already
    assert all(g["reset_report"]["result"] == "reset" for g in node001)
    assert sorted(r["gpu"]["uuid"] for r in journal(d, "node001")[journalled + 1:]) == sorted(uuids)
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(json.dumps({"mig": {"mode": True, "layout": LAYOUT}}))
    assert audit(d, baseline) == []

    before = {n: state(d, n).read_bytes() for n in applied}
    journalled = len(journal(d, "node001"))
    again = mig_apply(d, "--layout", layout)
    assert {n: (code, doc["result"]) for n, (code, doc) in again.items()} == {n: (0, "unchanged") for n in applied}
    assert {n: state(d, n).read_bytes() for n in applied} == before
    assert len(journal(d, "node001")) == journalled
