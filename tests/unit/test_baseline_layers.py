"""Baselines layer across an inventory's groups, parent to child, key by key; ``fleetops baseline
show`` explains the result; ``fleetops baseline schema`` exports the definition as JSON Schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from fleetops import baseline as bl
from fleetops.fleet import inventory
from fleetops.ops.baseline import explain, resolve_baselines

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


@pytest.fixture
def two_level(tmp_path: Path) -> Path:
    """all -> gpu -> h200 (two levels of groups under all), one host with host_vars."""
    _write(tmp_path / "hosts.yml", """
        all:
          children:
            gpu:
              children:
                h200:
                  hosts:
                    n1: {ansible_host: 127.65.20.1}
                    n2: {ansible_host: 127.65.20.2}
              hosts:
                n3: {ansible_host: 127.65.20.3}
    """)
    _write(tmp_path / "group_vars" / "all.yml", """
        fleetops_baseline:
          ecc_mode: true
    """)
    _write(tmp_path / "group_vars" / "gpu.yml", """
        other_var: 1
        fleetops_baseline:
          driver_version: "580.159.04"
          persistence_mode: true
          stray_process_allowlist: [dcgm*, nvidia-cuda-mps-server]
          mig:
            mode: false
          thresholds:
            pcie_replays_per_min: 20
            xid_window_hours: 12
    """)
    _write(tmp_path / "group_vars" / "h200.yml", """
        fleetops_baseline:
          power_limit_w: 650
          stray_process_allowlist: [dcgm*]
          mig: {profile: 1g.18gb}
          thresholds:
            pcie_replays_per_min: 40
    """)
    _write(tmp_path / "host_vars" / "n2.yml", """
        fleetops_baseline:
          persistence_mode: null
    """)
    return tmp_path / "hosts.yml"


def _by_host(inv: Path) -> dict[str, bl.Baseline]:
    hosts = inventory.load(str(inv))
    return resolve_baselines(hosts, None, str(inv))


def test_child_keys_win_mappings_merge_lists_replace(two_level: Path) -> None:
    b = _by_host(two_level)["n1"]
    assert b.ecc_mode is True and b.driver_version == "580.159.04" and b.persistence_mode is True
    assert b.power_limit_w == 650
    assert b.stray_process_allowlist == ("dcgm*",)  # the child's list replaces the parent's
    assert (b.mig.mode, b.mig.profile) == (False, "1g.18gb")  # merged key by key
    assert b.thresholds.pcie_replays_per_min == 40 and b.thresholds.xid_window_hours == 12
    assert b.thresholds.nvlink_crc_per_min_warn == 100  # untouched: the default


def test_a_host_outside_the_child_group_gets_the_parent_and_a_host_null_unsets(two_level: Path) -> None:
    got = _by_host(two_level)
    assert got["n3"].power_limit_w is None and got["n3"].thresholds.pcie_replays_per_min == 20
    assert got["n3"].stray_process_allowlist == ("dcgm*", "nvidia-cuda-mps-server")
    assert got["n2"].persistence_mode is None and got["n2"].power_limit_w == 650
    assert got["n1"] is not got["n2"]  # different layers: different baselines


def test_the_layers_are_parent_to_child_with_their_files(two_level: Path) -> None:
    [n1] = [h for h in inventory.load(str(two_level)) if h.name == "n1"]
    assert [(la.level, Path(la.source).name) for la in n1.baseline_layers] == [
        ("group all", "all.yml"), ("group gpu", "gpu.yml"), ("group h200", "h200.yml")]
    # what Ansible itself hands the roles: the child's mapping alone
    assert "driver_version" not in n1.vars["fleetops_baseline"]


def test_explain_names_the_level_file_and_line_of_every_key(two_level: Path) -> None:
    [n1] = [h for h in inventory.load(str(two_level)) if h.name == "n1"]
    keys = {k["path"]: k for k in explain(n1, str(two_level))["keys"]}
    assert (keys["driver_version"]["level"], Path(keys["driver_version"]["source"]).name,
            keys["driver_version"]["line"]) == ("group gpu", "gpu.yml", 3)
    assert (keys["thresholds.pcie_replays_per_min"]["level"], keys["thresholds.pcie_replays_per_min"]["line"],
            keys["thresholds.pcie_replays_per_min"]["value"]) == ("group h200", 6, 40)
    assert keys["thresholds.xid_window_hours"]["level"] == "group gpu"
    assert keys["mig.profile"]["level"] == "group h200" and keys["mig.mode"]["level"] == "group gpu"
    assert keys["ecc_mode"]["level"] == "group all"
    assert sorted(keys) == sorted([
        "ecc_mode", "driver_version", "persistence_mode", "stray_process_allowlist", "mig.mode",
        "mig.profile", "thresholds.pcie_replays_per_min", "thresholds.xid_window_hours", "power_limit_w"])


def test_a_bad_key_in_a_child_group_names_its_file_line_and_a_close_match(two_level: Path) -> None:
    _write(two_level.parent / "group_vars" / "h200.yml", """
        fleetops_baseline:
          power_limit_w: 650
          thresholds:
            pcie_replay_per_min: 40
    """)
    with pytest.raises(bl.BaselineError) as err:
        _by_host(two_level)
    msg = str(err.value)
    assert re.search(r"group_vars/h200\.yml:4: thresholds\.pcie_replay_per_min: unknown key", msg), msg
    assert "did you mean 'pcie_replays_per_min'?" in msg


def test_warn_above_crit_across_levels_blames_the_child(two_level: Path) -> None:
    _write(two_level.parent / "group_vars" / "gpu.yml", """
        fleetops_baseline:
          thresholds: {nvlink_crc_per_min_crit: 500}
    """)
    _write(two_level.parent / "group_vars" / "h200.yml", """
        fleetops_baseline:
          thresholds:
            nvlink_crc_per_min_warn: 600
    """)
    with pytest.raises(bl.BaselineError, match=r"h200\.yml:3: thresholds\.nvlink_crc_per_min_warn"):
        _by_host(two_level)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=60)


def test_baseline_show_text_explains_key_by_key(two_level: Path) -> None:
    proc = _cli("baseline", "show", "-i", str(two_level), "n1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "n1: effective baseline, layered from group all < group gpu < group h200"
    row = next(line for line in lines if line.split()[0] == "thresholds.pcie_replays_per_min")
    assert row.split()[1:3] == ["40.0", "group"] and "h200" in row and "group_vars/h200.yml:6)" in row
    row = next(line for line in lines if line.split()[0] == "driver_version")
    assert '"580.159.04"' in row and "group gpu" in row and "group_vars/gpu.yml:3)" in row


def test_baseline_show_json_and_errors(two_level: Path) -> None:
    proc = _cli("baseline", "show", "-i", str(two_level), "n2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    keys = {k["path"]: k for k in doc["keys"]}
    assert keys["persistence_mode"]["value"] is None and keys["persistence_mode"]["level"] == "host n2"
    assert doc["baseline"]["power_limit_w"] == 650
    assert [la["level"] for la in doc["layers"]] == ["group all", "group gpu", "group h200", "host n2"]
    proc = _cli("baseline", "show", "-i", str(two_level), "n11")
    assert proc.returncode == 4 and "no host 'n11'" in proc.stderr and "did you mean 'n1'?" in proc.stderr


def test_baseline_show_without_any_baseline_says_nothing_is_pinned(tmp_path: Path) -> None:
    _write(tmp_path / "hosts.ini", "[gpu]\nn1 ansible_host=127.65.20.1\n")
    proc = _cli("baseline", "show", "-i", str(tmp_path / "hosts.ini"), "n1", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["keys"] == []


# --- JSON Schema --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    proc = _cli("baseline", "schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _doc_baselines() -> list[tuple[str, object]]:
    """Every baseline shown in examples/, the example inventory and the docs' YAML blocks."""
    found: list[tuple[str, object]] = []
    for path in [*sorted((REPO / "examples").glob("*baseline*.yml")),
                 *sorted((REPO / "inventory").rglob("group_vars/*.yml"))]:
        data = yaml.safe_load(path.read_text())
        found.append((str(path.relative_to(REPO)), data.get(bl.WRAPPER_KEY, data)))
    for path in sorted((REPO / "docs").rglob("*.md")):
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.DOTALL):
            if f"{bl.WRAPPER_KEY}:" in block:
                data = yaml.safe_load(block)
                if isinstance(data, dict) and isinstance(data.get(bl.WRAPPER_KEY), dict):
                    found.append((str(path.relative_to(REPO)), data[bl.WRAPPER_KEY]))
    return found


def test_every_example_baseline_validates_against_the_schema(validator: jsonschema.protocols.Validator) -> None:
    found = _doc_baselines()
    sources = {s for s, _ in found}
    assert "examples/baseline.yml" in sources and any(s.startswith("docs/") for s in sources)
    for source, data in found:
        errors = [e.message for e in validator.iter_errors(data)]
        assert errors == [], source
        bl.from_mapping(data, source)  # and the validator agrees


@pytest.mark.parametrize("key", bl.SCHEMA, ids=lambda k: k.path)
def test_every_schema_example_validates_at_its_path(validator: jsonschema.protocols.Validator,
                                                    key: bl.SchemaKey) -> None:
    given: object = key.example
    free_key = "31" if key.path.startswith("xid_policy") else "NVIDIA H200"  # an XID code, a GPU model
    for part in reversed(key.path.replace("*", free_key).split(".")):
        given = {part: given}
    given = json.loads(json.dumps(given))  # as an editor sees the YAML: keys are text
    assert list(validator.iter_errors(given)) == []


@pytest.mark.parametrize("bad", [
    {"drivr_version": "580.159.04"},
    {"driver_version": 580},
    {"compute_mode": "Exclusive"},
    {"thresholds": {"pcie_replays_per_min": -1}},
    {"thresholds": None},
    {"gpu_models": {"NVIDIA H200": {"power_limt_w": 700}}},
    {"expected_topology": "NV"},
    {"services": ["", "x"]},
    {"xid_policy": {"abc": {"severity": "crit"}}},
    {"xid_policy": {"31": {"severity": "fatal"}}},
    {"packages": {"nvidia-open": 580}},
    {"packages": ["nvidia-open"]},
])
def test_the_schema_rejects_what_the_validator_rejects(validator: jsonschema.protocols.Validator,
                                                       bad: dict[str, object]) -> None:
    assert list(validator.iter_errors(bad)) != []
    with pytest.raises(bl.BaselineError):
        bl.from_mapping(bad, "bad")


def test_schema_output_file(tmp_path: Path) -> None:
    out = tmp_path / "baseline.schema.json"
    proc = _cli("baseline", "schema", "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == ""
    assert json.loads(out.read_text()) == bl.json_schema()


def test_show_says_which_keys_playbooks_do_not_see_layered(two_level: Path) -> None:
    hosts = {h.name: h for h in inventory.load(str(two_level))}
    assert explain(hosts["n1"], str(two_level))["ansible_differs"] == [
        "driver_version", "ecc_mode", "mig.mode", "persistence_mode", "thresholds.xid_window_hours"]
    assert explain(hosts["n3"], str(two_level))["ansible_differs"] == ["ecc_mode"]
    proc = _cli("baseline", "show", "-i", str(two_level), "n3")
    note = proc.stdout.splitlines()[-1]
    assert "with other values for ecc_mode;" in note and "fleetops baseline vars -i INVENTORY -o FILE" in note


def test_the_runbook_example_output_is_what_show_prints(tmp_path: Path) -> None:
    page = (REPO / "docs" / "runbooks" / "baseline-layers.md").read_text()
    # each block as an operator copies it, its first line the comment naming the file (which the
    # quoted line numbers count)
    files = re.findall(r"```yaml\n(# group_vars/(\w+\.yml)\n.*?)```", page, re.DOTALL)
    assert [name for _, name in files] == ["gpu.yml", "h200.yml"]
    for body, name in files:
        _write(tmp_path / "group_vars" / name, body)
    _write(tmp_path / "inventory.ini", "[h200]\nnode001 ansible_host=127.65.20.1\n\n[gpu:children]\nh200\n")
    proc = subprocess.run([*CLI, "baseline", "show", "-i", "inventory.ini", "node001"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=60)
    shown = re.search(r"```text\n(.*?)```", page, re.DOTALL)
    assert shown is not None and proc.returncode == 0, proc.stderr
    assert proc.stdout == shown.group(1)
