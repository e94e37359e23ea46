"""Values a node cannot report never become faults: silent when legitimately absent, one
unknown per family when something should have been readable."""

from __future__ import annotations

from fleetops import baseline, model
from fleetops.checks import run_node_checks


def _serious(findings):
    return [f for f in findings if f.severity in ("warn", "crit")]


def test_passthrough_h200_without_baseline_says_nothing(passthrough_node):
    assert run_node_checks(passthrough_node(), None, None) == []


def test_passthrough_h200_with_baseline_not_expecting_nvlink_has_no_fault_or_unknown(passthrough_node):
    node = passthrough_node()
    node.services = {"nvidia-persistenced": "active"}
    b = baseline.from_mapping({
        "driver_version": "580.159.04", "gpu_count": 1, "persistence_mode": True,
        "gpu_models": {"NVIDIA H200": {"power_limit_w": 700, "vbios_version": "96.00.A5.00.1A"}},
        "pcie": {"gen": 5, "width": 16},
    }, "vm")
    assert run_node_checks(node, b, None) == []


def test_passthrough_h200_with_baseline_expecting_nvlinks_reports_one_unknown_not_a_fault(passthrough_node):
    node = passthrough_node()
    node.services = {"nvidia-persistenced": "active", "nvidia-fabricmanager": "active"}
    findings = run_node_checks(node, baseline.from_mapping({"nvlinks_per_gpu": 18}, "hgx"), None)
    assert not _serious(findings)
    nvlink = [f for f in findings if f.check.startswith("nvlink.")]
    assert [(f.check, f.severity) for f in nvlink] == [("nvlink.unreadable", "unknown")]
    assert "NotSupported" in nvlink[0].message and nvlink[0].gpu is None


def test_passthrough_unreadable_services_are_unknown_not_inactive(passthrough_node):
    findings = run_node_checks(passthrough_node(), baseline.from_mapping({}, "empty"), None)
    assert [(f.check, f.severity) for f in findings] == [("config.unreadable", "unknown")]


def test_values_unreadable_for_a_real_reason_give_one_unknown_per_family_per_node(sim_node):
    node = sim_node(faults=["ecc-dbe@0", "row-remap-failure@1"])
    for gpu in node.gpus:  # every memory value unreadable, e.g. NVML answering Unknown
        for name in ("ecc_uncorrected_volatile", "ecc_corrected_volatile", "remapped_rows_pending",
                     "remapped_rows_failure", "remapped_rows_uncorrected"):
            setattr(gpu, name, None)
            gpu.unavailable[name] = "Unknown"
    findings = [f for f in run_node_checks(node, None, None) if f.check.startswith("memory.")]
    assert [(f.check, f.severity) for f in findings] == [("memory.unreadable", "unknown")]
    assert "Unknown" in findings[0].message and "GPU 0, 1, 2" in findings[0].message


def test_a_lost_gpu_is_one_crit_at_its_index_not_an_unknown_in_every_family(sim_node):
    node = sim_node(faults=["xid:79@5"])
    findings = run_node_checks(node, None, None)
    assert not [f for f in findings if f.check.endswith(".unreadable")], [f.message for f in findings]
    lost = [f for f in findings if f.check == "config.gpu_missing"]
    assert [(f.severity, f.gpu["index"], f.gpu["uuid"]) for f in lost] == [("crit", 5, node.gpus[5].uuid)]


def test_none_without_a_reason_on_an_optional_value_is_silent(sim_node):
    node = sim_node()  # Hopper: no retired pages; drop the reason to test a bare None
    for g in node.gpus:
        for key in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
            g.unavailable.pop(key, None)
    assert all(g.retired_pages_dbe is None and "retired_pages_dbe" not in g.unavailable for g in node.gpus)
    assert run_node_checks(node, None, None) == []


def test_none_without_a_reason_on_a_health_value_is_unknown_not_ok(sim_node):
    node = sim_node()
    node.gpus[2].temp_gpu_c = None
    findings = run_node_checks(node, None, None)
    assert [(f.check, f.severity) for f in findings] == [("thermal_power.unreadable", "unknown")]
    assert "not collected" in findings[0].message


def test_unreadable_baseline_value_is_unknown_never_a_mismatch(sim_node, sim_baseline):
    node = sim_node()
    node.driver_version = None
    node.unavailable["driver_version"] = "NoPermission"
    for gpu in node.gpus:
        gpu.power_limit_w = None
        gpu.unavailable["power_limit_w"] = "NotSupported"
    findings = run_node_checks(node, sim_baseline, None)
    assert not _serious(findings)
    assert {f.check for f in findings} == {"versions.unreadable", "thermal_power.unreadable"}


def test_link_states_unreadable_are_not_counted_as_down(sim_node, sim_baseline):
    node = sim_node()
    for link in node.gpus[0].nvlinks[:4]:
        link.state = None
        link.unavailable["state"] = "Unknown Error"
    findings = run_node_checks(node, sim_baseline, None)
    assert [(f.check, f.severity) for f in findings] == [("nvlink.unreadable", "unknown")]


def test_mig_mode_nvlinks_reported_down_are_not_a_fault(sim_node):
    node = sim_node(faults=["mig-drift@5"])
    assert node.gpus[5].nvlinks_up == 0
    b = baseline.from_mapping({"nvlinks_per_gpu": 18, "mig": {"mode": True}, "expected_topology": "NV18"}, "mig")
    for g in node.gpus:
        g.mig_mode_current = True
        g.mig_mode_pending = True
        g.nvlinks = [model.NvLink(link=i, state="down") for i in range(18)]
    assert run_node_checks(node, b, None) == []


def test_unreadable_kernel_log_is_unknown_not_silently_clean(sim_node):
    node = sim_node()
    node.unavailable["xids"] = "dmesg: Operation not permitted"
    findings = run_node_checks(node, None, None)
    assert [(f.check, f.severity) for f in findings] == [("xid.unreadable", "unknown")]
