"""The resident agent's Prometheus pages from a real H200, idle and under a bf16 load
(tests/fixtures/h200/): clean for promtool, healthy, and no warn or crit finding in either."""

from __future__ import annotations

from pathlib import Path

import pytest
from promtool_util import assert_clean

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
PAGES = ["h200_daemon_metrics_idle.prom", "h200_daemon_metrics_bf16_load.prom"]


@pytest.mark.promtool
@pytest.mark.parametrize("page", PAGES)
def test_the_real_h200_page_passes_promtool(page: str) -> None:
    assert_clean((H200 / page).read_text())


@pytest.mark.parametrize("page", PAGES)
def test_the_real_h200_is_healthy_idle_and_under_load(page: str) -> None:
    lines = (H200 / page).read_text().splitlines()
    samples = [ln for ln in lines if ln and not ln.startswith("#")]
    assert "fleetops_agent_degraded 0" in samples
    assert "fleetops_node_health 0" in samples
    health = [ln for ln in samples if ln.startswith("fleetops_gpu_health{")]
    assert len(health) == 1 and health[0].endswith(" 0")
    serious = [ln for ln in samples if ln.startswith(("fleetops_gpu_finding{", "fleetops_node_finding{"))
               and ('severity="warn"' in ln or 'severity="crit"' in ln)]
    assert serious == []


def test_the_load_page_shows_the_power_cap_the_load_reached() -> None:
    samples = (H200 / PAGES[1]).read_text().splitlines()
    assert any(ln.startswith("fleetops_gpu_clocks_event_active{") and 'reason="sw_power_cap"' in ln
               and ln.endswith(" 1") for ln in samples)
