"""The thin modules, run in-process against a real simulator state file and stand-in tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
LIBRARY = Path(__file__).resolve().parents[2] / "plugins" / "modules"
H100 = "NVIDIA H100 80GB HBM3"


def _limits(path: str) -> list[float]:
    return [g["power_limit_w"] for g in sim.read_state(path)["gpus"]]


def test_gpu_set_check_mode_reports_drift_and_changes_nothing(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "power-cap-drift", 2)
    before = Path(sim_state).read_bytes()
    rc, result = run_module(
        "fleetops_gpu_set",
        {"setting": "power", "value": 700, "sim_state": sim_state, "agent": AGENT},
        check=True,
        diff=True,
    )
    assert rc == 0 and result["changed"] is True
    assert len(result["changed_gpus"]) == 1
    assert "GPU 2" in result["diff"]["before"] and "power=500 W" in result["diff"]["before"]
    assert "power=500 W" not in result["diff"]["after"]
    assert Path(sim_state).read_bytes() == before


def test_gpu_set_fixes_drift_verifies_enforced_limit_and_is_idempotent(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "power-cap-drift", 0)
    args = {"setting": "power", "value": "700", "sim_state": sim_state, "agent": AGENT}
    rc, result = run_module("fleetops_gpu_set", args)
    assert rc == 0 and result["changed"] and result["verified"] is True
    assert _limits(sim_state) == [700.0] * 8
    rc, again = run_module("fleetops_gpu_set", args)
    assert rc == 0 and again["changed"] is False and "already set" in again["msg"]


def test_gpu_set_persistence_and_mig_report_reset_needs(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "persistence-off", 1)
    sim.inject(sim_state, "mig-drift", 3)
    rc, result = run_module(
        "fleetops_gpu_set", {"setting": "persistence", "value": True, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 0 and result["changed"] and len(result["changed_gpus"]) == 1
    rc, result = run_module(
        "fleetops_gpu_set", {"setting": "mig", "value": "off", "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 0 and result["changed"] and result["reset_required"] == []
    state = sim.read_state(sim_state)
    assert all(g["persistence_mode"] for g in state["gpus"])
    assert not any(g["mig_mode_current"] for g in state["gpus"])


def test_gpu_set_out_of_range_cap_fails_with_the_agents_message(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_set", {"setting": "power", "value": 900, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 1 and result["failed"]
    assert "outside" in result["msg"] and "nothing changed" in result["msg"]
    assert _limits(sim_state) == [700.0] * 8


def test_gpu_set_rejects_a_non_number_before_calling_the_agent(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_set", {"setting": "power", "value": "lots", "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 1 and result["kind"] == "usage"


def test_gpu_set_names_a_missing_agent(run_module, sim_state: str, tmp_path: Path) -> None:
    rc, result = run_module(
        "fleetops_gpu_set",
        {"setting": "power", "value": 700, "sim_state": sim_state, "agent": str(tmp_path / "nope")},
    )
    assert rc == 1 and result["kind"] == "missing-agent"


def test_gpu_facts_judges_every_expected_key_through_the_agents_checks(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "driver-drift")
    sim.inject(sim_state, "vbios-drift", 4)
    expect = {
        "driver_version": "580.159.04",
        "gpu_count": 8,
        "power_limit_w": 700,
        "persistence_mode": True,
        "mig_mode": False,
        "firmware": {"NVIDIA H200": {"vbios_version": "96.00.A5.00.1A", "inforom_image": "G520.0282.02.02"}},
        "packages": {"nvidia-fabricmanager-580": "580.159.04", "nvidia-driver-580-server": "580.159"},
    }
    rc, result = run_module("fleetops_gpu_facts", {"expect": expect, "sim_state": sim_state, "agent": AGENT})
    assert rc == 0 and result["compliant"] is False
    checks = sorted((m["check"], (m["gpu"] or {}).get("index")) for m in result["mismatches"])
    # "580.159" is not a prefix of 580.159.04-0ubuntu1 at a version boundary: a mismatch too, found
    # by the agent's versions.packages check like every other expect key's.
    assert checks == [("versions.driver", None), ("versions.packages", None), ("versions.vbios", 4)]
    [pin] = [m for m in result["mismatches"] if m["check"] == "versions.packages"]
    assert pin["message"] == "package nvidia-driver-580-server is 580.159.04-0ubuntu1, expected 580.159"
    assert pin in result["findings"]
    assert result["agent_check"]["kind"] == "fleetops.check/v1" and result["agent_check"]["scope"] == "node"
    # every finding of the agent's checks comes back; the mismatches are among them
    assert {f["check"] for f in result["findings"]} >= {"versions.driver", "versions.vbios"}
    assert result["ansible_facts"]["fleetops_gpu"]["driver_version"] == "570.133.20"
    rc, failed = run_module(
        "fleetops_gpu_facts",
        {"expect": expect, "fail_on_mismatch": True, "sim_state": sim_state, "agent": AGENT},
    )
    assert rc == 1 and failed["kind"] == "mismatch" and "ansible_facts" not in failed


def test_gpu_facts_pins_packages_through_the_baseline_and_layers_them(run_module, sim_state: str) -> None:
    """expect.packages is the baseline's packages key, layered over the task's baseline pin by pin;
    versions given as numbers (unquoted Jinja) are pinned as their text."""
    baseline = {"packages": {"nvidia-fabricmanager-580": "570.133.20", "nvidia-open": "580.159.04"}}
    expect = {"packages": {"nvidia-fabricmanager-580": "580.159.04", "cuda-toolkit-13-0": 13.0}}
    rc, result = run_module(
        "fleetops_gpu_facts", {"baseline": baseline, "expect": expect, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 0 and result["compliant"] is False
    # The expect pin of Fabric Manager wins over the baseline's and holds; "13.0" is not
    # cuda-toolkit-13-0's 13.0.2-1; the baseline's own nvidia-open pin is judged by the same check.
    assert sorted(m["message"] for m in result["mismatches"]) == [
        "package cuda-toolkit-13-0 is 13.0.2-1, expected 13.0",
        "package nvidia-open is not installed, expected 580.159.04",
    ]
    assert [f for f in result["findings"] if f["check"] == "versions.packages"] == result["mismatches"]
    rc, result = run_module(
        "fleetops_gpu_facts",
        {"expect": {"packages": {"nvidia-open": None}}, "sim_state": sim_state, "agent": AGENT},
    )
    assert (
        rc == 1
        and result["kind"] == "usage"
        and result["msg"] == ("expect.packages: nvidia-open: a version is text or a number")
    )


def test_gpu_facts_rejects_unknown_expectations(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_facts", {"expect": {"drvier_version": "1"}, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 1 and "drvier_version" in result["msg"]


def test_gpu_facts_names_a_baseline_that_does_not_validate(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_facts",
        {
            "baseline": {"power_limit_w": 700, "persistance_mode": True},
            "sim_state": sim_state,
            "agent": AGENT,
        },
    )
    assert rc == 1 and result["kind"] == "usage"
    assert "persistance_mode" in result["msg"] and "did you mean 'persistence_mode'" in result["msg"]
    assert result["msg"].startswith("baseline/expect")


def _mixed_models(sim_state: str, gpu5_w: float) -> None:
    """GPUs 4-7 become H100s at 600 W, GPU 5 at ``gpu5_w``."""
    with sim.locked_state(sim_state) as st:
        for gpu in st["gpus"][4:]:
            gpu.update(name=H100, power_limit_w=600.0, power_enforced_limit_w=600.0)
        st["gpus"][5].update(power_limit_w=gpu5_w, power_enforced_limit_w=gpu5_w)


MIXED = {"gpu_models": {"NVIDIA H200": {"power_limit_w": 700}, H100: {"power_limit_w": 600}}, "gpu_count": 8}


def test_gpu_facts_judges_each_gpu_by_its_own_models_limit(run_module, sim_state: str) -> None:
    _mixed_models(sim_state, 600.0)
    args = {"baseline": MIXED, "fail_on": "warn", "sim_state": sim_state, "agent": AGENT}
    rc, clean = run_module("fleetops_gpu_facts", args)
    assert rc == 0 and clean["findings"] == [], clean
    _mixed_models(sim_state, 700.0)  # the H200s' limit on an H100
    rc, failed = run_module("fleetops_gpu_facts", args)
    assert rc == 1 and failed["kind"] == "findings"
    assert [(f["check"], f["gpu"]["index"], f["expected"]) for f in failed["findings"]] == [
        ("thermal_power.power_limit", 5, 600.0)
    ]
    assert "GPU 5" in failed["msg"] and H100 in failed["msg"]
    rc, passed = run_module("fleetops_gpu_facts", {**args, "fail_on": "crit"})
    assert rc == 0 and len(passed["findings"]) == 1 and passed["compliant"] is True


def test_gpu_facts_takes_the_checks_tolerance_not_its_own(run_module, sim_state: str) -> None:
    """A limit 0.7 W off is rounding for the checks (thresholds.power_limit_tolerance_w, 1 W);
    a module comparing limits itself (it once allowed 0.5 W) would call it a mismatch."""
    with sim.locked_state(sim_state) as st:
        st["gpus"][3].update(power_limit_w=700.7, power_enforced_limit_w=700.7)
    args = {"expect": {"power_limit_w": 700}, "sim_state": sim_state, "agent": AGENT}
    rc, result = run_module("fleetops_gpu_facts", args)
    assert rc == 0 and result["compliant"] is True and result["mismatches"] == [], result["mismatches"]
    with sim.locked_state(sim_state) as st:
        st["gpus"][3].update(power_limit_w=702.0, power_enforced_limit_w=702.0)
    rc, result = run_module("fleetops_gpu_facts", args)
    assert rc == 0 and [(m["check"], m["gpu"]["index"]) for m in result["mismatches"]] == [
        ("thermal_power.power_limit", 3)
    ]


def test_gpu_facts_a_value_asked_for_that_cannot_be_read_is_not_compliant(run_module, sim_state: str) -> None:
    with sim.locked_state(sim_state) as st:
        st["gpus"][1].update(power_limit_w=None, unavailable={"power_limit_w": "NoPermission"})
    rc, power = run_module(
        "fleetops_gpu_facts", {"expect": {"power_limit_w": 700}, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 0 and power["compliant"] is False
    assert [(m["check"], m["severity"]) for m in power["mismatches"]] == [
        ("thermal_power.unreadable", "unknown")
    ]
    # the same unreadable value says nothing about a key that does not read it
    rc, driver = run_module(
        "fleetops_gpu_facts",
        {
            "expect": {"power_limit_w": None, "driver_version": "580.159.04"},
            "sim_state": sim_state,
            "agent": AGENT,
        },
    )
    assert rc == 0 and driver["compliant"] is True and driver["mismatches"] == []


def test_gpu_facts_verdict_is_the_agents(run_module, sim_state: str, tmp_path: Path) -> None:
    """An agent whose check finds nothing, over a snapshot whose limits differ from expect: the
    module reports what the agent judged, so a comparison of its own would show here."""
    snapshot = json.loads(subprocess.run([AGENT, "collect", "--backend", "sim", "--state", sim_state],
                                         capture_output=True, text=True, check=True).stdout)  # fmt: skip
    for gpu in snapshot["gpus"]:
        gpu.update(
            power_limit_w=450.0, power_enforced_limit_w=450.0, persistence_mode=False, mig_mode_current=True
        )
    report = {
        "kind": "fleetops.check/v1",
        "scope": "node",
        "exit_code": 0,
        "findings": [],
        "snapshot": snapshot,
    }
    agent = tmp_path / "agent"
    agent.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(report)}\nEOF\n")
    agent.chmod(0o755)
    expect = {"power_limit_w": 700, "persistence_mode": True, "mig_mode": False}
    rc, result = run_module("fleetops_gpu_facts", {"expect": expect, "fail_on": "warn", "agent": str(agent)})
    assert rc == 0 and result["compliant"] is True and result["mismatches"] == []
    assert {g["power_limit_w"] for g in result["ansible_facts"]["fleetops_gpu"]["gpus"]} == {450.0}


def test_gpu_facts_module_and_audit_role_hold_no_power_comparison() -> None:
    """The desired state is judged by fleetops.checks alone: no tolerance in the module, no
    power limit picked in the audit role's YAML."""
    source = (LIBRARY / "fleetops_gpu_facts.py").read_text()
    assert "TOLERANCE" not in source.upper() and "abs(" not in source
    role = Path(__file__).resolve().parents[2] / "roles" / "fleetops_audit"
    mentions = [str(p) for p in role.rglob("*.yml") if "power_limit" in p.read_text()]
    assert mentions == []


STRICT_SCONTROL = r'''#!/usr/bin/env python3
"""A strict stand-in for scontrol: nodes in a JSON file ($FAKE_SLURM), answered as slurmctld
answers (unknown node: "Node X not found", exit 1; RESUME of a node not drained: "Invalid node
state specified"; DRAIN without a Reason refused); every update logged with a timestamp."""
import fcntl, json, os, sys, time
db = os.environ["FAKE_SLURM"]
lock = open(db + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)
with open(db) as fh:
    nodes = json.load(fh)
args = [a for a in sys.argv[1:] if a not in ("-o", "--oneliner")]


def line(name, n):
    text = (f"NodeName={name} Arch=x86_64 CoresPerSocket=56 CPUAlloc=0 State={n['state']} "
            f"Gres=gpu:h200:8 Partitions={','.join(n.get('partitions', ['gpu']))}")
    if n.get("reason"):
        text += f" Reason={n['reason']} [root@2026-12-02T10:00:00]"
    return text


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


if args[:2] == ["show", "node"] and len(args) == 3:
    if args[2] not in nodes:
        fail(f"Node {args[2]} not found")
    print(line(args[2], nodes[args[2]]))
elif args[:2] in (["show", "nodes"], ["show", "node"]):
    for name in sorted(nodes):
        print(line(name, nodes[name]))
elif args[:1] == ["update"]:
    kv = dict(a.split("=", 1) for a in args[1:])
    name = kv.get("NodeName")
    if name not in nodes:
        fail("slurm_update error: Invalid node name specified")
    n = nodes[name]
    flags = n["state"].split("+")
    want = kv.get("State", "").upper()
    if want == "DRAIN":
        if not kv.get("Reason"):
            fail("You must specify a reason when DRAINING a node\nRequest aborted")
        if "DRAIN" not in flags:
            flags.append("DRAIN")
        n["reason"] = kv["Reason"]
    elif want == "RESUME":
        if "DRAIN" not in flags:
            fail("slurm_update error: Invalid node state specified")
        flags.remove("DRAIN")
        n.pop("reason", None)
    else:
        fail(f"slurm_update error: Invalid node state specified ({want})")
    n["state"] = "+".join(flags)
    with open(db + ".tmp", "w") as fh:
        json.dump(nodes, fh)
    os.replace(db + ".tmp", db)
    drained = {k: v.get("reason") for k, v in sorted(nodes.items()) if "DRAIN" in v["state"].split("+")}
    with open(db + ".log", "a") as fh:
        fh.write(json.dumps({"t": time.time(), "node": name, "state": want, "drained": drained}) + "\n")
else:
    fail(f"scontrol: invalid command {' '.join(args)!r}")
'''


RUN_A, RUN_B = "20261206T071502Z-3f9a", "20261207T080000Z-77c0"
HEALTH = "[fleetops] health/20261206T031207Z-node017: memory.ecc_dbe_volatile on GPU GPU-5d3e 0000:18:00.0"


@pytest.fixture
def strict_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The strict scontrol: returns (path, read_nodes, write_nodes, log) for a node table."""
    script = tmp_path / "scontrol"
    script.write_text(STRICT_SCONTROL.replace("/usr/bin/env python3", sys.executable))
    script.chmod(0o755)
    db = tmp_path / "slurm.json"
    monkeypatch.setenv("FAKE_SLURM", str(db))

    def setup(nodes: dict[str, dict[str, Any]]) -> tuple[str, Callable[[], dict[str, Any]]]:
        db.write_text(json.dumps(nodes))
        return str(script), lambda: json.loads(db.read_text())

    return setup


def _slurm(run_module, scontrol: str, name: str, state: str, **more: Any) -> tuple[int, dict[str, Any]]:
    args = {"scontrol": scontrol, "name": name, "host": f"{name}.dc1", "state": state, **more}
    check = bool(args.pop("check", False))
    return run_module("fleetops_slurm_node", args, check=check)


def test_slurm_drains_under_its_owner_is_idempotent_and_resumes_only_its_own_run(
    run_module, strict_slurm
) -> None:
    scontrol, nodes = strict_slurm({"n1": {"state": "MIXED"}, "n2": {"state": "IDLE"}})
    mine = {"owner": "rollout", "run": RUN_A, "reason": "driver rollout 580.163.01"}
    reason = f"[fleetops] rollout/{RUN_A}: driver rollout 580.163.01"

    rc, r = _slurm(run_module, scontrol, "n1", "drained", check=True, **mine)
    assert (
        rc == 0 and r["changed"] and r["action"] == "drain" and r["msg"] == "n1 would be drained (is MIXED)"
    )
    assert nodes()["n1"] == {"state": "MIXED"}
    rc, r = _slurm(run_module, scontrol, "n1", "drained", **mine)
    assert (
        rc == 0
        and r["changed"]
        and r["owner"] is None
        and nodes()["n1"] == {"state": "MIXED+DRAIN", "reason": reason}
    )
    rc, r = _slurm(run_module, scontrol, "n1", "drained", **mine)
    assert r["changed"] is False and r["action"] == "ours" and r["owner"]["run"] == RUN_A  # idempotent

    # another run of the same kind (a second rollout running at the same time would be a mistake,
    # but the rule is the rule): its resume leaves this run's drain alone
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", owner="rollout", run=RUN_B)
    assert rc == 0 and r["changed"] is False and r["held"] and r["action"] == "leave"
    assert nodes()["n1"]["reason"] == reason
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", check=True, **mine)
    assert r["changed"] and nodes()["n1"]["state"] == "MIXED+DRAIN"
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert rc == 0 and r["changed"] and r["action"] == "resume" and nodes()["n1"] == {"state": "MIXED"}
    # resumed already: nothing to do (the strict scontrol would refuse a second RESUME)
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert rc == 0 and r["changed"] is False and r["action"] == "not_drained"
    rc, r = _slurm(run_module, scontrol, "n2", "resumed", **mine)
    assert rc == 0 and r["changed"] is False and nodes()["n2"] == {"state": "IDLE"}


def test_slurm_leaves_a_health_drain_with_its_reason_through_drain_and_resume(
    run_module, strict_slurm
) -> None:
    scontrol, nodes = strict_slurm({"n1": {"state": "IDLE+DRAIN", "reason": HEALTH}})
    before = nodes()
    mine = {"owner": "rollout", "run": RUN_A, "reason": "driver rollout"}
    rc, r = _slurm(run_module, scontrol, "n1", "drained", **mine)
    assert rc == 0 and r["changed"] is False and r["held"] is True and r["action"] == "held"
    assert r["held_by"].startswith(
        "the health program (run 20261206T031207Z-node017): memory.ecc_dbe_volatile"
    )
    assert r["msg"].startswith("held: n1.dc1 (Slurm node name n1) drained by the health program")
    assert r["owner"]["kind"] == "health" and r["owner"]["fault"] is True
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert rc == 0 and r["changed"] is False and r["held"] and "only an operator lifts it" in r["msg"]
    assert nodes() == before
    # a drain from before owners were written is read on the safe side: no automation lifts it
    scontrol, nodes = strict_slurm({"n1": {"state": "IDLE+DRAIN", "reason": "[fleetops] GPU 3 reset"}})
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert (
        rc == 0 and r["changed"] is False and r["owner"]["legacy"] and nodes()["n1"]["state"] == "IDLE+DRAIN"
    )
    # someone outside fleetops re-drained our node with their own reason: left drained
    scontrol, nodes = strict_slurm({"n1": {"state": "IDLE"}})
    _slurm(run_module, scontrol, "n1", "drained", **mine)
    table = nodes()
    table["n1"]["reason"] = "GPU 3 XID 79, RMA"
    scontrol, nodes = strict_slurm(table)
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert r["changed"] is False and r["owner"]["kind"] == "other" and nodes()["n1"]["state"] == "IDLE+DRAIN"


def test_slurm_adopts_an_earlier_rollout_runs_drain_and_resumes_it(run_module, strict_slurm) -> None:
    earlier = f"[fleetops] rollout/{RUN_A}: driver rollout 580.163.01"
    scontrol, nodes = strict_slurm({"n1": {"state": "IDLE+DRAIN", "reason": earlier}})
    mine = {"owner": "rollout", "run": RUN_B, "reason": "driver rollout 580.163.01"}
    rc, r = _slurm(run_module, scontrol, "n1", "drained", check=True, **mine)
    assert r["changed"] and r["action"] == "adopt" and nodes()["n1"]["reason"] == earlier
    rc, r = _slurm(run_module, scontrol, "n1", "drained", **mine)
    assert (
        rc == 0
        and r["changed"]
        and r["action"] == "adopt"
        and r["adopted_from"].startswith(f"a driver rollout (run {RUN_A})")
    )
    assert nodes()["n1"] == {
        "state": "IDLE+DRAIN",
        "reason": f"[fleetops] rollout/{RUN_B}: driver rollout 580.163.01",
    }
    rc, r = _slurm(run_module, scontrol, "n1", "resumed", **mine)
    assert rc == 0 and r["changed"] and nodes()["n1"] == {"state": "IDLE"}
    # a MIG run's drain is another kind's: a rollout holds it
    scontrol, nodes = strict_slurm(
        {"n1": {"state": "IDLE+DRAIN", "reason": f"[fleetops] mig/{RUN_A}: MIG change"}}
    )
    rc, r = _slurm(run_module, scontrol, "n1", "drained", **mine)
    assert r["changed"] is False and r["held"] and r["held_by"].startswith("a MIG run")


def test_slurm_refuses_an_unknown_node_naming_it_and_skips_only_when_unmanaged(
    run_module, strict_slurm
) -> None:
    scontrol, nodes = strict_slurm({"n1": {"state": "IDLE"}})
    mine = {"owner": "rollout", "run": RUN_A}
    for state in ("query", "drained", "resumed"):
        rc, r = run_module(
            "fleetops_slurm_node",
            {"scontrol": scontrol, "name": "ghost211", "host": "node103", "state": state, **mine},
        )
        assert rc == 1 and r["failed"], r
        assert r["msg"].startswith(
            "node103 (Slurm node name ghost211): Slurm does not know a node named ghost211"
        )
        assert "Node ghost211 not found" in r["msg"] and "fleetops_slurm_managed: false" in r["msg"]
    rc, r = _slurm(run_module, scontrol, "ghost211", "drained", managed=False, **mine)
    assert rc == 0 and r["managed"] is False and r["changed"] is False
    assert (
        r["msg"]
        == "ghost211.dc1: fleetops_slurm_managed is false: Slurm is not asked and nothing is drained or resumed"
    )
    # no owner or a run id that cannot go into a Reason: refused before scontrol
    rc, r = _slurm(run_module, scontrol, "n1", "drained", owner="rollout", run="two words")
    assert rc == 1 and "run id" in r["msg"] and nodes()["n1"] == {"state": "IDLE"}
    rc, r = _slurm(run_module, scontrol, "n1", "drained", run=RUN_A)
    assert rc == 1 and "owner" in r["msg"]


def test_slurm_without_scontrol_or_a_cluster_fails_naming_the_node(
    run_module, tmp_path: Path, monkeypatch
) -> None:
    args = {
        "name": "n1",
        "host": "node101",
        "state": "drained",
        "owner": "rollout",
        "run": RUN_A,
        "scontrol": str(tmp_path / "no-scontrol"),
    }
    rc, r = run_module("fleetops_slurm_node", args)
    assert (
        rc == 1 and "scontrol not found" in r["msg"] and "node101" in r["msg"] and "no-scontrol" in r["msg"]
    )
    script = tmp_path / "scontrol"
    script.write_text('#!/bin/sh\necho "scontrol: error: $FAKE_ERR" >&2\nexit 1\n')
    script.chmod(0o755)
    args["scontrol"] = str(script)
    monkeypatch.setenv(
        "FAKE_ERR",
        "_establish_config_source: failed to fetch config; Could not establish a configuration source",
    )
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 1 and r["msg"].startswith("node101 (Slurm node name n1): cannot read Slurm node n1")
    assert "Could not establish a configuration source" in r["msg"]
    monkeypatch.setenv("FAKE_ERR", "Unable to contact slurm controller (connect failure)")
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 1 and "Unable to contact" in r["msg"]


def test_slurm_capacity_waits_then_fails_with_the_partition_message(run_module, strict_slurm) -> None:
    table = {f"g{i:02d}": {"state": "IDLE", "partitions": ["gpu"]} for i in range(1, 11)}
    table["g01"] = {"state": "IDLE+DRAIN", "reason": HEALTH, "partitions": ["gpu"]}
    table["c01"] = {"state": "IDLE", "partitions": ["cpu"]}
    scontrol, _nodes = strict_slurm(table)
    args = {
        "scontrol": scontrol,
        "state": "capacity",
        "max_share": 0.2,
        "poll_interval": 0.2,
        "wait_timeout": 1,
    }
    rc, r = run_module("fleetops_slurm_node", {**args, "names": ["g02"]})
    assert rc == 0 and r["problems"] == [] and r["counts"] == {"gpu": {"nodes": 10, "out": 1}}
    started = time.monotonic()
    rc, r = run_module("fleetops_slurm_node", {**args, "names": ["g02", "g03"]})
    assert rc == 1 and time.monotonic() - started >= 1 and r["waited_s"] >= 0.8
    assert r["msg"] == (
        "capacity: waited 1s; partition gpu: 1 of 10 nodes are out of service already (g01); "
        "draining g02, g03 would make 3, more than the allowed 2 (20%)"
    )
    # a node Slurm does not know is refused by name, not counted as nothing
    rc, r = run_module("fleetops_slurm_node", {**args, "names": ["g02", "ghost211"]})
    assert rc == 1 and "Slurm does not know ghost211" in r["msg"]
    rc, r = run_module("fleetops_slurm_node", {**args, "names": ["g02", "g03"], "managed": False})
    assert rc == 0 and r["managed"] is False


def test_slurm_parse_node_strips_the_stamp_and_later_keys(library_module) -> None:
    mod = library_module("fleetops_slurm_node")
    state, reason = mod.parse_node(
        "NodeName=g1 State=MIXED+DRAIN Reason=fleetops driver rollout [root@2026-12-02T10:00:00] Comment=x"
    )
    assert state == "MIXED+DRAIN" and reason == "fleetops driver rollout"
    assert mod.is_drained("IDLE+DRAIN") and mod.is_drained("DRAINED") and not mod.is_drained("IDLE")
    assert mod.is_busy("MIXED+DRAIN") and not mod.is_busy("IDLE+DRAIN")


FAKE_NVFWUPD = r'''#!/usr/bin/env python3
"""Prints nvfwupd -j documents from a JSON file ($FAKE_FW); update_fw marks devices current."""
import json, os, sys
db = os.environ["FAKE_FW"]
state = json.load(open(db))
args = sys.argv[1:]
with open(db + ".log", "a") as fh:
    fh.write(" ".join(a for a in args if not a.startswith("password=")) + "\n")
if "show_version" in args:
    print("Connecting...")
    print(json.dumps({"Connection Status": "Successful", "System Model": "HGX H200", "Firmware Devices": [
        {"AP Name": n, "Sys Version": d["sys"], "Pkg Version": d["pkg"], "Up-To-Date": "Yes" if d["sys"] == d["pkg"] or d["pkg"] == "N/A" else "No"}
        for n, d in state.items()]}, indent=2))
elif "update_fw" in args:
    for d in state.values():
        if d["pkg"] != "N/A":
            d["sys"] = d["pkg"]
    json.dump(state, open(db, "w"))
    print(json.dumps({"Update Status": "Success", "Error Code": 0}))
'''


def _fake_fw(tmp_path: Path, monkeypatch) -> tuple[str, Path]:
    script = tmp_path / "nvfwupd"
    script.write_text(FAKE_NVFWUPD)
    script.chmod(0o755)
    db = tmp_path / "fw.json"
    db.write_text(
        json.dumps(
            {
                "HGX_FW_GPU_SXM_1": {"sys": "96.00.A5.00.1A", "pkg": "96.00.B1.00.01"},
                "BMC_0": {"sys": "24.09", "pkg": "24.09"},
                "CX7_0": {"sys": "28.42.1000", "pkg": "N/A"},
            }
        )
    )
    monkeypatch.setenv("FAKE_FW", str(db))
    return str(script), db


def test_nvfwupd_audit_lists_outdated_devices_and_never_updates_unless_asked(
    run_module, tmp_path, monkeypatch
) -> None:
    exe, db = _fake_fw(tmp_path, monkeypatch)
    args = {
        "nvfwupd": exe,
        "target": {"ip": "10.0.0.9", "user": "admin", "password": "pw"},
        "package": "/srv/h200.fwpkg",
    }
    rc, r = run_module("fleetops_nvfwupd", args)
    assert rc == 0 and r["changed"] is False
    assert r["outdated"] == ["HGX_FW_GPU_SXM_1"] and r["would_need"] == ["power-cycle"]
    rc, r = run_module("fleetops_nvfwupd", {**args, "update": True}, check=True)
    assert r["changed"] and "update_fw" not in Path(str(db) + ".log").read_text()


def test_nvfwupd_update_states_the_activation_it_needs(run_module, tmp_path, monkeypatch) -> None:
    exe, _db = _fake_fw(tmp_path, monkeypatch)
    args = {
        "nvfwupd": exe,
        "target": {"ip": "10.0.0.9", "user": "admin", "password": "pw"},
        "package": "/srv/h200.fwpkg",
    }
    rc, r = run_module("fleetops_nvfwupd", {**args, "update": True})
    assert rc == 0 and r["changed"] and r["activation_required"] == ["power-cycle"]
    assert "power-cycle" in r["msg"] and r["pending_activation"] == []
    assert "password=pw" not in json.dumps(r)
    rc, r = run_module("fleetops_nvfwupd", {**args, "update": True})
    assert r["changed"] is False


def _gpu_uuid(path: str, index: int) -> str:
    return str(sim.read_state(path)["gpus"][index]["uuid"])


def test_gpu_reset_ends_only_the_confirmed_processes(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "stray-process", 2)
    args = {
        "gpu": _gpu_uuid(sim_state, 2),
        "sim_state": sim_state,
        "agent": AGENT,
        "kill_processes": True,
        "expect_pids": [sim.STRAY_PID],
        "grace": 1,
    }
    rc, result = run_module("fleetops_gpu_reset", args)
    assert rc == 0 and result["changed"] is True and result["result"] == "reset"
    assert result["expect_pids"] == [sim.STRAY_PID]
    ended = next(a for a in result["actions"] if a["action"] == "end_processes")["processes"]
    assert [p["pid"] for p in ended] == [sim.STRAY_PID]


def test_gpu_reset_refuses_a_process_the_operator_did_not_confirm(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "stray-process", 1)
    with sim.locked_state(sim_state) as st:
        sim.add_process(st, 1, 7777, "late-job.py")
    before = Path(sim_state).read_bytes()
    args = {
        "gpu": _gpu_uuid(sim_state, 1),
        "sim_state": sim_state,
        "agent": AGENT,
        "kill_processes": True,
        "expect_pids": [sim.STRAY_PID],
    }
    rc, result = run_module("fleetops_gpu_reset", args)
    assert rc == 1 and result["failed"] is True and result["result"] == "refused"
    busy = next(p for p in result["preconditions"] if p["name"] == "compute_processes")
    assert busy["unexpected_pids"] == [7777] and "late-job.py" in busy["detail"]
    assert Path(sim_state).read_bytes() == before


def test_gpu_reset_kill_processes_without_the_confirmed_list_is_refused_by_the_module(
    run_module, sim_state: str
) -> None:
    sim.inject(sim_state, "stray-process", 0)
    before = Path(sim_state).read_bytes()
    rc, result = run_module(
        "fleetops_gpu_reset",
        {"gpu": _gpu_uuid(sim_state, 0), "sim_state": sim_state, "agent": AGENT, "kill_processes": True},
    )
    assert rc == 1 and result["failed"] is True and "expect_pids" in result["msg"]
    assert Path(sim_state).read_bytes() == before


def test_gpu_facts_documentation_parses_and_names_the_new_options(library_module) -> None:
    import yaml

    module = library_module("fleetops_gpu_facts")
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["options"]["fail_on"]["choices"] == ["none", "warn", "crit"]
    assert doc["options"]["baseline"]["type"] == "dict" and doc["options"]["expect"]["type"] == "dict"
    returned = yaml.safe_load(module.RETURN)
    assert {"findings", "mismatches", "compliant", "agent_check"} <= set(returned)
    assert set(module.EXPECT_CHECKS) == {"driver_version", "cuda_driver_version", "gpu_count", "power_limit_w",
                                         "persistence_mode", "mig_mode", "mig_profile", "firmware", "services",
                                         "packages"}  # fmt: skip


def test_gpu_facts_names_an_agent_without_check(run_module, sim_state: str, tmp_path: Path) -> None:
    """An agent from before ``check``: its argparse refusal, with what to do about it."""
    old = tmp_path / "old-agent"
    old.write_text(
        "#!/bin/sh\n"
        """echo '{"error": "fleetops-agent: argument command: invalid choice: '"'check'"'", "kind": "usage"}' >&2\n"""
        "exit 2\n"
    )
    old.chmod(0o755)
    rc, result = run_module("fleetops_gpu_facts", {"sim_state": sim_state, "agent": str(old)})
    assert rc == 1 and result["kind"] == "usage"
    assert "has no check command" in result["msg"] and "fleetops_agent role" in result["msg"]


# --- the MIG play's batches on a simulated fleet ---------------------------------------------

MIG_NODES = 12
MIG_BATCH = 3


@pytest.mark.root
@pytest.mark.slow
def test_mig_play_never_has_more_than_its_batch_drained(tmp_path: Path) -> None:
    """Twelve simulated nodes (real sshd per loopback address, real agents) and the strict fake
    scontrol on the controller (slurm_drain_delegate_to: localhost), which logs every update with
    the drains standing after it: the MIG play drains batch by batch, so at no moment does it hold
    more than fleetops_mig_batch drains; node005, drained by the health program, is held (not
    changed, Reason kept, named) and every other node is changed and resumed."""
    import socket

    import yaml

    from fleetops.rollout.runner import run_playbook
    from fleetops.sim import fleet

    if os.geteuid() != 0 or fleet.find_sshd() is None:
        pytest.skip("needs root and sshd: the simulated fleet runs real sshd processes")
    first = os.environ.get("FLEETOPS_MIG_BATCH_TEST_ADDRESS", "127.0.47.1")
    with socket.socket() as sock:
        sock.bind((first, 0))
        port = sock.getsockname()[1]
    directory = tmp_path / "fleet"
    info = fleet.up(MIG_NODES, str(directory), first_address=first, port=port)
    try:
        nodes = sorted(info["nodes"])
        held = nodes[4]
        db = tmp_path / "slurm.json"
        table: dict[str, dict[str, Any]] = {n: {"state": "IDLE", "partitions": ["gpu"]} for n in nodes}
        table[held] = {"state": "IDLE+DRAIN", "reason": HEALTH, "partitions": ["gpu"]}
        db.write_text(json.dumps(table))
        fake = tmp_path / "scontrol.py"
        fake.write_text(STRICT_SCONTROL)
        wrapper = tmp_path / "scontrol"
        wrapper.write_text(f'#!/bin/sh\nFAKE_SLURM={db} exec {sys.executable} {fake} "$@"\n')
        wrapper.chmod(0o755)
        group_vars = directory / "group_vars"
        group_vars.mkdir(exist_ok=True)
        (group_vars / "sim.yml").write_text(
            yaml.safe_dump(
                {
                    "fleetops_baseline": {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}},
                    # the simulator's inventory says its nodes are outside Slurm; here they are in
                    # the fake's (group_vars/ files win over the inventory's own group vars)
                    "fleetops_slurm_managed": True,
                    "slurm_drain_scontrol": str(wrapper),
                    "slurm_drain_delegate_to": "localhost",
                    "slurm_drain_wait": False,
                    "slurm_drain_poll_interval": 1,
                }
            )
        )
        lines: list[str] = []
        result = run_playbook(
            "mig.yml",
            [str(directory / "inventory.yml")],
            # 4 of 12 may be out: the held node and one batch
            extravars={
                "fleetops_mig_batch": MIG_BATCH,
                "fleetops_max_drain_share": 0.34,
                "fleetops_run_id": RUN_A,
            },
            emit=lambda kind, line: lines.append(line),
            private_data_dir=str(tmp_path / "runner"),
        )
        out = "\n".join(lines)
        assert result.ok, out + "\n" + "\n".join(result.errors)
        log = [json.loads(line) for line in Path(str(db) + ".log").read_text().splitlines()]
        ours = [
            [n for n, r in entry["drained"].items() if r.startswith(f"[fleetops] mig/{RUN_A}:")]
            for entry in log
        ]
        assert max(len(d) for d in ours) == MIG_BATCH, log
        # every node but the held one drained once and resumed once, batch after batch (serial
        # over the hosts in name order; within a batch the nodes go in parallel)
        drains = [e["node"] for e in log if e["state"] == "DRAIN"]
        assert sorted(drains) == [n for n in nodes if n != held], log
        assert sorted(e["node"] for e in log if e["state"] == "RESUME") == sorted(drains)
        batches = [nodes.index(e["node"]) // MIG_BATCH for e in log]
        assert batches == sorted(batches), log
        final = json.loads(db.read_text())
        assert final[held] == table[held]
        assert all(final[n]["state"] == "IDLE" for n in nodes if n != held)
        assert result.held == {
            held: f"held: {held} drained by the health program (run 20261206T031207Z-node017): "
            "memory.ecc_dbe_volatile on GPU GPU-5d3e 0000:18:00.0; left drained, Reason unchanged"
        }
        assert sorted(result.changed_hosts()) == [n for n in nodes if n != held]
        # what the run did in Slurm, as the history store keeps it (fleetops history --kind drains)
        import io

        from fleetops.fleet.store.database import Store
        from fleetops.rollout.cli import record_drains

        history = tmp_path / "history.db"
        assert record_drains(str(history), result.slurm, source="mig", stream=io.StringIO()) == 23
        with Store(str(history)) as store:
            rows = store.drains(limit=100)
        done = sorted((r.node, r.action) for r in rows if r.outcome == "done")
        assert done == sorted([(n, a) for n in nodes if n != held for a in ("drain", "resume")])
        assert {(r.kind, r.run, r.source) for r in rows} == {("mig", RUN_A, "mig")}
        drained = [r for r in rows if r.action == "drain" and r.outcome == "done"]
        assert all(r.reason and r.reason.startswith(f"[fleetops] mig/{RUN_A}: ") for r in drained)
        (refused,) = [r for r in rows if r.outcome == "refused"]
        assert refused.node == held and refused.action == "drain" and refused.reason is None
        assert refused.previous_owner and refused.previous_owner.startswith("the health program (run ")
    finally:
        fleet.down(str(directory))
