"""The shipped alert rules (``prometheus/fleetops-rules.yml``): promtool accepts them, their unit
tests (``prometheus/tests/*.yml``) pass, and every metric they read is one the agent exports."""

from __future__ import annotations

import glob
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from promtool_util import promtool

from fleetops import baseline, checks, model
from fleetops.agent import metrics, slurm_healthcheck

pytestmark = [pytest.mark.promtool]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "prometheus" / "fleetops-rules.yml"
RULE_TESTS = sorted(glob.glob(str(REPO / "prometheus" / "tests" / "*.yml")))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def test_promtool_check_rules_accepts_the_rules() -> None:
    proc = run("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_the_rules_unit_tests_pass() -> None:
    assert len(RULE_TESTS) >= 4, RULE_TESTS
    proc = run("test", "rules", *RULE_TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_has_a_unit_test() -> None:
    alerts = set(re.findall(r"^\s*- alert: (\S+)$", RULES.read_text(), re.M))
    tested = {name for path in RULE_TESTS for name in re.findall(r"alertname: (\S+)", Path(path).read_text())}
    assert alerts and alerts <= tested, sorted(alerts - tested)


def test_every_metric_the_rules_read_is_exported_by_the_agent(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline, tmp_path: Path
) -> None:
    node = sim_node(faults=["ecc-dbe@1", "nvlink-down@3", "driver-drift"])
    findings = checks.run_node_checks(node, sim_baseline)
    agent = metrics.AgentInfo(time.time(), 2.0, degraded=True, reason="nvml_hang", sample_age_s=1.0)
    text = metrics.render(metrics.MetricsInput(node=node, agent=agent, findings=tuple(findings),
                                               xid_counts=metrics.xid_counts_from_events(node.xids)))
    # the page adds the Slurm health program's last report (serve/exposition.page)
    report = tmp_path / "slurm-healthcheck.json"
    held = {"kind": slurm_healthcheck.KIND, "action": "held-by-breaker", "breaker": {"open": True}}
    slurm_healthcheck.write_report(str(report), {**held, "at": time.time()})
    text += slurm_healthcheck.metrics_text(str(report))
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    read = set(re.findall(r"\b(fleetops_[a-z0-9_]+)", RULES.read_text()))
    assert read and read <= exported, sorted(read - exported)
