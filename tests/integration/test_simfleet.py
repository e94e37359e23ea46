"""The simulated fleet itself: layout, status, faults, scenarios, start/stop (real sshd; root)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from fleetops import model
from fleetops.fleet import inventory, transport
from fleetops.gpu import sim
from fleetops.sim import fleet

pytestmark = pytest.mark.root

COLLECT = ["fleetops-agent", "collect"]


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return rest[0], int(rest[1])


def fleet_processes(directory: str) -> list[int]:
    """Live sshd listeners of the fleet in ``directory`` and every process under them."""
    listeners, parents = [], {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is None or stat[0] == "Z":
            continue
        parents[int(entry)] = stat[1]
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ")
        except OSError:
            continue
        if directory.encode() + b"/sshd/" in cmd:
            listeners.append(int(entry))
    found = set(listeners)
    changed = True
    while changed:
        extra = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= extra
        changed = bool(extra)
    return sorted(found)


# --- refusals that need neither root nor sshd -----------------------------------------------


def test_up_refuses_without_root(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(fleet.SimFleetError, match="needs root"):
        fleet.up(2, str(tmp_path / "f"))


def test_up_refuses_without_sshd(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(fleet, "find_sshd", lambda: None)
    with pytest.raises(fleet.SimFleetError) as err:
        fleet.up(2, str(tmp_path / "f"))
    assert str(err.value) == "sshd not found: apt-get install -y openssh-server"


def test_addresses_roll_over_into_the_next_24():
    addrs = fleet.addresses("127.0.10.250", 8)
    assert addrs == [
        "127.0.10.250",
        "127.0.10.251",
        "127.0.10.252",
        "127.0.10.253",
        "127.0.10.254",
        "127.0.11.1",
        "127.0.11.2",
        "127.0.11.3",
    ]
    assert len(set(fleet.addresses("127.0.10.1", 600))) == 600
    with pytest.raises(fleet.SimFleetError, match="loopback"):
        fleet.addresses("10.0.0.1", 2)
    assert fleet.node_names(3) == ["node001", "node002", "node003"]
    assert fleet.node_names(1000)[-1] == "node1000"


def test_down_on_a_folder_without_fleet_is_zero(tmp_path):
    assert fleet.down(str(tmp_path)) == 0
    assert fleet.down(str(tmp_path / "missing")) == 0


# --- the session fleet ----------------------------------------------------------------------


def test_layout_and_generated_files(sim_fleet):
    d = sim_fleet.directory
    record = json.loads(Path(d, "fleet.json").read_text())
    assert sorted(record["nodes"]) == [f"node00{i}" for i in range(1, 7)]
    first = int(sim_fleet.info["nodes"]["node001"]["address"].rsplit(".", 1)[1])
    for i, (name, node) in enumerate(sorted(record["nodes"].items())):
        assert node["address"].rsplit(".", 1)[1] == str(first + i)
        assert node["state"] == os.path.join(d, "state", f"{name}.json")
        assert sim.read_state(node["state"])["hostname"] == name
        assert os.path.getsize(os.path.join(d, "home", name, ".bashrc")) == 0
        config = Path(node["config"]).read_text()
        assert f"ListenAddress {node['address']}" in config
        assert "KexAlgorithms curve25519-sha256" in config and "MaxStartups 1000" in config
        setenv = next(line for line in config.splitlines() if line.startswith("SetEnv "))
        assert f"FLEETOPS_SIM_STATE={node['state']}" in setenv and f"HOME={node['home']}" in setenv
        for line in config.splitlines():  # every path in the config is absolute
            for word in line.split()[1:]:
                if "/" in word:
                    assert word.split("=", 1)[-1].startswith("/"), line
        assert isinstance(node["pid"], int)
    known = Path(d, "known_hosts").read_text().splitlines()
    port = sim_fleet.info["port"]
    assert known[0].startswith(f"[{record['nodes']['node001']['address']}]:{port} ssh-ed25519 ")
    assert len(known) == 6
    assert oct(os.stat(os.path.join(d, "id_ed25519")).st_mode & 0o777) == "0o600"
    assert os.path.isdir("/run/sshd")


def test_generated_inventory_reads_back(sim_fleet):
    raw = yaml.safe_load(Path(sim_fleet.inventory_path).read_text())
    assert sorted(raw["all"]["children"]["sim"]["hosts"]) == [f"node00{i}" for i in range(1, 7)]
    hosts = inventory.load(sim_fleet.inventory_path)
    assert [h.name for h in hosts] == [f"node00{i}" for i in range(1, 7)]
    h = hosts[1]
    node = sim_fleet.info["nodes"]["node002"]
    assert (h.address, h.port, h.user, h.connection) == (node["address"], node["port"], "root", "ssh")
    assert h.key_file == os.path.join(sim_fleet.directory, "id_ed25519")
    assert h.groups == ("sim",)
    assert h.vars["ansible_remote_tmp"] == os.path.join(
        sim_fleet.directory, "home", "node002", ".ansible", "tmp"
    )
    assert h.vars["ansible_ssh_common_args"] == f"-o UserKnownHostsFile={sim_fleet.directory}/known_hosts"
    assert h.vars["fleetops_sim_state"] == node["state"]
    assert os.path.isabs(h.vars["ansible_python_interpreter"])
    limited = inventory.load(sim_fleet.inventory_path, "sim[0:1]")
    assert [x.name for x in limited] == ["node001", "node002"]


def test_status_follows_faults(clean_fleet):
    d = clean_fleet.directory
    rows = {r["node"]: r for r in fleet.status(d)}
    assert all(r["status"] == "up" and r["faults"] == [] for r in rows.values())
    fleet.inject(d, "node001", "ecc-dbe", 3)
    fleet.inject(d, 2, "host-hang")  # a number names the n-th node
    fleet.inject(d, "node003", "host-down")
    assert fleet.inject(d, "node003", "host-down") is False  # already down
    rows = {r["node"]: r for r in fleet.status(d)}
    assert rows["node001"]["faults"] == ["ecc-dbe@3"] and rows["node001"]["status"] == "up"
    assert rows["node002"]["status"] == "hung" and rows["node002"]["faults"] == ["host-hang"]
    assert rows["node003"]["status"] == "down" and rows["node003"]["pid"] is None
    assert fleet.clear(d, "node002", "host-hang") == 1
    assert fleet.clear(d, "node003", "all") == 1
    rows = {r["node"]: r for r in fleet.status(d)}
    assert rows["node002"]["status"] == "up" and rows["node003"]["status"] == "up"
    res = transport.run_all([clean_fleet.host("node003")], ["true"])
    assert res["node003"].ok  # restarted with the same config: same address, key, identity


def test_up_again_on_a_running_fleet_says_so(sim_fleet):
    with pytest.raises(fleet.SimFleetError, match="already runs a fleet"):
        fleet.up(6, sim_fleet.directory, first_address="127.0.21.1")


def test_unknown_node_and_fault_are_named(sim_fleet):
    with pytest.raises(fleet.SimFleetError) as err:
        fleet.inject(sim_fleet.directory, "node042", "ecc-dbe")
    assert "node042" in str(err.value) and "node001" in str(err.value)
    with pytest.raises(fleet.SimFleetError, match="unknown fault 'ecc-tbe'.*host-down"):
        fleet.inject(sim_fleet.directory, "node001", "ecc-tbe")
    with pytest.raises(fleet.SimFleetError, match="GPU index 9"):
        fleet.inject(sim_fleet.directory, "node001", "ecc-dbe", 9)
    with pytest.raises(fleet.SimFleetError, match="no GPU index"):
        fleet.inject(sim_fleet.directory, "node001", "host-down", 1)
    with pytest.raises(fleet.SimFleetError, match="no simulated fleet"):
        fleet.status(os.path.dirname(sim_fleet.directory))


# --- fleets of their own --------------------------------------------------------------------


def test_scenario_defaults_and_per_node_overrides(root_sshd, tmp_path):
    scenario = tmp_path / "scenario.yml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "gpu_count": 4,
                "faults": ["persistence-off@0"],
                "nodes": {"node002": {"faults": ["ecc-dbe@2"]}, 3: {"node": {"driver_version": "570.1"}}},
            }
        )
    )
    d = str(tmp_path / "fleet")
    info = fleet.up(3, d, str(scenario), first_address="127.0.22.1", port=free_port("127.0.22.1"))
    try:
        results = transport.run_all(inventory.load(info["inventory"]), COLLECT)
        nodes = {name: model.node_from_json(r.stdout) for name, r in results.items()}
        assert all(n.gpu_count == 4 for n in nodes.values())
        assert all(not n.gpus[0].persistence_mode for n in nodes.values())  # the default applies to all
        assert [g.ecc_uncorrected_volatile for g in nodes["node002"].gpus] == [0, 0, 2, 0]
        assert [g.ecc_uncorrected_volatile for g in nodes["node001"].gpus] == [0, 0, 0, 0]
        assert nodes["node003"].driver_version == "570.1"
        assert nodes["node001"].driver_version == nodes["node002"].driver_version != "570.1"
        assert {r["node"]: r["faults"] for r in fleet.status(d)}["node002"] == [
            "persistence-off@0",
            "ecc-dbe@2",
        ]
    finally:
        assert fleet.down(d) == 3


def test_bad_scenario_is_refused_before_anything_starts(root_sshd, tmp_path):
    scenario = tmp_path / "scenario.yml"
    scenario.write_text("nodes: {node009: {faults: [ecc-dbe]}}\n")
    d = str(tmp_path / "fleet")
    with pytest.raises(fleet.SimFleetError, match="node009"):
        fleet.up(3, d, str(scenario), first_address="127.0.23.1", port=free_port("127.0.23.1"))
    assert fleet_processes(d) == []
    scenario.write_text("nodes: {2: {faults: [warp-drive]}}\n")
    with pytest.raises(fleet.SimFleetError, match="warp-drive"):
        fleet.up(3, d, str(scenario), first_address="127.0.23.1", port=free_port("127.0.23.1"))
    assert fleet_processes(d) == []


def test_down_stops_everything_including_sessions_and_hung_ones(root_sshd, tmp_path):
    d = str(tmp_path / "fleet")
    info = fleet.up(4, d, first_address="127.0.24.1", port=free_port("127.0.24.1"))
    hosts = inventory.load(info["inventory"])
    with transport.SessionPool(hosts) as pool:  # open sessions: sshd children per connection
        assert all(r.ok for r in pool.run(["true"]).values())
        fleet.inject(d, "node002", "host-hang")
        fleet.inject(d, "node003", "host-down")
        record = json.loads(Path(d, "fleet.json").read_text())
        listeners = [n["pid"] for n in record["nodes"].values() if n["pid"]]
        assert len(listeners) == 3
        before = fleet_processes(d)
        assert len(before) >= 3 + 3  # listeners and the sessions' own sshd processes
        start = time.monotonic()
        assert fleet.down(d) == 3
        assert time.monotonic() - start < 8
        assert fleet_processes(d) == []
        for pid in before:
            stat = _stat(pid)
            assert stat is None or stat[0] == "Z", (pid, stat)
    assert fleet.down(d) == 0  # safe twice
    assert all(r["status"] == "down" for r in fleet.status(d))
    # the folder can hold a fleet again, with the same keys
    info2 = fleet.up(2, d, first_address="127.0.24.1", port=free_port("127.0.24.1"))
    try:
        assert all(r.ok for r in transport.run_all(inventory.load(info2["inventory"]), ["true"]).values())
    finally:
        fleet.down(d)


@pytest.mark.slow
def test_hundred_nodes_start_fast_and_answer(root_sshd, tmp_path):
    d = str(tmp_path / "fleet")
    start = time.monotonic()
    info = fleet.up(100, d, first_address="127.0.30.1", port=free_port("127.0.30.1"))
    up_s = time.monotonic() - start
    try:
        hosts = inventory.load(info["inventory"])
        assert info["nodes"]["node100"]["address"] == "127.0.30.100"
        start = time.monotonic()
        results = transport.run_all(hosts, COLLECT, forks=50)
        run_s = time.monotonic() - start
        assert all(r.ok for r in results.values()), [r for r in results.values() if not r.ok][:3]
        print(f"\nfleet.up(100): {up_s:.2f}s; run_all(collect) over 100 nodes, forks 50: {run_s:.2f}s")
        assert up_s < 15  # a few seconds measured; generous for a loaded CI machine
        assert run_s < 30
    finally:
        assert fleet.down(d) == 100
