"""``fleetops prometheus targets``: file_sd groups from a real Ansible inventory (ansible-core's
loader, group_vars included), written whole, and bad input named by file, host and variable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetops import cli
from fleetops.fleet import inventory, prom_targets


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        "[rack1]\n"
        "gpu01 ansible_host=10.1.0.11\n"
        "gpu02 ansible_host=10.1.0.12 fleetops_agent_metrics_port=9500\n"
        "[rack2]\n"
        "gpu03 ansible_host=fd00::13\n"
        "[h200:children]\nrack1\n"
        "[loose]\n"
        "[other]\n"
        "gpu04\n"
    )
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "rack2.yml").write_text("fleetops_agent_metrics_port: 9600\n")
    return inv


def test_one_group_per_node_with_its_address_port_and_labels(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    groups = prom_targets.target_groups(str(inv), inventory.load(str(inv)), port=9401)
    by_node = {g["labels"]["node"]: g for g in groups}
    # group: the one the host is listed in, not the parent group holding it
    assert by_node["gpu01"] == {"targets": ["10.1.0.11:9401"],
                                "labels": {"node": "gpu01", "group": "rack1", "groups": ",rack1,h200,"}}
    assert by_node["gpu02"]["targets"] == ["10.1.0.12:9500"]  # host var
    assert by_node["gpu03"]["targets"] == ["[fd00::13]:9600"]  # group_vars, IPv6 bracketed
    assert by_node["gpu03"]["labels"] == {"node": "gpu03", "group": "rack2", "groups": ",rack2,"}
    assert by_node["gpu04"]["targets"] == ["gpu04:9401"]  # no ansible_host: the inventory name
    assert sorted(by_node) == ["gpu01", "gpu02", "gpu03", "gpu04"]


def test_the_cli_writes_the_file_whole_and_limit_selects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory(tmp_path)
    out = tmp_path / "sd" / "fleetops.json"
    out.parent.mkdir()
    out.write_text("old")
    assert cli.main(["prometheus", "targets", "-i", str(inv), "-o", str(out), "--port", "9777", "--limit", "rack2:gpu01"]) == 0
    doc = json.loads(out.read_text())
    assert sorted((g["labels"]["node"], g["targets"]) for g in doc) == [("gpu01", ["10.1.0.11:9777"]),
                                                                         ("gpu03", ["[fd00::13]:9600"])]
    assert os.listdir(out.parent) == ["fleetops.json"]  # no temporary file left behind
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert "2 targets written" in capsys.readouterr().err
    assert cli.main(["prometheus", "targets", "-i", str(inv), "--limit", "gpu04"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"targets": ["gpu04:9401"], "labels": {"node": "gpu04", "group": "other", "groups": ",other,"}}]


# the INI value, and as the message shows it (ansible-core reads INI values as Python literals)
@pytest.mark.parametrize(("value", "shown"), [("x", "'x'"), ("0", "0"), ("70000", "70000"), ("9401.5", "9401.5")])
def test_a_bad_port_variable_names_the_file_the_host_and_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, shown: str
) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"[gpu]\ngood ansible_host=10.0.0.1\nbad ansible_host=10.0.0.2 fleetops_agent_metrics_port={value}\n")
    out = tmp_path / "t.json"
    assert cli.main(["prometheus", "targets", "-i", str(inv), "-o", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"{inv}: host bad: fleetops_agent_metrics_port {shown} is not a TCP port" in err
    assert not out.exists()


def test_a_broken_or_missing_inventory_is_an_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("all:\n  hosts: [\n")
    assert cli.main(["prometheus", "targets", "-i", str(broken)]) == 4
    assert str(broken) in capsys.readouterr().err
    missing = tmp_path / "none.ini"
    assert cli.main(["prometheus", "targets", "-i", str(missing)]) == 4
    assert str(missing) in capsys.readouterr().err
    assert cli.main(["prometheus", "targets", "-i", str(broken), "--port", "0"]) == 4
    assert "--port 0 is not a TCP port" in capsys.readouterr().err


def test_a_node_with_tls_on_is_scraped_over_https(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    gpus:\n      hosts:\n"
        "        gpu01: {ansible_host: 10.1.0.11, fleetops_agent_tls_cert_src: files/agent.crt}\n"
        "        gpu02:\n          ansible_host: 10.1.0.12\n          fleetops_agent_web_config:\n"
        "            tls_server_config: {cert_file: /etc/pki/agent.crt, key_file: /etc/pki/agent.key}\n"
        "        gpu03:\n          ansible_host: 10.1.0.13\n          fleetops_agent_web_config:\n"
        "            basic_auth_users: {prometheus: x}\n"
    )
    groups = {g["labels"]["node"]: g for g in prom_targets.target_groups(str(inv), inventory.load(str(inv)))}
    assert groups["gpu01"]["labels"]["__scheme__"] == "https"
    assert groups["gpu02"]["labels"]["__scheme__"] == "https"
    assert "__scheme__" not in groups["gpu03"]["labels"]  # basic auth alone: still http
