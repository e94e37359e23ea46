"""``mig apply``'s NVML path (``fleetops.gpu.nvml.MigControl``) against the fake pynvml, whose
GPU-instance profiles are the real H200's capture: the profile table NVML answers, GPU and
compute instances created with their placements, the rerun that makes no changing call, a
busy instance refused before any destroy call, the mode that stays pending (applied through the
reset flow's NVML backend, or left pending with ``--no-reset``), a dry run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent import mig_apply
from fleetops.agent.reset.backends import nvml_backend
from fleetops.catalog import mig as catalog
from fleetops.gpu import nvml
from fleetops.gpu.nvml.access import NvmlAccess

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_nvml

CHANGING = ("nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance",
            "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy")


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"mode": "ok", "temp": 40}))
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(path))
    fake_nvml.fresh()
    return path


def nvml_ops(dry_run: bool, kind: type[mig_apply.MigOps] = mig_apply.MigOps) -> mig_apply.MigOps:
    """``mig apply``'s ops on the reset flow's NVML backend, its access on the fake pynvml."""
    return kind(nvml_backend(dry_run, NvmlAccess(fake_nvml)))


def run(tmp_path: Path, layout: str, dry_run: bool = False, selector: str = "all") -> tuple[dict[str, Any], int]:
    ops = nvml_ops(dry_run)
    source = mig_apply.Source(layout=mig_apply.parse_layout(layout))
    return mig_apply.run(source, selector, dry_run, "nvml", None, str(tmp_path / "lock"), ops=ops)


def mig_state(control: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(control.read_text())
    return data.get("mig", {})


def changing_calls() -> dict[str, int]:
    return {k: v for k, v in fake_nvml.calls().items() if k in CHANGING}


def test_the_profile_table_nvml_answers_is_the_catalogs_h200_table(control: Path) -> None:
    fake_nvml.nvmlInit()  # a handle exists only once NVML is initialised (the fake refuses otherwise)
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


def needs_reset(control: Path) -> None:
    data = json.loads(control.read_text())
    data["mig_needs_reset"] = True  # a MIG mode change stays pending until the GPU is reset
    control.write_text(json.dumps(data))


def test_with_no_reset_a_mode_that_stays_pending_is_reported_with_the_reset(control: Path, tmp_path: Path) -> None:
    needs_reset(control)
    ops = nvml_ops(False)
    source = mig_apply.Source(layout=mig_apply.parse_layout("3g.71gb,3g.71gb"))
    doc, code = mig_apply.run(source, "GPU-fake-0", False, "nvml", None, str(tmp_path / "lock"), ops=ops, reset=False)
    assert code == 1 and doc["result"] == "mode-pending"
    assert doc["gpus"][0]["remedy"] == "fleetops-agent reset --gpu GPU-fake-0"
    assert mig_state(control)["0"] == {"mode": [0, 1], "instances": []}


@pytest.fixture
def reset_node(control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The reset backend's node-changing functions on the fake NVML: every call recorded in order,
    ``nvidia-smi -r`` applying the pending mode as the driver does; the snapshots are the real
    NVML reader's, on the fake."""
    from fleetops import model
    from fleetops.agent.reset import host
    from fleetops.gpu import hostinfo
    from fleetops.gpu.nvml import access as nvml_access

    calls: list[tuple[Any, ...]] = []

    def snapshot() -> model.Node:
        calls.append(("snapshot",))
        node = model.Node(hostname="fake", backend="nvml")
        nvml.collect_into(node)
        for extra in [c for c in calls if c[0] == "job"]:  # a job the test started on a GPU
            node.gpus[extra[1]].processes = [model.GpuProcess(pid=extra[2], name="python3", used_memory_mib=512)]
        if ("peers",) in calls:  # GPUs 0 and 1 linked directly (no NVSwitch): reset together only
            for gpu, other in ((0, 1), (1, 0)):
                node.gpus[gpu].nvlinks = [model.NvLink(link=0, state="up", remote_type="gpu",
                                                       remote_bus_id=node.gpus[other].bus_id)]
        node.services = {u: "active" for u in ("nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter")}
        return node

    def smi_reset(bus_id: str, timeout: float) -> tuple[int, str]:
        calls.append(("nvidia-smi -r -i", bus_id))
        fake_nvml.reset_gpu(bus_id)
        return 0, f"GPU {bus_id} was successfully reset."

    def systemctl(verb: str, unit: str, timeout: float = 60.0) -> tuple[int, str]:
        calls.append(("systemctl", verb, unit))
        return 0, ""

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)  # the flow's second look-up and its snapshots
    monkeypatch.setattr(nvml_access.NvmlAccess, "snapshot", lambda self, release=False: snapshot())
    monkeypatch.setattr(nvml_access, "nvidia_smi_reset", smi_reset)
    monkeypatch.setattr(host, "systemctl", systemctl)
    monkeypatch.setattr(host, "send_signal", lambda *a: pytest.fail(f"a signal was sent: {a}"))
    monkeypatch.setattr(hostinfo, "service_states", lambda units: ({u: "active" for u in units}, None))
    monkeypatch.setenv("FLEETOPS_RESET_LOG", str(tmp_path / "reset.jsonl"))
    monkeypatch.setenv("FLEETOPS_RESET_CLIENTS", "nvidia-dcgm")
    return calls


def test_a_pending_mode_is_applied_through_the_nvml_reset_backend_then_the_layout_made(
    control: Path, tmp_path: Path, reset_node: list[tuple[Any, ...]]
) -> None:
    needs_reset(control)
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", dry_run=True, selector="GPU-fake-1")
    assert code == 0 and doc["gpus"][0]["reset"] is None  # NVML cannot tell before the mode is set
    assert doc["gpus"][0]["reset_report"]["result"] == "would-reset" and changing_calls() == {}
    assert [c for c in reset_node if c[0] != "snapshot"] == []
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", selector="GPU-fake-1")
    assert code == 0, doc["message"]
    (gpu,) = doc["gpus"]
    assert doc["result"] == "applied" and gpu["reset_report"]["result"] == "reset"
    assert [c for c in reset_node if c[0] != "snapshot"] == [
        ("systemctl", "stop", "nvidia-dcgm"), ("nvidia-smi -r -i", "0000:19:00.0"), ("systemctl", "start", "nvidia-dcgm")]
    assert changing_calls() == {"nvmlDeviceSetMigMode": 1, "nvmlDeviceCreateGpuInstanceWithPlacement": 2,
                                "nvmlGpuInstanceCreateComputeInstance": 2}
    assert mig_state(control)["1"]["mode"] == [1, 1]
    assert sorted(m["start"] for m in mig_state(control)["1"]["instances"]) == [0, 4]
    (line,) = [json.loads(x) for x in (tmp_path / "reset.jsonl").read_text().splitlines()]
    assert line["gpu"]["uuid"] == "GPU-fake-1" and line["backend"] == "nvml" and line["result"] == "reset"
    fake_nvml.reset_calls()
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", selector="GPU-fake-1")
    assert code == 0 and doc["result"] == "unchanged" and changing_calls() == {}
    assert len((tmp_path / "reset.jsonl").read_text().splitlines()) == 1


def test_a_job_on_the_gpu_refuses_the_nvml_reset_and_nothing_but_the_mode_is_sent(
    control: Path, tmp_path: Path, reset_node: list[tuple[Any, ...]]
) -> None:
    needs_reset(control)

    class JobStartsAfterTheModeIsSet(mig_apply.MigOps):
        def set_mode(self, uuid: str, enabled: bool) -> bool:
            now = super().set_mode(uuid, enabled)
            reset_node.append(("job", 1, 4242))
            return now

    ops = nvml_ops(False, JobStartsAfterTheModeIsSet)
    source = mig_apply.Source(layout=mig_apply.parse_layout("3g.71gb,3g.71gb"))
    doc, code = mig_apply.run(source, "GPU-fake-1", False, "nvml", None, str(tmp_path / "lock"), ops=ops)
    (gpu,) = doc["gpus"]
    assert code == 1 and doc["result"] == "mode-pending" and gpu["status"] == "mode-pending"
    assert gpu["reset_report"]["result"] == "refused" and "pid 4242 (python3)" in gpu["detail"]
    assert [c for c in reset_node if c[0] not in ("snapshot", "job")] == []  # no systemctl, no nvidia-smi -r
    assert changing_calls() == {"nvmlDeviceSetMigMode": 1}
    assert mig_state(control)["1"] == {"mode": [0, 1], "instances": []}
    (line,) = [json.loads(x) for x in (tmp_path / "reset.jsonl").read_text().splitlines()]
    assert line["result"] == "refused" and not (tmp_path / "lock").exists()


def test_nvlink_peers_that_must_be_reset_together_are_named_by_the_dry_run_and_leave_the_mode_pending(
    control: Path, tmp_path: Path, reset_node: list[tuple[Any, ...]]
) -> None:
    needs_reset(control)
    reset_node.append(("peers",))
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", dry_run=True, selector="GPU-fake-1")
    (gpu,) = doc["gpus"]
    # NVML tells only once the mode is set whether it waits for a reset: the refusal is said, not final
    assert code == 0 and doc["result"] == "would-change" and gpu["reset"] is None
    assert gpu["reset_report"]["result"] == "refused" and changing_calls() == {}
    assert "the GPU reset (if NVML keeps the mode pending) would be refused" in gpu["detail"]
    assert "these GPUs can only be reset together" in gpu["detail"]
    assert gpu["remedy"].startswith("reset the peer set: GPU-fake-1 (0000:19:00.0), GPU-fake-0 (0000:18:00.0)")
    doc, code = run(tmp_path, "3g.71gb,3g.71gb", selector="GPU-fake-1")
    (gpu,) = doc["gpus"]
    assert code == 1 and doc["result"] == "mode-pending" and gpu["status"] == "mode-pending"
    assert gpu["remedy"].startswith("reset the peer set: ")
    assert [c for c in reset_node if c[0] not in ("snapshot", "peers")] == []
    assert changing_calls() == {"nvmlDeviceSetMigMode": 1}
    assert mig_state(control)["1"] == {"mode": [0, 1], "instances": []}


def test_a_mig_parted_device_filter_matches_nvmls_pci_device_id(control: Path, tmp_path: Path) -> None:
    config = tmp_path / "parted.yaml"
    config.write_text(json.dumps({"version": "v1", "mig-configs": {"h200": [
        {"devices": [0], "device-filter": "0x233510DE", "mig-enabled": True, "mig-devices": {"3g.71gb": 2}}]}}))
    ops = nvml_ops(False)
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
