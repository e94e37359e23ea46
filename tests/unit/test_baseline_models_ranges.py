"""Issue 27: the baseline refuses what it cannot mean. A gpu_models key no GPU reports is an
error at load (it silently turned the firmware and power-limit checks off); numeric keys have
their physical ranges (7000 W was accepted); and an audit whose fleet has no GPU of a listed
model, while its GPUs' model is unlisted, warns."""

from __future__ import annotations

from typing import Any

import pytest

from fleetops import baseline as bl
from fleetops.catalog import gpus
from fleetops.checks import versions


def _error(tmp_path: Any, text: str) -> bl.BaselineError:
    path = tmp_path / "baseline.yml"
    path.write_text(text)
    with pytest.raises(bl.BaselineError) as info:
        bl.load_file(str(path))
    return info.value


def test_a_typod_model_key_is_an_error_naming_file_line_and_the_known_models(tmp_path):
    err = _error(tmp_path, "driver_version: '580.159.04'\ngpu_models:\n  NVIDIA H200 SXM:\n    power_limit_w: 700\n")
    assert str(err).startswith(f"{tmp_path / 'baseline.yml'}:3: ")
    assert err.path == 'gpu_models["NVIDIA H200 SXM"]' and err.line == 3
    assert "did you mean 'NVIDIA H200'?" in err.problem
    assert "known models (the name NVML reports): NVIDIA H200, NVIDIA H200 NVL, NVIDIA H100 80GB HBM3" in err.problem


def test_a_power_limit_of_7000_w_is_an_error_naming_file_line_and_the_range(tmp_path):
    err = _error(tmp_path, "persistence_mode: true\npower_limit_w: 7000\n")
    assert err.line == 2 and err.path == "power_limit_w"
    assert str(err) == f"{tmp_path / 'baseline.yml'}:2: power_limit_w: must be between 100 and 1000 W, got 7000"


def test_a_model_power_limit_above_the_boards_maximum_is_an_error(tmp_path):
    err = _error(tmp_path, "gpu_models:\n  NVIDIA H100 PCIe:\n    power_limit_w: 700\n")
    assert err.line == 3
    assert err.problem == "must be at most 350 W, the maximum power limit of NVIDIA H100 PCIe; got 700"


@pytest.mark.parametrize(("text", "path", "line", "words"), [
    ("power_limit_w: 50\n", "power_limit_w", 1, "between 100 and 1000 W, got 50"),
    ("gpu_models:\n  NVIDIA H200:\n    power_limit_w: 1200\n", 'gpu_models["NVIDIA H200"].power_limit_w', 3,
     "between 100 and 1000 W, got 1200"),
    ("gpu_count: 0\n", "gpu_count", 1, "between 1 and 16, got 0"),
    ("nvlinks_per_gpu: 36\n", "nvlinks_per_gpu", 1, "between 0 and 18, got 36"),
    ("thresholds:\n  temp_memory_warn_c: 150\n", "thresholds.temp_memory_warn_c", 2, "between 30 and 120 C"),
    ("thresholds:\n  temp_slowdown_margin_c: 60\n", "thresholds.temp_slowdown_margin_c", 2, "between 0 and 50 C"),
    ("thresholds:\n  ecc_dbe_volatile_crit: 0\n", "thresholds.ecc_dbe_volatile_crit", 2, "at least 1, got 0"),
    ("thresholds:\n  xid_hold_hours: 0\n", "thresholds.xid_hold_hours", 2, "must be above 0 h, got 0"),
    ("thresholds:\n  rate_min_interval_s: 0\n", "thresholds.rate_min_interval_s", 2, "must be above 0 s"),
    ("validation:\n  max_age_days: 400\n", "validation.max_age_days", 2, "between 0.001 and 366 d"),
])
def test_numeric_keys_out_of_their_range_name_file_line_and_range(tmp_path, text, path, line, words):
    err = _error(tmp_path, text)
    assert err.path == path and err.line == line and words in str(err), str(err)


def test_values_at_the_ends_of_a_range_load():
    b = bl.from_mapping({"power_limit_w": 100, "gpu_count": 16, "nvlinks_per_gpu": 0,
                         "gpu_models": {"NVIDIA H200": {"power_limit_w": 700}},
                         "thresholds": {"temp_memory_warn_c": 120, "xid_hold_hours": 0.5}}, "t")
    assert b.power_limit_for("NVIDIA H200") == 700 and b.power_limit_w == 100


def test_json_schema_states_the_ranges_and_the_known_models():
    schema = bl.json_schema()["properties"]
    assert schema["power_limit_w"]["minimum"] == 100 and schema["power_limit_w"]["maximum"] == 1000
    assert schema["gpu_models"]["propertyNames"] == {"enum": gpus.names()}
    th = schema["thresholds"]["properties"]
    assert th["xid_hold_hours"]["exclusiveMinimum"] == 0 and "minimum" not in th["xid_hold_hours"]
    assert th["ecc_dbe_volatile_crit"]["minimum"] == 1


def test_every_json_schema_example_and_default_is_in_its_range():
    for key in bl.SCHEMA:
        for value in (key.default, key.example):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert bl.range_problem(key, value) is None, key.path


def _node(host: str, name: str, count: int = 8) -> Any:
    from fleetops import model

    n = model.Node(hostname=host)
    n.gpus = [model.Gpu(index=i, uuid=f"GPU-{host}-{i}", bus_id=f"0000:{i:02x}:00.0", name=name) for i in range(count)]
    return n


def test_fleet_without_a_gpu_of_a_listed_model_warns_naming_the_key_and_its_line(tmp_path):
    path = tmp_path / "b.yml"
    path.write_text("gpu_models:\n  NVIDIA H100 80GB HBM3:\n    power_limit_w: 700\n")
    b = bl.load_file(str(path))
    found = [f for f in versions.run_fleet([_node("a", "NVIDIA H200"), _node("b", "NVIDIA H200")], b)
             if f.check == "versions.baseline_model"]
    assert [(f.node, f.severity) for f in found] == [("a", "warn"), ("b", "warn")]
    assert f'gpu_models["NVIDIA H100 80GB HBM3"] ({path}:2) matches no GPU of the 2 node(s)' in found[0].message
    assert found[0].observed == ["NVIDIA H200"]


def test_a_shared_baseline_listing_more_models_than_the_fleet_has_is_silent_when_every_gpu_is_listed():
    b = bl.from_mapping({"gpu_models": {"NVIDIA H200": {"power_limit_w": 700},
                                        "NVIDIA H100 80GB HBM3": {"power_limit_w": 700}}}, "t")
    assert not [f for f in versions.run_fleet([_node("a", "NVIDIA H200")], b) if f.check == "versions.baseline_model"]
