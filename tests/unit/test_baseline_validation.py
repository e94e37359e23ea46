"""The baseline's ``validation:`` block: floor overrides checked against the shipped floors'
models and metrics, ``require`` and ``max_age_days``, with file:line errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetops.baseline import VALIDATION_FLOOR_METRICS, BaselineError, from_mapping, load_file, merge
from fleetops.validation.floors import SHIPPED, floors_for


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "baseline.yml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return str(path)


def _error(tmp_path: Path, text: str) -> BaselineError:
    path = _write(tmp_path, text)
    with pytest.raises(BaselineError) as info:
        load_file(path)
    assert info.value.source == path
    return info.value


def test_good_validation_block_loads_and_overrides_reach_the_judge(tmp_path: Path) -> None:
    b = load_file(_write(tmp_path, """
        driver_version: "580.159.04"
        validation:
          require: full
          max_age_days: 3
          floors:
            NVIDIA H200: {hbm_triad_gbps: 3500, h2d_gbps: 40}
            H100 SXM: {gemm_bf16_tflops: 600}
        """))
    v = b.validation
    assert (v.require, v.max_age_days) == ("full", 3.0)
    # NVML names are keyed by the shipped floor model, the key floors_for looks up
    assert dict(v.floors) == {"H200 SXM": {"hbm_triad_gbps": 3500.0, "h2d_gbps": 40.0},
                              "H100 SXM": {"gemm_bf16_tflops": 600.0}}
    h200 = floors_for("NVIDIA H200", {k: dict(m) for k, m in v.floors.items()})
    assert h200 is not None
    assert (h200.hbm_triad_gbps, h200.h2d_gbps) == (3500.0, 40.0)
    assert h200.hbm_copy_gbps == SHIPPED["H200 SXM"].hbm_copy_gbps  # not overridden: shipped


def test_absent_block_requires_nothing() -> None:
    b = from_mapping({"driver_version": "580.159.04"}, "inline")
    assert (b.validation.require, b.validation.max_age_days, dict(b.validation.floors)) == (None, None, {})


def test_every_accepted_metric_changes_the_floor_it_names() -> None:
    # a metric the baseline accepts but floors_for ignored would be an override that does nothing
    for metric in VALIDATION_FLOOR_METRICS:
        got = floors_for("NVIDIA H200", {"H200 SXM": {metric: 1.5}})
        assert got is not None and got.metric(metric) == 1.5, metric


def test_unknown_model_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    err = _error(tmp_path, """
        validation:
          require: quick
          floors:
            NVIDIA A100-SXM4-80GB: {hbm_triad_gbps: 1500}
        """)
    assert err.line == 4
    assert err.path == 'validation.floors["NVIDIA A100-SXM4-80GB"]'
    assert "no shipped floors for GPU model 'NVIDIA A100-SXM4-80GB'" in err.problem
    assert str(err).startswith(f"{err.source}:4: ")


def test_close_model_name_gets_a_did_you_mean(tmp_path: Path) -> None:
    err = _error(tmp_path, """
        validation:
          floors:
            H20 SXM: {hbm_triad_gbps: 3000}
        """)
    assert err.line == 3
    assert "did you mean 'H200 SXM'?" in err.problem


def test_unknown_metric_is_an_error_with_did_you_mean(tmp_path: Path) -> None:
    err = _error(tmp_path, """
        validation:
          floors:
            NVIDIA H200:
              hbm_copy_gbps: 3000
              hbm_triad: 3100
        """)
    assert err.line == 5
    assert err.path == 'validation.floors["NVIDIA H200"].hbm_triad'
    assert "did you mean 'hbm_triad_gbps'?" in err.problem


@pytest.mark.parametrize(
    ("text", "line", "path", "problem"),
    [
        ("validation:\n  floors:\n    NVIDIA H200: {hbm_triad_gbps: fast}\n", 3,
         'validation.floors["NVIDIA H200"].hbm_triad_gbps', "expected a number, got string 'fast'"),
        ("validation:\n  require: nightly\n", 2, "validation.require", "must be one of quick, full; got 'nightly'"),
        ("validation:\n  max_age_days: \"7\"\n", 2, "validation.max_age_days", "expected a number, got string '7'"),
        ("validation:\n  max_age_days: 0\n", 2, "validation.max_age_days", "must be between 0.001 and 366 d, got 0"),
        ("validation:\n  floors: [H200]\n", 2, "validation.floors", "expected a mapping, got a list"),
        ("validation:\n  requires: quick\n", 2, "validation.requires", "did you mean 'require'?"),
    ],
)
def test_bad_types_and_values_name_file_line_and_key(tmp_path: Path, text: str, line: int, path: str,
                                                     problem: str) -> None:
    err = _error(tmp_path, text)
    assert (err.line, err.path) == (line, path)
    assert problem in err.problem


def test_merge_layers_floors_per_metric() -> None:
    base = from_mapping({"validation": {"require": "quick", "floors": {"NVIDIA H200": {"h2d_gbps": 40}}}}, "a")
    over = from_mapping({"validation": {"floors": {"NVIDIA H200": {"hbm_triad_gbps": 3000}}}}, "b")
    merged = merge(base, over).validation
    assert merged.require == "quick"
    assert dict(merged.floors) == {"H200 SXM": {"h2d_gbps": 40.0, "hbm_triad_gbps": 3000.0}}
