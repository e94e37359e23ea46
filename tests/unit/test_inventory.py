"""Inventory loading through ansible-core: INI, YAML, group_vars/host_vars, limits, errors."""

from __future__ import annotations

import textwrap

import pytest

from fleetops.fleet import inventory
from fleetops.fleet.inventory import Host, InventoryError


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


INI = """
[gpu]
gpu01 ansible_host=10.0.0.1
gpu02 ansible_host=10.0.0.2 ansible_port=2200 ansible_user=ops
gpu03 ansible_host=10.0.0.3 ansible_ssh_private_key_file=~/.ssh/gpu_key
gpu[04:06] ansible_host=10.0.0.9

[login]
login1 ansible_connection=local

[hgx:children]
gpu

[gpu:vars]
ansible_user=admin
fleetops_role=compute
"""

YAML = """
all:
  vars:
    site: dc1
  children:
    gpu:
      vars:
        ansible_user: admin
      hosts:
        gpu01:
          ansible_host: 10.1.0.1
        gpu02:
          ansible_host: 10.1.0.2
          ansible_port: 2222
          ansible_ssh_private_key_file: /keys/id_ed25519
          ansible_ssh_common_args: -o UserKnownHostsFile=/keys/known_hosts
    login:
      hosts:
        login1:
          ansible_connection: local
"""


@pytest.fixture
def ini(tmp_path):
    return write(tmp_path / "hosts.ini", INI)


@pytest.fixture
def yml(tmp_path):
    return write(tmp_path / "hosts.yml", YAML)


def by_name(hosts):
    return {h.name: h for h in hosts}


def test_ini_hosts_ports_users_keys_groups(ini):
    hosts = inventory.load(ini)
    assert sorted(h.name for h in hosts) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06", "login1"]
    h = by_name(hosts)
    assert h["gpu01"] == Host("gpu01", "10.0.0.1", 22, "admin", None, "ssh", ("gpu", "hgx"), {})
    assert (h["gpu02"].port, h["gpu02"].user) == (2200, "ops")  # host var beats group var
    assert h["gpu03"].key_file.endswith("/.ssh/gpu_key") and not h["gpu03"].key_file.startswith("~")
    assert h["gpu05"].address == "10.0.0.9"
    assert (
        h["login1"].connection == "local"
        and h["login1"].address == "login1"
        and h["login1"].groups == ("login",)
    )
    assert h["gpu01"].vars["fleetops_role"] == "compute"
    assert set(h["gpu01"].groups) == {"gpu", "hgx"}


def test_yaml_hosts_and_vars(yml):
    h = by_name(inventory.load(yml))
    assert set(h) == {"gpu01", "gpu02", "login1"}
    assert (h["gpu02"].address, h["gpu02"].port, h["gpu02"].user) == ("10.1.0.2", 2222, "admin")
    assert h["gpu02"].key_file == "/keys/id_ed25519"
    assert h["gpu02"].vars["ansible_ssh_common_args"] == "-o UserKnownHostsFile=/keys/known_hosts"
    assert h["gpu01"].vars["site"] == "dc1"
    assert h["login1"].connection == "local"


def test_values_are_plain_python(yml):
    host = by_name(inventory.load(yml))["gpu02"]
    for key, value in host.vars.items():
        assert type(key) is str
        assert type(value) in (str, int, bool, float, list, dict), (key, type(value))
    assert type(host.name) is str and type(host.address) is str and type(host.port) is int
    assert "groups" not in host.vars and "inventory_hostname" not in host.vars  # magic vars left out
    hash(host)  # frozen and hashable despite its vars dict


def test_group_vars_and_host_vars_next_to_the_inventory(tmp_path):
    path = write(tmp_path / "inv" / "hosts.ini", INI)
    write(
        tmp_path / "inv" / "group_vars" / "gpu.yml",
        "fleetops_baseline: {driver_version: '580.159.04'}\nsite: lab\n",
    )
    write(tmp_path / "inv" / "group_vars" / "all.yml", "site: everywhere\nansible_port: 2022\n")
    write(tmp_path / "inv" / "host_vars" / "gpu01.yml", "site: rack7\n")
    h = by_name(inventory.load(path))
    assert h["gpu01"].vars["site"] == "rack7"  # host_vars beat group_vars
    assert h["gpu02"].vars["site"] == "lab"  # a group beats all
    assert h["login1"].vars["site"] == "everywhere"
    assert h["gpu02"].vars["fleetops_baseline"] == {"driver_version": "580.159.04"}
    assert h["gpu01"].port == 2022 and h["gpu02"].port == 2200  # inventory host var beats group_vars/all


def test_inventory_folder_is_read_whole(tmp_path):
    write(tmp_path / "inv" / "a.ini", "[a]\nhost-a\n")
    write(tmp_path / "inv" / "b.yml", "b:\n  hosts:\n    host-b:\n")
    assert [h.name for h in inventory.load(str(tmp_path / "inv"))] == ["host-a", "host-b"]


def test_templated_connection_vars(tmp_path):
    path = write(
        tmp_path / "t.yml",
        """
        gpu:
          vars:
            domain: example.net
          hosts:
            n1:
              ansible_host: "{{ inventory_hostname }}.{{ domain }}"
              ansible_port: "{{ 2000 + 22 }}"
        """,
    )
    host = inventory.load(path)[0]
    assert (host.address, host.port) == ("n1.example.net", 2022)


@pytest.mark.parametrize(
    "limit, expected",
    [
        ("gpu01", ["gpu01"]),
        ("gpu01:gpu02", ["gpu01", "gpu02"]),
        ("gpu[0:2]", ["gpu01", "gpu02", "gpu03"]),  # a slice of group gpu
        ("gpu*", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06"]),
        ("hgx:!gpu05", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu06"]),
        ("gpu:&hgx:!~gpu0[4-6]", ["gpu01", "gpu02", "gpu03"]),
        ("login,gpu06", ["gpu06", "login1"]),
        ("~gpu0[13]", ["gpu01", "gpu03"]),
    ],
)
def test_limit_patterns(ini, limit, expected):
    assert sorted(h.name for h in inventory.load(ini, limit)) == expected


def test_limit_from_a_file(ini, tmp_path):
    retry = write(tmp_path / "retry.txt", "gpu02\ngpu04\n")
    assert [h.name for h in inventory.load(ini, "@" + retry)] == ["gpu02", "gpu04"]


def test_limit_matching_nothing(ini):
    with pytest.raises(InventoryError, match="matched no host"):
        inventory.load(ini, "gpu0[1:2]")  # as ansible: host ranges are for inventories, not patterns
    with pytest.raises(InventoryError) as err:
        inventory.load(ini, "gpu[0:3]:&login")
    assert str(err.value) == f"--limit 'gpu[0:3]:&login' matched no host in {ini}"
    with pytest.raises(InventoryError, match="matched no host"):
        inventory.load(ini, "nosuchhost")


def test_missing_file(tmp_path):
    with pytest.raises(InventoryError, match=r"nope\.ini: inventory file not found"):
        inventory.load(str(tmp_path / "nope.ini"))


def test_empty_inventory(tmp_path):
    for name, text in (
        ("empty.ini", ""),
        ("comments.ini", "# nothing\n"),
        ("groups.yml", "all:\n  children:\n    gpu: {}\n"),
    ):
        path = write(tmp_path / name, text)
        with pytest.raises(InventoryError, match="has no hosts") as err:
            inventory.load(path)
        assert path in str(err.value)


@pytest.mark.parametrize(
    "text, line, reason",
    [
        ("[gpu]\ngpu01 ansible_host=10.0.0.1\n[gpu:vars\nx=1\n", 3, "not enough values"),
        ("[gpu]\ngpu01\n[gpu:vars]\nnovalue\n", 4, "Expected key=value, got: novalue"),
        ("[gpu]\ngpu01\n\n[gpu:kids]\ngpu01\n", 4, "unknown type: kids"),
        ("[gpu:children]\nmissing\n", 2, "undefined group 'missing'"),
    ],
)
def test_malformed_ini_names_file_and_line(tmp_path, text, line, reason):
    path = write(tmp_path / "bad.ini", text)
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line {line}: cannot parse the inventory as INI")
    assert reason in message


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.yml", "all:\n  hosts:\n    a: {ansible_host: 10.0.0.1\n  b: [\n")
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line 4, column 4: cannot parse the inventory as YAML")
    assert "did not find expected" in message


def test_yaml_with_wrong_shape(tmp_path):
    path = write(tmp_path / "shape.yml", "- just\n- a list\n")
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert path in str(err.value) and "YAML" in str(err.value)


def test_bad_port_and_unsupported_connection(tmp_path):
    path = write(tmp_path / "p.ini", "[gpu]\ngpu01 ansible_port=http\n")
    with pytest.raises(InventoryError, match="host gpu01: ansible_port 'http' is not a TCP port"):
        inventory.load(path)
    path = write(tmp_path / "c.ini", "[win]\nw1 ansible_connection=winrm\n")
    with pytest.raises(InventoryError, match="w1: ansible_connection=winrm is not supported"):
        inventory.load(path)


def test_ansible_warnings_stay_off_the_screen(tmp_path, capfd):
    path = write(tmp_path / "bad.ini", "[gpu]\ngpu01\n[gpu:vars]\nnovalue\n")
    with pytest.raises(InventoryError):
        inventory.load(path)
    inventory.load(write(tmp_path / "ok.ini", "[gpu]\ngpu01\n"), "nomatch,gpu01")  # warns "could not match"
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_comma_host_list_like_ansible():
    hosts = inventory.load("10.0.0.1,10.0.0.2,")
    assert [h.address for h in hosts] == ["10.0.0.1", "10.0.0.2"]


def test_thousand_hosts_load_with_their_group_vars(tmp_path):
    # How long it takes is bench/inventory_load.py's figure (bench/RESULTS.md), not a test's.
    lines = ["[gpu]"] + [
        f"gpu{i:04d} ansible_host=10.{i // 250}.0.{i % 250 + 1} ansible_port=22" for i in range(1000)
    ]
    lines += ["[gpu:vars]", "ansible_user=ops"]
    path = write(tmp_path / "big.ini", "\n".join(lines) + "\n")
    write(tmp_path / "group_vars" / "gpu.yml", "fleetops_baseline: {driver_version: '580.159.04'}\n")
    hosts = inventory.load(path, "gpu")
    assert [h.name for h in hosts] == [f"gpu{i:04d}" for i in range(1000)]
    assert hosts[999].user == "ops" and hosts[999].address == "10.3.0.250"
    assert all(h.vars["fleetops_baseline"] == {"driver_version": "580.159.04"} for h in hosts)
