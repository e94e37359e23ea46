"""fleetops-agent mig apply on the simulator, through real subprocesses of the agent: a layout
applied and audited clean, a rerun that changes nothing, refusals that change nothing on any
GPU (a busy instance, an impossible placement, a GPU that changed under the lock), the
mig-parted config, the mode change applied through the safe reset flow (and left pending with
``--no-reset`` or when the flow refuses), and the simulator's
profile tables against the real H200's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops import baseline, checks, model
from fleetops.agent import mig_apply
from fleetops.agent.collect import collect
from fleetops.agent.reset.backends import Backend, sim_backend
from fleetops.agent.reset.host import SimHost
from fleetops.catalog import mig as catalog
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

AGENT = [sys.executable, "-m", "fleetops.agent.main"]
REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "h200" / "mig_profiles.json"
PARTED = REPO / "tests" / "fixtures" / "mig" / "mig-parted.yaml"
LAYOUT = "3g.71gb,3g.71gb"


def agent(args: list[str], state: Path, env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Any]:
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env[sim.STATE_ENV] = str(state)
    env.update(env_extra or {})
    proc = subprocess.run(AGENT + args, capture_output=True, text=True, check=False, env=env, timeout=120)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc, doc


def apply(state: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    return agent(["mig", "apply", *args], state)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node034", {"gpu_count": 4})
    return path


def uuid_of(state: Path, index: int) -> str:
    return str(sim.read_state(str(state))["gpus"][index]["uuid"])


def instances(state: Path, index: int) -> list[tuple[str, int]]:
    gpu = sim.read_state(str(state))["gpus"][index]
    return sorted((m["profile"], m["placement_start"]) for m in gpu.get("mig_instances") or [])


def audit(state: Path, data: dict[str, Any]) -> list[Any]:
    node = collect("sim", str(state))
    b = baseline.from_mapping(data, "test baseline")
    return [f for f in checks.run_node_checks(node, b) if f.check.startswith("config.mig")]


# --- the profile tables ------------------------------------------------------------------------


def test_the_simulated_h200_table_equals_the_real_h200_field_by_field(state: Path) -> None:
    captured = json.loads(CAPTURE.read_text())["gpus"][0]
    assert captured["name"] == "NVIDIA H200"
    real = {row["profile"]: row for row in captured["profiles"] if "error" not in row}
    simulated = {row["profile"]: row for row in sim.mig_profile_rows(sim.read_state(str(state)), 0)}
    assert sorted(simulated) == sorted(real) == [0, 1, 2, 3, 4, 7, 9]
    for index, row in real.items():
        for key, value in row.items():
            assert simulated[index][key] == value, (index, key)
        assert set(simulated[index]) == set(row)


def test_the_h100_table_has_the_guide_profiles_and_places_like_hopper(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    sim.init_state(str(path), "h100node", {"gpu_count": 1, "gpu": {"name": "NVIDIA H100 80GB HBM3"}})
    table = sim.mig_table(sim.read_state(str(path)), 0)
    assert table is catalog.H100_SXM
    assert [(p.name, p.instances) for p in table.profiles] == [
        ("1g.10gb", 7), ("2g.20gb", 3), ("3g.40gb", 2), ("4g.40gb", 1), ("7g.80gb", 1), ("1g.10gb+me", 1), ("1g.20gb", 4)]
    assert [s for _, s in catalog.place(table, ["1g.10gb"] * 7)] == list(range(7))
    assert [(p.name, s) for p, s in catalog.place(table, ["3g.40gb", "4g.40gb"])] == [("3g.40gb", 4), ("4g.40gb", 0)]
    with pytest.raises(catalog.LayoutError, match="3g.71gb.*did you mean '3g.40gb'"):
        catalog.place(table, ["3g.71gb"])


def test_the_simulator_creates_in_order_and_fails_where_nvml_would(state: Path) -> None:
    with sim.locked_state(str(state)) as st:
        st["gpus"][0]["mig_mode_current"] = st["gpus"][0]["mig_mode_pending"] = True
        made = sim.set_mig_instances(st, 0, ["2g.35gb", "2g.35gb"])
        # a 3g takes slices 0-3 and the 4g has no other placement: created in this order it fails
        with pytest.raises(sim.SimError, match="no free placement for 4g.71gb"):
            sim.set_mig_instances(st, 0, ["3g.71gb", "4g.71gb"])
        assert st["gpus"][0]["mig_instances"] == made  # nothing half made
        with pytest.raises(sim.SimError, match="no 4g.71gb left"):
            sim.set_mig_instances(st, 0, ["4g.71gb", "4g.71gb"])
        assert [m["placement_start"] for m in sim.set_mig_instances(st, 0, ["4g.71gb", "3g.71gb"])] == [0, 4]


# --- apply ----------------------------------------------------------------------------------------


def test_a_layout_is_applied_audited_clean_and_a_rerun_changes_nothing(state: Path) -> None:
    wanted = {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}}
    assert {f.check for f in audit(state, wanted)} == {"config.mig_mode"}  # MIG is off on every GPU
    proc, doc = apply(state, "--layout", LAYOUT)
    assert proc.returncode == 0, proc.stderr
    assert doc["kind"] == "fleetops.mig/v1" and doc["action"] == "mig apply"
    assert doc["result"] == "applied" and doc["changed"] is True
    assert [g["status"] for g in doc["gpus"]] == ["mode-change"] * 4
    for i, gpu in enumerate(doc["gpus"]):
        assert gpu["changed"] is True and gpu["result"] == "done"
        assert [(m["profile"], m["placement"]["start"]) for m in gpu["after"]] == [("3g.71gb", 0), ("3g.71gb", 4)]
        assert all(m["uuid"].startswith("MIG-") and m["compute_instance_id"] == 0 for m in gpu["after"])
        assert instances(state, i) == [("3g.71gb", 0), ("3g.71gb", 4)]
    snap = collect("sim", str(state))
    assert [m.uuid for m in snap.gpus[2].mig_instances or []] == [m["uuid"] for m in doc["gpus"][2]["after"]]
    proc, printed = agent(["collect", "--fresh"], state)  # the snapshot has NVML's fields, not the state's
    fields = {f.name for f in dataclasses.fields(model.MigInstance)}
    assert [set(m) for m in printed["gpus"][2]["mig_instances"]] == [fields, fields]
    assert audit(state, wanted) == []
    assert not Path(str(state) + ".maintenance.lock").exists()

    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT)
    assert proc.returncode == 0, proc.stderr
    assert doc["result"] == "unchanged" and doc["changed"] is False
    assert [(g["status"], g["changed"]) for g in doc["gpus"]] == [("unchanged", False)] * 4
    assert state.read_bytes() == before


def test_a_changed_layout_keeps_the_instances_it_still_has(state: Path) -> None:
    apply(state, "--layout", LAYOUT)
    kept = sim.read_state(str(state))["gpus"][0]["mig_instances"][1]  # the 3g at slice 4
    proc, doc = apply(state, "--layout", "3g.71gb,2g.35gb,1g.18gb,1g.18gb", "--gpu", uuid_of(state, 0))
    assert proc.returncode == 0, proc.stderr
    (gpu,) = doc["gpus"]
    assert gpu["status"] == "recreate" and gpu["destroy"] == [1]
    assert instances(state, 0) == [("1g.18gb", 2), ("1g.18gb", 3), ("2g.35gb", 0), ("3g.71gb", 4)]
    assert kept["uuid"] in {m["uuid"] for m in gpu["after"]}
    assert instances(state, 1) == [("3g.71gb", 0), ("3g.71gb", 4)]  # other GPUs untouched


def test_a_dry_run_plans_and_changes_nothing(state: Path) -> None:
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", "4g.71gb,3g.71gb", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert doc["dry_run"] is True and doc["result"] == "would-change" and doc["changed"] is False
    gpu = doc["gpus"][0]
    assert gpu["status"] == "mode-change" and gpu["create"] == [
        {"profile": "4g.71gb", "placement_start": 0}, {"profile": "3g.71gb", "placement_start": 4}]
    assert state.read_bytes() == before
    assert not Path(str(state) + ".maintenance.lock").exists()


def test_a_busy_instance_it_would_destroy_is_refused_and_no_gpu_changes(state: Path) -> None:
    apply(state, "--layout", LAYOUT)
    with sim.locked_state(str(state)) as st:
        busy = st["gpus"][2]["mig_instances"][0]
        busy["in_use"] = True
        busy["pids"] = [4242]
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", "7g.141gb")
    assert proc.returncode == 1
    assert doc["refused"] is True and doc["result"] == "refused" and doc["changed"] is False
    refused = [g for g in doc["gpus"] if g["status"] == "refused"]
    assert [g["uuid"] for g in refused] == [uuid_of(state, 2)]
    assert busy["uuid"] in refused[0]["detail"] and "4242" in refused[0]["detail"]
    assert [m["uuid"] for m in refused[0]["in_use"]] == [busy["uuid"]]
    assert json.loads(proc.stderr)["kind"] == "refused"
    assert state.read_bytes() == before


def test_a_busy_instance_the_layout_keeps_is_not_a_reason_to_refuse(state: Path) -> None:
    apply(state, "--layout", LAYOUT, "--gpu", uuid_of(state, 0))
    with sim.locked_state(str(state)) as st:
        busy = st["gpus"][0]["mig_instances"][1]  # the 3g at slice 4 runs a job
        busy["in_use"] = True
    proc, doc = apply(state, "--layout", "3g.71gb,2g.35gb,2g.35gb", "--gpu", uuid_of(state, 0))
    assert proc.returncode == 0, proc.stderr
    assert doc["gpus"][0]["destroy"] == [1]
    assert busy["uuid"] in {m["uuid"] for m in doc["gpus"][0]["after"]}


def test_an_impossible_placement_is_refused_before_anything_changes(state: Path) -> None:
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", "3g.71gb,3g.71gb,1g.18gb")
    assert proc.returncode == 1
    assert doc["result"] == "refused"
    assert {g["status"] for g in doc["gpus"]} == {"refused"}
    assert "no placement fits 3g.71gb, 3g.71gb, 1g.18gb" in doc["gpus"][0]["detail"]
    assert state.read_bytes() == before


def test_bad_input_is_a_usage_error_naming_the_profile(state: Path) -> None:
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", "3g.70gb")
    assert proc.returncode == 2 and doc is None
    err = json.loads(proc.stderr)
    assert err["kind"] == "usage" and "'3g.70gb'" in err["error"] and "did you mean '3g.71gb'" in err["error"]
    for args in (["--profiles", "1g.18gb"], ["--config", str(PARTED)], ["--layout", LAYOUT, "--config", str(PARTED)], []):
        proc, _ = apply(state, *args)
        assert proc.returncode == 2, args
    proc, _ = agent(["mig", "reset", "--layout", LAYOUT], state)
    assert proc.returncode == 2
    proc, _ = apply(state, "--config", str(PARTED), "--select", "mixd")
    assert proc.returncode == 2 and "did you mean 'mixed'" in json.loads(proc.stderr)["error"]
    assert state.read_bytes() == before


def test_a_mig_parted_config_gives_each_gpu_its_entry(state: Path) -> None:
    apply(state, "--layout", LAYOUT, "--gpu", uuid_of(state, 2))  # GPU 2 in MIG mode: the config turns it off
    proc, doc = apply(state, "--config", str(PARTED), "--select", "mixed")
    assert proc.returncode == 0, proc.stderr
    assert doc["source"] == {"config": str(PARTED), "select": "mixed"}
    assert [g["status"] for g in doc["gpus"]] == ["mode-change", "mode-change", "mode-change", "unchanged"]
    for i in (0, 1):
        assert instances(state, i) == [("1g.18gb", 4), ("1g.18gb", 5), ("1g.18gb", 6), ("4g.71gb", 0)]
    st = sim.read_state(str(state))
    assert st["gpus"][2]["mig_mode_current"] is False and not st["gpus"][2]["mig_instances"]
    assert st["gpus"][3]["mig_mode_current"] is False  # no entry covers GPU 3: left alone
    data = {"mig": {"config_file": str(PARTED), "config": "mixed"}}
    assert audit(state, data) == []
    proc, doc = apply(state, "--config", str(PARTED), "--select", "mixed")
    assert doc["result"] == "unchanged"


def test_a_device_filter_selects_the_entry_by_the_gpus_pci_device_id(state: Path, tmp_path: Path) -> None:
    config = tmp_path / "parted.yaml"
    config.write_text(json.dumps({"version": "v1", "mig-configs": {"by-model": [
        {"devices": "all", "device-filter": ["0x233010DE"], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": [1], "device-filter": "0x233510DE", "mig-enabled": True, "mig-devices": {"7g.141gb": 1}},
    ]}}))
    proc, doc = apply(state, "--config", str(config), "--select", "by-model")
    assert proc.returncode == 0, proc.stderr
    assert [g["status"] for g in doc["gpus"]] == ["unchanged", "mode-change", "unchanged", "unchanged"]
    assert instances(state, 1) == [("7g.141gb", 0)] and instances(state, 0) == []


def journal(state: Path) -> list[dict[str, Any]]:
    path = Path(str(state)[: -len(".json")] + ".reset.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def needs_reset(state: Path) -> None:
    with sim.locked_state(str(state)) as st:
        st["node"][sim.MIG_NEEDS_RESET_FIELD] = True  # a MIG mode change is pending until a GPU reset


def test_a_mode_change_that_needs_a_reset_goes_through_the_reset_flow_in_one_apply(state: Path) -> None:
    needs_reset(state)
    uuid = uuid_of(state, 1)
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    (gpu,) = doc["gpus"]
    assert gpu["status"] == "mode-change" and gpu["reset"] is True and "safe reset flow" in gpu["detail"]
    assert gpu["reset_report"]["result"] == "would-reset" and journal(state) == []

    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid)
    assert proc.returncode == 0, proc.stderr
    (gpu,) = doc["gpus"]
    assert doc["result"] == "applied" and gpu["status"] == "mode-change" and gpu["result"] == "done"
    assert gpu["reset_report"]["result"] == "reset" and gpu["reset_report"]["verified"] is True
    lock_check = next(c for c in gpu["reset_report"]["preconditions"] if c["name"] == "maintenance_lock")
    assert lock_check["status"] == "ok" and "held by this process (mig apply" in lock_check["detail"]
    assert instances(state, 1) == [("3g.71gb", 0), ("3g.71gb", 4)]
    assert [(r["gpu"]["uuid"], r["result"], r["within"]) for r in journal(state)] == [(uuid, "reset", "mig apply")]
    assert [r["gpu"] for r in sim.read_state(str(state))["resets"]] == [1]
    assert not Path(str(state) + ".maintenance.lock").exists()

    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid)
    assert proc.returncode == 0 and doc["result"] == "unchanged" and doc["changed"] is False
    assert state.read_bytes() == before and len(journal(state)) == 1  # no second reset, nothing journalled

    proc, doc = apply(state, "--layout", "off", "--gpu", uuid)  # MIG off waits for a reset as well
    assert proc.returncode == 0, proc.stderr
    assert doc["gpus"][0]["destroy"] == [1, 2] and doc["gpus"][0]["reset_report"]["result"] == "reset"
    st = sim.read_state(str(state))["gpus"][1]
    assert (st["mig_mode_current"], st["mig_mode_pending"], st["mig_instances"]) == (False, False, [])
    assert [r["result"] for r in journal(state)] == ["reset", "reset"]


def test_no_reset_leaves_the_mode_pending_and_a_rerun_resets_without_asking_for_the_mode_again(state: Path) -> None:
    needs_reset(state)
    uuid = uuid_of(state, 1)
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid, "--no-reset")
    assert proc.returncode == 1
    (gpu,) = doc["gpus"]
    assert doc["result"] == "mode-pending" and gpu["status"] == "mode-pending" and doc["reset"] is False
    assert gpu["remedy"] == f"fleetops-agent reset --gpu {uuid}"
    st = sim.read_state(str(state))["gpus"][1]
    assert (st["mig_mode_current"], st["mig_mode_pending"]) == (False, True) and not st.get("mig_instances")
    assert journal(state) == []
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid, "--no-reset")  # asks again for nothing
    assert proc.returncode == 1 and doc["gpus"][0]["status"] == "mode-pending" and doc["changed"] is False
    assert state.read_bytes() == before

    class CountsModeCalls(mig_apply.MigOps):
        sent = 0

        def set_mode(self, uuid: str, enabled: bool) -> bool:
            self.sent += 1
            return super().set_mode(uuid, enabled)

    ops = CountsModeCalls(sim_backend(str(state), dry_run=False))
    source = mig_apply.Source(layout=mig_apply.parse_layout(LAYOUT))
    doc, code = mig_apply.run(source, uuid, False, "sim", str(state), None, ops=ops)
    assert code == 0, doc["message"]
    assert doc["gpus"][0]["mode"]["send"] is False and ops.sent == 0  # pending already: only the reset
    assert "already asked for" in doc["gpus"][0]["detail"]
    assert instances(state, 1) == [("3g.71gb", 0), ("3g.71gb", 4)]
    assert [r["result"] for r in journal(state)] == ["reset"]


def test_the_reset_flow_refusing_leaves_the_gpu_mode_pending_with_its_reason(state: Path) -> None:
    needs_reset(state)
    with sim.locked_state(str(state)) as st:
        st["node"]["services"]["nvidia-fabricmanager"] = "inactive"  # an NVSwitch node without its fabric
    uuid = uuid_of(state, 0)
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid, "--dry-run")
    assert proc.returncode == 1 and doc["result"] == "mode-pending" and doc["dry_run"] is True
    (gpu,) = doc["gpus"]
    assert gpu["reset_report"]["result"] == "refused" and "nvidia-fabricmanager is inactive" in gpu["detail"]
    assert gpu["remedy"].startswith("start it (systemctl start nvidia-fabricmanager)")
    assert state.read_bytes() == before and journal(state) == []

    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid)
    assert proc.returncode == 1
    (gpu,) = doc["gpus"]
    assert doc["result"] == "mode-pending" and gpu["status"] == "mode-pending" and gpu["result"] == "mode-pending"
    assert "the safe reset flow refused" in gpu["detail"] and "nvidia-fabricmanager is inactive" in gpu["detail"]
    assert gpu["remedy"].startswith("start it (systemctl start nvidia-fabricmanager)")
    assert "nvidia-fabricmanager" in doc["message"]
    failed = [c["name"] for c in gpu["reset_report"]["preconditions"] if c["status"] == "failed"]
    assert failed == ["fabric_manager"]
    st = sim.read_state(str(state))
    assert not st["gpus"][0].get("mig_instances") and st["gpus"][0]["mig_mode_current"] is False
    assert not st.get("resets")
    assert [(r["gpu"]["uuid"], r["result"]) for r in journal(state)] == [(uuid, "refused")]
    assert not Path(str(state) + ".maintenance.lock").exists()


def test_a_busy_gpu_whose_mode_change_needs_a_reset_is_left_mode_pending_by_the_reset_flow(state: Path) -> None:
    needs_reset(state)
    with sim.locked_state(str(state)) as st:
        sim.add_process(st, 3, 5151, "vllm", 4096)
    uuid = uuid_of(state, 3)
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid, "--dry-run")
    assert proc.returncode == 1 and doc["result"] == "mode-pending" and state.read_bytes() == before
    assert "pid 5151 (vllm)" in doc["gpus"][0]["detail"] and journal(state) == []
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid)
    assert proc.returncode == 1 and doc["result"] == "mode-pending"
    (gpu,) = doc["gpus"]
    assert gpu["status"] == "mode-pending" and "1 compute process(es) on the GPU: pid 5151 (vllm)" in gpu["detail"]
    assert gpu["remedy"].startswith("drain the GPU's jobs first")
    assert instances(state, 3) == [] and not sim.read_state(str(state)).get("resets")
    assert [r["result"] for r in journal(state)] == ["refused"]
    with sim.locked_state(str(state)) as st:
        sim.end_process(st, 3, 5151)  # the job ended (the node was drained)
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid)
    assert proc.returncode == 0, doc["message"]
    assert doc["gpus"][0]["mode"]["send"] is False and instances(state, 3) == [("3g.71gb", 0), ("3g.71gb", 4)]
    assert [r["result"] for r in journal(state)] == ["refused", "reset"]


def test_a_job_that_starts_before_the_reset_refuses_it_and_no_instance_is_made(state: Path, tmp_path: Path) -> None:
    needs_reset(state)

    class JobStartsAfterTheModeIsSet(mig_apply.MigOps):
        def set_mode(self, uuid: str, enabled: bool) -> bool:
            now = super().set_mode(uuid, enabled)
            with sim.locked_state(str(state)) as st:
                sim.add_process(st, 2, 4242, "python3", 2048)
            return now

    ops = JobStartsAfterTheModeIsSet(sim_backend(str(state), dry_run=False))
    source = mig_apply.Source(layout=mig_apply.parse_layout(LAYOUT))
    doc, code = mig_apply.run(source, uuid_of(state, 2), False, "sim", str(state), str(tmp_path / "lock"), ops=ops)
    assert code == 1 and doc["result"] == "mode-pending"
    (gpu,) = doc["gpus"]
    assert gpu["status"] == "mode-pending" and "pid 4242 (python3)" in gpu["detail"]
    assert "--kill-processes --expect-pids 4242" in gpu["remedy"]
    assert instances(state, 2) == [] and not sim.read_state(str(state)).get("resets")
    assert not (tmp_path / "lock").exists()


def test_a_signal_during_the_reset_ends_it_cleanly_and_interrupts_mig_apply(state: Path, tmp_path: Path) -> None:
    import signal

    needs_reset(state)

    class TermDuringTheReset(Backend):
        def reset(self, gpu: Any, timeout: float) -> Any:
            os.kill(os.getpid(), signal.SIGTERM)  # held until the reset returns
            return super().reset(gpu, timeout)

    handler_before = signal.getsignal(signal.SIGTERM)
    ops = mig_apply.MigOps(TermDuringTheReset(SimAccess(str(state)), SimHost(str(state)), dry_run=False))
    lock = tmp_path / "lock"
    source = mig_apply.Source(layout=mig_apply.parse_layout(LAYOUT))
    doc, code = mig_apply.run(source, uuid_of(state, 0), False, "sim", str(state), str(lock), ops=ops)
    assert code == 128 + signal.SIGTERM and doc["result"] == "interrupted" and doc["interrupted_by"] == "SIGTERM"
    (gpu,) = doc["gpus"]
    assert gpu["reset_report"]["result"] == "interrupted"
    started = [a["unit"] for a in gpu["reset_report"]["actions"] if a["action"] == "start_service"]
    assert started == ["nvidia-persistenced"]  # the client it stopped is running again
    assert sim.read_state(str(state))["node"]["services"]["nvidia-persistenced"] == "active"
    assert [r["result"] for r in journal(state)] == ["interrupted"]
    assert instances(state, 0) == []  # nothing created after the signal
    assert sim.read_state(str(state))["gpus"][0]["mig_mode_current"] is True  # the reset itself was not cut off
    assert not lock.exists() and signal.getsignal(signal.SIGTERM) == handler_before
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid_of(state, 0))  # a rerun completes it, no reset
    assert proc.returncode == 0 and doc["gpus"][0]["status"] == "create"
    assert len(journal(state)) == 1


def test_a_gpu_that_changes_between_the_plan_and_the_lock_is_refused(state: Path, tmp_path: Path) -> None:
    apply(state, "--layout", LAYOUT)

    class JobStartsUnderTheLock(mig_apply.MigOps):
        reads = 0

        def read(self) -> list[mig_apply.GpuMig]:
            self.reads += 1
            if self.reads == 2:  # the read under the lock: a job started on GPU 0's first instance
                with sim.locked_state(str(state)) as st:
                    st["gpus"][0]["mig_instances"][0]["in_use"] = True
            return super().read()

    before = sim.read_state(str(state))["gpus"]
    ops = JobStartsUnderTheLock(sim_backend(str(state), dry_run=False))
    source = mig_apply.Source(layout=mig_apply.parse_layout("7g.141gb"))
    doc, code = mig_apply.run(source, "all", False, "sim", str(state), str(tmp_path / "lock"), ops=ops)
    assert code == 1 and doc["result"] == "refused"
    assert "changed between the plan and the lock" in doc["gpus"][0]["detail"]
    after = sim.read_state(str(state))["gpus"]
    assert [g.get("mig_instances") for g in after][1:] == [g.get("mig_instances") for g in before][1:]
    assert [m["uuid"] for m in after[0]["mig_instances"]] == [m["uuid"] for m in before[0]["mig_instances"]]


def test_a_signal_lets_the_change_in_hand_finish_then_stops_and_releases_the_lock(state: Path, tmp_path: Path) -> None:
    import signal

    class TermDuringTheFirstCreate(mig_apply.MigOps):
        def create(self, uuid: str, profile: catalog.GiProfile, start: int) -> int:
            made = super().create(uuid, profile, start)
            if not getattr(self, "sent", False):
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)  # held until this create is done
            return made

    lock = tmp_path / "lock"
    handler_before = signal.getsignal(signal.SIGTERM)  # another test of this process may have set one
    ops = TermDuringTheFirstCreate(sim_backend(str(state), dry_run=False))
    source = mig_apply.Source(layout=mig_apply.parse_layout(LAYOUT))
    doc, code = mig_apply.run(source, uuid_of(state, 0), False, "sim", str(state), str(lock), ops=ops)
    assert code == 128 + signal.SIGTERM and doc["result"] == "interrupted" and doc["interrupted_by"] == "SIGTERM"
    assert doc["changed"] is True
    assert instances(state, 0) == [("3g.71gb", 0)]  # the first create whole, with its compute instance
    assert sim.read_state(str(state))["gpus"][0]["mig_instances"][0]["compute_instance_id"] == 0
    assert [(m["profile"], m["placement"]["start"]) for m in doc["gpus"][0]["after"]] == [("3g.71gb", 0)]
    assert not lock.exists()
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the guard put back what it found
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid_of(state, 0))  # a rerun completes it
    assert proc.returncode == 0 and doc["gpus"][0]["status"] == "create"
    assert instances(state, 0) == [("3g.71gb", 0), ("3g.71gb", 4)]


def test_a_held_maintenance_lock_refuses(state: Path) -> None:
    from fleetops.agent import lock as node_lock

    held = node_lock.acquire(str(state) + ".maintenance.lock", "reset", "GPU-x", 600)
    try:
        before = state.read_bytes()
        proc, doc = apply(state, "--layout", LAYOUT)
        assert proc.returncode == 1 and doc["result"] == "refused" and doc["holder"]["action"] == "reset"
        assert state.read_bytes() == before
    finally:
        held.release()


def test_mig_reset_still_recreates_one_gpu_after_apply(state: Path) -> None:
    apply(state, "--layout", LAYOUT)
    old = {m["uuid"] for m in sim.read_state(str(state))["gpus"][3]["mig_instances"]}
    proc, doc = agent(["mig", "reset", "--gpu", uuid_of(state, 3)], state)
    assert proc.returncode == 0, proc.stderr
    new = sim.read_state(str(state))["gpus"][3]["mig_instances"]
    assert {m["uuid"] for m in new}.isdisjoint(old) and instances(state, 3) == [("3g.71gb", 0), ("3g.71gb", 4)]


def test_a_layout_drift_is_found_on_the_gpu_that_drifted(state: Path) -> None:
    apply(state, "--layout", LAYOUT)
    agent(["mig", "reset", "--gpu", uuid_of(state, 1), "--profiles", "3g.71gb,1g.18gb,1g.18gb"], state)
    wanted = {"gpu_models": {"NVIDIA H200": {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}}}}
    found = audit(state, wanted)
    assert [(f.check, f.gpu["uuid"]) for f in found] == [("config.mig_layout", uuid_of(state, 1))]
    assert "missing 3g.71gb" in found[0].message and "extra 1g.18gb, 1g.18gb" in found[0].message
    assert found[0].observed == ["1g.18gb", "1g.18gb", "3g.71gb"] and found[0].expected == ["3g.71gb", "3g.71gb"]


def test_mig_apply_on_a_lost_gpu_fails_as_nvml_does_and_changes_nothing(state: Path) -> None:
    sim.inject(str(state), "xid:79", 1)
    before = state.read_bytes()
    proc, doc = apply(state, "--layout", LAYOUT, "--gpu", uuid_of(state, 1))
    assert proc.returncode != 0, proc.stdout
    said = json.dumps(doc) + proc.stderr
    assert [(g["uuid"], g["result"]) for g in doc["gpus"]] == [(uuid_of(state, 1), "failed")], said
    assert doc["result"] == "failed" and doc["gpus"][0]["detail"].endswith(
        ": set MIG mode: GPU is lost (xid:79): NVML answers GPU_IS_LOST until the node is rebooted"), said
    assert instances(state, 1) == [] and not sim.read_state(str(state))["gpus"][1].get("mig_mode_current")
    assert sim.read_state(str(state))["faults"] == json.loads(before)["faults"]
