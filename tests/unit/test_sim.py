"""Each simulator fault changes exactly what it should, and nothing else."""

import json
import os

import pytest

from fleetops import model
from fleetops.sim import gpu as sim

T0 = 1_800_000_000.0


def snap(faults, now=T0 + 60):
    state = sim.build_state("node001", {"faults": []})
    for entry in faults:
        name, _, gpu = entry.partition("@")
        sim.inject_into(state, name, int(gpu) if gpu else None)
        state["faults"][-1]["since"] = T0
    return sim.snapshot(state, now=now)


def flat(data):
    """Every leaf of a snapshot keyed by GPU UUID (indices shift when a GPU disappears)."""
    out = {}
    for key, value in data.items():
        if key in ("gpus", "topology", "_kernel_log", "uptime_s"):
            continue
        out[("node", key)] = json.dumps(value, sort_keys=True)
    for gpu in data["gpus"]:
        for key, value in gpu.items():
            if key == "index":
                continue
            if key == "nvlinks":
                for link in value:
                    for lk, lv in link.items():
                        out[(gpu["uuid"], f"nvlink{link['link']}.{lk}")] = lv
                continue
            out[(gpu["uuid"], key)] = json.dumps(value, sort_keys=True)
    return out


CLEAN = None


def changes(faults):
    global CLEAN
    if CLEAN is None:
        CLEAN = flat(snap([]))
    after = flat(snap(faults))
    changed = {k for k in set(CLEAN) | set(after) if CLEAN.get(k) != after.get(k)}
    return changed


def uuid(i):
    return sim.build_state("node001")["gpus"][i]["uuid"]


EXPECTED = {
    "ecc-dbe@3": {(3, "ecc_uncorrected_volatile"), (3, "ecc_uncorrected_aggregate")},
    "ecc-sbe-storm@2": {(2, "ecc_corrected_volatile"), (2, "ecc_corrected_aggregate")},
    "row-remap-pending@1": {(1, "remapped_rows_pending"), (1, "remapped_rows_uncorrected")},
    "row-remap-failure@1": {(1, "remapped_rows_failure")},
    "pcie-downgrade@4": {(4, "pcie_gen_current"), (4, "pcie_width_current")},
    "pcie-replay-storm@5": {(5, "pcie_replay_counter")},
    "nvlink-down@6": {(6, "nvlink3.state")},
    "nvlink-crc-storm@7": {(7, "nvlink0.crc_errors"), (7, "nvlink0.replay_errors")},
    # a job on GPU 6: its load and every link's traffic but link 5's
    "nvlink-idle@6": {(6, "utilization_gpu_pct")}
    | {(6, f"nvlink{n}.{d}_kib") for n in range(18) if n != 5 for d in ("tx", "rx")},
    "thermal-slowdown@0": {
        (0, "temp_gpu_c"),
        (0, "temp_memory_c"),
        (0, "clocks_event_mask"),
        (0, "clocks_event_reasons"),
        (0, "clock_sm_mhz"),
    },
    "power-brake@0": {(0, "clocks_event_mask"), (0, "clocks_event_reasons"), (0, "clock_sm_mhz")},
    "power-cap-drift@2": {(2, "power_limit_w"), (2, "power_enforced_limit_w")},
    "persistence-off@2": {(2, "persistence_mode")},
    "vbios-drift@2": {(2, "vbios_version")},
    "stray-process@3": {(3, "processes"), (3, "memory_used_mib")},
}


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_changes_exactly_its_fields(fault):
    want = {(uuid(i), key) for i, key in EXPECTED[fault]}
    assert changes([fault]) == want


def test_driver_drift_changes_only_the_node_driver_and_its_branch():
    assert changes(["driver-drift"]) == {("node", "driver_version"), ("node", "driver_branch")}


def test_mig_drift_turns_mig_on_and_nvlinks_report_down_on_that_gpu_only():
    changed = changes(["mig-drift@1"])
    assert (uuid(1), "mig_mode_current") in changed
    assert (uuid(1), "mig_instances") in changed
    assert all(key[0] == uuid(1) for key in changed)


@pytest.mark.parametrize("fault", ["gpu-missing@5", "xid:79@5"])
def test_lost_gpu_keeps_its_index_and_identity_and_nobody_shifts(fault):
    """As NVML: nvmlDeviceGetCount still counts it, its handle answers GPU_IS_LOST, and the
    other GPUs keep their indices until the driver reloads."""
    healthy = snap([])
    data = snap([fault])
    assert data["gpu_count"] == 8
    assert [(g["index"], g["uuid"], g["bus_id"]) for g in data["gpus"]] == [
        (g["index"], g["uuid"], g["bus_id"]) for g in healthy["gpus"]]
    lost = data["gpus"][5]
    assert lost["uuid"] == uuid(5) and lost["bus_id"] == "0000:ab:00.0"
    assert lost["temp_gpu_c"] is None and lost["unavailable"]["temp_gpu_c"] == "GpuIsLost"
    assert lost["nvlinks"] is None and lost["processes"] is None
    gpu = model.node_from_dict({**data, "collected_at": T0}).gpus[5]
    assert model.gpu_lost(gpu) and not any(model.gpu_lost(g) for g in model.node_from_dict(
        {**data, "collected_at": T0}).gpus if g.index != 5)
    topo = data["topology"]
    assert topo["gpus"][5] == "0000:ab:00.0" and topo["links"][5][0] is None and topo["links"][0][1] == "NV18"
    assert topo["unavailable"]["0000:18:00.0|0000:ab:00.0"] == "GpuIsLost"


@pytest.mark.parametrize("fault", ["gpu-missing@5", "xid:79@5"])
def test_a_lost_gpu_refuses_workloads_and_mig_as_nvml_does(fault):
    state = sim.build_state("node001", {"faults": [fault]})
    with pytest.raises(sim.SimError, match="GPU is lost"):
        sim.set_load(state, 5, 50)
    with pytest.raises(sim.SimError, match="GPU is lost"):
        sim.set_mig_mode(state, 5, True)
    with pytest.raises(sim.SimError, match="GPU is lost"):
        sim.mig_reset(state, 5)
    with pytest.raises(sim.SimError, match="not enumerated|lost"):
        sim.reset_gpu(state, 5)
    sim.set_load(state, 4, 50)  # the others work as before
    assert sim.gpu_position(state, uuid(5)) is None and sim.gpu_position(state, uuid(4)) == 4


def test_xid_fault_writes_a_kernel_log_line_for_that_gpu():
    data = snap(["xid:94@2"])
    assert len(data["_kernel_log"]) == 1
    assert "NVRM: Xid (PCI:0000:3a:00): 94," in data["_kernel_log"][0]
    assert changes(["xid:94@2"]) == set()  # no GPU value changes, only the log


def test_storm_counters_grow_with_time():
    early = snap(["ecc-sbe-storm@0", "pcie-replay-storm@0"], now=T0 + 60)
    late = snap(["ecc-sbe-storm@0", "pcie-replay-storm@0"], now=T0 + 180)
    assert late["gpus"][0]["ecc_corrected_volatile"] - early["gpus"][0]["ecc_corrected_volatile"] == 2 * sim.SBE_STORM_PER_MIN
    assert late["gpus"][0]["pcie_replay_counter"] - early["gpus"][0]["pcie_replay_counter"] == 2 * sim.REPLAY_STORM_PER_MIN


def test_unknown_fault_name_is_rejected_with_the_known_list(tmp_path):
    path = tmp_path / "n.json"
    sim.init_state(str(path), "n")
    before = path.read_bytes()
    with pytest.raises(sim.SimError, match="unknown fault 'ecc-dbz'.*ecc-dbe"):
        sim.inject(str(path), "ecc-dbz", 0)
    with pytest.raises(sim.SimError, match="xid:<code>"):
        sim.inject(str(path), "xid:abc", 0)
    assert path.read_bytes() == before


def test_gpu_index_that_does_not_exist_is_rejected(tmp_path):
    path = tmp_path / "n.json"
    sim.init_state(str(path), "n")
    before = path.read_bytes()
    with pytest.raises(sim.SimError, match="GPU index 8 does not exist.*0-7"):
        sim.inject(str(path), "ecc-dbe", 8)
    assert path.read_bytes() == before


def test_corrupt_state_file_is_named_and_left_untouched(tmp_path):
    path = tmp_path / "n.json"
    path.write_text('{"version": 1, "hostname": "n", "gpus": [')
    with pytest.raises(sim.SimError, match=f"{path}: corrupt simulator state"):
        sim.inject(str(path), "ecc-dbe", 0)
    assert path.read_text() == '{"version": 1, "hostname": "n", "gpus": ['


def test_inject_then_clear_restores_the_clean_snapshot(tmp_path):
    path = str(tmp_path / "n.json")
    sim.init_state(path, "n")
    clean = flat(sim.snapshot(sim.read_state(path), now=T0))
    for fault in ("power-cap-drift", "driver-drift", "ecc-dbe", "xid:79", "vbios-drift"):
        gpu = None if fault == "driver-drift" else 2
        assert sim.inject(path, fault, gpu) is True
        assert sim.inject(path, fault, gpu) is False  # idempotent
        sim.clear(path, fault, gpu)
    state = sim.read_state(path)
    assert state["faults"] == [] and state["kernel_log"] == []
    assert flat(sim.snapshot(state, now=T0)) == clean


def test_state_writes_are_atomic_renames(tmp_path):
    path = str(tmp_path / "n.json")
    sim.init_state(path, "n")
    inode = os.stat(path).st_ino
    sim.inject(path, "ecc-dbe", 1)
    assert os.stat(path).st_ino != inode  # replaced, not rewritten in place
    assert [p for p in os.listdir(tmp_path) if p.startswith(".state.")] == []


def test_default_node_looks_like_the_reference_h200():
    data = snap([])
    gpu = data["gpus"][0]
    assert data["driver_version"] == "580.159.04" and data["cuda_driver_version"] == "13.0"
    assert gpu["vbios_version"] == "96.00.A5.00.1A" and gpu["inforom_image"] == "G520.0282.02.02"
    assert (gpu["power_limit_w"], gpu["power_min_limit_w"], gpu["power_max_limit_w"]) == (700.0, 200.0, 700.0)
    assert len(gpu["nvlinks"]) == 18 and data["gpu_count"] == 8
    assert model.node_from_dict({**{k: v for k, v in data.items() if k != "_kernel_log"}, "collected_at": T0})


def test_simulated_processes_carry_their_owner():
    """The stray process is a training job's service account's; a process a test registers
    names its user, or, a real process of this machine, is read from /proc as NVML's collector
    reads it; a record without one has none."""
    import pwd

    state = sim.build_state("node001", {"faults": []})
    sim.inject_into(state, "stray-process", 2)
    sim.add_process(state, 1, 4242, "vllm", 30720, user="alice")
    sim.add_process(state, 1, os.getpid(), "pytest", 10, real=True)
    sim.add_process(state, 1, 4343, "python3", 10)
    doc = sim.snapshot(state, now=T0)
    assert [p["user"] for p in doc["gpus"][2]["processes"]] == [sim.STRAY_USER]
    users = [(p["pid"], p.get("user")) for p in doc["gpus"][1]["processes"]]
    assert users == [(4242, "alice"), (os.getpid(), pwd.getpwuid(os.getuid()).pw_name), (4343, None)]
