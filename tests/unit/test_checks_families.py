"""Per-family behaviour beyond the simulator's faults: thresholds, not-a-fault cases, config."""

from __future__ import annotations

import pytest

from fleetops import baseline, model
from fleetops.catalog import throttle
from fleetops.checks import run_node_checks
from fleetops.checks.config import process_allowed


def _checks(findings):
    return {(f.check, f.severity) for f in findings}


# --- thermal / power ---------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["gpu_idle", "sw_power_cap", "applications_clocks_setting", "sync_boost",
                                    "display_clock_setting"])
def test_normal_clock_event_reasons_are_not_faults(sim_node, reason):
    node = sim_node()
    node.gpus[0].clocks_event_reasons = [reason]
    node.gpus[0].clocks_event_mask = throttle.encode([reason])
    assert run_node_checks(node, None, None) == []


@pytest.mark.parametrize("reason", ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                    "sw_thermal_slowdown"])
def test_slowdown_clock_event_reasons_are_faults(sim_node, reason):
    node = sim_node()
    node.gpus[0].clocks_event_reasons = ["sw_power_cap", reason]
    [f] = run_node_checks(node, None, None)
    assert (f.check, f.severity, f.observed) == ("thermal_power.throttle", "warn", [reason])


def test_throttle_reasons_decoded_from_the_mask_when_names_are_missing(sim_node):
    node = sim_node()
    node.gpus[1].clocks_event_reasons = None
    node.gpus[1].clocks_event_mask = 0x80 | 0x4
    [f] = run_node_checks(node, None, None)
    assert f.observed == ["hw_power_brake_slowdown"] and "power" in f.action.lower()


def test_temperature_within_margin_of_slowdown_warns_and_above_is_crit(sim_node):
    node = sim_node()
    node.gpus[0].temp_gpu_c = 84.0  # slowdown 89 (the real H200's), margin 5
    node.gpus[1].temp_gpu_c = 89.0
    node.gpus[2].temp_gpu_c = 83.0
    found = {f.gpu["index"]: f.severity for f in run_node_checks(node, None, None)}
    assert found == {0: "warn", 1: "crit"}


def test_hbm_temperature_warns_then_crits_at_the_gpus_maximum(sim_node):
    node = sim_node()
    node.gpus[0].temp_memory_c = 86.0
    node.gpus[1].temp_memory_c = 95.0
    found = {f.gpu["index"]: (f.check, f.severity) for f in run_node_checks(node, None, None)}
    assert found == {0: ("thermal_power.memory_temperature", "warn"), 1: ("thermal_power.memory_temperature", "crit")}


def test_model_power_limit_overrides_the_group_power_limit(sim_node):
    node = sim_node()
    b = baseline.from_mapping({"power_limit_w": 500, "gpu_models": {"NVIDIA H200": {"power_limit_w": 700}}}, "t")
    assert run_node_checks(node, b, None) == []
    b = baseline.from_mapping({"power_limit_w": 600}, "t")
    findings = run_node_checks(node, b, None)
    assert len(findings) == 8 and {f.expected for f in findings} == {600.0}


def test_power_limit_within_tolerance_is_not_drift(sim_node):
    node = sim_node()
    node.gpus[0].power_limit_w = 699.5
    node.gpus[0].power_enforced_limit_w = 699.5
    assert run_node_checks(node, baseline.from_mapping({"power_limit_w": 700}, "t"), None) == []


def test_baseline_power_limit_outside_the_gpus_range_says_fix_the_baseline(sim_node):
    [f, *_] = run_node_checks(sim_node(), baseline.from_mapping({"power_limit_w": 900}, "t"), None)
    assert "outside this GPU's range 200-700 W" in f.message


def test_enforced_limit_below_the_set_limit_warns(sim_node):
    node = sim_node()
    node.gpus[3].power_enforced_limit_w = 550.0
    [f] = run_node_checks(node, None, None)
    assert (f.check, f.gpu["index"], f.observed, f.expected) == ("thermal_power.power_enforced", 3, 550.0, 700.0)


# --- memory ------------------------------------------------------------------------------


def test_sbe_thresholds_warn_then_crit(sim_node):
    node = sim_node()
    node.gpus[0].ecc_corrected_volatile = 9_999
    node.gpus[1].ecc_corrected_volatile = 10_000
    node.gpus[2].ecc_corrected_volatile = 50_000_000
    assert {f.gpu["index"]: f.severity for f in run_node_checks(node, None, None)} == {1: "warn", 2: "crit"}


def test_uncorrectable_remapped_rows_over_threshold_warn(sim_node):
    node = sim_node()
    node.gpus[0].remapped_rows_uncorrected = 511
    node.gpus[1].remapped_rows_uncorrected = 512
    node.gpus[2].remapped_rows_corrected = 2  # healthy H200: routine
    assert _checks(run_node_checks(node, None, None)) == {("memory.row_remap_uncorrectable", "warn")}


def test_retired_pages_where_supported(sim_node):
    node = sim_node()
    node.gpus[0].retired_pages_sbe, node.gpus[0].retired_pages_dbe = 60, 3
    node.gpus[1].retired_pages_sbe, node.gpus[1].retired_pages_dbe = 1, 16
    node.gpus[2].retired_pages_sbe, node.gpus[2].retired_pages_dbe, node.gpus[2].retired_pages_pending = 1, 0, True
    node.gpus[3].retired_pages_sbe, node.gpus[3].retired_pages_dbe = 10, 2
    found = {f.gpu["index"]: f.severity for f in run_node_checks(node, None, None)}
    assert found == {0: "crit", 1: "crit", 2: "warn"}


# --- pcie ----------------------------------------------------------------------------------


def test_link_below_the_gpus_own_maximum_warns_without_baseline(sim_node):
    node = sim_node()
    node.gpus[4].pcie_width_current = 8
    [f] = run_node_checks(node, None, None)
    assert f.check == "pcie.link_degraded" and f.expected == {"gen": 5, "width": 16} and "x8" in f.message


def test_link_below_the_baseline_warns_even_at_the_gpus_maximum(sim_node):
    node = sim_node()
    node.gpus[4].pcie_gen_current = node.gpus[4].pcie_gen_max = 4
    assert run_node_checks(node, None, None) == []
    [f] = run_node_checks(node, baseline.from_mapping({"pcie": {"gen": 5}}, "t"), None)
    assert "baseline's Gen5" in f.message


# --- nvlink --------------------------------------------------------------------------------


def test_fewer_links_reported_than_the_baseline_expects_is_crit(sim_node):
    node = sim_node()
    node.gpus[2].nvlinks = node.gpus[2].nvlinks[:12]
    assert run_node_checks(node, None, None) == []  # without a baseline: every reported link is up
    [f] = run_node_checks(node, baseline.from_mapping({"nvlinks_per_gpu": 18}, "t"), None)
    assert (f.check, f.severity, f.observed["up"]) == ("nvlink.links_down", "crit", 12)


def test_no_nvlink_expected_means_no_link_check(sim_node):
    node = sim_node()
    for link in node.gpus[0].nvlinks:
        link.state = "down"
    assert [f.check for f in run_node_checks(node, None, None)] == ["nvlink.links_down"]
    assert run_node_checks(node, baseline.from_mapping({"nvlinks_per_gpu": 0}, "t"), None) == []


# --- config --------------------------------------------------------------------------------


def test_allowlist_matches_names_basenames_and_patterns():
    assert process_allowed("/usr/bin/nv-hostengine -n", ("nv-hostengine",))
    assert process_allowed("dcgm-exporter", ("dcgm*",))
    assert not process_allowed("python3 train.py", ("dcgm*", "nv-hostengine"))
    assert not process_allowed(None, ("*",))


def test_allowlisted_process_is_not_stray(sim_node):
    node = sim_node(faults=["stray-process@1"])
    b = baseline.from_mapping({"stray_process_allowlist": ["python3"]}, "t")
    assert run_node_checks(node, b, None) == []
    assert run_node_checks(node, None, None) == []  # no allowlist: not checked


def test_inactive_fabric_manager_is_crit_and_other_services_warn(sim_node):
    node = sim_node()
    node.services = {"nvidia-persistenced.service": "inactive", "nvidia-fabricmanager": "failed"}
    findings = run_node_checks(node, baseline.from_mapping({"nvlinks_per_gpu": 18}, "t"), None)
    assert {(f.observed and next(iter(f.observed)), f.severity) for f in findings} == {
        ("nvidia-persistenced", "warn"), ("nvidia-fabricmanager", "crit")}


def test_services_default_has_fabric_manager_only_with_nvlinks():
    assert baseline.from_mapping({}, "t").services == ("nvidia-persistenced",)
    assert baseline.from_mapping({"nvlinks_per_gpu": 18}, "t").services == ("nvidia-persistenced", "nvidia-fabricmanager")


def test_ecc_and_compute_mode_against_baseline(sim_node):
    node = sim_node()
    node.gpus[0].ecc_mode_current = False
    node.gpus[0].ecc_mode_pending = False
    node.gpus[1].compute_mode = "Exclusive_Process"
    b = baseline.from_mapping({"ecc_mode": True, "compute_mode": "Default"}, "t")
    found = {(f.check, f.gpu["index"]) for f in run_node_checks(node, b, None)}
    assert found == {("config.ecc_mode", 0), ("config.compute_mode", 1)}


def test_mig_profile_mismatch_and_missing_instances(sim_node):
    node = sim_node()
    for g in node.gpus:
        g.mig_mode_current = g.mig_mode_pending = True
        g.mig_instances = [model.MigInstance(gpu_instance_id=i, profile="1g.18gb") for i in range(7)]
    node.gpus[1].mig_instances = [model.MigInstance(gpu_instance_id=0, profile="3g.71gb")]
    node.gpus[2].mig_instances = []
    b = baseline.from_mapping({"mig": {"mode": True, "profile": "1g.18gb"}}, "t")
    found = {f.gpu["index"]: f.check for f in run_node_checks(node, b, None)}
    assert found == {1: "config.mig_profile", 2: "config.mig_profile"}


def test_more_gpus_than_the_baseline_is_warn_fewer_is_crit(sim_node):
    node = sim_node()
    [f] = run_node_checks(node, baseline.from_mapping({"gpu_count": 4}, "t"), None)
    assert (f.check, f.severity) == ("config.gpu_count", "warn")
    [f] = run_node_checks(node, baseline.from_mapping({"gpu_count": 16}, "t"), None)
    assert (f.check, f.severity) == ("config.gpu_count", "crit")


@pytest.mark.parametrize("state,status,severity", [("in_progress", None, "warn"), ("not_started", None, "crit"),
                                                   ("completed", "NVML_ERROR_UNKNOWN", "crit")])
def test_fabric_state_not_completed_is_reported(sim_node, state, status, severity):
    node = sim_node()
    node.gpus[7].fabric_state, node.gpus[7].fabric_status = state, status
    [f] = run_node_checks(node, None, None)
    assert (f.check, f.severity, f.gpu["index"]) == ("config.fabric_state", severity, 7)


def test_fabric_not_supported_is_silent(sim_node):
    node = sim_node()
    node.gpus[7].fabric_state = "not_supported"
    assert run_node_checks(node, None, None) == []


# --- versions / topology ----------------------------------------------------------------


def test_fabric_manager_version_defaults_to_the_baseline_driver(sim_node):
    node = sim_node()
    node.packages["nvidia-fabricmanager-580"] = "580.95.05-1"
    b = baseline.from_mapping({"driver_version": "580.159.04"}, "t")
    checks = {f.check for f in run_node_checks(node, b, None)}
    assert checks == {"versions.fabric_manager", "versions.fabric_manager_match"}


def test_missing_fabric_manager_package_warns_when_nvlinks_are_expected(sim_node):
    node = sim_node()
    del node.packages["nvidia-fabricmanager-580"]
    b = baseline.from_mapping({"driver_version": "580.159.04", "nvlinks_per_gpu": 18}, "t")
    [f] = [f for f in run_node_checks(node, b, None) if f.check.startswith("versions.")]
    assert f.check == "versions.fabric_manager" and "not installed" in f.message


def test_gpu_model_missing_from_baseline_is_info(sim_node):
    b = baseline.from_mapping({"gpu_models": {"NVIDIA H100 80GB HBM3": {"power_limit_w": 700}}}, "t")
    findings = run_node_checks(sim_node(), b, None)
    assert _checks(findings) == {("versions.gpu_model", "info")} and len(findings) == 8


def test_topology_pair_not_on_the_expected_link_is_named(sim_node):
    node = sim_node()
    assert node.topology is not None
    node.topology.links[2][5] = node.topology.links[5][2] = "SYS"
    found = {f.gpu["index"]: f.observed for f in
             run_node_checks(node, baseline.from_mapping({"expected_topology": "NV18"}, "t"), None)}
    assert found == {2: {"SYS": ["GPU 5"]}, 5: {"SYS": ["GPU 2"]}}


def test_missing_topology_with_an_expected_topology_is_unknown(sim_node):
    node = sim_node()
    node.topology = None
    node.unavailable["topology"] = "nvidia-smi topo failed"
    [f] = run_node_checks(node, baseline.from_mapping({"expected_topology": "NV18"}, "t"), None)
    assert (f.check, f.severity) == ("topology.unreadable", "unknown")


def test_a_check_that_crashes_becomes_unknown_not_an_exception(sim_node):
    node = sim_node()
    node.gpus[0].temp_gpu_c = "hot"  # a malformed value from a broken collector
    findings = run_node_checks(node, None, None)
    assert [(f.check, f.severity) for f in findings] == [("thermal_power.unreadable", "unknown")]
    assert "check failed" in findings[0].message


def test_service_the_agent_did_not_report_is_unknown_not_inactive(sim_node):
    node = sim_node()
    b = baseline.from_mapping({"services": ["nvidia-persistenced", "nvidia-dcgm"]}, "t")
    [f] = run_node_checks(node, b, None)
    assert (f.check, f.severity) == ("config.unreadable", "unknown") and "nvidia-dcgm" in f.message


def test_services_unreadable_without_systemctl_are_unknown(sim_node):
    node = sim_node()
    node.services = {"nvidia-fabricmanager": None, "nvidia-persistenced": None}
    node.unavailable["services"] = "systemctl not found"
    [f] = run_node_checks(node, baseline.from_mapping({"nvlinks_per_gpu": 18}, "t"), None)
    assert (f.check, f.severity) == ("config.unreadable", "unknown") and "systemctl not found" in f.message


def test_driver_helper_packages_are_not_driver_versions(sim_node):
    node = sim_node()
    node.packages["nvidia-driver-assistant"] = "0.21.57.08-1"
    node.packages["cuda-drivers-580"] = "580.159.04-1"
    assert run_node_checks(node, None, None) == []
    node.packages["nvidia-headless-580-server"] = "580.126.09-0ubuntu1"  # half-done upgrade
    [f] = run_node_checks(node, None, None)
    assert f.check == "versions.driver_package" and "nvidia-headless-580-server 580.126.09" in f.message
