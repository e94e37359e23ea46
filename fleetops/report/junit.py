"""JUnit XML: one testsuite per node, one testcase per check that ran on it.

A warn or crit finding is a <failure>, unknown is <error> (we could not tell), info and ok pass.
CI systems (Jenkins, GitLab) then show the fleet's health as a test report.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from fleetops.report import values


def render(result: Any, exit_code: int) -> str:
    suites = ET.Element("testsuites", name="fleetops audit")
    by_node: dict[str, list[Any]] = {}
    for f in result.findings:
        by_node.setdefault(f.node, []).append(f)
    total = failures = errors = 0
    for node in result.nodes:
        findings = by_node.get(node.name, [])
        at = node.snapshot.collected_at if node.snapshot is not None else getattr(result, "started_at", None)
        checks = list(result.checks_run.get(node.name, []))
        for f in findings:  # transport and fleet findings are checks too
            if f.check not in checks:
                checks.append(f.check)
        suite = ET.SubElement(suites, "testsuite", name=node.name)
        if node.source is not None:  # where the snapshot came from, for whoever reads a failure
            props = ET.SubElement(suite, "properties")
            ET.SubElement(props, "property", name="source", value=node.source)
            if node.age_s is not None:
                ET.SubElement(props, "property", name="snapshot_age_s", value=f"{node.age_s:g}")
            ET.SubElement(props, "property", name="rates", value=node.rates or "none")
        s_fail = s_err = 0
        for check in checks:
            case = ET.SubElement(suite, "testcase", classname=node.name, name=check)
            mine = [f for f in findings if f.check == check]
            bad = [f for f in mine if f.severity in ("warn", "crit")]
            unknown = [f for f in mine if f.severity == "unknown"]
            if bad:
                s_fail += 1
                worst = "crit" if any(f.severity == "crit" for f in bad) else "warn"
                el = ET.SubElement(case, "failure", type=worst, message="; ".join(f.message for f in bad)[:2000])
                el.text = "\n".join(_line(f, at) for f in bad)
            elif unknown:
                s_err += 1
                el = ET.SubElement(case, "error", type="unknown", message="; ".join(f.message for f in unknown)[:2000])
                el.text = "\n".join(_line(f, at) for f in unknown)
            elif mine:
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join(_line(f, at) for f in mine)
        suite.set("tests", str(len(checks)))
        suite.set("failures", str(s_fail))
        suite.set("errors", str(s_err))
        total += len(checks)
        failures += s_fail
        errors += s_err
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    suites.set("errors", str(errors))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _line(f: Any, at: float | None) -> str:
    gpu = f" gpu {f.gpu['index']} {f.gpu['uuid']} {f.gpu['bus_id']}" if f.gpu else ""
    shown = values.values_text(f, at)
    jobs = values.jobs_text(f)
    return (f"[{f.severity}] {f.node}{gpu}: {f.message}" + (f" ({shown})" if shown else "")
            + (f" [{jobs}]" if jobs else "") + f" -> {f.action}")
