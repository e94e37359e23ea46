"""The judge on the real H200's validation results (``tests/fixtures/h200``): both levels, as the
torch backend measured them after its untimed warm-up, are steady and above the shipped floors,
and what the GPU went through during each test came with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetops.validation.floors import floors_for
from fleetops.validation.judge import MAX_SPREAD, judge, steady

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


@pytest.mark.parametrize("level", ["quick", "full"])
def test_real_h200_results_are_steady_and_pass_the_shipped_floors(level: str) -> None:
    doc = json.loads((CAPTURE / f"h200_validate_{level}.json").read_text())
    assert doc["level"] == level and doc["provenance"]["backend"] == "torch"
    (gpu,) = doc["gpus"]
    floors = floors_for(gpu["name"])
    assert floors is not None
    for metric, stat in gpu["tests"].items():
        assert steady(stat), (metric, stat, MAX_SPREAD)
        floor = floors.metric(metric)
        assert floor is not None and stat["median"] > floor, (metric, stat["median"], floor)
        seen = gpu["telemetry"]["during"][metric]
        assert seen["readings"] >= 2 and "errors" not in seen
    (verdict,) = judge([{**gpu, "host": "h200"}])
    assert verdict.status == "ok", verdict.to_dict()
    # the GEMMs ran at the power cap, and the result says so
    assert "sw_power_cap" in gpu["telemetry"]["during"]["gemm_bf16_tflops"]["clocks_event_reasons"]
