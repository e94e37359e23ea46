"""NVLink on a GPU in MIG mode: NVML reports every link down there by design (MIG does not use
NVLink), so neither the link checks nor the daemon's metrics flag it; a GPU whose MIG mode is
only pending still has its links judged."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetops import baseline, checks, model
from fleetops.agent import metrics
from fleetops.sim import gpu as sim

GPU = 2


def _mig_on(state: dict[str, object], position: int) -> None:
    gpus = state["gpus"]
    assert isinstance(gpus, list)
    gpus[position]["mig_mode_current"] = True
    gpus[position]["mig_mode_pending"] = True


def _nvlink_findings(findings: list[model.Finding]) -> list[model.Finding]:
    return [f for f in findings if f.check.startswith("nvlink.") or f.check.startswith("topology.")]


def test_a_gpu_in_mig_mode_reports_its_links_down_and_no_link_check_flags_it(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline
) -> None:
    state = sim.build_state("n1")
    _mig_on(state, GPU)
    t0 = time.time()
    prev, node = sim_node(state=state, now=t0), sim_node(state=state, now=t0 + 120)
    gpu = node.gpus[GPU]
    assert gpu.mig_mode_current and gpu.nvlinks and gpu.nvlinks_up == 0  # what NVML shows under MIG
    findings = checks.run_node_checks(node, sim_baseline, prev)  # the baseline expects 18 links per GPU
    assert _nvlink_findings(findings) == []


def test_the_same_links_down_without_mig_are_critical(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline
) -> None:
    # the counterpart: MIG only pending (the mode changes at the next reset) leaves the links judged
    state = sim.build_state("n1", {"faults": [f"nvlink-down@{GPU}"]})
    state["gpus"][GPU]["mig_mode_pending"] = True
    node = sim_node(state=state)
    [f] = [f for f in checks.run_node_checks(node, sim_baseline, None) if f.check == "nvlink.links_down"]
    assert f.severity == "crit" and f.gpu is not None and f.gpu["uuid"] == node.gpus[GPU].uuid


def test_the_metrics_page_has_no_link_state_for_a_gpu_in_mig_mode(sim_node: Callable[..., model.Node]) -> None:
    state = sim.build_state("n1")
    _mig_on(state, GPU)
    node = sim_node(state=state)
    page = metrics.render(metrics.MetricsInput(
        node=node,
        agent=metrics.AgentInfo(started_at=(node.collected_at or 0) - 60, interval_s=2.0, sample_age_s=0.4),
        findings=tuple(checks.run_node_checks(node, None)),
        xid_counts=metrics.xid_counts_from_events(node.xids),
    ))
    up_lines = [line for line in page.splitlines() if line.startswith("fleetops_gpu_nvlink_up{")]
    mig_uuid = node.gpus[GPU].uuid
    # the shipped rule FleetopsGpuNvlinkDown fires on any series at 0: the MIG GPU has none
    assert not [line for line in up_lines if mig_uuid in line]
    others = {g.uuid for g in node.gpus if g.uuid != mig_uuid}
    assert {u for u in others if any(u in line for line in up_lines)} == others
    assert all(line.endswith(" 1") for line in up_lines)
