"""The daemon samples MIG instances: a real ``fleetops-agent serve`` on the simulator serves, per
GPU in MIG mode, its instances and the processes in each, in the snapshot and in ``watch``
lines, and a watch line carries them only when they changed; the NVML daemon samples them on
every light read too, listing instances only on the GPUs in MIG mode (the fake NVML)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from test_agent_serve import AGENT, Daemon, _ask, _until

from fleetops.gpu import instances
from fleetops.sim import gpu as sim

GPU = 3


@pytest.fixture()
def node(tmp_path: Path) -> Path:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    return state


@pytest.fixture()
def daemon(node: Path) -> Iterator[Daemon]:
    d = Daemon([node])
    d.start()
    yield d
    d.stop()


def _split(path: Path, profiles: list[str]) -> list[dict[str, Any]]:
    """MIG on for GPU ``GPU`` and ``profiles`` created on it, as the agent's mig apply leaves it."""
    with sim.locked_state(str(path)) as state:
        state["gpus"][GPU]["mig_mode_current"] = True
        state["gpus"][GPU]["mig_mode_pending"] = True
        made = [dict(m) for m in sim.set_mig_instances(state, GPU, profiles)]
    return made


def _run_in(path: Path, gi: int, pid: int, name: str) -> None:
    """A compute process in GPU instance ``gi`` of GPU ``GPU`` (NVML names the instance per process)."""
    with sim.locked_state(str(path)) as state:
        sim.add_process(state, GPU, pid, name, 4096)
        state["processes"][str(GPU)][-1].update({"gpu_instance_id": gi, "compute_instance_id": 0})


def _line(out: IO[bytes]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out.readline())
    return doc


def test_the_snapshot_lists_each_instance_with_the_processes_in_it(node: Path, daemon: Daemon) -> None:
    assert (_ask(node, "snapshot") or {}).get("mig") == {}  # no GPU in MIG mode
    made = _split(node, ["3g.71gb", "2g.35gb", "1g.18gb"])
    _run_in(node, made[1]["gpu_instance_id"], 4242, "vllm")
    uuid = sim.read_state(str(node))["gpus"][GPU]["uuid"]

    def served() -> Any:
        mig = (_ask(node, "snapshot") or {}).get("mig") or {}
        entry = mig.get(uuid)
        return entry if entry and any(i["pids"] for i in entry["instances"]) else None

    entry = _until("the instances and the process in the daemon's snapshot", served)
    assert entry["mode"] is True
    assert [(i["gi"], i["ci"], i["profile"], i["uuid"], i["pids"], i["in_use"]) for i in entry["instances"]] == [
        (m["gpu_instance_id"], 0, m["profile"], m["uuid"], [4242] if m is made[1] else [], m is made[1])
        for m in made
    ]
    assert entry["other_pids"] == []
    assert list((_ask(node, "snapshot") or {})["mig"]) == [uuid]  # only the GPU in MIG mode


def test_watch_sends_instances_when_they_change_and_not_otherwise(node: Path, daemon: Daemon) -> None:
    env = {**os.environ, "FLEETOPS_SIM_STATE": str(node)}
    proc = subprocess.Popen([AGENT, "watch"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        first = _line(proc.stdout)
        assert first["mig"] == {}
        made = _split(node, ["4g.71gb", "3g.71gb"])
        uuid = sim.read_state(str(node))["gpus"][GPU]["uuid"]
        while True:  # change lines until one carries the instances
            change = _line(proc.stdout)["change"]
            if "mig" in change:
                break
        assert [i["uuid"] for i in change["mig"][uuid]["instances"]] == [m["uuid"] for m in made]
        # a job starting in an instance is a change of the instances
        _run_in(node, made[0]["gpu_instance_id"], 5151, "python3")
        while "mig" not in (change := _line(proc.stdout)["change"]):
            pass
        assert [i["pids"] for i in change["mig"][uuid]["instances"]] == [[5151], []]
        # an XID is a change of its own: its line does not carry the (unchanged) instances
        assert sim.inject(str(node), "xid:31", 0)
        while True:
            change = _line(proc.stdout)["change"]
            if change.get("daemon", {}).get("xid_counts"):
                break
            assert "mig" not in change, "a line repeated instances that had not changed"
        assert "mig" not in change
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_a_process_the_driver_places_in_no_listed_instance_is_kept_apart() -> None:
    gpu = {
        "uuid": "GPU-1", "mig_mode_current": True, "mig_mode_pending": True,
        "mig_instances": [
            {"gpu_instance_id": 1, "compute_instance_id": 0, "profile": "3g.71gb", "uuid": "MIG-a", "in_use": False},
            {"gpu_instance_id": 2, "compute_instance_id": None, "profile": "3g.71gb", "uuid": None, "in_use": False},
        ],
        "processes": [
            {"pid": 10, "gpu_instance_id": 1, "compute_instance_id": 0},
            {"pid": 11, "gpu_instance_id": 1, "compute_instance_id": 1},  # another CI of GI 1: not listed
            {"pid": 12, "gpu_instance_id": None},
        ],
    }
    entry = instances.gpu_table(gpu)
    assert entry is not None
    assert [(i["gi"], i["pids"], i["in_use"]) for i in entry["instances"]] == [(1, [10], True), (2, [], False)]
    assert entry["other_pids"] == [11, 12]
    assert instances.gpu_table({"uuid": "GPU-2", "mig_mode_current": False, "mig_instances": None}) is None


def test_the_nvml_daemon_serves_instances_from_its_full_snapshot(tmp_path: Path) -> None:
    # the fake NVML holds GPU 1 in MIG mode with a 3g.71gb (GI 1) running pid 4242 and an idle 3g (GI 2)
    # (GPU 1: the fake's MIG handles of GPU 0 fall below 1000, where it takes them for GPU indices)
    from test_agent_serve import _ask_path, _nvml_daemon

    d, control, _, sock = _nvml_daemon(tmp_path)
    doc = json.loads(control.read_text())
    doc["mig"] = {"1": {"mode": [1, 1], "instances": [
        {"gi": 1, "profile_id": 9, "start": 0, "size": 4, "ci": 0, "pids": [4242]},
        {"gi": 2, "profile_id": 9, "start": 4, "size": 4, "ci": 0, "pids": []},
    ]}}
    control.write_text(json.dumps(doc))
    try:
        served = _until("the NVML daemon's instances", lambda: ((_ask_path(sock) or {}).get("mig") or None))
        [(uuid, entry)] = served.items()
        assert uuid == (_ask_path(sock) or {})["gpus"][1]["uuid"]
        assert [(i["gi"], i["ci"], i["profile"], i["uuid"], i["pids"], i["in_use"]) for i in entry["instances"]] == [
            (1, 0, "3g.71gb", "MIG-fake-1-1", [4242], True),
            (2, 0, "3g.71gb", "MIG-fake-1-2", [], False),
        ]
        assert entry["other_pids"] == []
    finally:
        d.stop()


def _fake_mig(control: Path, gpu: int, instances_: list[dict[str, Any]]) -> None:
    doc = json.loads(control.read_text())
    doc.setdefault("mig", {})[str(gpu)] = {"mode": [1, 1], "instances": instances_}
    control.write_text(json.dumps(doc))


def test_the_nvml_daemon_samples_instances_on_every_light_read_not_only_at_full_snapshots(tmp_path: Path) -> None:
    # GPU 1 in MIG mode from the start, and a full snapshot every 600 s: after the first one,
    # only a light read can see the instance and the job that appear
    from test_agent_serve import _ask_path, _nvml_daemon

    one = [{"gi": 1, "profile_id": 9, "start": 0, "size": 4, "ci": 0, "pids": []}]
    d, control, _, sock = _nvml_daemon(tmp_path, full_interval_s=600, mig={"1": {"mode": [1, 1], "instances": one}})
    try:
        served = _until("the MIG GPU's instance", lambda: (_ask_path(sock) or {}).get("mig") or None)
        [(uuid, entry)] = served.items()
        assert [(i["gi"], i["pids"]) for i in entry["instances"]] == [(1, [])]
        _fake_mig(control, 1, [{"gi": 1, "profile_id": 9, "start": 0, "size": 4, "ci": 0, "pids": [4242]},
                               {"gi": 2, "profile_id": 9, "start": 4, "size": 4, "ci": 0, "pids": []}])

        def sampled() -> Any:
            entry = ((_ask_path(sock) or {}).get("mig") or {}).get(uuid) or {}
            return entry if len(entry.get("instances") or []) == 2 else None

        entry = _until("the new instance and the job, from a light read", sampled, 30.0)
        assert [(i["gi"], i["profile"], i["uuid"], i["pids"], i["in_use"]) for i in entry["instances"]] == [
            (1, "3g.71gb", "MIG-fake-1-1", [4242], True), (2, "3g.71gb", "MIG-fake-1-2", [], False)]
    finally:
        d.stop()


def test_a_light_read_lists_instances_only_on_gpus_in_mig_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import fake_nvml

    from fleetops.gpu import hostinfo
    from fleetops.gpu.nvml.access import NvmlAccess

    control = tmp_path / "control.json"
    control.write_text(json.dumps({"mode": "ok", "temp": 40}))
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(control))
    monkeypatch.setenv("FLEETOPS_AGENT_NVML_MODULE", "fake_nvml")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)  # put back after the test
    fake_nvml.fresh()  # NVML not initialised in this process yet, whatever ran before
    monkeypatch.setattr(hostinfo, "nvidia_packages_with_origins", lambda: ({}, {}, None))
    backend = NvmlAccess()
    mig_calls = ("nvmlDeviceGetMigMode", "nvmlDeviceGetGpuInstances", "nvmlGpuInstanceGetInfo",
                 "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetMaxMigDeviceCount",
                 "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetComputeRunningProcesses")

    def light_calls() -> dict[str, int]:
        fake_nvml.reset_calls()
        backend.light()
        return {k: v for k, v in fake_nvml.calls().items() if k in mig_calls or "Instance" in k or "Mig" in k}

    backend.light()
    assert backend.mig is None  # no full snapshot yet: the daemon serves the full snapshot's instances
    backend.full()
    assert light_calls() == {} and backend.mig == {}  # MIG off on both GPUs: not one MIG call
    _fake_mig(control, 1, [{"gi": 1, "profile_id": 9, "start": 0, "size": 4, "ci": 0, "pids": [4242]},
                           {"gi": 2, "profile_id": 9, "start": 4, "size": 4, "ci": 0, "pids": []}])
    assert light_calls() == {}  # mode changes are found by the full snapshot
    backend.full()
    light_calls()  # the first sample reads the GPU's profile table, once
    assert light_calls() == {
        "nvmlDeviceGetMigMode": 1,  # GPU 1 only
        "nvmlDeviceGetGpuInstances": 7,  # one per H200 profile
        "nvmlGpuInstanceGetInfo": 2,
        "nvmlDeviceGetMaxMigDeviceCount": 1,
        "nvmlDeviceGetMigDeviceHandleByIndex": 7,
        "nvmlDeviceGetGpuInstanceId": 2,
        "nvmlDeviceGetComputeInstanceId": 2,
        "nvmlDeviceGetComputeRunningProcesses": 3,  # each MIG device, and the parent's
    }
    assert backend.mig is not None
    (uuid, entry), = backend.mig.items()
    assert uuid == "GPU-fake-1" and entry["mode"] is True and entry["other_pids"] == []
    assert [(i["gi"], i["pids"]) for i in entry["instances"]] == [(1, [4242]), (2, [])]
    doc = json.loads(control.read_text())
    doc["mig"]["1"] = {"mode": [0, 0], "instances": []}  # MIG turned off: the next sample drops it
    control.write_text(json.dumps(doc))
    light_calls()
    assert backend.mig == {} and light_calls() == {}
