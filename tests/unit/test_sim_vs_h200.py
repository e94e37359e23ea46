"""The simulator's default GPU against the real H200 in tests/fixtures/h200.

The simulator is what every test and the demo audit; if its healthy GPU is not what a real
healthy H200 reports, a check can be green on the simulator and wrong on a real node (a lifetime
ECC count of 289, two remapped rows and a slowdown at 89 C are normal). So the default node, as
``fleetops-agent collect --backend sim`` delivers it, is compared with the capture on every field
a check reads and on the other values a healthy GPU shows. The capture is read by
``h200_capture`` (standard library only), never through the simulator's or the collector's code.

Not compared: identity (UUID, serial, bus id, index; the capture's minor number and board id
have no snapshot field), and what the capture could not report or reports for a different machine:
it is a VM with one GPU passed through, the simulator a bare-metal HGX board of eight GPUs behind
NVSwitch (see ``EXCEPTED``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import h200_capture as cap
import pytest

from fleetops import model
from fleetops.sim import gpu as sim

ROOT = Path(__file__).resolve().parents[2]

# Every Gpu field compared, and who reads it: the checks (family.check) or, for a value no check
# reads, why it is compared anyway. Where the capture has each value: h200_capture (the XML path
# or NVML getter is in the failure message).
COMPARED: dict[str, str] = {
    "name": "versions.vbios/inforom and thermal_power.power_limit group GPUs by model",
    "board_part_number": "no check; the SKU (a different board is a different GPU)",
    "vbios_version": "versions.vbios",
    "inforom_image": "versions.inforom",
    "inforom_oem": "no check; firmware a stock H200 ships",
    "gsp_firmware": "no check; GSP firmware equals the driver on a healthy node",
    "persistence_mode": "config.persistence_mode",
    "compute_mode": "config.compute_mode",
    "power_draw_w": "no check; an idle GPU's draw (within 0.5 W: the capture's readings span 77.39-77.79 W)",
    "power_limit_w": "thermal_power.power_limit, thermal_power.power_enforced",
    "power_default_limit_w": "no check; the stock limit",
    "power_min_limit_w": "thermal_power.power_limit (the range a baseline must fit)",
    "power_max_limit_w": "thermal_power.power_limit (the range a baseline must fit)",
    "power_enforced_limit_w": "thermal_power.power_enforced",
    "temp_gpu_c": "thermal_power.temperature",
    "temp_memory_c": "thermal_power.memory_temperature",
    "temp_slowdown_c": "thermal_power.temperature",
    "temp_shutdown_c": "no check; the threshold next to slowdown (real 95 C)",
    "clock_sm_mhz": "thermal_power.throttle (the message)",
    "clock_sm_max_mhz": "thermal_power.throttle (the message)",
    "clock_mem_mhz": "no check; idle memory clock",
    "clock_mem_max_mhz": "no check; max memory clock",
    "clocks_event_mask": "thermal_power.throttle",
    "clocks_event_reasons": "thermal_power.throttle",
    "utilization_gpu_pct": "no check; an idle GPU",
    "utilization_mem_pct": "no check; an idle GPU",
    "memory_used_mib": "no check; an idle GPU",
    "memory_total_mib": "no check; the H200's 141 GB (143771 MiB usable)",
    "ecc_mode_current": "config.ecc_mode",
    "ecc_mode_pending": "config.ecc_mode",
    "ecc_corrected_volatile": "memory.ecc_sbe_volatile, memory.ecc_sbe_rate",
    "ecc_uncorrected_volatile": "memory.ecc_dbe_volatile",
    "ecc_corrected_aggregate": "no check; a lifetime count, 289 on a healthy GPU",
    "ecc_uncorrected_aggregate": "no check; a lifetime count",
    "remapped_rows_corrected": "no check; 2 on a healthy GPU",
    "remapped_rows_uncorrected": "memory.row_remap_uncorrectable",
    "remapped_rows_pending": "memory.row_remap_pending",
    "remapped_rows_failure": "memory.row_remap_failure",
    "pcie_gen_current": "pcie.link_degraded, pcie.replay_rate",
    "pcie_gen_max": "pcie.link_degraded",
    "pcie_width_current": "pcie.link_degraded, pcie.replay_rate",
    "pcie_width_max": "pcie.link_degraded",
    "pcie_replay_counter": "pcie.replay_rate",
    "mig_mode_current": "config.mig_mode, nvlink.*, topology.*",
    "mig_mode_pending": "config.mig_mode",
    "processes": "config.stray_processes",
    "recovery_action": "xid.recovery_action",
}

# Fields not compared, and why. "unsupported" ones are checked below to be Not Supported / N/A in
# the capture, so the reason cannot go stale silently.
# minor_number: the device file's minor (/dev/nvidia<N>), identity as the index is (the capture
# predates the field; job attribution resolves by it, no check reads it)
IDENTITY = ("index", "uuid", "bus_id", "serial", "minor_number")
EXCEPTED: dict[str, str] = {
    "nvlinks": "unsupported: NVLink is Not Supported in the passthrough VM; the simulator models a "
    "bare-metal HGX H200 with 18 NVLinks up per GPU through NVSwitch (read by nvlink.*)",
    "fabric_state": "unsupported: fabric N/A in the VM (no NVSwitch); the simulator's HGX has Fabric "
    "Manager: completed (read by config.fabric_state)",
    "fabric_status": "unsupported: as fabric_state; the simulator says success",
    "numa_node": "unsupported: NUMA node Not Supported in the VM (sysfs -1); the simulator's two-socket "
    "HGX host puts GPUs 0-3 on node 0 and 4-7 on node 1 (read by topology.numa)",
    "retired_pages_sbe": "unsupported in both: Hopper remaps rows instead (compared below as Not Supported)",
    "retired_pages_dbe": "unsupported in both: as retired_pages_sbe",
    "retired_pages_pending": "unsupported in both: as retired_pages_sbe",
    "cpu_affinity": "the host's CPUs (the VM has 16, affinity 0-15), not the GPU's; the simulator's "
    "two-socket host has 224",
    "temp_memory_max_c": "the capture states the HBM maximum only as a T.Limit margin "
    "(gpu_temp_max_mem_tlimit_threshold 0 C) with no HBM margin reading to anchor it, so not in "
    "degrees; the simulator says 95 C (HBM3e rating; read by thermal_power.memory_temperature)",
    "last_reset_at": "not from NVML: when fleetops last reset the GPU (the agent's reset journal, the "
    "simulator's resets); None in the capture and on a fresh simulated node (read by xid.recent)",
    "mig_instances": "MIG is disabled in the capture and the simulator: no instances to compare (both "
    "None; the simulator records 'MIG disabled')",
}
# Not Supported in the capture, with no snapshot field: fan speed (an HGX board's fans belong to the
# chassis BMC; nothing in fleetops reads a fan).


def _collect_default_node(tmp: Path) -> model.Node:
    """The default node as the agent delivers it: a fresh state, then the agent's own command."""
    state = tmp / "state.json"
    sim.init_state(str(state), "node001")
    env = {k: v for k, v in os.environ.items() if k != "FLEETOPS_SIM_STATE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "collect", "--backend", "sim", "--state", str(state)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    return model.node_from_json(done.stdout)


@pytest.fixture(scope="module")
def sim_node(tmp_path_factory: pytest.TempPathFactory) -> model.Node:
    return _collect_default_node(tmp_path_factory.mktemp("sim-vs-h200"))


def _capture() -> dict[str, cap.Real]:
    """XML values, completed by NVML for the fields only the probe read."""
    return cap.gpu_from_nvml() | cap.gpu_from_xml()


# --- the capture itself ------------------------------------------------------------------------


def test_xml_and_nvml_agree_on_every_value_both_report():
    xml, nvml = cap.gpu_from_xml(), cap.gpu_from_nvml()
    both = sorted(set(xml) & set(nvml))
    assert len(both) >= 30  # the parsers found the values, not two empty sets
    differ = {f: (xml[f].value, nvml[f].value) for f in both if xml[f].value != nvml[f].value}
    assert differ == {}


def test_xml_threshold_tags_mean_what_the_text_report_says():
    """The XML's tag names are ambiguous (``gpu_temp_max_tlimit_threshold`` is the shutdown one);
    the text report labels the same numbers."""
    pairs = {
        "GPU T.Limit Temp": "temperature/gpu_temp_tlimit",
        "GPU Shutdown T.Limit Temp": "temperature/gpu_temp_max_tlimit_threshold",
        "GPU Slowdown T.Limit Temp": "temperature/gpu_temp_slow_tlimit_threshold",
        "GPU Max Operating T.Limit Temp": "temperature/gpu_temp_max_gpu_tlimit_threshold",
        "Memory Max Operating T.Limit Temp": "temperature/gpu_temp_max_mem_tlimit_threshold",
        "GPU Current Temp": "temperature/gpu_temp",
    }
    assert {label: cap.text_report_label(label) for label in pairs} == {
        label: cap.xml_text(tag) for label, tag in pairs.items()
    }


def test_the_capture_shows_what_a_healthy_h200_has():
    real = _capture()
    assert real["ecc_corrected_aggregate"].value == 289
    assert (real["ecc_corrected_volatile"].value, real["ecc_uncorrected_aggregate"].value) == (0, 0)
    assert [real[f].value for f in ("remapped_rows_corrected", "remapped_rows_uncorrected",
                                    "remapped_rows_pending", "remapped_rows_failure")] == [2, 0, False, False]
    assert (real["temp_slowdown_c"].value, real["temp_shutdown_c"].value) == (89.0, 95.0)
    assert [real[f].value for f in ("power_limit_w", "power_min_limit_w", "power_max_limit_w")] == [700.0, 200.0, 700.0]


# --- the simulator against it ------------------------------------------------------------------


def test_the_default_node_is_eight_h200s(sim_node):
    assert sim_node.backend == "sim" and len(sim_node.gpus) == 8 and sim_node.gpu_count == 8


@pytest.mark.parametrize("field", sorted(COMPARED))
def test_default_gpu_matches_the_capture(sim_node, field):
    real = _capture()[field]
    for gpu in sim_node.gpus:
        have = getattr(gpu, field)
        if field == "power_draw_w":
            assert have == pytest.approx(real.value, abs=0.5), f"GPU {gpu.index} {field}: sim {have}, {real.source}"
            continue
        if field == "processes":
            have = [dataclasses.asdict(p) for p in have]
        assert have == real.value, f"GPU {gpu.index} {field}: sim {have!r}, capture {real.value!r} ({real.source})"


@pytest.mark.parametrize("field", sorted(cap.node_from_capture()))
def test_default_node_versions_match_the_capture(sim_node, field):
    real = cap.node_from_capture()[field]
    assert getattr(sim_node, field) == real.value, real.source


def test_default_node_names_the_build_branch_the_real_h200_names(sim_node):
    """The capture predates nvmlSystemGetDriverBranch; read later on the same kind of machine
    (tests/fixtures/h200/README.md), the captured 580.159.04 driver names build branch r582_49."""
    driver = cap.node_from_capture()["driver_version"].value
    assert (driver, sim_node.driver_branch) == ("580.159.04", "r582_49")


def test_retired_pages_are_not_supported_in_the_capture_and_the_simulator(sim_node):
    assert cap.nvml_failed_as("nvmlDeviceGetRetiredPagesPendingStatus") == cap.NOT_SUPPORTED
    assert cap.nvml_failed_as("retired_dbe") == cap.NOT_SUPPORTED
    for tag in ("multiple_single_bit_retirement/retired_count", "double_bit_retirement/retired_count",
                "pending_retirement"):
        assert cap.xml_text("retired_pages/" + tag) == "N/A"
    for gpu in sim_node.gpus:
        for field in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
            assert getattr(gpu, field) is None and gpu.unavailable[field] == "NotSupported"


def test_what_the_passthrough_vm_cannot_report_is_not_supported_in_the_capture():
    """The exceptions' evidence: NVLink, NUMA, fabric and fan are Not Supported / N/A there."""
    gpu = cap.nvml_gpu()
    links = gpu["nvlink"]
    assert len(links) == 18
    assert {probe["value"] for link in links.values() for probe in link.values()} == {repr(cap.NOT_SUPPORTED)}
    for name in ("NVML_FI_DEV_NVLINK_LINK_COUNT", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"):
        assert cap.nvml_field(name)[0] == 3  # NVML_ERROR_NOT_SUPPORTED
    assert cap.nvml_failed_as("nvmlDeviceGetNumaNodeId") == cap.NOT_SUPPORTED
    assert "numa=-1" in cap.QUERIES.read_text()
    assert (cap.xml_text("fabric/state"), cap.xml_text("fabric/status")) == ("N/A", "N/A")
    assert cap.nvml_failed_as("nvmlDeviceGetFanSpeed") == cap.NOT_SUPPORTED
    assert cap.xml_text("fan_speed") == "N/A"
    assert cap.xml_text("gpu_virtualization_mode/virtualization_mode") == "Pass-Through"


def _fields_the_checks_read() -> set[str]:
    """Gpu fields named in the checks' source (attribute access or a quoted name)."""
    names = {f.name for f in dataclasses.fields(model.Gpu)} - {"unavailable"}
    text = "\n".join(p.read_text() for p in sorted((ROOT / "fleetops" / "checks").glob("*.py")))
    return {n for n in names if re.search(r"""[."']""" + n + r"\b", text)}


def test_every_field_a_check_reads_is_compared_or_excepted():
    read = _fields_the_checks_read()
    assert {"temp_slowdown_c", "remapped_rows_uncorrected", "nvlinks"} <= read  # the scan works
    uncovered = read - set(COMPARED) - set(EXCEPTED) - set(IDENTITY)
    assert uncovered == set()
    assert set(COMPARED) & set(EXCEPTED) == set()


def test_every_compared_field_has_a_value_in_the_capture():
    missing = set(COMPARED) - set(_capture())
    assert missing == set()
    assert set(COMPARED) <= {f.name for f in dataclasses.fields(model.Gpu)}


def test_default_snapshot_fields_are_all_accounted_for(sim_node):
    """A field added to the snapshot lands in COMPARED, EXCEPTED or IDENTITY, not nowhere."""
    gpu_fields = {f.name for f in dataclasses.fields(model.Gpu)} - {"unavailable"}
    assert gpu_fields - set(COMPARED) - set(EXCEPTED) - set(IDENTITY) == set()
