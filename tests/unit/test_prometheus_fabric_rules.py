"""The RDMA port alerts of ``prometheus/fleetops-rules.yml`` hold the baseline's default
thresholds (``thresholds.fabric_*``: NVSentinel's and gpud's), and no critical one can name a
port that is not a compute port (the checks never drain a node for a management port). Read from
the YAML; promtool runs their behaviour (``prometheus/tests/fabric.yml``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from fleetops.baseline import DEFAULT_THRESHOLDS as TH

RULES = Path(__file__).resolve().parents[2] / "prometheus" / "fleetops-rules.yml"


def fabric() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    [group] = [g for g in doc["groups"] if g["name"] == "fleetops-fabric"]
    return {r["alert"]: r for r in group["rules"] if "alert" in r}


def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([smh])", text).groups()  # type: ignore[union-attr]
    return float(value) * {"s": 1, "m": 60, "h": 3600}[unit]


def test_every_critical_fabric_alert_reads_compute_ports_only() -> None:
    rules = fabric()
    critical = {name for name, r in rules.items() if r["labels"]["severity"] == "critical"}
    assert critical >= {"FleetopsRdmaPortDown", "FleetopsRdmaLinkDowned", "FleetopsRdmaSymbolErrorsFatal",
                        "FleetopsRdmaFatalCounter", "FleetopsRdmaPortFlapping"}
    for name in critical:
        # a filter ("and on (...) port up") only keeps series of the side before it
        expr = re.sub(r"and on \([^)]*\) fleetops_rdma_port_up == 1", "", rules[name]["expr"])
        reads = [m.group(0) for m in re.finditer(r"fleetops_rdma_[a-z_]+(\{[^}]*\})?", expr)]
        assert reads, f"{name} reads no RDMA series"
        assert all('role="compute"' in sel for sel in reads), f"{name}: a selector without role=\"compute\": {expr}"
    assert 'role="excluded"' in rules["FleetopsRdmaExcludedPortDown"]["expr"]
    assert rules["FleetopsRdmaExcludedPortDown"]["labels"]["severity"] == "warning"


def test_the_thresholds_are_the_baselines_defaults() -> None:
    rules = fabric()
    assert seconds(rules["FleetopsRdmaPortDown"]["for"]) == TH.fabric_drop_down_s
    assert rules["FleetopsRdmaSymbolErrorRate"]["expr"].endswith(f"> {TH.fabric_symbol_errors_per_s_warn:g}")
    assert re.search(rf"\[1h\]\) > {TH.fabric_symbol_errors_per_hour_crit:g}$", rules["FleetopsRdmaSymbolErrorsFatal"]["expr"])
    assert rules["FleetopsRdmaLinkRecoveryRate"]["expr"].endswith(f"* 60 > {TH.fabric_link_recoveries_per_min_warn:g}")
    assert rules["FleetopsRdmaPortFlapping"]["expr"].endswith(f"/ 2) >= {TH.fabric_flap_count}")
    assert TH.fabric_link_downed_crit == 1  # "> 0" in FleetopsRdmaLinkDowned: any growth
    assert "> 0" in rules["FleetopsRdmaLinkDowned"]["expr"]
