"""The real H200 capture in tests/fixtures/h200, read into ``model.Gpu`` field names.

Parsed with the standard library only (``xml.etree``, ``json``, ``ast``) and nothing of
fleetops: the capture is the evidence the simulator and the collector are held to, so its
reading must not share their code. Each value carries where in the capture it came from.
"""

from __future__ import annotations

import ast
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
XML = FIXTURE / "h200_nvsmi_q.xml"
TEXT = FIXTURE / "h200_nvsmi_q.txt"
NVML = FIXTURE / "h200_nvml.json"
QUERIES = FIXTURE / "h200_queries.txt"

NOT_SUPPORTED = "NVMLError: Not Supported"


@dataclass(frozen=True)
class Real:
    """One value of the capture, and the place it was read from."""

    value: Any
    source: str


@cache
def xml_gpu() -> ET.Element:
    gpus = ET.parse(XML).getroot().findall("gpu")
    assert len(gpus) == 1, f"{XML}: one <gpu> expected, found {len(gpus)}"
    return gpus[0]


@cache
def xml_root() -> ET.Element:
    return ET.parse(XML).getroot()


@cache
def nvml_doc() -> dict[str, Any]:
    doc = json.loads(NVML.read_text())
    assert isinstance(doc, dict)
    return doc


def nvml_gpu() -> dict[str, Any]:
    gpus = nvml_doc()["gpus"]
    assert len(gpus) == 1
    return dict(gpus[0])


def xml_text(path: str) -> str:
    node = xml_gpu().find(path)
    assert node is not None and node.text is not None, f"{XML}: no <{path}>"
    return node.text.strip()


def _number(text: str, unit: str) -> float:
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*" + re.escape(unit), text)
    assert match, f"{text!r} is not a number in {unit}"
    return float(match.group(1))


def _yes(text: str) -> bool:
    assert text in ("Enabled", "Disabled", "Yes", "No"), text
    return text in ("Enabled", "Yes")


def nvml_call(name: str) -> dict[str, Any]:
    entry = nvml_gpu()[name]
    assert isinstance(entry, dict)
    return entry


def nvml_value(name: str) -> Any:
    """The value a getter returned, from the probe's ``repr``; the getter must have answered."""
    entry = nvml_call(name)
    assert entry["ok"], f"{NVML}: {name} failed: {entry['value']}"
    return ast.literal_eval(entry["value"])


def nvml_failed_as(name: str) -> str:
    """The error a getter answered (the probe's text)."""
    entry = nvml_call(name)
    assert not entry["ok"], f"{NVML}: {name} answered {entry['value']}"
    return str(ast.literal_eval(entry["value"]))


def nvml_field(name: str) -> tuple[int, int]:
    """(nvmlReturn, value) of one field of the probe's FieldValues call; the value is the
    union member its valueType names (0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong)."""
    field = nvml_gpu()["fields"][name]
    return int(field["ret"]), field["val"][int(field["type"])]


def system_value(name: str) -> Any:
    entry = nvml_doc()["system"][name]
    assert entry["ok"], entry
    return ast.literal_eval(entry["value"])


def temperatures() -> dict[str, Real]:
    """Absolute thresholds from this driver's T.Limit margins.

    ``<gpu_temp_tlimit>`` is the current temperature's margin to T.Limit, so T.Limit is
    ``gpu_temp + gpu_temp_tlimit``; the thresholds are margins on the same scale, negative
    above T.Limit, so a threshold is ``T.Limit - margin``."""
    current = _number(xml_text("temperature/gpu_temp"), "C")
    tlimit = current + _number(xml_text("temperature/gpu_temp_tlimit"), "C")
    slow = _number(xml_text("temperature/gpu_temp_slow_tlimit_threshold"), "C")
    shutdown = _number(xml_text("temperature/gpu_temp_max_tlimit_threshold"), "C")
    where = "XML temperature: gpu_temp + gpu_temp_tlimit (T.Limit) - "
    return {
        "temp_slowdown_c": Real(tlimit - slow, where + "gpu_temp_slow_tlimit_threshold"),
        "temp_shutdown_c": Real(tlimit - shutdown, where + "gpu_temp_max_tlimit_threshold (shutdown)"),
    }


def text_report_label(value_line_prefix: str) -> str:
    """The value of a line of the text report (``nvidia-smi -q``), by its label."""
    for line in TEXT.read_text().splitlines():
        label, sep, value = line.partition(":")
        if sep and label.strip() == value_line_prefix:
            return value.strip()
    raise AssertionError(f"{TEXT}: no line {value_line_prefix!r}")


def gpu_from_xml() -> dict[str, Real]:
    """The capture's value of each ``model.Gpu`` field that ``nvidia-smi -q -x`` states."""
    t = xml_text
    ecc = "ecc_errors/"
    vol = [int(t(ecc + "volatile/" + k)) for k in ("sram_correctable", "dram_correctable")]
    vol_unc = [int(t(ecc + "volatile/" + k))
               for k in ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")]
    agg = [int(t(ecc + "aggregate/" + k)) for k in ("sram_correctable", "dram_correctable")]
    agg_unc = [int(t(ecc + "aggregate/" + k))
               for k in ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")]
    reasons = xml_gpu().find("clocks_event_reasons")
    assert reasons is not None
    active = sorted(e.tag.removeprefix("clocks_event_reason_") for e in reasons if (e.text or "").strip() == "Active")
    processes = xml_gpu().find("processes")
    assert processes is not None
    link = "pci/pci_gpu_link_info/"
    out = {
        "name": Real(t("product_name"), "XML product_name"),
        "board_part_number": Real(t("board_part_number"), "XML board_part_number"),
        "vbios_version": Real(t("vbios_version"), "XML vbios_version"),
        "inforom_image": Real(t("inforom_version/img_version"), "XML inforom_version/img_version"),
        "inforom_oem": Real(t("inforom_version/oem_object"), "XML inforom_version/oem_object"),
        "gsp_firmware": Real(t("gsp_firmware_version"), "XML gsp_firmware_version"),
        "persistence_mode": Real(_yes(t("persistence_mode")), "XML persistence_mode"),
        "compute_mode": Real(t("compute_mode"), "XML compute_mode"),
        "power_draw_w": Real(_number(t("gpu_power_readings/instant_power_draw"), "W"),
                             "XML gpu_power_readings/instant_power_draw"),
        "power_limit_w": Real(_number(t("gpu_power_readings/current_power_limit"), "W"),
                              "XML gpu_power_readings/current_power_limit"),
        "power_default_limit_w": Real(_number(t("gpu_power_readings/default_power_limit"), "W"),
                                      "XML gpu_power_readings/default_power_limit"),
        "power_min_limit_w": Real(_number(t("gpu_power_readings/min_power_limit"), "W"),
                                  "XML gpu_power_readings/min_power_limit"),
        "power_max_limit_w": Real(_number(t("gpu_power_readings/max_power_limit"), "W"),
                                  "XML gpu_power_readings/max_power_limit"),
        "temp_gpu_c": Real(_number(t("temperature/gpu_temp"), "C"), "XML temperature/gpu_temp"),
        "temp_memory_c": Real(_number(t("temperature/memory_temp"), "C"), "XML temperature/memory_temp"),
        **temperatures(),
        "clock_sm_mhz": Real(int(_number(t("clocks/sm_clock"), "MHz")), "XML clocks/sm_clock"),
        "clock_sm_max_mhz": Real(int(_number(t("max_clocks/sm_clock"), "MHz")), "XML max_clocks/sm_clock"),
        "clock_mem_mhz": Real(int(_number(t("clocks/mem_clock"), "MHz")), "XML clocks/mem_clock"),
        "clock_mem_max_mhz": Real(int(_number(t("max_clocks/mem_clock"), "MHz")), "XML max_clocks/mem_clock"),
        "clocks_event_reasons": Real(active, "XML clocks_event_reasons (the reasons that say Active)"),
        "utilization_gpu_pct": Real(int(_number(t("utilization/gpu_util"), "%")), "XML utilization/gpu_util"),
        "utilization_mem_pct": Real(int(_number(t("utilization/memory_util"), "%")), "XML utilization/memory_util"),
        "memory_used_mib": Real(int(_number(t("fb_memory_usage/used"), "MiB")), "XML fb_memory_usage/used"),
        "memory_total_mib": Real(int(_number(t("fb_memory_usage/total"), "MiB")), "XML fb_memory_usage/total"),
        "ecc_mode_current": Real(_yes(t("ecc_mode/current_ecc")), "XML ecc_mode/current_ecc"),
        "ecc_mode_pending": Real(_yes(t("ecc_mode/pending_ecc")), "XML ecc_mode/pending_ecc"),
        "ecc_corrected_volatile": Real(sum(vol), "XML ecc_errors/volatile sram_correctable + dram_correctable"),
        "ecc_uncorrected_volatile": Real(sum(vol_unc), "XML ecc_errors/volatile sram_uncorrectable_* + dram_uncorrectable"),
        "ecc_corrected_aggregate": Real(sum(agg), "XML ecc_errors/aggregate sram_correctable + dram_correctable"),
        "ecc_uncorrected_aggregate": Real(sum(agg_unc),
                                          "XML ecc_errors/aggregate sram_uncorrectable_* + dram_uncorrectable"),
        "remapped_rows_corrected": Real(int(t("remapped_rows/remapped_row_corr")), "XML remapped_rows/remapped_row_corr"),
        "remapped_rows_uncorrected": Real(int(t("remapped_rows/remapped_row_unc")), "XML remapped_rows/remapped_row_unc"),
        "remapped_rows_pending": Real(_yes(t("remapped_rows/remapped_row_pending")), "XML remapped_rows/remapped_row_pending"),
        "remapped_rows_failure": Real(_yes(t("remapped_rows/remapped_row_failure")), "XML remapped_rows/remapped_row_failure"),
        "pcie_gen_current": Real(int(t(link + "pcie_gen/current_link_gen")), "XML pci_gpu_link_info/pcie_gen/current_link_gen"),
        "pcie_gen_max": Real(int(t(link + "pcie_gen/max_link_gen")), "XML pci_gpu_link_info/pcie_gen/max_link_gen"),
        "pcie_width_current": Real(int(_number(t(link + "link_widths/current_link_width"), "x")),
                                   "XML pci_gpu_link_info/link_widths/current_link_width"),
        "pcie_width_max": Real(int(_number(t(link + "link_widths/max_link_width"), "x")),
                               "XML pci_gpu_link_info/link_widths/max_link_width"),
        "pcie_replay_counter": Real(int(t("pci/replay_counter")), "XML pci/replay_counter"),
        "mig_mode_current": Real(_yes(t("mig_mode/current_mig")), "XML mig_mode/current_mig"),
        "mig_mode_pending": Real(_yes(t("mig_mode/pending_mig")), "XML mig_mode/pending_mig"),
        "processes": Real([e.tag for e in processes], "XML processes (no <process_info>)"),
        "recovery_action": Real(t("gpu_recovery_action").lower(), "XML gpu_recovery_action"),
    }
    return out


COMPUTE_MODES = {0: "Default", 2: "Prohibited", 3: "Exclusive_Process"}  # nvmlComputeMode_t


def gpu_from_nvml() -> dict[str, Real]:
    """The capture's value of each ``model.Gpu`` field that the NVML probe read (where it
    states a plain value rather than an object ``repr``), in the snapshot's units."""
    v = nvml_value
    lo, hi = v("nvmlDeviceGetPowerManagementLimitConstraints")
    ecc_current, ecc_pending = v("nvmlDeviceGetEccMode")
    mig_current, mig_pending = v("nvmlDeviceGetMigMode")
    corr, unc, pending, failure = v("nvmlDeviceGetRemappedRows")
    field = nvml_field
    return {
        "name": Real(v("nvmlDeviceGetName"), "NVML nvmlDeviceGetName"),
        "board_part_number": Real(v("nvmlDeviceGetBoardPartNumber"), "NVML nvmlDeviceGetBoardPartNumber"),
        "vbios_version": Real(v("nvmlDeviceGetVbiosVersion"), "NVML nvmlDeviceGetVbiosVersion"),
        "inforom_image": Real(v("nvmlDeviceGetInforomImageVersion"), "NVML nvmlDeviceGetInforomImageVersion"),
        "gsp_firmware": Real(v("nvmlDeviceGetGspFirmwareVersion").decode(), "NVML nvmlDeviceGetGspFirmwareVersion"),
        "persistence_mode": Real(v("nvmlDeviceGetPersistenceMode") == 1, "NVML nvmlDeviceGetPersistenceMode"),
        "compute_mode": Real(COMPUTE_MODES[v("nvmlDeviceGetComputeMode")], "NVML nvmlDeviceGetComputeMode"),
        "power_limit_w": Real(v("nvmlDeviceGetPowerManagementLimit") / 1000, "NVML nvmlDeviceGetPowerManagementLimit (mW)"),
        "power_default_limit_w": Real(v("nvmlDeviceGetPowerManagementDefaultLimit") / 1000,
                                      "NVML nvmlDeviceGetPowerManagementDefaultLimit (mW)"),
        "power_min_limit_w": Real(lo / 1000, "NVML nvmlDeviceGetPowerManagementLimitConstraints[0] (mW)"),
        "power_max_limit_w": Real(hi / 1000, "NVML nvmlDeviceGetPowerManagementLimitConstraints[1] (mW)"),
        "power_enforced_limit_w": Real(v("nvmlDeviceGetEnforcedPowerLimit") / 1000,
                                       "NVML nvmlDeviceGetEnforcedPowerLimit (mW)"),
        "temp_gpu_c": Real(float(v("temp_gpu")), "NVML nvmlDeviceGetTemperature(GPU)"),
        "temp_memory_c": Real(float(field("NVML_FI_DEV_MEMORY_TEMP")[1]), "NVML field NVML_FI_DEV_MEMORY_TEMP"),
        "clock_sm_mhz": Real(v("clock_sm"), "NVML nvmlDeviceGetClockInfo(SM)"),
        "clock_sm_max_mhz": Real(v("maxclock_sm"), "NVML nvmlDeviceGetMaxClockInfo(SM)"),
        "clocks_event_mask": Real(v("nvmlDeviceGetCurrentClocksEventReasons"),
                                  "NVML nvmlDeviceGetCurrentClocksEventReasons"),
        "ecc_mode_current": Real(ecc_current == 1, "NVML nvmlDeviceGetEccMode[0]"),
        "ecc_mode_pending": Real(ecc_pending == 1, "NVML nvmlDeviceGetEccMode[1]"),
        "ecc_corrected_volatile": Real(v("ecc_corr_vol"), "NVML nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)"),
        "ecc_uncorrected_volatile": Real(v("ecc_unc_vol"), "NVML nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)"),
        "ecc_uncorrected_aggregate": Real(v("ecc_unc_agg"), "NVML nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)"),
        "remapped_rows_corrected": Real(corr, "NVML nvmlDeviceGetRemappedRows[0]"),
        "remapped_rows_uncorrected": Real(unc, "NVML nvmlDeviceGetRemappedRows[1]"),
        "remapped_rows_pending": Real(pending == 1, "NVML nvmlDeviceGetRemappedRows[2]"),
        "remapped_rows_failure": Real(failure == 1, "NVML nvmlDeviceGetRemappedRows[3]"),
        "pcie_gen_current": Real(v("nvmlDeviceGetCurrPcieLinkGeneration"), "NVML nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_gen_max": Real(v("nvmlDeviceGetMaxPcieLinkGeneration"), "NVML nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_width_current": Real(v("nvmlDeviceGetCurrPcieLinkWidth"), "NVML nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_width_max": Real(v("nvmlDeviceGetMaxPcieLinkWidth"), "NVML nvmlDeviceGetMaxPcieLinkWidth"),
        "pcie_replay_counter": Real(v("nvmlDeviceGetPcieReplayCounter"), "NVML nvmlDeviceGetPcieReplayCounter"),
        "mig_mode_current": Real(mig_current == 1, "NVML nvmlDeviceGetMigMode[0]"),
        "mig_mode_pending": Real(mig_pending == 1, "NVML nvmlDeviceGetMigMode[1]"),
        "processes": Real(v("nvmlDeviceGetComputeRunningProcesses"), "NVML nvmlDeviceGetComputeRunningProcesses"),
    }


def node_from_capture() -> dict[str, Real]:
    """Node-level values the version checks read."""
    root = xml_root()
    driver, cuda = root.findtext("driver_version"), root.findtext("cuda_version")
    assert driver is not None and cuda is not None
    cuda_int = system_value("cuda_driver")
    assert system_value("driver") == driver.strip(), "the capture disagrees with itself on the driver"
    assert f"{cuda_int // 1000}.{cuda_int % 1000 // 10}" == cuda.strip(), "the capture disagrees on CUDA"
    return {
        "driver_version": Real(driver.strip(), "XML driver_version, NVML nvmlSystemGetDriverVersion"),
        "cuda_driver_version": Real(cuda.strip(), "XML cuda_version, NVML nvmlSystemGetCudaDriverVersion_v2"),
        "nvml_version": Real(system_value("nvml"), "NVML nvmlSystemGetNVMLVersion"),
    }
