"""The simulated fleet itself: layout, status, faults, scenarios, start/stop (real sshd; root)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetops import model
from fleetops.fleet import inventory, transport
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = pytest.mark.root

COLLECT = ["fleetops-agent", "collect"]
# Fleets of their own take /24s next to the session fleet's block (FLEETOPS_TEST_FLEET_ADDRESS).
_FIRST = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1").split(".")


def block(offset: int) -> str:
    """The first address of the /24 ``offset`` above the session fleet's."""
    return f"{_FIRST[0]}.{_FIRST[1]}.{int(_FIRST[2]) + offset}.1"


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
        assert isinstance(node["pid"], int)
    known = Path(d, "known_hosts").read_text().splitlines()
    port = sim_fleet.info["port"]
    assert known[0].startswith(f"[{record['nodes']['node001']['address']}]:{port} ssh-ed25519 ")
    assert len(known) == 6
    assert oct(os.stat(os.path.join(d, "id_ed25519")).st_mode & 0o777) == "0o600"
    assert os.path.isdir("/run/sshd")


def ssh(fleet_dir: str, node: dict, command: str, *options: str, key: str | None = None):
    """The system ssh client, told nothing but this fleet's key and known_hosts."""
    argv = [
        "ssh", "-F", "/dev/null", "-p", str(node["port"]), "-i", key or os.path.join(fleet_dir, "id_ed25519"),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={fleet_dir}/known_hosts",
        "-o", "GlobalKnownHostsFile=/dev/null", *options, f"root@{node['address']}", command,
    ]
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}  # no agent's keys either
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_each_address_reaches_its_own_node_with_the_fleet_key(sim_fleet):
    for name, node in sorted(sim_fleet.info["nodes"].items()):
        proc = ssh(sim_fleet.directory, node, 'echo "$FLEETOPS_SIM_STATE"')
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.strip() == node["state"], name  # the agent there finds this node's state


def test_sshd_refuses_passwords_and_any_other_key(sim_fleet, tmp_path):
    node = sim_fleet.info["nodes"]["node002"]
    # The server lists the methods it would take in its refusal: publickey, and nothing else.
    proc = ssh(sim_fleet.directory, node, "true", "-o", "PubkeyAuthentication=no",
               "-o", "PasswordAuthentication=yes", "-o", "KbdInteractiveAuthentication=yes")
    assert proc.returncode == 255 and "Permission denied (publickey)." in proc.stderr, proc.stderr
    other = str(tmp_path / "other_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other], check=True)
    proc = ssh(sim_fleet.directory, node, "true", key=other)
    assert proc.returncode == 255 and "Permission denied (publickey)." in proc.stderr, proc.stderr


def test_known_hosts_holds_the_key_each_server_presents(sim_fleet):
    known = {}
    for line in Path(sim_fleet.directory, "known_hosts").read_text().splitlines():
        host, kind, key = line.split()[:3]
        known[host] = (kind, key)
    for name, node in sorted(sim_fleet.info["nodes"].items()):
        scan = subprocess.run(
            ["ssh-keyscan", "-T", "10", "-p", str(node["port"]), "-t", "ed25519", node["address"]],
            capture_output=True, text=True, timeout=60, check=False,
        )
        presented = [line.split() for line in scan.stdout.splitlines() if line and not line.startswith("#")]
        assert len(presented) == 1, (name, scan.stdout, scan.stderr)
        host, kind, key = presented[0][:3]
        assert host == f"[{node['address']}]:{node['port']}"
        assert known.get(host) == (kind, key), name


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
        fleet.up(6, sim_fleet.directory, first_address=block(1))


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
    info = fleet.up(3, d, str(scenario), first_address=block(2), port=free_port(block(2)))
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
        fleet.up(3, d, str(scenario), first_address=block(3), port=free_port(block(3)))
    assert fleet_processes(d) == []
    scenario.write_text("nodes: {2: {faults: [warp-drive]}}\n")
    with pytest.raises(fleet.SimFleetError, match="warp-drive"):
        fleet.up(3, d, str(scenario), first_address=block(3), port=free_port(block(3)))
    assert fleet_processes(d) == []


def test_down_stops_everything_including_sessions_and_hung_ones(root_sshd, tmp_path):
    d = str(tmp_path / "fleet")
    info = fleet.up(4, d, first_address=block(4), port=free_port(block(4)))
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
        assert fleet.down(d) == 3  # it raises if anything outlives SIGKILL
        assert fleet_processes(d) == []
        for pid in before:
            stat = _stat(pid)
            assert stat is None or stat[0] == "Z", (pid, stat)
    assert fleet.down(d) == 0  # safe twice
    assert all(r["status"] == "down" for r in fleet.status(d))
    # the folder can hold a fleet again, with the same keys
    info2 = fleet.up(2, d, first_address=block(4), port=free_port(block(4)))
    try:
        assert all(r.ok for r in transport.run_all(inventory.load(info2["inventory"]), ["true"]).values())
    finally:
        fleet.down(d)


@pytest.mark.slow
def test_hundred_nodes_start_and_answer(root_sshd, tmp_path):
    # How fast they do is bench/audit_fanout.py's business, not a test's.
    d = str(tmp_path / "fleet")
    info = fleet.up(100, d, first_address=block(5), port=free_port(block(5)))
    try:
        hosts = inventory.load(info["inventory"])
        assert info["nodes"]["node100"]["address"] == block(5)[:-1] + "100"
        results = transport.run_all(hosts, COLLECT, forks=50)
        assert sorted(results) == [h.name for h in hosts]
        assert all(r.ok for r in results.values()), [r for r in results.values() if not r.ok][:3]
        assert {model.node_from_json(r.stdout).hostname for r in results.values()} == set(results)
    finally:
        assert fleet.down(d) == 100


def test_a_folder_too_long_for_the_daemon_s_sockets_is_refused_before_anything_starts(root_sshd, tmp_path):
    d = str(tmp_path / ("f" * 90))
    sock = os.path.join(d, "state", "node002.agent", "agent.sock")
    with pytest.raises(fleet.SimFleetError) as err:
        fleet.up(2, d, first_address=block(6), port=free_port(block(6)), daemon=True)
    assert str(err.value) == (
        f"{d}: too long a folder for the daemon's sockets: {sock} is {len(sock)} bytes, "
        "a unix socket's path at most 107; use a shorter --dir"
    )
    assert not os.path.exists(os.path.join(d, "fleet.json"))


def test_up_daemon_serves_every_node_and_down_stops_it(root_sshd):
    import shutil
    import tempfile
    import time

    # a short folder of its own: the daemon's sockets live under it (at most 107 bytes), and a
    # worker's tmp_path under pytest-xdist is longer than one alone
    top = tempfile.mkdtemp(prefix="fo-simd-", dir="/tmp")
    d = os.path.join(top, "fleet")
    info = fleet.up(2, d, first_address=block(6), port=free_port(block(6)), daemon=True,
                    metrics_port=free_port(block(6)))
    pid = info["daemon"]["pid"]
    try:
        fleet.inject(d, "node002", "xid:31", 1)
        deadline = time.monotonic() + 60
        while True:  # collect over SSH is answered by the daemon once it has seen the XID
            results = transport.run_all(inventory.load(info["inventory"]), COLLECT)
            docs = {name: json.loads(r.stdout) for name, r in results.items()}
            counts = {n: (doc.get("daemon") or {}).get("xid_counts") for n, doc in docs.items()}
            if counts.get("node002") and counts.get("node001") == {}:
                break
            assert time.monotonic() < deadline, f"daemon never answered with the XID: {counts}"
            time.sleep(0.2)
        assert list(counts["node002"].values()) == [1] and list(counts["node002"])[0].endswith("/31")
        assert {doc["hostname"] for doc in docs.values()} == {"node001", "node002"}
    finally:
        assert fleet.down(d) == 2
    assert _stat(pid) is None or _stat(pid)[0] == "Z"
    assert not os.path.exists(os.path.join(d, "state", "node001.agent", "agent.sock"))
    shutil.rmtree(top)
