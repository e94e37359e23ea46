"""The thin modules, run in-process against a real simulator state file and stand-in tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fleetops.gpu import sim

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
    rc, result = run_module("fleetops_gpu_facts",
                            {"baseline": baseline, "expect": expect, "sim_state": sim_state, "agent": AGENT})
    assert rc == 0 and result["compliant"] is False
    # The expect pin of Fabric Manager wins over the baseline's and holds; "13.0" is not
    # cuda-toolkit-13-0's 13.0.2-1; the baseline's own nvidia-open pin is judged by the same check.
    assert sorted(m["message"] for m in result["mismatches"]) == [
        "package cuda-toolkit-13-0 is 13.0.2-1, expected 13.0",
        "package nvidia-open is not installed, expected 580.159.04",
    ]
    assert [f for f in result["findings"] if f["check"] == "versions.packages"] == result["mismatches"]
    rc, result = run_module("fleetops_gpu_facts", {"expect": {"packages": {"nvidia-open": None}},
                                                   "sim_state": sim_state, "agent": AGENT})
    assert rc == 1 and result["kind"] == "usage" and result["msg"] == (
        "expect.packages: nvidia-open: a version is text or a number")


def test_gpu_facts_rejects_unknown_expectations(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_facts", {"expect": {"drvier_version": "1"}, "sim_state": sim_state, "agent": AGENT}
    )
    assert rc == 1 and "drvier_version" in result["msg"]


def test_gpu_facts_names_a_baseline_that_does_not_validate(run_module, sim_state: str) -> None:
    rc, result = run_module(
        "fleetops_gpu_facts",
        {"baseline": {"power_limit_w": 700, "persistance_mode": True}, "sim_state": sim_state, "agent": AGENT},
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
        ("thermal_power.power_limit", 5, 600.0)]
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
        ("thermal_power.power_limit", 3)]


def test_gpu_facts_a_value_asked_for_that_cannot_be_read_is_not_compliant(run_module, sim_state: str) -> None:
    with sim.locked_state(sim_state) as st:
        st["gpus"][1].update(power_limit_w=None, unavailable={"power_limit_w": "NoPermission"})
    rc, power = run_module("fleetops_gpu_facts", {"expect": {"power_limit_w": 700}, "sim_state": sim_state, "agent": AGENT})
    assert rc == 0 and power["compliant"] is False
    assert [(m["check"], m["severity"]) for m in power["mismatches"]] == [("thermal_power.unreadable", "unknown")]
    # the same unreadable value says nothing about a key that does not read it
    rc, driver = run_module(
        "fleetops_gpu_facts",
        {"expect": {"power_limit_w": None, "driver_version": "580.159.04"}, "sim_state": sim_state, "agent": AGENT},
    )
    assert rc == 0 and driver["compliant"] is True and driver["mismatches"] == []


def test_gpu_facts_verdict_is_the_agents(run_module, sim_state: str, tmp_path: Path) -> None:
    """An agent whose check finds nothing, over a snapshot whose limits differ from expect: the
    module reports what the agent judged, so a comparison of its own would show here."""
    snapshot = json.loads(subprocess.run([AGENT, "collect", "--backend", "sim", "--state", sim_state],
                                         capture_output=True, text=True, check=True).stdout)  # fmt: skip
    for gpu in snapshot["gpus"]:
        gpu.update(power_limit_w=450.0, power_enforced_limit_w=450.0, persistence_mode=False, mig_mode_current=True)
    report = {"kind": "fleetops.check/v1", "scope": "node", "exit_code": 0, "findings": [], "snapshot": snapshot}
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


def test_slurm_drain_records_and_resumes_only_what_it_drained(run_module, fake_slurm, tmp_path: Path) -> None:
    scontrol, db = fake_slurm({"n1": {"state": "MIXED"}, "n2": {"state": "IDLE+DRAIN", "reason": "bad DIMM"}})
    common = {
        "scontrol": scontrol,
        "marker_dir": str(tmp_path / "markers"),
        "reason": "fleetops driver rollout",
    }

    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "drained"}, check=True)
    assert rc == 0 and r["changed"] and json.loads(db.read_text())["n1"]["state"] == "MIXED"
    assert r["msg"] == "n1 would be drained (is MIXED)"
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "drained"})
    assert r["changed"] and r["was_drained"] is False and r["msg"] == "n1 drained (was MIXED)"
    assert json.loads(db.read_text())["n1"] == {
        "state": "MIXED+DRAIN",
        "reason": "[fleetops] fleetops driver rollout",
    }
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "drained"})
    assert r["changed"] is False  # idempotent

    # n2 was drained by someone else: left drained, never resumed.
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n2", "state": "drained"})
    assert r["changed"] is False and r["was_drained"] and r["drained_by_us"] is False
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n2", "state": "resumed"})
    assert r["changed"] is False and json.loads(db.read_text())["n2"]["state"] == "IDLE+DRAIN"
    assert "not drained by fleetops" in r["msg"] and "bad DIMM" in r["msg"]

    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "resumed"}, check=True)
    assert r["changed"] and json.loads(db.read_text())["n1"]["state"] == "MIXED+DRAIN"
    assert r["msg"] == "n1 would be resumed (fleetops drained it: [fleetops] fleetops driver rollout)"
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "resumed"})
    assert r["changed"] and json.loads(db.read_text())["n1"]["state"] == "MIXED"
    assert r["msg"] == "n1 resumed (fleetops drained it: [fleetops] fleetops driver rollout)"
    rc, r = run_module("fleetops_slurm_node", {**common, "name": "n1", "state": "resumed"})
    assert r["changed"] is False


def test_slurm_resume_leaves_a_node_someone_else_redrained(run_module, fake_slurm, tmp_path: Path) -> None:
    scontrol, db = fake_slurm({"n1": {"state": "IDLE"}})
    common = {
        "scontrol": scontrol,
        "marker_dir": str(tmp_path / "m"),
        "reason": "fleetops driver rollout",
        "name": "n1",
    }
    run_module("fleetops_slurm_node", {**common, "state": "drained"})
    nodes = json.loads(db.read_text())
    nodes["n1"]["reason"] = "GPU 3 XID 79, RMA"
    db.write_text(json.dumps(nodes))
    _rc, r = run_module("fleetops_slurm_node", {**common, "state": "resumed"})
    assert r["changed"] is False and "another reason" in r["msg"]
    assert json.loads(db.read_text())["n1"]["state"] == "IDLE+DRAIN"


def test_slurm_without_scontrol_is_reported_not_failed(run_module, tmp_path: Path) -> None:
    args = {"name": "n1", "state": "drained", "scontrol": str(tmp_path / "no-scontrol")}
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 0 and r["managed"] is False and r["changed"] is False
    rc, r = run_module("fleetops_slurm_node", {**args, "required": True})
    assert rc == 1


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


def test_slurm_scontrol_without_a_cluster_is_not_managed_but_a_dead_controller_fails(
    run_module, tmp_path: Path, monkeypatch
) -> None:
    script = tmp_path / "scontrol"
    script.write_text('#!/bin/sh\necho "scontrol: error: $FAKE_ERR" >&2\nexit 1\n')
    script.chmod(0o755)
    args = {"name": "n1", "state": "drained", "scontrol": str(script)}
    monkeypatch.setenv(
        "FAKE_ERR",
        "_establish_config_source: failed to fetch config; Could not establish a configuration source",
    )
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 0 and r["managed"] is False and "no Slurm configuration" in r["msg"]
    rc, r = run_module("fleetops_slurm_node", {**args, "required": True})
    assert rc == 1
    monkeypatch.setenv("FAKE_ERR", "Unable to contact slurm controller (connect failure)")
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 1 and "Unable to contact" in r["msg"]


def _gpu_uuid(path: str, index: int) -> str:
    return str(sim.read_state(path)["gpus"][index]["uuid"])


def test_gpu_reset_ends_only_the_confirmed_processes(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "stray-process", 2)
    args = {"gpu": _gpu_uuid(sim_state, 2), "sim_state": sim_state, "agent": AGENT, "kill_processes": True,
            "expect_pids": [sim.STRAY_PID], "grace": 1}
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
    args = {"gpu": _gpu_uuid(sim_state, 1), "sim_state": sim_state, "agent": AGENT, "kill_processes": True,
            "expect_pids": [sim.STRAY_PID]}
    rc, result = run_module("fleetops_gpu_reset", args)
    assert rc == 1 and result["failed"] is True and result["result"] == "refused"
    busy = next(p for p in result["preconditions"] if p["name"] == "compute_processes")
    assert busy["unexpected_pids"] == [7777] and "late-job.py" in busy["detail"]
    assert Path(sim_state).read_bytes() == before


def test_gpu_reset_kill_processes_without_the_confirmed_list_is_refused_by_the_module(run_module, sim_state: str) -> None:
    sim.inject(sim_state, "stray-process", 0)
    before = Path(sim_state).read_bytes()
    rc, result = run_module("fleetops_gpu_reset", {"gpu": _gpu_uuid(sim_state, 0), "sim_state": sim_state,
                                                   "agent": AGENT, "kill_processes": True})
    assert rc == 1 and result["failed"] is True and "expect_pids" in result["msg"]
    assert Path(sim_state).read_bytes() == before


def test_slurm_resume_lifts_a_marked_drain_made_elsewhere_without_a_marker_file(
    run_module, fake_slurm, tmp_path: Path
) -> None:
    # the TUI or the controller drained it (no marker file on this host): the Reason says it is ours
    scontrol, db = fake_slurm({"n1": {"state": "IDLE+DRAIN", "reason": "[fleetops] GPU 3 reset"}})
    args = {"scontrol": scontrol, "marker_dir": str(tmp_path / "m"), "name": "n1", "state": "resumed"}
    rc, r = run_module("fleetops_slurm_node", args)
    assert rc == 0 and r["changed"] and json.loads(db.read_text())["n1"]["state"] == "IDLE"


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
