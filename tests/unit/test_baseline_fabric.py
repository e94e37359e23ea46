"""The baseline's ``fabric`` key: loaded, refused at FILE:LINE when wrong, layered key by key like
every other mapping, and described in the JSON Schema."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

from fleetops import baseline as bl
from fleetops import model
from fleetops.checks import run_fleet_checks, run_node_checks
from fleetops.sim import gpu as sim


def _load(tmp_path: Path, text: str) -> bl.Baseline:
    path = tmp_path / "baseline.yml"
    path.write_text(textwrap.dedent(text).lstrip())
    return bl.load_file(str(path))


def _error(tmp_path: Path, text: str) -> bl.BaselineError:
    with pytest.raises(bl.BaselineError) as info:
        _load(tmp_path, text)
    return info.value


def test_the_fabric_key_loads_into_its_values(tmp_path: Path) -> None:
    b = _load(tmp_path, """
        fabric:
          compute_ports: 8
          link_layer: InfiniBand
          rate_gbps: 400
          width: 4X
          firmware: "28.39.1002"
          exclude_devices: [mlx5_8, "mlx5_bond*"]
          exclude_link_layers: [Ethernet]
        """)
    assert b.fabric == bl.FabricBaseline(compute_ports=8, link_layer="InfiniBand", rate_gbps=400.0, width="4X",
                                         firmware="28.39.1002", exclude_devices=("mlx5_8", "mlx5_bond*"),
                                         exclude_link_layers=("Ethernet",))
    assert bl.load_file(str(Path(__file__).resolve().parents[2] / "examples" / "baseline.yml")).fabric.compute_ports == 8


@pytest.mark.parametrize(("text", "path", "line", "problem"), [
    ("driver_version: '580.159.04'\nfabric:\n  width: 3X\n", "fabric.width", 3, "must be one of 1X, 2X, 4X, 8X, 12X"),
    ("fabric:\n  compute_ports: 8\n  rate_gbps: '400'\n", "fabric.rate_gbps", 3, "expected a number"),
    ("fabric:\n  firmware: 28.39\n", "fabric.firmware", 2, "expected a string"),
    ("fabric:\n  exclude_link_layers: [Ethernet, Token]\n", "fabric.exclude_link_layers[1]", 2,
     "must be one of InfiniBand, Ethernet"),
    ("fabric:\n\n  compute_port: 8\n", "fabric.compute_port", 3, "did you mean 'compute_ports'"),
    ("fabric:\n  compute_ports: -1\n", "fabric.compute_ports", 2, "must be between 0 and 64"),
    ("thresholds:\n  fabric_link_downed_crit: 0\n", "thresholds.fabric_link_downed_crit", 2, "at least 1"),
])
def test_a_bad_fabric_key_is_refused_at_its_file_and_line(tmp_path: Path, text: str, path: str, line: int,
                                                          problem: str) -> None:
    err = _error(tmp_path, text)
    assert (err.source, err.path, err.line) == (str(tmp_path / "baseline.yml"), path, line)
    assert problem in err.problem
    assert str(err).startswith(f"{tmp_path / 'baseline.yml'}:{line}: {path}: ")


def test_fabric_layers_key_by_key_and_a_null_unsets(tmp_path: Path) -> None:
    merged = bl.layer([
        ("all", "group_vars/all.yml", {"fabric": {"compute_ports": 8, "rate_gbps": 400, "firmware": "28.39.1002",
                                                   "exclude_devices": ["mlx5_8"]}}),
        ("group h100_hdr", "group_vars/h100_hdr.yml", {"fabric": {"rate_gbps": 200, "firmware": None}}),
    ])
    assert merged.fabric == bl.FabricBaseline(compute_ports=8, rate_gbps=200.0, firmware=None,
                                              exclude_devices=("mlx5_8",))
    assert merged.level_of("fabric.rate_gbps") == "group h100_hdr"
    assert merged.level_of("fabric.compute_ports") == "all"
    with pytest.raises(bl.BaselineError) as info:
        bl.layer([("all", "all.yml", {"fabric": {"width": "3X"}})])
    assert (info.value.source, info.value.path) == ("all.yml", "fabric.width")


def test_the_json_schema_describes_fabric_and_accepts_the_example(tmp_path: Path) -> None:
    schema = bl.json_schema()
    fabric = schema["properties"]["fabric"]
    assert set(fabric["properties"]) == {"compute_ports", "link_layer", "rate_gbps", "width", "firmware",
                                         "exclude_devices", "exclude_link_layers"}
    example = bl.SCHEMA_BY_PATH["fabric"].example
    jsonschema.validate({"fabric": example}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"fabric": {"width": "3X"}}, schema)


# --- gpu_models.*.fabric: a model's own fabric over the group's ----------------------------------

H100 = "NVIDIA H100 80GB HBM3"


def _node(name: str, gpu_name: str = "NVIDIA H200", faults: tuple[str, ...] = ()) -> model.Node:
    now = time.time()
    doc = sim.snapshot(sim.build_state(name, {"gpu": {"name": gpu_name}, "faults": list(faults)}), now=now)
    doc.pop("_kernel_log")
    doc["collected_at"] = now
    return model.node_from_dict(doc)


def _fabric_faults(node: model.Node, b: bl.Baseline) -> list[tuple[str, str, str | None]]:
    return sorted((f.check, f.severity, f.port) for f in run_node_checks(node, b, None)
                  if f.check.startswith("fabric.") and f.severity in ("warn", "crit"))


def test_a_models_fabric_key_applies_to_the_nodes_of_that_model_only(tmp_path: Path) -> None:
    b = _load(tmp_path, """
        fabric:
          compute_ports: 8
          exclude_devices: [mlx5_8]
        gpu_models:
          NVIDIA H100 80GB HBM3:
            fabric:
              compute_ports: 9
              firmware: "28.40.1000"
        """)
    assert b.gpu_models[H100].fabric == bl.FabricBaseline(compute_ports=9, firmware="28.40.1000")
    assert b.fabric_for(H100) == bl.FabricBaseline(compute_ports=9, firmware="28.40.1000", exclude_devices=("mlx5_8",))
    assert b.fabric_for("NVIDIA H200") == b.fabric == bl.FabricBaseline(compute_ports=8, exclude_devices=("mlx5_8",))
    # the H100 node: the model's 9 ports and firmware, the group's exclusion (mlx5_8 is no compute port)
    assert _fabric_faults(_node("h100", H100), b) == [
        ("fabric.firmware", "warn", f"mlx5_{i}") for i in range(8)] + [("fabric.port_count", "crit", None)]
    # the H200 node: the group's fabric alone, which it meets
    assert _fabric_faults(_node("h200"), b) == []
    # an H200 node short of an HCA is short of the group's 8, not of the H100's 9
    [count] = [f for f in run_node_checks(_node("h200", faults=("ib-missing-hca@2",)), b, None)
               if f.check == "fabric.port_count"]
    assert (count.severity, count.expected, count.observed["compute_ports"]) == ("crit", 8, 7)


def test_the_models_key_wins_over_the_groups_key_by_key_whatever_level_set_either() -> None:
    """As gpu_models.*.power_limit_w over power_limit_w: each level merges key by key (a child
    level's key beats its parent's, a null unsets it); then, for a node of the model, each key its
    fabric sets beats the group's fabric, and a key it leaves out is the group's."""
    merged = bl.layer([
        ("all", "group_vars/all.yml", {
            "fabric": {"compute_ports": 8, "rate_gbps": 400, "exclude_devices": ["mlx5_8"]},
            "gpu_models": {"NVIDIA H200": {"fabric": {"compute_ports": 9, "firmware": "28.37.1014",
                                                      "width": "4X"}}}}),
        ("group h200_hdr", "group_vars/h200_hdr.yml", {
            "fabric": {"rate_gbps": 200, "compute_ports": 10},
            "gpu_models": {"NVIDIA H200": {"fabric": {"firmware": "28.39.1002", "width": None}}}}),
    ])
    assert merged.gpu_models["NVIDIA H200"].fabric == bl.FabricBaseline(compute_ports=9, firmware="28.39.1002")
    assert merged.fabric_for("NVIDIA H200") == bl.FabricBaseline(
        compute_ports=9, rate_gbps=200.0, firmware="28.39.1002", exclude_devices=("mlx5_8",))
    assert merged.fabric_for(H100) == bl.FabricBaseline(compute_ports=10, rate_gbps=200.0, exclude_devices=("mlx5_8",))
    assert merged.level_of('gpu_models["NVIDIA H200"].fabric.firmware') == "group h200_hdr"
    assert merged.level_of('gpu_models["NVIDIA H200"].fabric.compute_ports') == "all"


def test_a_node_of_a_model_that_pins_the_port_count_is_left_out_of_the_fleets_vote() -> None:
    """Four H200 nodes, one short of an HCA: the model's compute_ports judges it (crit) and the
    fleet's majority, which only judges what nothing pins, says nothing of it."""
    b = bl.from_mapping({"gpu_models": {"NVIDIA H200": {"fabric": {"compute_ports": 8}}}}, "test")
    nodes = [_node(f"n{i}", faults=("ib-missing-hca@2",) if i == 4 else ()) for i in range(1, 5)]
    assert [(f.check, f.node) for f in run_fleet_checks(nodes, b) if f.check.startswith("fabric.")] == []
    assert [(f.check, f.severity) for f in run_node_checks(nodes[3], b, None) if f.check == "fabric.port_count"] == [
        ("fabric.port_count", "crit")]
    unpinned = bl.from_mapping({"gpu_models": {H100: {"fabric": {"compute_ports": 8}}}}, "test")
    assert [(f.check, f.severity, f.node, f.expected) for f in run_fleet_checks(nodes, unpinned)
            if f.check.startswith("fabric.")] == [("fabric.port_count", "warn", "n4", 8)]


@pytest.mark.parametrize(("text", "path", "line", "problem"), [
    ("gpu_models:\n  NVIDIA H200:\n    fabric:\n      width: 3X\n", 'gpu_models["NVIDIA H200"].fabric.width', 4,
     "must be one of 1X, 2X, 4X, 8X, 12X"),
    ("gpu_models:\n  NVIDIA H200:\n    power_limit_w: 700\n    fabric:\n      exclude_link_layers: [Token]\n",
     'gpu_models["NVIDIA H200"].fabric.exclude_link_layers[0]', 5, "must be one of InfiniBand, Ethernet"),
    ("gpu_models:\n  NVIDIA H200:\n    fabric:\n\n      compute_port: 8\n", 'gpu_models["NVIDIA H200"].fabric.compute_port',
     5, "did you mean 'compute_ports'"),
    ("gpu_models:\n  NVIDIA H200:\n    fabric: 8\n", 'gpu_models["NVIDIA H200"].fabric', 3, "expected a mapping"),
])
def test_a_bad_model_fabric_key_is_refused_at_its_file_and_line(tmp_path: Path, text: str, path: str, line: int,
                                                                problem: str) -> None:
    err = _error(tmp_path, text)
    assert (err.source, err.path, err.line) == (str(tmp_path / "baseline.yml"), path, line)
    assert problem in err.problem


def test_the_json_schema_describes_a_models_fabric() -> None:
    schema = bl.json_schema()
    model_fabric = schema["properties"]["gpu_models"]["additionalProperties"]["properties"]["fabric"]
    assert set(model_fabric["properties"]) == {"compute_ports", "link_layer", "rate_gbps", "width", "firmware",
                                               "exclude_devices", "exclude_link_layers"}
    assert model_fabric["additionalProperties"] is False
    jsonschema.validate({"gpu_models": {"NVIDIA H200": {"fabric": bl.SCHEMA_BY_PATH["gpu_models.*.fabric"].example}}},
                        schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"gpu_models": {"NVIDIA H200": {"fabric": {"width": "3X"}}}}, schema)
