"""The checks on the real H200's own values: the NVML collector, fed by the fake NVML of
test_nvml_unit answering what tests/fixtures/h200 recorded, then every check.

A healthy GPU shows 289 lifetime corrected ECC errors, 2 rows remapped for corrected errors, and
a passthrough VM answers Not Supported for NVLink, NUMA, retired pages and the fabric: none of it
may be a fault. The values come from the capture (``h200_capture``), not from the fake's
hand-written defaults, and the defaults are held to the capture too.
"""

from __future__ import annotations

from typing import Any

import h200_capture as cap
import pytest

pynvml = pytest.importorskip("pynvml")

from test_nvml_unit import MIB, NS, FakeNvml, _no_sysfs, collect, h200  # noqa: E402, F401  (_no_sysfs: autouse fixture)

from fleetops import baseline, model  # noqa: E402
from fleetops.checks import run_fleet_checks, run_node_checks  # noqa: E402
from fleetops.gpu import nvml  # noqa: E402

# The probe's own names for the calls it made with arguments -> the pynvml getter.
PROBE_GETTERS = {
    "retired_dbe": "nvmlDeviceGetRetiredPages",
    "state": "nvmlDeviceGetNvLinkState",
    "remote": "nvmlDeviceGetNvLinkRemotePciInfo",
    "crc_flit": "nvmlDeviceGetNvLinkErrorCounter",
}


class CaptureNvml(FakeNvml):
    """The fake, answering NotSupported for a temperature threshold the capture does not state
    (the HBM maximum) instead of making one up."""

    def nvmlDeviceGetTemperatureThreshold(self, h: Any, which: int) -> int:
        table = self.g(h)["thresholds"]
        if which not in table:
            raise pynvml.NVMLError(NS)
        return int(table[which])


def _cpu_mask(cpus: str) -> int:
    mask = 0
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        for cpu in range(int(lo), int(hi or lo) + 1):
            mask |= 1 << cpu
    return mask


def _affinity_from_topo() -> list[int]:
    """GPU0's CPU affinity from the capture's ``nvidia-smi topo -m``."""
    for line in cap.QUERIES.read_text().splitlines():
        cols = line.split()
        if cols[:2] == ["GPU0", "X"]:
            return [_cpu_mask(cols[2])]
    raise AssertionError(f"{cap.QUERIES}: no GPU0 row in topo -m")


def _not_supported_getters() -> set[str]:
    gpu = cap.nvml_gpu()
    out = set()
    for name, entry in gpu.items():
        if isinstance(entry, dict) and entry.get("ok") is False and cap.NOT_SUPPORTED in entry["value"]:
            out.add(PROBE_GETTERS.get(name, name))
    for link in gpu["nvlink"].values():
        for probe, entry in link.items():
            if cap.NOT_SUPPORTED in entry["value"]:
                out.add(PROBE_GETTERS[probe])
    return out


def capture_fake_gpu() -> dict[str, Any]:
    """The fake's GPU description with every value taken from the capture: the NVML probe where
    it recorded a plain value, the XML (and topo -m) where it recorded only an object."""
    v = cap.nvml_value
    xml = cap.gpu_from_xml()
    gpu = h200()  # the shape the fake needs; every value is replaced below
    fields: dict[int, tuple[int, int, float]] = {}
    for name, probe in cap.nvml_gpu()["fields"].items():
        ret, value = cap.nvml_field(name)
        fields[getattr(pynvml, name)] = (ret, int(probe["type"]), value)
    # Not in the probe's FieldValues call: the aggregate counters and the recovery action.
    fields[pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL] = (0, 3, xml["ecc_corrected_aggregate"].value)
    fields[pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL] = (0, 3, v("ecc_unc_agg"))
    assert xml["recovery_action"].value == "none"
    fields[getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)] = (0, 1, 0)  # NVML_GPU_RECOVERY_ACTION_NONE
    errors = {name: NS for name in _not_supported_getters()}
    if (cap.xml_text("fabric/state"), cap.xml_text("fabric/status")) == ("N/A", "N/A"):
        # the probe's fabric calls failed on its own missing argument; nvidia-smi says N/A
        errors |= {"nvmlDeviceGetGpuFabricInfoV": NS, "nvmlDeviceGetGpuFabricInfo": NS}
    gpu.update(
        uuid=v("nvmlDeviceGetUUID"),
        bus=cap.xml_text("pci/pci_bus_id"),
        name=v("nvmlDeviceGetName"),
        serial=v("nvmlDeviceGetSerial"),
        part=v("nvmlDeviceGetBoardPartNumber"),
        vbios=v("nvmlDeviceGetVbiosVersion"),
        inforom=v("nvmlDeviceGetInforomImageVersion"),
        inforom_oem=xml["inforom_oem"].value,
        gsp=v("nvmlDeviceGetGspFirmwareVersion"),
        persistence=v("nvmlDeviceGetPersistenceMode"),
        compute_mode=v("nvmlDeviceGetComputeMode"),
        power=v("nvmlDeviceGetPowerUsage"),
        limit=v("nvmlDeviceGetPowerManagementLimit"),
        default_limit=v("nvmlDeviceGetPowerManagementDefaultLimit"),
        constraints=v("nvmlDeviceGetPowerManagementLimitConstraints"),
        enforced=v("nvmlDeviceGetEnforcedPowerLimit"),
        temp=v("temp_gpu"),
        thresholds={
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: int(xml["temp_shutdown_c"].value),
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: int(xml["temp_slowdown_c"].value),
        },
        clocks={pynvml.NVML_CLOCK_SM: v("clock_sm"), pynvml.NVML_CLOCK_MEM: xml["clock_mem_mhz"].value},
        max_clocks={pynvml.NVML_CLOCK_SM: v("maxclock_sm"), pynvml.NVML_CLOCK_MEM: xml["clock_mem_max_mhz"].value},
        events=v("nvmlDeviceGetCurrentClocksEventReasons"),
        util=(xml["utilization_gpu_pct"].value, xml["utilization_mem_pct"].value),
        mem=(xml["memory_total_mib"].value * MIB, xml["memory_used_mib"].value * MIB,
             int(cap.xml_text("fb_memory_usage/reserved").split()[0]) * MIB),
        ecc_mode=v("nvmlDeviceGetEccMode"),
        mig_mode=v("nvmlDeviceGetMigMode"),
        pcie={
            "gen": v("nvmlDeviceGetCurrPcieLinkGeneration"),
            "gen_max": v("nvmlDeviceGetMaxPcieLinkGeneration"),
            "width": v("nvmlDeviceGetCurrPcieLinkWidth"),
            "width_max": v("nvmlDeviceGetMaxPcieLinkWidth"),
        },
        processes=v("nvmlDeviceGetComputeRunningProcesses"),
        affinity=_affinity_from_topo(),
        fields=fields,
        errors=errors,
    )
    return gpu


def _capture_node(monkeypatch: pytest.MonkeyPatch, collected_at: float = 1_800_000_000.0) -> model.Node:
    # The probe never called nvmlSystemGetDriverBranch: the capture's NVML names no branch, as a
    # driver without the call, so the branch check takes the driver version's.
    CaptureNvml([capture_fake_gpu()], monkeypatch, driver_branch=None)
    node = collect(None)
    node.collected_at = collected_at
    return node


def _capture_baseline(**extra: Any) -> baseline.Baseline:
    """The desired state of a stock H200 node, as the capture shows it."""
    xml, node = cap.gpu_from_xml(), cap.node_from_capture()
    return baseline.from_mapping({
        "driver_version": node["driver_version"].value,
        "cuda_driver_version": node["cuda_driver_version"].value,
        "gpu_models": {xml["name"].value: {
            "vbios_version": xml["vbios_version"].value, "inforom_image": xml["inforom_image"].value,
            "power_limit_w": xml["power_limit_w"].value,
        }},
        "persistence_mode": xml["persistence_mode"].value,
        "ecc_mode": xml["ecc_mode_current"].value,
        "compute_mode": xml["compute_mode"].value,
        "mig": {"mode": xml["mig_mode_current"].value},
        "gpu_count": 1,
        "pcie": {"gen": xml["pcie_gen_max"].value, "width": xml["pcie_width_max"].value},
        "stray_process_allowlist": [],
        "driver": {"branches": [int(node["driver_version"].value.split(".")[0])]},
        # The capture holds no service states: its VM had no systemctl (h200_queries.txt), and
        # the NVML collector under test does not read them.
        "services": [],
        **extra,
    }, "h200-capture")


# --- the fake's defaults are the capture's --------------------------------------------------


def test_the_fakes_default_h200_is_the_capture():
    """Where test_nvml_unit's ``h200()`` differs from the capture, it says so here."""
    real, fake = capture_fake_gpu(), h200()
    differ = {k for k in real if real[k] != fake[k]}
    # h200() also answers the HBM maximum (95 C), which the capture does not state; its memory
    # total carries 512 KiB the collector rounds away; it lists only the Not Supported getters and
    # the field values the collector asks for.
    assert differ == {"thresholds", "mem", "errors", "fields"}
    mem_max = pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
    assert {k: t for k, t in fake["thresholds"].items() if k != mem_max} == real["thresholds"]
    assert fake["mem"][0] // MIB == real["mem"][0] // MIB and fake["mem"][1:] == real["mem"][1:]
    assert set(fake["errors"].items()) <= set(real["errors"].items())
    assert {fid: real["fields"][fid] for fid in fake["fields"]} == fake["fields"]
    asked = {getattr(pynvml, name) for _, name in nvml.FIELD_IDS if hasattr(pynvml, name)}
    assert set(fake["fields"]) >= asked  # the fields the fake leaves out are ones nobody asks for


# --- the checks on it -------------------------------------------------------------------------


def test_the_collector_delivers_the_real_healthy_values(monkeypatch):
    """What the checks below are given: the real counts and thresholds, the real Not Supported."""
    g = _capture_node(monkeypatch).gpus[0]
    assert (g.ecc_corrected_aggregate, g.ecc_uncorrected_aggregate) == (289, 0)
    assert (g.remapped_rows_corrected, g.remapped_rows_uncorrected) == (2, 0)
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
    assert (g.temp_slowdown_c, g.temp_shutdown_c) == (89.0, 95.0)
    assert g.temp_memory_max_c is None and g.unavailable["temp_memory_max_c"] == "NotSupported"
    for name in ("nvlinks", "numa_node", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
                 "fabric_state", "fabric_status"):
        assert getattr(g, name) is None and g.unavailable[name] == "NotSupported", name


def test_no_finding_on_the_capture_without_a_baseline(monkeypatch):
    node = _capture_node(monkeypatch)
    assert run_node_checks(node, None, None) == []
    assert run_fleet_checks([node], None) == []


def test_no_finding_on_the_capture_with_its_baseline(monkeypatch):
    node = _capture_node(monkeypatch)
    assert run_node_checks(node, _capture_baseline(), None) == []


def test_the_branch_check_on_the_capture_takes_the_driver_versions_major(monkeypatch):
    node = _capture_node(monkeypatch)
    assert node.driver_branch is None and node.unavailable == {"driver_branch": "FunctionNotFound"}
    [f] = run_node_checks(node, _capture_baseline(driver={"branches": [570]}), None)
    assert (f.check, f.severity, f.expected) == ("versions.driver_branch", "warn", [570])
    assert f.observed == {"branch": 580, "driver_version": "580.159.04", "nvml_build_branch": None}


def test_no_finding_between_two_snapshots_of_the_capture(monkeypatch):
    """Rates over a minute: the lifetime ECC count and the remapped rows did not grow."""
    before = _capture_node(monkeypatch, collected_at=1_800_000_000.0)
    after = _capture_node(monkeypatch, collected_at=1_800_000_060.0)
    assert run_node_checks(after, _capture_baseline(), before) == []


def test_a_baseline_expecting_nvlinks_gets_unknown_not_a_fault(monkeypatch):
    node = _capture_node(monkeypatch)
    findings = run_node_checks(node, _capture_baseline(nvlinks_per_gpu=18), None)
    # NVLinks expected means Fabric Manager expected: its package version is a node value this
    # NVML-only collection does not read ("not collected"), the other unknown.
    assert [(f.check, f.severity) for f in findings] == [
        ("versions.unreadable", "unknown"), ("nvlink.unreadable", "unknown"),
    ]
    assert findings[0].observed == {"packages": {"not collected": ["node"]}}
    assert findings[1].observed == {"nvlinks": {"NotSupported": ["GPU 0"]}}


def test_the_checks_still_fire_on_this_gpu_when_it_is_faulty(monkeypatch):
    """The quiet above is the checks passing the real values, not checks that cannot see: the
    same collected GPU with a DBE, a pending remap and a slowdown-hot die is flagged."""
    node = _capture_node(monkeypatch)
    gpu = node.gpus[0]
    gpu.ecc_uncorrected_volatile = 1
    gpu.remapped_rows_pending = True
    gpu.temp_gpu_c = gpu.temp_slowdown_c
    found = {(f.check, f.severity) for f in run_node_checks(node, None, None)}
    assert found == {
        ("memory.ecc_dbe_volatile", "crit"),
        ("memory.row_remap_pending", "warn"),
        ("thermal_power.temperature", "crit"),
    }
