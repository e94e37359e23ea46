"""``mig apply``'s NVML path (``fleetops.gpu.nvml.MigControl``) against the fake pynvml, whose
GPU-instance profiles are the real H200's capture: the profile table NVML answers, GPU and
compute instances created with their placements, the rerun that makes no changing call, a
busy instance refused before any destroy call, the mode that stays pending, a dry run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent import mig_apply
from fleetops.catalog import mig as catalog
from fleetops.gpu import nvml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_nvml

CHANGING = ("nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
            "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy")


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"mode": "ok", "temp": 40}))
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(path))
    fake_nvml.reset_calls()
    return path


def run(tmp_path: Path, layout: str, dry_run: bool = False, selector: str = "all") -> tuple[dict[str, Any], int]:
    ops = mig_apply.NvmlMig(dry_run, nv=fake_nvml)
    source = mig_apply.Source(layout=mig_apply.parse_layout(layout))
    return mig_apply.run(source, selector, dry_run, "nvml", None, str(tmp_path / "lock"), ops=ops)


def mig_state(control: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(control.read_text())
    return data.get("mig", {})


def changing_calls() -> dict[str, int]:
    return {k: v for k, v in fake_nvml.calls().items() if k in CHANGING}


def test_the_profile_table_nvml_answers_is_the_catalogs_h200_table(control: Path) -> None:
    table, why = nvml.MigControl(fake_nvml).profiles(0, "NVIDIA H200")
    assert why is None
    assert table == catalog.H200_SXM


def test_a_layout_is_created_with_placements_and_a_rerun_makes_no_changing_call(control: Path, tmp_path: Path) -> None:
    doc, code = run(tmp_path, "4g.71gb,1g.18gb,1g.18gb")
    assert code == 0, doc["message"]
    assert doc["result"] == "applied" and doc["backend"] == "nvml"
    assert changing_calls() == {"nvmlDeviceSetMigMode": 2, "nvmlDeviceCreateGpuInstanceWithPlacement": 6,
                                "nvmlGpuInstanceCreateComputeInstance": 6}
    for gpu in ("0", "1"):
        got = sorted((m["profile_id"], m["start"], m["size"], m["ci"]) for m in mig_state(control)[gpu]["instances"])
        assert got == [(5, 0, 4, 0), (19, 4, 1, 0), (19, 5, 1, 0)]
    assert [m["uuid"] for m in doc["gpus"][1]["after"]] == ["MIG-fake-1-1", "MIG-fake-1-2", "MIG-fake-1-3"]
    fake_nvml.reset_calls()
    doc, code = run(tmp_path, "4g.71gb,1g.18gb,1g.18gb")
    assert code == 0 and doc["result"] == "unchanged"
    assert changing_calls() == {}


def test_a_recreate_destroys_compute_then_gpu_instances(control: Path, tmp_path: Path) -> None:
    run(tmp_path, "3g.71gb,3g.71gb", selector="GPU-fake-0")
    fake_nvml.reset_calls()
    doc, code = run(tmp_path, "3g.71gb,2g.35gb,1g.18gb", selector="GPU-fake-0")
    assert code == 0, doc["message"]
    assert changing_calls() == {"nvmlComputeInstanceDestroy": 1, "nvmlGpuInstanceDestroy": 1,
                                "nvmlDeviceCreateGpuInstanceWithPlacement": 2, "nvmlGpuInstanceCreateComputeInstance": 2}
    got = sorted((m["profile_id"], m["start"]) for m in mig_state(control)["0"]["instances"])
    assert got == [(9, 0), (14, 4), (19, 6)]  # the 3g at slice 0 stays
    assert fake_nvml.nvmlDeviceGetMigMode(1) == [0, 0]  # the other GPU untouched


def test_a_busy_instance_is_refused_before_any_changing_call(control: Path, tmp_path: Path) -> None:
    run(tmp_path, "3g.71gb,3g.71gb")
    data = json.loads(control.read_text())
    data["mig"]["1"]["instances"][1]["pids"] = [777]
    control.write_text(json.dumps(data))
    fake_nvml.reset_calls()
    doc, code = run(tmp_path, "7g.141gb")
    assert code == 1 and doc["result"] == "refused"
    refused = [g for g in doc["gpus"] if g["status"] == "refused"]
    assert [g["uuid"] for g in refused] == ["GPU-fake-1"] and "pid 777" in refused[0]["detail"]
    assert changing_calls() == {}
    assert json.loads(control.read_text())["mig"] == data["mig"]


def test_a_mode_that_stays_pending_is_reported_with_the_reset(control: Path, tmp_path: Path) -> None:
    data = json.loads(control.read_text())
    data["mig_needs_reset"] = True
    control.write_text(json.dumps(data))
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", selector="GPU-fake-0")
    assert code == 1 and doc["result"] == "mode-pending"
    assert doc["gpus"][0]["remedy"] == "fleetops-agent reset --gpu GPU-fake-0"
    assert mig_state(control)["0"] == {"mode": [0, 1], "instances": []}


def test_a_mig_parted_device_filter_matches_nvmls_pci_device_id(control: Path, tmp_path: Path) -> None:
    config = tmp_path / "parted.yaml"
    config.write_text(json.dumps({"version": "v1", "mig-configs": {"h200": [
        {"devices": [0], "device-filter": "0x233510DE", "mig-enabled": True, "mig-devices": {"3g.71gb": 2}}]}}))
    ops = mig_apply.NvmlMig(False, nv=fake_nvml)
    source = mig_apply.Source(config=str(config), select="h200")
    doc, code = mig_apply.run(source, "all", False, "nvml", None, str(tmp_path / "lock"), ops=ops)
    assert code == 0, doc["message"]
    assert [g["status"] for g in doc["gpus"]] == ["mode-change", "unchanged"]
    assert sorted(m["start"] for m in mig_state(control)["0"]["instances"]) == [0, 4]


def test_a_dry_run_makes_no_changing_call(control: Path, tmp_path: Path) -> None:
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", dry_run=True)
    assert code == 0 and doc["result"] == "would-change"
    assert [g["status"] for g in doc["gpus"]] == ["mode-change", "mode-change"]
    assert changing_calls() == {}
    assert not (tmp_path / "lock").exists()
