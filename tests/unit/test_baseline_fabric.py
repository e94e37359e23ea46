"""The baseline's ``fabric`` key: loaded, refused at FILE:LINE when wrong, layered key by key like
every other mapping, and described in the JSON Schema."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import pytest

from fleetops import baseline as bl


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
