"""Escalation from history over real SSH and the real history store: a PCIe link that stays
downtrained through two simulated reboots (``fleetops sim inject NODE reboot``) is planned for
hardware inspection, and ``fleetops history`` shows what it survived and the time between a
node's incidents."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from fleetops.fleet import escalation
from fleetops.fleet.store import database as store_db
from fleetops.fleet.store.database import Store
from fleetops.remedy import plan as plan_mod

pytestmark = [pytest.mark.root]

CLI = [sys.executable, "-m", "fleetops.cli"]
# a block of its own: other fleets of the suite run on 127.0.20.x
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_ESCALATION_ADDRESS", "127.0.26.1")


@pytest.fixture(scope="module")
def twonodes(tmp_path_factory):
    from fleetops.sim import fleet

    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd")
    d = str(tmp_path_factory.mktemp("escfleet"))
    with socket.socket() as sock:
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(2, d, first_address=FIRST_ADDRESS, port=port)
    yield d
    fleet.down(d)


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, check=False)


def _sim(d: str, verb: str, node: str, fault: str, gpu: int | None = None) -> None:
    done = _cli("sim", verb, "--dir", d, node, fault, *(["--gpu", str(gpu)] if gpu is not None else []))
    assert done.returncode == 0, done.stderr


def _audit(d: str, db: str) -> None:
    done = _cli(
        "audit",
        "-i",
        os.path.join(d, "inventory.yml"),
        "--db",
        db,
        "-q",
        "--format",
        "json",
        "--connect-timeout",
        "2",
        "--timeout",
        "10",
    )
    assert done.stdout.strip().startswith("{"), done.stderr


def test_escalation_after_2_reboots_is_shown_on_the_simulator_through_the_real_history_store(
    twonodes, tmp_path
):
    d, db = twonodes, str(tmp_path / "history.db")
    _audit(d, db)  # clean: the incidents below start from here
    _sim(d, "inject", "node001", "pcie-downgrade", 1)  # broken hardware: a reboot keeps it
    _sim(d, "inject", "node002", "xid:13", 0)
    _audit(d, db)
    _sim(d, "inject", "node001", "reboot")
    _sim(d, "clear", "node002", "xid:13", 0)
    time.sleep(3)  # the next boot's audit sees more uptime than the one after the second reboot
    _audit(d, db)
    _sim(d, "inject", "node001", "reboot")
    _sim(d, "inject", "node002", "xid:13", 0)
    _audit(d, db)

    # the plan fed from the store, as fleetops remediate builds it
    with Store(db) as store:
        latest = store.audits(limit=1)[0].id
        findings = store.findings(latest)
    plan = plan_mod.build(findings, escalations=store_db.escalations(db, findings, escalation.Policy()))
    node = next(n for n in plan.nodes if n.node == "node001")
    [item] = [i for i in node.items if i.gpu and i.gpu["index"] == 1]
    assert (node.action, item.action) == ("drain_and_inspect", "drain_and_inspect")
    [note] = [e for r in item.reasons for e in r.get("escalation", [])]
    assert (note["fault"], note["reboots"], note["resets"], note["audits"]) == ("pcie.link_degraded", 2, 0, 3)
    assert note["text"].startswith("survived 2 reboots since ") and note["text"].endswith(
        ": hardware inspection"
    )
    # without the history the same finding asks for a GPU reset
    bare = next(n for n in plan_mod.build(findings).nodes if n.node == "node001")
    assert [i.action for i in bare.items if i.gpu and i.gpu["index"] == 1] == ["reset_gpu"]

    # and through the command
    done = _cli(
        "remediate",
        "-i",
        os.path.join(d, "inventory.yml"),
        "--db",
        db,
        "--dry-run",
        "--format",
        "json",
        "--connect-timeout",
        "2",
    )
    doc = json.loads(done.stdout)
    [cli_node] = [n for n in doc["plan"]["nodes"] if n["node"] == "node001"]
    [cli_item] = [i for i in cli_node["items"] if i["gpu"] and i["gpu"]["index"] == 1]
    assert cli_item["action"] == "drain_and_inspect"
    assert [e["reboots"] for r in cli_item["reasons"] for e in r.get("escalation", [])] == [2]

    text = _cli("history", "--db", db).stdout
    assert "node001 GPU1" in text and "pcie.link_degraded: survived 2 reboots since" in text
    assert "hardware inspection (in 3 audits, present now)" in text
    assert "Time between incidents" in text and "p50" in text and "p90" in text
    doc = json.loads(_cli("history", "--kind", "escalation", "--db", db, "--format", "json").stdout)
    incidents = doc["incidents"]["node002"]
    assert incidents["incidents"] == 2 and len(incidents["intervals_s"]) == 1
    assert incidents["p50_s"] == incidents["p90_s"] == incidents["intervals_s"][0] > 3
    [fault] = [f for f in doc["faults"] if f["node"] == "node001" and f["fault"] == "pcie.link_degraded"]
    assert (fault["reboots"], fault["escalated"], fault["current"]) == (2, True, True)
    assert not [f for f in doc["faults"] if f["node"] == "node002" and f["reboots"]]
