"""The audit that ``outputs.md`` shows, and that page's data.

Every example on that page is real output: the real audit and report renderers over three
simulated nodes, with the SSH transport replaced by the simulator's answers and the clock fixed,
so that the page is the same bytes on every run and every machine.
"""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from typing import Any
from unittest import mock

from fleetops.docgen.data import example_baseline

EXAMPLE_NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
EXAMPLE_DURATION_S = 0.412
EXAMPLE_INVENTORY = "/etc/fleetops/inventory.yml"
# node -> faults ("name@gpu"); None: the node does not answer.
EXAMPLE_FLEET: dict[str, tuple[str, ...] | None] = {
    "node001": (),
    "node002": ("ecc-dbe@2", "power-cap-drift@0", "pcie-replay-storm@5"),
    "node003": None,
}
EXAMPLE_FAULT_AGE_S = 120.0


def _example_state(name: str, faults: tuple[str, ...]) -> dict[str, Any]:
    from fleetops.sim import gpu as sim

    state = sim.build_state(name, {"faults": list(faults)})
    boot = EXAMPLE_NOW - 3 * 86400
    since = EXAMPLE_NOW - EXAMPLE_FAULT_AGE_S
    state["node"]["boot_time"] = boot
    for fault in state["faults"]:
        fault["since"] = since
    for entry in state.get("kernel_log", []):  # the simulator stamps lines with the real clock
        entry["line"] = re.sub(r"^\[\s*-?[\d.]+\]", f"[{since - boot:12.6f}]", entry["line"])
    return state


def _example_agent_output(name: str, faults: tuple[str, ...]) -> str:
    """What ``fleetops-agent collect`` prints for the node at ``EXAMPLE_NOW``."""
    from fleetops import model
    from fleetops.sim import gpu as sim
    from fleetops.xid import kernlog as xid

    doc = sim.snapshot(_example_state(name, faults), now=EXAMPLE_NOW)
    lines = doc.pop("_kernel_log")
    doc["collected_at"] = EXAMPLE_NOW
    gpus = {g["bus_id"]: g for g in doc["gpus"]}
    boot = EXAMPLE_NOW - float(doc["uptime_s"])
    events = []
    for event in xid.parse_lines(lines, source="sim"):
        gpu = gpus.get(event.bus_id or "")
        if gpu is not None:
            event.gpu_uuid, event.gpu_index = gpu["uuid"], gpu["index"]
        if event.timestamp is None and event.uptime_s is not None:
            event.timestamp = round(boot + event.uptime_s, 3)
        events.append(model.to_dict(event))
    doc["xids"] = events
    return json.dumps(doc)


def example_audit() -> tuple[Any, int]:
    """(AuditResult, exit code) of ``fleetops audit`` over ``EXAMPLE_FLEET`` with the full
    example baseline: the real audit, with the SSH transport replaced by the simulator's
    answers and the clock fixed."""
    from fleetops import baseline as bl
    from fleetops.checks import verdict
    from fleetops.fleet import audit, inventory, transport

    hosts = [
        inventory.Host(name=name, address=f"127.0.50.{i}") for i, name in enumerate(EXAMPLE_FLEET, start=1)
    ]
    base = bl.from_mapping(example_baseline(), source="baseline.yml")

    def fake_run_all(group: Any, command: Any, **kwargs: Any) -> dict[str, Any]:
        out = {}
        for host in group:
            faults = EXAMPLE_FLEET[host.name]
            if faults is None:
                out[host.name] = transport.Result(
                    host=host.name,
                    ok=False,
                    exit_status=None,
                    stdout="",
                    stderr="",
                    error_kind="unreachable",
                    error="127.0.50.3:22: connection refused",
                    elapsed_s=0.001,
                )
            else:
                out[host.name] = transport.Result(
                    host=host.name,
                    ok=True,
                    exit_status=0,
                    stdout=_example_agent_output(host.name, faults),
                    stderr="",
                    error_kind=None,
                    error=None,
                    elapsed_s=0.09,
                )
        return out

    with mock.patch.object(transport, "run_all", fake_run_all):
        result = audit.run(hosts, {h.name: base for h in hosts}, {}, inventory=EXAMPLE_INVENTORY)
    result.started_at = EXAMPLE_NOW
    result.duration_s = EXAMPLE_DURATION_S
    for node in result.nodes:
        node.elapsed_s = None
    return result, verdict.exit_code(result.findings, "warn")


def _fields(cls: type) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in dataclasses.fields(cls)]


def _trim_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    snap: dict[str, Any] = json.loads(json.dumps(snapshot))
    gpus = snap.get("gpus") or []
    snap["gpus"] = gpus[:1]
    for gpu in snap["gpus"]:
        if gpu.get("nvlinks"):
            gpu["nvlinks"] = gpu["nvlinks"][:1]
    topo = snap.get("topology")
    if isinstance(topo, dict):
        snap["topology"] = {
            "gpus": topo.get("gpus", [])[:2],
            "links": [row[:2] for row in topo.get("links", [])[:2]],
            "nvlink_counts": [row[:2] for row in topo.get("nvlink_counts", [])[:2]],
            "numa": dict(list((topo.get("numa") or {}).items())[:2]),
            "unavailable": topo.get("unavailable", {}),
        }
    return snap


def _junit_excerpt(xml_text: str, node: str) -> str:
    """The node's testsuite with its failing and erroring test cases and one passing one."""
    root = ET.fromstring(xml_text.split("\n", 1)[1])
    out = ET.Element("testsuites", root.attrib)
    for suite in root:
        if suite.get("name") != node:
            continue
        copy = ET.SubElement(out, "testsuite", suite.attrib)
        passing = 0
        for case in suite:
            bad = case.find("failure") is not None or case.find("error") is not None
            if bad or passing < 1:
                copy.append(case)
                passing += 0 if bad else 1
        ET.indent(out)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(out, encoding="unicode")


def _prom_metrics(text: str) -> list[dict[str, str]]:
    """Name, type, labels and help of each metric in a textfile, in order."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    labels: dict[str, str] = {}
    order: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            helps[name] = help_text
            if name not in order:
                order.append(name)
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if name not in labels:
                labels[name] = ", ".join(re.findall(r'([a-z_]+)="', line))
    return [
        {"name": n, "type": types.get(n, ""), "labels": labels.get(n, ""), "help": helps.get(n, "")} for n in order
    ]


# The audit exit-code table: (what the audit found, its findings' severities, --fail-on);
# ``unreachable`` stands for a node that gave no snapshot (a ``transport.unreachable`` finding).
EXIT_CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("no finding, or only `info`", (), "warn"),
    ("a `warn` finding, nothing `crit`, every node answered", ("warn", "unknown"), "warn"),
    ("a `warn` finding with `--fail-on crit`", ("warn",), "crit"),
    ("a `crit` finding, every node answered", ("crit", "warn", "unknown"), "warn"),
    ("an unreachable node (no snapshot), whatever else was found", ("unreachable", "crit", "warn"), "warn"),
    ("an unreachable node with `--fail-on crit`", ("unreachable", "warn"), "crit"),
    ("only `unknown` findings (values that could not be read)", ("unknown",), "warn"),
    ("`warn` and `unknown` with `--fail-on crit`", ("warn", "unknown"), "crit"),
)


def _exit_codes() -> dict[str, Any]:
    from fleetops import cli, model
    from fleetops.agent import check as agent_check
    from fleetops.agent import main as agent_main
    from fleetops.checks import verdict

    def exit_for(severities: tuple[str, ...], fail_on: str) -> int:
        findings = [
            model.Finding(check="transport.unreachable", severity="unknown", node="n", message="")
            if s == model.UNREACHABLE
            else model.Finding(check="x", severity=s, node="n", message="")
            for s in severities
        ]
        return verdict.exit_code(findings, fail_on)

    try:
        from fleetops.rollout import cli as rollout_cli

        rollout: dict[str, int] | None = {
            "ok": rollout_cli.EXIT_OK,
            "hosts_failed": rollout_cli.EXIT_HOSTS_FAILED,
            "run_failed": rollout_cli.EXIT_RUN_FAILED,
            "usage": rollout_cli.EXIT_USAGE,
        }
    except ImportError:
        rollout = None
    return {
        "audit": [{"found": found, "exit": exit_for(sevs, fail_on)} for found, sevs, fail_on in EXIT_CASES],
        "usage": cli.EXIT_USAGE,
        "rollout": rollout,
        "agent": {"ok": agent_main.EXIT_OK, "fail": agent_main.EXIT_FAIL, "usage": agent_main.EXIT_USAGE},
        "check": {"kind": agent_check.KIND, "scope": agent_check.SCOPE},
    }


def outputs_page_data() -> dict[str, Any]:
    from fleetops import model
    from fleetops.report import json_report, junit, prometheus
    from fleetops.schema import SCHEMA_ID

    result, code = example_audit()
    doc = json_report.document(result, code)
    node002 = next(n for n in doc["nodes"] if n["name"] == "node002")
    prom_text = prometheus.render(result, code)
    gauge_names = {m for m, _, _ in prometheus.GPU_GAUGES}
    return {
        "findings_schema": model.FINDINGS_SCHEMA_ID,
        "snapshot_schema": SCHEMA_ID,
        "summary": doc["summary"],
        "findings": doc["findings"],
        "node_entry": {**node002, "snapshot": _trim_snapshot(node002["snapshot"])},
        "unreachable_entry": next(n for n in doc["nodes"] if n["snapshot"] is None),
        "field_tables": [
            {"title": title, "fields": _fields(cls)}
            for title, cls in (
                ("Node (the snapshot)", model.Node),
                ("GPU (`gpus[]`)", model.Gpu),
                ("NVLink (`gpus[].nvlinks[]`)", model.NvLink),
                ("XID event (`xids[]`)", model.XidEvent),
                ("Topology (`topology`)", model.Topology),
            )
        ],
        "junit_excerpt": _junit_excerpt(junit.render(result, code), "node002"),
        "metrics": [m for m in _prom_metrics(prom_text) if m["name"] not in gauge_names],
        "gpu_gauges": [{"name": n, "field": attr, "help": h} for n, attr, h in prometheus.GPU_GAUGES],
        "severity_values": sorted(prometheus.SEV_VALUE.items(), key=lambda kv: kv[1]),
        "renamed": list(prometheus.RENAMED.items()),
        "prom_head": prom_text.splitlines()[:24],
        "exit_codes": _exit_codes(),
        "health_order": list(model.HEALTH_ORDER),
    }
