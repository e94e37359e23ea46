"""A fleet that agrees is its own baseline: ``fleetops audit`` without a baseline, over real SSH
to sixteen simulated nodes, reports the one GPU whose setting differs from its model's majority,
and nothing else."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

NODES = 16
CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")


@pytest.fixture(scope="module")
def fleet16(tmp_path_factory):
    from fleetops.sim import fleet

    if os.geteuid() != 0:
        pytest.skip("needs root to start sshd")
    if not fleet.find_sshd():
        pytest.skip("sshd not installed (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("consistency"))
    with socket.socket() as sock:  # a port free at this address now: parallel runs do not collide
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(NODES, d, first_address=FIRST_ADDRESS, port=port)
    yield d
    fleet.down(d)


@pytest.fixture
def clean16(fleet16):
    from fleetops.sim import fleet

    yield fleet16
    for i in range(1, NODES + 1):
        fleet.clear(fleet16, f"node{i:03d}", "all")
        with sim.locked_state(os.path.join(fleet16, "state", f"node{i:03d}.json")) as state:
            for gpu in state["gpus"]:
                gpu["ecc_mode_current"] = gpu["ecc_mode_pending"] = True
                gpu["compute_mode"] = "Default"


def audit(d):
    args = [*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--format", "json", "-q", "--no-history",
            "--connect-timeout", "2", "--timeout", "20"]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=180)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def uuid(d, node, index):
    return sim.read_state(os.path.join(d, "state", f"{node}.json"))["gpus"][index]["uuid"]


def test_persistence_off_and_mig_on_are_both_reported_and_nothing_else(clean16):
    from fleetops.sim import fleet

    fleet.inject(clean16, "node003", "persistence-off", 2)
    fleet.inject(clean16, "node007", "mig-drift", 5)
    rc, doc = audit(clean16)
    assert doc["summary"]["nodes"] == NODES and doc["summary"]["gpus"] == NODES * 8
    bad = sorted((f["check"], f["node"], f["gpu"]["uuid"] if f["gpu"] else None, f["severity"])
                 for f in doc["findings"] if f["severity"] != "ok")
    assert bad == [
        ("config.mig_mode", "node007", uuid(clean16, "node007", 5), "warn"),
        ("config.persistence_mode", "node003", uuid(clean16, "node003", 2), "warn"),
    ]
    assert rc == 1
    by_check = {f["check"]: f for f in doc["findings"]}
    assert "fleet NVIDIA H200: on 127, off 1" in by_check["config.persistence_mode"]["message"]
    assert "fleet NVIDIA H200: disabled 127, enabled 1" in by_check["config.mig_mode"]["message"]


def test_ecc_off_and_exclusive_compute_mode_are_found_against_the_fleet(clean16):
    with sim.locked_state(os.path.join(clean16, "state", "node011.json")) as state:
        state["gpus"][1]["ecc_mode_current"] = state["gpus"][1]["ecc_mode_pending"] = False
    with sim.locked_state(os.path.join(clean16, "state", "node015.json")) as state:
        state["gpus"][7]["compute_mode"] = "Exclusive_Process"
    _, doc = audit(clean16)
    bad = sorted((f["check"], f["node"], f["gpu"]["index"], f["severity"], f["expected"])
                 for f in doc["findings"] if f["severity"] != "ok")
    assert bad == [
        ("config.compute_mode", "node015", 7, "warn", "Default"),
        ("config.ecc_mode", "node011", 1, "warn", True),
    ]


def _two_level_inventory(d: str) -> str:
    """The simulated fleet regrouped as all -> gpu -> h200: the parent pins the settings, the child
    only a threshold (so Ansible alone would hand every host the child's mapping and nothing else)."""
    import yaml

    with open(os.path.join(d, "inventory.yml")) as fh:
        hosts = yaml.safe_load(fh)["all"]["children"]["sim"]["hosts"]
    root = os.path.join(d, "layered")
    os.makedirs(os.path.join(root, "group_vars"), exist_ok=True)
    with open(os.path.join(root, "hosts.yml"), "w") as fh:
        yaml.safe_dump({"all": {"children": {"gpu": {"children": {"h200": {"hosts": hosts}}}}}}, fh)
    with open(os.path.join(root, "group_vars", "gpu.yml"), "w") as fh:
        fh.write("fleetops_baseline:\n  persistence_mode: true\n  gpu_models:\n    NVIDIA H200:\n"
                 "      power_limit_w: 700\n")
    with open(os.path.join(root, "group_vars", "h200.yml"), "w") as fh:
        fh.write("fleetops_baseline:\n  thresholds:\n    xid_window_hours: 12\n")
    return os.path.join(root, "hosts.yml")


def test_an_audit_of_a_two_level_inventory_uses_the_layered_baseline(clean16):
    from fleetops.sim import fleet

    inv = _two_level_inventory(clean16)
    fleet.inject(clean16, "node002", "power-cap-drift", 1)
    fleet.inject(clean16, "node005", "persistence-off", 3)
    args = [*CLI, "audit", "-i", inv, "--format", "json", "-q", "--no-history", "--connect-timeout", "2",
            "--timeout", "20"]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=180)
    doc = json.loads(proc.stdout)
    bad = {(f["check"], f["node"], f["gpu"]["index"]): f for f in doc["findings"] if f["severity"] != "ok"}
    assert sorted(bad) == [("config.persistence_mode", "node005", 3), ("thermal_power.power_limit", "node002", 1)]
    # judged by the parent group's keys (per node, against the baseline), not by the fleet's vote
    assert bad[("thermal_power.power_limit", "node002", 1)]["message"].endswith("power limit 500 W, baseline 700 W "
                                                                                 "for NVIDIA H200")
    assert "baseline on" in bad[("config.persistence_mode", "node005", 3)]["message"]
    assert not any("fleet NVIDIA H200" in f["message"] for f in bad.values())
    show = subprocess.run([*CLI, "baseline", "show", "-i", inv, "node002", "--json"], check=False,
                          capture_output=True, text=True, timeout=60)
    keys = {k["path"]: k for k in json.loads(show.stdout)["keys"]}
    assert keys['gpu_models["NVIDIA H200"].power_limit_w']["level"] == "group gpu"
    assert keys["thresholds.xid_window_hours"]["level"] == "group h200"
