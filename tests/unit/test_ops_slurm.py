"""fleetops.ops.slurm on the controller: argv, Slurm names, where scontrol runs, and the drain /
resume decisions against a stand-in scontrol run as a real subprocess (no shell)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetops.fleet.inventory import Host
from fleetops.ops import results, slurm

# A stand-in for scontrol: node states in a JSON file given by $FAKE_SLURM; every call logged,
# one argv per line as JSON, so a test sees exactly what was run.
FAKE_SCONTROL = r"""#!/usr/bin/env python3
import json, os, sys
db = os.environ["FAKE_SLURM"]
nodes = json.load(open(db))
with open(db + ".log", "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:3] == ["show", "node", "-o"]:
    name = args[3]
    if name not in nodes:
        print(f"Node {name} not found", file=sys.stderr)
        sys.exit(1)
    n = nodes[name]
    line = f"NodeName={name} Arch=x86_64 State={n['state']} Partitions=gpu"
    if n.get("reason"):
        line += f" Reason={n['reason']} [{n.get('by', 'root')}@2026-12-02T10:00:00]"
    print(line)
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    n = nodes[kv["NodeName"]]
    if kv["State"] == "DRAIN":
        n["state"] = n["state"].split("+")[0] + "+DRAIN"
        n["reason"] = kv["Reason"]
    elif kv["State"] == "RESUME":
        n["state"] = n["state"].split("+")[0]
        n["reason"] = None
    json.dump(nodes, open(db, "w"))
else:
    sys.exit(f"unexpected {args}")
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    script = tmp_path / "scontrol"
    script.write_text(FAKE_SCONTROL)
    script.chmod(0o755)
    db = tmp_path / "slurm.json"
    monkeypatch.setenv("FAKE_SLURM", str(db))

    def setup(nodes: dict) -> tuple[slurm.SlurmControl, Path]:
        db.write_text(json.dumps(nodes))
        return slurm.SlurmControl([], scontrol=str(script)), db

    return setup


def calls(db: Path) -> list[list[str]]:
    log = Path(str(db) + ".log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def node(name: str = "gpu01.dc1.example.com", **vars: object) -> Host:
    return Host(name=name, address="127.0.0.1", vars=dict(vars))


def test_argv_is_a_list_with_the_marked_reason() -> None:
    assert slurm.show_argv("gpu01") == ["scontrol", "show", "node", "-o", "gpu01"]
    assert slurm.drain_argv("gpu01", "GPU 3: XID 79; rm -rf /") == [
        "scontrol",
        "update",
        "NodeName=gpu01",
        "State=DRAIN",
        "Reason=[fleetops] GPU 3: XID 79; rm -rf /",  # one argument: no shell ever sees it
    ]
    assert slurm.resume_argv("gpu01", "/opt/slurm/bin/scontrol") == [
        "/opt/slurm/bin/scontrol",
        "update",
        "NodeName=gpu01",
        "State=RESUME",
    ]


def test_slurm_name_is_the_variable_or_the_short_inventory_name() -> None:
    assert slurm.slurm_name(node("gpu01.dc1.example.com")) == "gpu01"
    assert slurm.slurm_name(node("gpu01")) == "gpu01"
    assert slurm.slurm_name(node("gpu01.dc1", fleetops_slurm_node_name="dc1-gpu-001")) == "dc1-gpu-001"
    assert slurm.slurm_name(node("gpu01.dc1", fleetops_slurm_node_name="  ")) == "gpu01"


def test_place_is_the_controller_an_inventory_host_or_an_address() -> None:
    ctl = Host(name="slurmctl", address="127.0.0.9", port=2222, user="ops")
    control = slurm.SlurmControl([ctl])
    assert control.place(node()).host is None
    assert control.place(node()).where == "the controller"
    by_name = control.place(node(fleetops_slurm_host="slurmctl"))
    assert by_name.host is ctl and by_name.where == "Slurm host slurmctl"
    gpu = Host(
        name="gpu01",
        address="127.0.0.5",
        user="root",
        key_file="/k",
        vars={"fleetops_slurm_host": "127.0.0.7"},
    )
    by_address = control.place(gpu)
    assert (by_address.host.address, by_address.host.user, by_address.host.key_file) == (
        "127.0.0.7",
        "root",
        "/k",
    )
    local = Host(name="here", address="localhost", connection="local")
    assert slurm.SlurmControl([local]).place(node(fleetops_slurm_host="here")).host is None


def test_drain_then_resume_lifts_only_our_drain(fake) -> None:
    control, db = fake({"gpu01": {"state": "MIXED"}})
    done = control.drain(node(), "GPU 3 hung")
    assert done.outcome == results.DONE and done.action == "drain", done
    assert json.loads(db.read_text())["gpu01"] == {"state": "MIXED+DRAIN", "reason": "[fleetops] GPU 3 hung"}
    again = control.drain(node(), "something else")
    assert again.outcome == results.DONE and "already drained by fleetops" in again.message
    resumed = control.resume(node())
    assert resumed.outcome == results.DONE and resumed.action == "resume", resumed
    assert json.loads(db.read_text())["gpu01"]["state"] == "MIXED"
    assert [c for c in calls(db) if c[0] == "update"] == [
        ["update", "NodeName=gpu01", "State=DRAIN", "Reason=[fleetops] GPU 3 hung"],
        ["update", "NodeName=gpu01", "State=RESUME"],
    ]
    nothing = control.resume(node())
    assert nothing.outcome == results.REFUSED and "not drained" in nothing.message


def test_someone_elses_drain_is_left_alone_and_named(fake) -> None:
    control, db = fake({"gpu01": {"state": "IDLE+DRAIN", "reason": "maintenance by alice", "by": "alice"}})
    res = control.resume(node())
    assert res.outcome == results.REFUSED, res
    assert "maintenance by alice" in res.message and "alice at 2026-12-02T10:00:00" in res.message
    drained = control.drain(node(), "GPU 3 hung")  # does not overwrite alice's reason either
    assert drained.outcome == results.REFUSED and "someone else" in drained.message
    assert [c for c in calls(db) if c[0] == "update"] == []
    assert json.loads(db.read_text())["gpu01"]["reason"] == "maintenance by alice"


def test_unknown_node_and_missing_scontrol_are_refused_by_name(fake, tmp_path: Path) -> None:
    control, db = fake({"gpu01": {"state": "IDLE"}})
    res = control.drain(node("gpu99.dc1"), "x")
    assert res.outcome == results.REFUSED
    assert (
        "'gpu99'" in res.message and "fleetops_slurm_node_name" in res.message and "gpu99.dc1" in res.message
    )
    missing = slurm.SlurmControl([], scontrol=str(tmp_path / "no-scontrol"))
    res = missing.drain(node(), "x")
    assert res.outcome == results.REFUSED and res.message.endswith("scontrol not found on the controller")
    assert "scontrol not found on the controller" in (missing.precheck(node()) or "")


def test_a_controller_that_fails_is_failed_not_refused(tmp_path: Path) -> None:
    broken = tmp_path / "scontrol"
    broken.write_text(
        "#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    res = slurm.SlurmControl([], scontrol=str(broken)).drain(node(), "x")
    assert res.outcome == results.FAILED and "Unable to contact slurm controller" in res.message


def test_precheck_wants_a_slurm_configuration_on_the_controller(fake, tmp_path: Path, monkeypatch) -> None:
    control, _db = fake({})
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "absent.conf"))
    assert "no Slurm configuration" in (control.precheck(node()) or "")
    (tmp_path / "absent.conf").write_text("ClusterName=x\n")
    assert control.precheck(node()) is None
    # a Slurm host is asked over SSH: nothing to check locally
    assert control.precheck(node(fleetops_slurm_host="127.0.0.7")) is None


def test_an_update_whose_answer_was_lost_is_unknown_with_the_check(fake) -> None:
    """The transport's outcome-unknown (sent over SSH, connection lost) is the action's unknown:
    never retried here, and the operator gets the command that tells what happened."""
    from fleetops.fleet import transport

    control, db = fake({"gpu01": {"state": "IDLE"}})
    real = control._transport_run
    sent: list[list[str]] = []

    def lose_updates(host, argv):
        if argv[1] != "update":
            return real(host, argv)
        sent.append(list(argv))
        return transport.Result("slurmctl", False, None, "", "", "outcome-unknown", "sent, no answer", 0.1)

    lossy = slurm.SlurmControl([], scontrol=control.scontrol, runner=lose_updates)
    res = lossy.drain(node(), "GPU 3 hung")
    assert res.outcome == results.UNKNOWN and not res.ok
    assert res.check == f"{control.scontrol} show node -o gpu01" and res.check in res.message
    assert len(sent) == 1  # sent once, not again
