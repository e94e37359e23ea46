"""Baseline loading, validation errors (file, key path, line), defaults, merging, and the
SCHEMA that drives both the validator and the docs."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from fleetops import baseline
from fleetops.baseline import SCHEMA, Baseline, BaselineError, Thresholds, from_mapping, load_file, merge

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "baseline.yml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return str(path)


def _error(tmp_path: Path, text: str, name: str = "baseline.yml") -> BaselineError:
    path = _write(tmp_path, text, name)
    with pytest.raises(BaselineError) as info:
        load_file(path)
    assert info.value.source == path
    return info.value


# --- loading ---------------------------------------------------------------------------


def test_standalone_file_loads_every_kind_of_key(tmp_path):
    b = load_file(_write(tmp_path, """
        driver_version: "580.159.04"
        cuda_driver_version: "13.0"
        gpu_models:
          NVIDIA H200: {vbios_version: "96.00.A5.00.1A", inforom_image: "G520.0282.02.02", power_limit_w: 700}
        power_limit_w: 650.5
        persistence_mode: true
        mig: {mode: true, profile: 1g.18gb}
        gpu_count: 8
        pcie: {gen: 5, width: 16}
        nvlinks_per_gpu: 18
        expected_topology: NV18
        stray_process_allowlist: [nv-hostengine, "dcgm*"]
        services: [nvidia-persistenced]
        thresholds: {pcie_replays_per_min: 40, xid_storm_count: 3}
    """))
    assert b.driver_version == "580.159.04" and b.cuda_driver_version == "13.0"
    assert b.gpu_models["NVIDIA H200"].power_limit_w == 700.0
    assert b.power_limit_for("NVIDIA H200") == 700.0 and b.power_limit_for("NVIDIA H100") == 650.5
    assert b.mig.mode is True and b.mig.profile == "1g.18gb"
    assert b.pcie.gen == 5 and b.stray_process_allowlist == ("nv-hostengine", "dcgm*")
    assert b.services == ("nvidia-persistenced",)
    assert b.thresholds.pcie_replays_per_min == 40.0 and b.thresholds.xid_storm_count == 3
    assert b.thresholds.xid_window_hours == Thresholds().xid_window_hours
    assert b.expected_fabric_manager() == "580.159.04"


def test_group_vars_file_uses_only_the_fleetops_baseline_key(tmp_path):
    b = load_file(_write(tmp_path, """
        ansible_user: admin
        slurm_partition: gpu
        fleetops_baseline:
          driver_version: "580.159.04"
    """, "h200.yml"))
    assert b.driver_version == "580.159.04"


def test_empty_file_is_a_baseline_that_pins_nothing(tmp_path):
    b = load_file(_write(tmp_path, "# nothing\n"))
    assert b.driver_version is None and b.thresholds == Thresholds()


def test_the_example_baseline_in_the_repo_loads():
    b = load_file(str(REPO / "examples" / "baseline.yml"))
    assert b.nvlinks_per_gpu == 18 and "nvidia-fabricmanager" in b.services


def test_thresholds_default_when_absent():
    b = from_mapping({"driver_version": "580.159.04"}, "t")
    assert b.thresholds == baseline.DEFAULT_THRESHOLDS
    assert b.thresholds.pcie_replays_per_min == 31 and b.thresholds.ecc_dbe_volatile_crit == 1


# --- errors name file, key path and line -------------------------------------------------


def test_unknown_top_level_key_names_file_path_line_and_suggests(tmp_path):
    err = _error(tmp_path, """
        driver_version: "580.159.04"
        persistance_mode: true
    """)
    assert (err.path, err.line) == ("persistance_mode", 2)
    assert "did you mean 'persistence_mode'" in str(err)
    assert str(err).startswith(f"{err.source}:2: persistance_mode: unknown key")


def test_wrong_type_for_a_threshold_names_the_dotted_path_and_line(tmp_path):
    err = _error(tmp_path, """
        driver_version: "580.159.04"
        thresholds:
          xid_window_hours: 24
          pcie_replays_per_min: lots
    """)
    assert (err.path, err.line) == ("thresholds.pcie_replays_per_min", 4)
    assert "expected a number, got string 'lots'" in str(err)


def test_unknown_threshold_is_rejected_with_its_path(tmp_path):
    err = _error(tmp_path, """
        thresholds:
          pcie_replay_per_min: 20
    """)
    assert (err.path, err.line) == ("thresholds.pcie_replay_per_min", 2)
    assert "did you mean 'pcie_replays_per_min'" in str(err)


def test_unquoted_version_number_is_rejected_with_a_hint(tmp_path):
    err = _error(tmp_path, """
        cuda_driver_version: 13.0
    """)
    assert (err.path, err.line) == ("cuda_driver_version", 1)
    assert 'quote it ("13.0")' in str(err)


def test_gpu_model_keys_are_free_but_their_fields_are_checked(tmp_path):
    err = _error(tmp_path, """
        gpu_models:
          NVIDIA H200:
            vbios_version: "96.00.A5.00.1A"
            power_limit_w: "700 W"
    """)
    assert (err.path, err.line) == ('gpu_models["NVIDIA H200"].power_limit_w', 4)


@pytest.mark.parametrize("text,path,line,words", [
    ("persistence_mode: yes please\n", "persistence_mode", 1, "expected true or false"),
    ("gpu_count: true\n", "gpu_count", 1, "expected an integer, got boolean true"),
    ("gpu_count: 0\n", "gpu_count", 1, "must be between 1 and 16, got 0"),
    ("pcie:\n  gen: 7\n", "pcie.gen", 2, "must be one of"),
    ("pcie: 5\n", "pcie", 1, "expected a mapping"),
    ("expected_topology: NVLINK\n", "expected_topology", 1, "does not match"),
    ("compute_mode: Exclusive\n", "compute_mode", 1, "must be one of"),
    ("stray_process_allowlist: dcgm\n", "stray_process_allowlist", 1, "expected a list of strings"),
    ("services:\n  - nvidia-persistenced\n  - 3\n", "services[1]", 1, "non-empty string"),
    ("thresholds:\n  xid_window_hours: -1\n", "thresholds.xid_window_hours", 2, "must be above 0 h"),
    ("thresholds:\n  xid_storm_count: 2.5\n", "thresholds.xid_storm_count", 2, "expected an integer"),
    ("thresholds:\n  xid_window_hours:\n", "thresholds.xid_window_hours", 2, "cannot be unset"),
    ("thresholds:\n\n  ecc_sbe_volatile_crit: 5\n", "thresholds.ecc_sbe_volatile_crit", 3, "must not exceed"),
    ("mig:\n  mode: false\n  mode: true\n", "mig.mode", 3, "duplicate key (first at line 2)"),
    ("driver_version: [580\n", "", 2, "not valid YAML"),
    ("- driver_version\n", "", 1, "a baseline is a mapping"),
])
def test_validation_errors_name_key_path_and_line(tmp_path, text, path, line, words):
    err = _error(tmp_path, text)
    assert err.path == path and err.line == line and words in str(err), str(err)


def test_group_vars_errors_give_the_path_inside_the_baseline_and_the_file_line(tmp_path):
    err = _error(tmp_path, """
        ansible_user: admin
        fleetops_baseline:
          mig:
            mode: on
            profil: 1g.18gb
    """)
    assert (err.path, err.line) == ("mig.profil", 5)


def test_jinja_template_in_a_typed_key_gets_a_hint():
    with pytest.raises(BaselineError, match="templates are not rendered"):
        from_mapping({"gpu_count": "{{ n }}"}, "group_vars/all.yml")


def test_from_mapping_takes_lines_from_read_yaml_data(tmp_path):
    # ansible-loaded values carry their lines only in ansible-core's private data tags: the
    # inventory re-reads group_vars/host_vars with read_yaml (PyYAML's start marks) instead
    path = _write(tmp_path, """
        fleetops_baseline:
          gpu_count: 8
          thresholds:
            temp_memory_warn_c: warm
    """, "all.yml")
    data = baseline.read_yaml(Path(path).read_text(), path)
    with pytest.raises(BaselineError) as info:
        from_mapping(data["fleetops_baseline"], source=path)
    assert (info.value.source, info.value.path, info.value.line) == (path, "thresholds.temp_memory_warn_c", 4)


def test_missing_file_is_a_baseline_error(tmp_path):
    with pytest.raises(BaselineError, match="cannot read"):
        load_file(str(tmp_path / "nope.yml"))


# --- merge ---------------------------------------------------------------------------------


def test_merge_layers_child_over_parent_key_by_key():
    parent = from_mapping({
        "driver_version": "570.133.20", "gpu_count": 8,
        "gpu_models": {"NVIDIA H200": {"vbios_version": "96.00.A5.00.1A", "power_limit_w": 700}},
        "thresholds": {"xid_window_hours": 12, "xid_storm_count": 5},
        "stray_process_allowlist": ["a", "b"],
    }, "group_vars/all.yml")
    child = from_mapping({
        "driver_version": "580.159.04",
        "gpu_models": {"NVIDIA H200": {"power_limit_w": 600}},
        "thresholds": {"xid_storm_count": 20},
        "stray_process_allowlist": ["c"],
    }, "group_vars/h200.yml")
    m = merge(parent, child)
    assert m.driver_version == "580.159.04" and m.gpu_count == 8
    assert m.gpu_models["NVIDIA H200"] == baseline.GpuModelBaseline(vbios_version="96.00.A5.00.1A", power_limit_w=600.0)
    assert (m.thresholds.xid_window_hours, m.thresholds.xid_storm_count) == (12.0, 20)
    assert m.stray_process_allowlist == ("c",)
    assert m.source == "group_vars/all.yml + group_vars/h200.yml"


def test_merge_null_in_child_unsets_and_defaults_never_override():
    parent = from_mapping({"gpu_count": 8, "persistence_mode": True, "thresholds": {"xid_storm_count": 5}}, "all")
    child = from_mapping({"gpu_count": None}, "small")
    m = merge(parent, child)
    assert m.gpu_count is None and m.persistence_mode is True and m.thresholds.xid_storm_count == 5


def test_merge_recomputes_default_services_from_the_merged_nvlinks():
    m = merge(from_mapping({}, "all"), from_mapping({"nvlinks_per_gpu": 18}, "hgx"))
    assert m.services == ("nvidia-persistenced", "nvidia-fabricmanager")


def test_merge_checks_warn_below_crit_across_layers():
    parent = from_mapping({"thresholds": {"ecc_sbe_volatile_crit": 20000}}, "all.yml")
    child = from_mapping({"thresholds": {"ecc_sbe_volatile_warn": 30000}}, "h200.yml")
    with pytest.raises(BaselineError) as info:
        merge(parent, child)
    assert info.value.source == "h200.yml" and info.value.path == "thresholds.ecc_sbe_volatile_warn"


# --- SCHEMA drives the validator and the docs ------------------------------------------


def _nest(path: str, value):
    parts = path.replace("*", "31" if path.startswith("xid_policy") else "NVIDIA H200").split(".")
    out = value
    for part in reversed(parts):
        out = {part: out}
    return out


def test_schema_describes_every_key_with_type_default_description_example():
    for key in SCHEMA:
        assert key.path and key.type and key.description and key.example is not None, key.path
    dicts = baseline.schema_dicts()
    assert {"path", "name", "type", "default", "description", "example"} <= set(dicts[0])
    assert [d["path"] for d in dicts] == [k.path for k in SCHEMA]


MIG_PARTED = Path(__file__).resolve().parents[1] / "fixtures" / "mig" / "mig-parted.yaml"


@pytest.mark.parametrize("key", SCHEMA, ids=lambda k: k.path)
def test_every_schema_example_validates_at_its_own_path(key):
    given = _nest(key.path, key.example)
    if key.path.startswith("xid_policy.*.escalate."):  # an escalate needs count and within_s together
        leaf = key.path.rsplit(".", 1)[1]
        given = _nest("xid_policy.*.escalate", {"count": 3, "within_s": 600, leaf: key.example})
    if key.path in ("mig.config_file", "mig.config"):  # the file and the config in it go together
        given = {"mig": {"config_file": str(MIG_PARTED), "config": "all-3g.71gb"}}
    kept = given
    if key.path.startswith("xid_policy"):  # XID codes are kept as text keys, as YAML may quote them
        import json

        kept = json.loads(json.dumps(given))
    assert from_mapping(given, f"example of {key.path}").raw == kept  # kept, at that path


def test_schema_top_level_keys_are_the_baseline_fields():
    top = {k.path for k in SCHEMA if "." not in k.path}
    fields = {f.name for f in dataclasses.fields(Baseline)} - {"source", "raw", "origins", "levels"}
    assert top == fields


def test_schema_thresholds_are_the_thresholds_fields_with_the_same_defaults():
    in_schema = {k.name: k.default for k in SCHEMA if k.parent == "thresholds"}
    assert in_schema == {f.name: f.default for f in dataclasses.fields(Thresholds)}


def test_a_key_missing_from_schema_is_rejected_by_the_validator():
    # the validator knows only SCHEMA's keys: a Baseline attribute that is not a key is refused
    with pytest.raises(BaselineError, match="unknown key"):
        from_mapping({"source": "x"}, "t")
    with pytest.raises(BaselineError, match="unknown key"):
        from_mapping({"thresholds": {"raw": 1}}, "t")


def test_baseline_survives_pickle_and_deepcopy():
    import copy
    import pickle

    b = load_file(str(REPO / "examples" / "baseline.yml"))
    assert pickle.loads(pickle.dumps(b)) == b
    assert copy.deepcopy(b) == b


def test_a_json_baseline_loads_without_pyyaml_and_a_bad_one_names_file_and_line(tmp_path, monkeypatch):
    """The node agent's environment has no PyYAML: the daemon's JSON baseline must still load."""
    import builtins
    import sys as _sys

    real_import = builtins.__import__

    def no_yaml(name, *args, **kwargs):
        if name == "yaml" or name.startswith("yaml."):
            raise ModuleNotFoundError("No module named 'yaml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(_sys.modules, "yaml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_yaml)
    good = tmp_path / "baseline.yml"
    good.write_text('{\n  "fleetops_baseline": {\n    "power_limit_w": 600\n  }\n}\n')
    assert baseline.load_file(str(good)).power_limit_w == 600.0
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "power_limit_w": 600,\n  oops\n}\n')
    with pytest.raises(baseline.BaselineError) as err:
        baseline.load_file(str(bad))
    assert str(bad) in str(err.value) and ":3" in str(err.value)
    typo = tmp_path / "typo.json"
    typo.write_text('{"power_limt_w": 600}')
    with pytest.raises(baseline.BaselineError, match="power_limit_w"):
        baseline.load_file(str(typo))
    plain = tmp_path / "plain.yml"
    plain.write_text("power_limit_w: 600\n")
    with pytest.raises(baseline.BaselineError, match="PyYAML is not installed"):
        baseline.load_file(str(plain))
