"""Pinned packages: the baseline's ``packages`` key, judged by ``versions.packages`` on the node
(the one rule the audit, the daemon and the Ansible modules share), with one version match rule."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jsonschema
import pytest

from fleetops import baseline as bl
from fleetops.checks import REGISTRY, run_node_checks
from fleetops.checks.versions import package_version_matches

DRIVER = "nvidia-driver-580-server"
FM = "nvidia-fabricmanager-580"


@pytest.mark.parametrize(("installed", "pinned", "matches"), [
    ("580.159.04", "580.159.04", True),  # the same text
    ("580.159.04-0ubuntu1", "580.159.04", True),  # Debian/Ubuntu revision
    ("580.159.04-1", "580.159.04", True),  # NVIDIA's repository
    ("580.159.04~rc1", "580.159.04", True),  # a tilde revision
    ("580.159.04+really1", "580.159.04", True),  # a plus revision
    ("580.159.04-0ubuntu1", "580.159.04-0ubuntu1", True),  # the whole package version
    ("580.159.041", "580.159.04", False),  # another version, not a revision
    ("580.159.04.1", "580.159.04", False),  # a dot is no revision separator
    ("580.159.04-0ubuntu1", "580.159", False),  # a pin is a whole upstream version, not a prefix
    ("580.159.04-0ubuntu1", "580", False),
    ("580.159.04-0ubuntu1", "580.159.04-0ubuntu2", False),
    ("3:580.159.04-1.el9", "580.159.04", False),  # the epoch is part of the version
    ("3:580.159.04-1.el9", "3:580.159.04", True),  # an epoch pin
    ("3:580.159.04-1.el9", "3", True),  # the epoch alone: ':' follows it
    ("580.159", "580.159.04", False),  # the pin is longer than what is installed
    ("570.133.20-0ubuntu1", "580.159.04", False),
])
def test_package_version_match_rule(installed: str, pinned: str, matches: bool) -> None:
    assert package_version_matches(installed, pinned) is matches


def _pins(**pins: str | None) -> bl.Baseline:
    return bl.from_mapping({"packages": {k.replace("_", "-"): v for k, v in pins.items()}}, "pins")


def _pkg_findings(node, b):
    return [f for f in run_node_checks(node, b, None) if f.check in ("versions.packages", "versions.unreadable")]


def test_the_simulators_packages_at_their_pins_give_nothing(sim_node) -> None:
    node = sim_node("n1")  # nvidia-driver-580-server 580.159.04-0ubuntu1, nvidia-fabricmanager-580 580.159.04-1
    b = bl.from_mapping({"packages": {DRIVER: "580.159.04", FM: "580.159.04-1"}}, "pins")
    assert _pkg_findings(node, b) == []


def test_each_package_off_its_pin_is_a_warning_of_its_own(sim_node) -> None:
    node = sim_node("n1")
    b = bl.from_mapping({"packages": {FM: "580.159.04", DRIVER: "580.159", "nvidia-open": "580.159.04"}}, "pins")
    found = _pkg_findings(node, b)
    assert [(f.check, f.severity, f.gpu) for f in found] == [("versions.packages", "warn", None)] * 2
    by_name = {next(iter(f.expected)): f for f in found}
    assert set(by_name) == {DRIVER, "nvidia-open"}
    drv, missing = by_name[DRIVER], by_name["nvidia-open"]
    assert drv.message == f"package {DRIVER} is 580.159.04-0ubuntu1, expected 580.159"
    assert (drv.observed, drv.expected) == ({DRIVER: "580.159.04-0ubuntu1"}, {DRIVER: "580.159"})
    assert drv.action == f"Install {DRIVER} 580.159 and hold it: fleetops rollout driver."
    assert missing.message == "package nvidia-open is not installed, expected 580.159.04"
    assert missing.observed == {"nvidia-open": None}


def test_a_node_with_no_nvidia_package_has_none_of_the_pins(sim_node) -> None:
    node = sim_node("n1")
    node.packages, node.package_origins = {}, {}
    [f] = _pkg_findings(node, bl.from_mapping({"packages": {DRIVER: "580.159.04"}}, "pins"))
    assert (f.check, f.message) == ("versions.packages", f"package {DRIVER} is not installed, expected 580.159.04")


def test_packages_the_node_could_not_list_are_unknown_not_missing(sim_node) -> None:
    node = sim_node("n1")
    node.packages, node.package_origins = {}, {}
    node.unavailable["packages"] = "no dpkg status file and no rpm"
    [f] = _pkg_findings(node, bl.from_mapping({"packages": {DRIVER: "580.159.04"}}, "pins"))
    assert (f.check, f.severity) == ("versions.unreadable", "unknown")
    assert f.observed == {"packages": {"no dpkg status file and no rpm": ["node"]}}


def test_the_check_is_registered_documented_and_runs_only_with_pins(sim_node) -> None:
    spec = REGISTRY["versions.packages"]
    assert (spec.family, spec.severities, spec.scope, spec.requires) == ("versions", ("warn",), "node", "packages")
    assert spec.action.endswith("fleetops rollout driver.")
    assert REGISTRY["versions.driver"].severities == spec.severities  # as the driver version's
    node = sim_node("n1")
    assert spec.applies(node, _pins(nvidia_open="1")) is True
    assert spec.applies(node, bl.from_mapping({}, "none")) is False and spec.applies(node, None) is False


# --- the baseline key ----------------------------------------------------------------------------


def test_the_key_keeps_the_pins_as_text_and_drops_unset_ones() -> None:
    b = bl.from_mapping({"packages": {DRIVER: "580.159.04", FM: None}}, "pins")
    assert b.packages == {DRIVER: "580.159.04"}
    assert bl.from_mapping({}, "none").packages == {}


def test_a_number_or_a_misspelt_key_names_file_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "b.yml"
    path.write_text(textwrap.dedent(f"""
        driver_version: "580.159.04"
        packages:
          {DRIVER}: 580.159
    """).lstrip())
    with pytest.raises(bl.BaselineError) as info:
        bl.load_file(str(path))
    assert str(info.value) == (f'{path}:3: packages["{DRIVER}"]: expected a string, got number 580.159: '
                               'quote it ("580.159") so YAML keeps it as text')
    path.write_text('pakages:\n  nvidia-open: "580.159.04"\n')
    with pytest.raises(bl.BaselineError) as info:
        bl.load_file(str(path))
    assert info.value.line == 1 and "unknown key (did you mean 'packages'?)" in str(info.value)
    path.write_text('packages:\n  nvidia-open: ""\n')
    with pytest.raises(bl.BaselineError) as info:
        bl.load_file(str(path))
    assert str(info.value) == f"{path}:2: packages[\"nvidia-open\"]: '' does not match \\S+"


def test_pins_layer_package_by_package_and_null_unsets_one() -> None:
    b = bl.layer([
        ("group all", "all.yml", {"packages": {DRIVER: "580.159.04", FM: "580.159.04"}}),
        ("group h200", "h200.yml", {"packages": {FM: "580.159.04-1", "cuda-toolkit-13-0": "13.0.2"}}),
        ("host n1", "n1.yml", {"packages": {"cuda-toolkit-13-0": None}}),
    ])
    assert b.packages == {DRIVER: "580.159.04", FM: "580.159.04-1"}
    assert b.level_of(f'packages["{DRIVER}"]') == "group all"
    assert b.level_of(f'packages["{FM}"]') == "group h200"
    assert b.level_of('packages["cuda-toolkit-13-0"]') == "host n1"


def test_the_json_schema_states_the_key() -> None:
    validator = jsonschema.Draft202012Validator(bl.json_schema())
    assert list(validator.iter_errors({"packages": {DRIVER: "580.159.04", FM: None}})) == []
    for bad in ({"packages": {DRIVER: 580}}, {"packages": [DRIVER]}, {"packages": {DRIVER: ""}}):
        assert list(validator.iter_errors(json.loads(json.dumps(bad)))) != [], bad
        with pytest.raises(bl.BaselineError):
            bl.from_mapping(bad, "bad")
