"""MIG layouts in the baseline: mig.layout, gpu_models.*.mig, an nvidia-mig-parted file through
mig.config_file + mig.config, their errors (file, line, did-you-mean), their layering, and
config.mig_layout judging a snapshot against them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetops import baseline, checks
from fleetops.catalog import migparted
from fleetops.model import MigInstance
from fleetops.sim import gpu as sim

PARTED = Path(__file__).resolve().parents[1] / "fixtures" / "mig" / "mig-parted.yaml"


def load(tmp_path: Path, text: str, name: str = "baseline.yaml") -> baseline.Baseline:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return baseline.load_file(str(path))


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(baseline.BaselineError) as exc:
        load(tmp_path, text)
    return str(exc.value)


def test_a_layout_at_the_top_and_per_model(tmp_path: Path) -> None:
    b = load(tmp_path, """\
        mig:
          mode: true
          layout: ["3g.71gb", "MIG 3G.71GB"]
        gpu_models:
          "NVIDIA H100 80GB HBM3":
            mig:
              layout: ["1g.10gb", "1g.10gb", "2g.20gb"]
          "NVIDIA H100 PCIe":
            mig:
              mode: false
        """)
    assert b.mig_want("NVIDIA H200", 0) == baseline.MigWant(True, ("3g.71gb", "3g.71gb"), "mig.layout")
    h100 = b.mig_want("NVIDIA H100 80GB HBM3", 3)
    assert h100 is not None and h100.layout == ("1g.10gb", "1g.10gb", "2g.20gb") and h100.mode is True
    assert h100.key == 'gpu_models["NVIDIA H100 80GB HBM3"].mig.layout'
    assert b.mig_want("NVIDIA H100 PCIe", 0) == baseline.MigWant(False, (), 'gpu_models["NVIDIA H100 PCIe"].mig.mode')
    assert baseline.load_file(str(tmp_path / "baseline.yaml")).mig.layout == ("3g.71gb", "3g.71gb")


def test_an_unknown_profile_names_the_file_line_and_the_close_one(tmp_path: Path) -> None:
    msg = error(tmp_path, """\
        mig:
          mode: true
          layout:
            - 3g.71gb
            - 3g.17gb
        """)
    assert msg.startswith(f"{tmp_path / 'baseline.yaml'}:3: mig.layout: unknown MIG profile '3g.17gb'")
    assert "did you mean '3g.71gb'" in msg


def test_a_models_layout_is_checked_against_that_models_table(tmp_path: Path) -> None:
    msg = error(tmp_path, """\
        gpu_models:
          "NVIDIA H100 80GB HBM3":
            mig:
              layout: ["3g.71gb"]
        """)
    assert ':4: gpu_models["NVIDIA H100 80GB HBM3"].mig.layout: unknown MIG profile \'3g.71gb\' for NVIDIA H100' in msg
    assert "did you mean '3g.40gb'" in msg
    # a model fleetops has no table for: its GPUs' own tables judge the names, on the node
    b = load(tmp_path, """\
        gpu_models:
          "NVIDIA A100-SXM4-80GB":
            mig:
              layout: ["3g.40gb"]
        """)
    assert b.mig_want("NVIDIA A100-SXM4-80GB", 0) is not None


@pytest.mark.parametrize(("text", "wanted"), [
    ("mig: {mode: false, layout: [3g.71gb]}", ":1: mig.layout: a layout needs MIG mode: mig.mode is false"),
    ("mig: {layout: [], mode: true}", ":1: mig.layout: expected at least one profile"),
    ("mig: {config_file: x.yaml}", "mig.config: mig.config_file and mig.config go together"),
    ("mig: {layout: [3g.71gb], config_file: x.yaml, config: a}", "mig.config_file: give the layout once"),
])
def test_the_rules_between_mig_keys(tmp_path: Path, text: str, wanted: str) -> None:
    assert wanted in error(tmp_path, text + "\n")


def test_a_mig_parted_file_relative_to_the_baseline_selects_per_gpu_index(tmp_path: Path) -> None:
    (tmp_path / "parted.yaml").write_text(PARTED.read_text())
    b = load(tmp_path, """\
        mig:
          config_file: parted.yaml
          config: mixed
        """)
    want0 = b.mig_want("NVIDIA H200", 0)
    assert want0 is not None and want0.layout == ("4g.71gb", "1g.18gb", "1g.18gb", "1g.18gb") and want0.mode
    assert want0.key == "mig.config mixed of parted.yaml"
    assert b.mig_want("NVIDIA H200", 2) == baseline.MigWant(False, (), "mig.config mixed of parted.yaml")
    assert b.mig_want("NVIDIA H200", 3) is None  # no entry covers GPU 3


def test_a_mig_parted_config_it_lacks_or_a_broken_file_is_an_error_at_the_key(tmp_path: Path) -> None:
    (tmp_path / "parted.yaml").write_text(PARTED.read_text())
    msg = error(tmp_path, "mig:\n  config_file: parted.yaml\n  config: mixd\n")
    assert ":3: mig.config:" in msg and "no config named 'mixd' (did you mean 'mixed'?)" in msg
    (tmp_path / "parted.yaml").write_text("version: v2\nmig-configs: {}\n")
    msg = error(tmp_path, "mig:\n  config_file: parted.yaml\n  config: mixed\n")
    assert ":2: mig.config_file:" in msg and "version: expected 'v1', got 'v2'" in msg


@pytest.mark.parametrize(("entry", "wanted"), [
    ({"devices": "some", "mig-enabled": True}, "mig-configs.c[0].devices: expected 'all' or a list"),
    ({"devices": "all", "mig-enabled": "yes"}, "mig-configs.c[0].mig-enabled: expected true or false"),
    ({"devices": "all", "mig-enabled": True, "mig-devices": {"3g": 2}}, "'3g' is not a MIG profile name"),
    ({"devices": "all", "mig-enabled": True, "mig-devices": {"3g.71gb": -1}}, "mig-devices.3g.71gb: expected a count"),
    ({"devices": "all", "mig-enabled": False, "mig-devices": {"3g.71gb": 1}}, "given with mig-enabled: false"),
    ({"devices": "all", "mig-enabled": True, "colour": 1}, "unknown key 'colour'"),
])
def test_mig_parted_entries_are_validated_naming_the_entry(entry: dict[str, object], wanted: str) -> None:
    with pytest.raises(migparted.MigPartedError, match="^f.yaml: ") as exc:
        migparted.parse({"version": "v1", "mig-configs": {"c": [entry]}}, "f.yaml")
    assert wanted in str(exc.value)


def test_a_device_filter_narrows_an_entry_to_the_gpus_of_that_pci_device_id() -> None:
    cfg = migparted.parse({"version": "v1", "mig-configs": {"c": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
        {"devices": "all", "device-filter": "0x233510DE", "mig-enabled": True, "mig-devices": {"3g.71gb": 2}},
    ]}}, "f.yaml")
    entries = cfg.select("c")
    assert migparted.want_for(entries, 0, "0x233510de") == (True, ["3g.71gb", "3g.71gb"])
    assert migparted.want_for(entries, 0, "0x233010DE") == (True, ["1g.18gb"] * 7)
    assert migparted.want_for(entries, 0, None) == (True, ["1g.18gb"] * 7)


def test_a_group_layout_layers_under_a_models_own(tmp_path: Path) -> None:
    b = baseline.layer([
        ("all", "all.yml", {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}}),
        ("group inference", "inference.yml",
         {"gpu_models": {"NVIDIA H200": {"mig": {"layout": ["1g.18gb"] * 7}}}}),
    ])
    want = b.mig_want("NVIDIA H200", 0)
    assert want is not None and want.layout == ("1g.18gb",) * 7
    assert b.level_of('gpu_models["NVIDIA H200"].mig.layout') == "group inference"
    assert b.mig_want("NVIDIA H100 80GB HBM3", 0) == baseline.MigWant(True, ("3g.71gb", "3g.71gb"), "mig.layout")


# --- config.mig_layout on snapshots ----------------------------------------------------------


def _node(profiles_by_gpu: dict[int, list[str] | None]) -> object:
    from tests.unit.conftest import node_from_state

    state = sim.build_state("n34", {"gpu_count": 3})
    node = node_from_state(state)
    for gpu in node.gpus:
        got = profiles_by_gpu.get(gpu.index)
        if got is not None:
            gpu.mig_mode_current = gpu.mig_mode_pending = True
            gpu.mig_instances = [MigInstance(gpu_instance_id=i + 1, compute_instance_id=0, profile=p)
                                 for i, p in enumerate(got)]
    return node


def _layout_findings(node: object, data: dict[str, object]) -> list[object]:
    b = baseline.from_mapping(data, "b.yaml")
    return [f for f in checks.run_node_checks(node, b) if f.check == "config.mig_layout"]  # type: ignore[arg-type]


def test_instances_that_differ_from_the_layout_are_a_finding_per_gpu() -> None:
    node = _node({0: ["3g.71gb", "3g.71gb"], 1: ["3g.71gb", "2g.35gb", "1g.18gb"], 2: ["3g.71gb", "3g.71gb"]})
    found = _layout_findings(node, {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}})
    assert [f.gpu["index"] for f in found] == [1]  # type: ignore[attr-defined]
    assert found[0].severity == "warn"  # type: ignore[attr-defined]
    assert "missing 3g.71gb; extra 1g.18gb, 2g.35gb" in found[0].message  # type: ignore[attr-defined]
    assert found[0].action.startswith("Apply the MIG layout on n34")  # type: ignore[attr-defined]


def test_a_mode_the_layout_alone_asks_for_is_reported_once() -> None:
    node = _node({0: ["3g.71gb", "3g.71gb"]})
    data = {"gpu_models": {"NVIDIA H200": {"mig": {"layout": ["3g.71gb", "3g.71gb"]}}}}
    found = _layout_findings(node, data)
    assert [f.gpu["index"] for f in found] == [1, 2]  # type: ignore[attr-defined]
    assert "MIG is disabled; gpu_models[\"NVIDIA H200\"].mig.layout wants it enabled" in found[0].message  # type: ignore[attr-defined]
    # where mig.mode says the same, config.mig_mode has the finding and this check adds none
    b = baseline.from_mapping({"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}}, "b.yaml")
    all_found = checks.run_node_checks(node, b)  # type: ignore[arg-type]
    assert sorted(f.gpu["index"] for f in all_found if f.check == "config.mig_mode") == [1, 2]  # type: ignore[index]
    assert [f for f in all_found if f.check == "config.mig_layout"] == []


def test_unlistable_instances_are_unknown_not_drift() -> None:
    node = _node({0: ["3g.71gb"]})
    gpu = node.gpus[0]  # type: ignore[attr-defined]
    gpu.mig_instances = None
    gpu.unavailable["mig_instances"] = "NoPermission"
    b = baseline.from_mapping({"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}}, "b.yaml")
    found = checks.run_node_checks(node, b)  # type: ignore[arg-type]
    assert [f for f in found if f.check == "config.mig_layout"] == []
    (unread,) = [f for f in found if f.check == "config.unreadable"]
    assert unread.severity == "unknown" and unread.observed == {"mig_instances": {"NoPermission": ["GPU 0"]}}


def test_a_group_layout_a_model_has_no_profiles_for_says_so_instead_of_drift() -> None:
    node = _node({0: ["3g.71gb", "3g.71gb"]})
    node.gpus[0].name = "NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    found = _layout_findings(node, {"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}})
    assert [f.gpu["index"] for f in found] == [0]  # type: ignore[attr-defined]
    assert "unknown MIG profile '3g.71gb' for NVIDIA H100 80GB HBM3 (did you mean '3g.40gb'?)" in found[0].message  # type: ignore[attr-defined]
    assert found[0].action == "Give NVIDIA H100 80GB HBM3 a layout of its own profiles (gpu_models.*.mig.layout)."  # type: ignore[attr-defined]


def test_a_profile_the_model_lacks_is_named_also_on_a_gpu_whose_mig_is_still_off() -> None:
    # GPU 0 has MIG on, 1 and 2 off: all three are told the profile does not exist, none is told
    # to apply a layout that no apply can make (the runbook's first step is MIG off -> layout)
    node = _node({0: ["3g.71gb", "3g.71gb"]})
    for gpu in node.gpus:  # type: ignore[attr-defined]
        gpu.name = "NVIDIA H100 80GB HBM3"
    for data in ({"mig": {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}},
                 {"mig": {"layout": ["3g.71gb", "3g.71gb"]}}):
        found = _layout_findings(node, data)
        assert [f.gpu["index"] for f in found] == [0, 1, 2], data  # type: ignore[attr-defined]
        for f in found:
            assert "unknown MIG profile '3g.71gb' for NVIDIA H100 80GB HBM3 (did you mean '3g.40gb'?)" in f.message  # type: ignore[attr-defined]
            assert not f.action.startswith("Apply the MIG layout")  # type: ignore[attr-defined]
