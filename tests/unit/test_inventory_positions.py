"""Baseline positions in an inventory come from PyYAML's public start marks (not ansible-core's
private data tags): group_vars/host_vars files and a YAML inventory's inline vars are re-read
with ``fleetops.baseline.read_yaml``; where that reading differs from ansible's, no line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetops.baseline import BaselineError
from fleetops.fleet import inventory
from fleetops.ops.baseline import resolve_baselines


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _resolve(inv: Path) -> None:
    resolve_baselines(inventory.load(str(inv)), None, str(inv))


def test_a_bad_key_inline_in_a_yaml_inventory_names_the_inventory_line(tmp_path: Path) -> None:
    inv = _write(tmp_path / "hosts.yml", """
        all:
          children:
            gpu:
              vars:
                fleetops_baseline:
                  ecc_mode: true
                  power_limit_x: 1
              hosts:
                n1: {ansible_host: 127.65.21.1}
    """)
    with pytest.raises(BaselineError, match=r"hosts\.yml:7: power_limit_x: unknown key"):
        _resolve(inv)


def test_the_last_file_of_a_group_vars_folder_that_sets_the_baseline_is_named(tmp_path: Path) -> None:
    inv = _write(tmp_path / "hosts.ini", "[gpu]\nn1 ansible_host=127.65.21.1\n")
    _write(tmp_path / "group_vars" / "gpu" / "a.yml", "fleetops_baseline:\n  ecc_mode: true\n")
    _write(tmp_path / "group_vars" / "gpu" / "b.yml", "x: 1\nfleetops_baseline:\n  ecc_mode: true\n  eccmode: 1\n")
    with pytest.raises(BaselineError, match=r"gpu/b\.yml:4: eccmode: unknown key"):
        _resolve(inv)


def test_a_value_pyyaml_reads_otherwise_keeps_ansibles_without_a_line(tmp_path: Path) -> None:
    inv = _write(tmp_path / "hosts.ini", "[gpu]\nn1 ansible_host=127.65.21.1\n")
    _write(tmp_path / "group_vars" / "gpu.yml", "fleetops_baseline:\n  ecc_mode: !unsafe 'on'\n  bad_key: 1\n")
    with pytest.raises(BaselineError) as err:
        _resolve(inv)
    assert err.value.line is None and err.value.path in ("ecc_mode", "bad_key")
    assert Path(err.value.source).name == "gpu.yml"
