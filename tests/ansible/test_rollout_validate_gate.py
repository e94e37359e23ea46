"""The rollout's validation gate through the real ansible-playbook against the simulated fleet.

The package steps of driver_rollout.yml refuse loopback simulated nodes (they share the
controller's file system), so this drives the rollout's own tail, playbooks/tasks/
driver_rollout_resume.yml (audit gate, validation gate, resume), inside the same drain / block /
rescue and serial + max_fail_percentage shape as driver_rollout.yml, with one node's simulated
GPU degraded. Before the block, as in driver_rollout_node.yml, the rollout's preflight
(playbooks/tasks/driver_rollout_preflight.yml) asks each node's agent whether the gate could
measure there at all, and refuses a node without a validation backend before draining it.
A structural test holds driver_rollout_node.yml to including the preflight before its block and
the tail inside it.

Slurm is the strict stand-in scontrol (tests/fake_scontrol.py), run on the controller; the nodes
are in Slurm (a copy of the simulator's inventory with fleetops_slurm_managed: true), the batch
passes the partition's capacity check first (one of three nodes: the 10% share, never fewer than
one node), and the drain is the rollout's: owner rollout, run RUN, so its Reason is
"[fleetops] rollout/RUN: fleetops driver rollout".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
REASON = "fleetops driver rollout"
RUN = "20261206T071502Z-3f9a"
SLURM_REASON = f"[fleetops] rollout/{RUN}: {REASON}"
DEGRADED = ("node002", 3, "slow-pcie")  # 44 GB/s to the host: under the 48 GB/s floor


def _inventory(fleet: Any, tmp_path: Path) -> Path:
    """The simulator's inventory with its nodes in Slurm (it says fleetops_slurm_managed: false)."""
    doc = yaml.safe_load(Path(fleet.inventory).read_text())
    group = doc["all"]["children"]["sim"]
    assert group["vars"]["fleetops_slurm_managed"] is False
    group["vars"]["fleetops_slurm_managed"] = True
    folder = tmp_path / "inventory"
    folder.mkdir()
    path = folder / "inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _playbook(tmp_path: Path, scontrol: str) -> Path:
    play = [{
        "name": "Upgrade in batches (the rollout's shape)",
        "hosts": "all",
        "order": "sorted",
        "gather_facts": False,
        "serial": 1,
        "max_fail_percentage": 0,
        "vars": {
            "slurm_drain_scontrol": scontrol, "slurm_drain_delegate_to": "localhost", "slurm_drain_wait": False,
            "fleetops_audit_command": os.path.join(BIN, "fleetops"), "fleetops_audit_history": False,
        },
        "tasks": [{
            "name": "Check the node can pass the validation gate before draining it",
            "ansible.builtin.include_tasks": str(REPO / "playbooks" / "tasks" / "driver_rollout_preflight.yml"),
        }, {
            "name": "Check the batch against the partitions' capacity",
            "ansible.builtin.include_role": {"name": "slurm_drain", "tasks_from": "capacity"},
            "vars": {"slurm_drain_capacity_hosts": "{{ ansible_play_batch }}"},
        }, {
            "name": "Upgrade one node",
            "block": [
                {"name": "Drain the node in Slurm", "ansible.builtin.include_role": {"name": "slurm_drain"},
                 "vars": {"slurm_drain_state": "drained", "slurm_drain_owner": "rollout",
                          "slurm_drain_reason": REASON}},
                {"name": "Pass the gates and resume the node",
                 "when": "not (slurm_drain_result.held | default(false))",
                 "ansible.builtin.include_tasks": str(REPO / "playbooks" / "tasks" / "driver_rollout_resume.yml")},
            ],
            "rescue": [{"name": "Leave the failed node drained and name it", "ansible.builtin.fail": {
                "msg": "ROLLOUT FAILED on {{ inventory_hostname }} at "
                       "\"{{ ansible_failed_task.name | default('?') }}\": {{ ansible_failed_result.msg }}"}}],
        }],
    }]
    path = tmp_path / "gate.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def _run(inventory: Path, slurm: Any, book: Path, driver: str,
         check: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""), **slurm.env())
    argv = [os.path.join(BIN, "ansible-playbook"), "-v", "-i", str(inventory), str(book),
            "-e", json.dumps({"fleetops_rollout_driver_version": driver}), "-e", f"fleetops_run_id={RUN}"]
    if check:
        argv.append("--check")
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.mark.root
def test_a_degraded_node_stays_drained_is_named_and_stops_the_rollout(sim_fleet, fake_slurm,
                                                                       tmp_path: Path) -> None:
    fleet = sim_fleet
    node, gpu, fault = DEGRADED
    path = str(fleet.state_path(node))
    state = sim.read_state(path)
    sim.inject_validation_fault(state, fault, gpu)
    sim.write_state(path, state)
    uuid = state["gpus"][gpu]["uuid"]
    driver = str(state["node"]["driver_version"])
    slurm = fake_slurm
    slurm.set({n: {"state": "MIXED", "partitions": ["gpu"]} for n in fleet.nodes})
    inventory = _inventory(fleet, tmp_path)
    book = _playbook(tmp_path, str(slurm.scontrol))

    # check mode: says it would validate, drains nothing, changes no node
    before = fleet.state_bytes()
    check = _run(inventory, slurm, book, driver, check=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("would validate (quick) and judge against the floors") == 3, check.stdout
    assert fleet.state_bytes() == before
    assert {n: v["state"] for n, v in slurm.nodes().items()} == {n: "MIXED" for n in fleet.nodes}
    assert slurm.updates() == []

    real = _run(inventory, slurm, book, driver)
    out = real.stdout + real.stderr
    assert real.returncode == 2, out  # ansible-playbook: a host failed
    nodes = slurm.nodes()
    # node001 passed both gates and is back; node002 failed validation and stays drained under
    # this run's rollout Reason; the rollout stopped there (max_fail_percentage 0), so node003
    # was never drained
    assert nodes["node001"]["state"] == "MIXED" and "reason" not in nodes["node001"]
    assert nodes["node002"]["state"] == "MIXED+DRAIN" and nodes["node002"]["reason"] == SLURM_REASON
    assert nodes["node003"] == {"state": "MIXED", "partitions": ["gpu"]}
    assert slurm.updates() == [
        ["update", "NodeName=node001", "State=DRAIN", f"Reason={SLURM_REASON}"],
        ["update", "NodeName=node001", "State=RESUME"],
        ["update", "NodeName=node002", "State=DRAIN", f"Reason={SLURM_REASON}"],
    ]
    failed = [line for line in out.splitlines() if "ROLLOUT FAILED on node002" in line]
    assert failed, out
    assert "Validate the node's GPUs against their floors" in failed[0]
    assert f"GPU {gpu} {uuid}" in failed[0] and "h2d_gbps" in failed[0] and "floor 48.0" in failed[0]
    assert "ROLLOUT FAILED on node001" not in out and "node003" not in out.split("PLAY RECAP")[0]


@pytest.mark.root
def test_a_node_without_a_validation_backend_is_refused_before_it_is_drained(sim_fleet, fake_slurm,
                                                                            tmp_path: Path) -> None:
    """node002's inventory gives its agent CuPy (fleetops_agent_validate_backend: cupy), which its
    Python does not have: the preflight refuses it while it is still in service, saying what to
    install; node001 (the simulator answers its auto backend) is upgraded first, and the rollout
    stops at node002 (max_fail_percentage 0), so node003 is never touched."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the simulated node would have the backend")
    fleet = sim_fleet
    driver = str(sim.read_state(str(fleet.state_path("node001")))["node"]["driver_version"])
    slurm = fake_slurm
    slurm.set({n: {"state": "MIXED", "partitions": ["gpu"]} for n in fleet.nodes})
    inventory = _inventory(fleet, tmp_path)
    book = _playbook(tmp_path, str(slurm.scontrol))
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "node002.yml").write_text(yaml.safe_dump({"fleetops_agent_validate_backend": "cupy"}))
    before = fleet.state_bytes()

    check = _run(inventory, slurm, book, driver, check=True)  # the probe reads only: check mode refuses too
    assert check.returncode == 2, check.stdout + check.stderr
    assert "ROLLOUT REFUSED on node002 before draining" in check.stdout

    real = _run(inventory, slurm, book, driver)
    out = real.stdout + real.stderr
    assert real.returncode == 2, out
    refused = [line for line in out.splitlines() if "ROLLOUT REFUSED on node002 before draining" in line]
    assert refused, out
    assert "--backend cupy: cupy is not installed" in refused[0] and "CuPy" in refused[0]
    assert "fleetops_agent_validate_backend" in refused[0] and "The node was not drained" in refused[0]
    # node001 drained under this run's rollout Reason and resumed; node002 never drained
    assert slurm.updates() == [
        ["update", "NodeName=node001", "State=DRAIN", f"Reason={SLURM_REASON}"],
        ["update", "NodeName=node001", "State=RESUME"],
    ]
    nodes = slurm.nodes()
    assert {n: v["state"] for n, v in nodes.items()} == {n: "MIXED" for n in fleet.nodes}, nodes
    assert not [n for n, v in nodes.items() if "reason" in v], nodes
    assert "ROLLOUT FAILED" not in out and "node003" not in out.split("PLAY RECAP")[0]
    assert fleet.state_bytes() == before  # validation reads; nothing on any node changed


def test_the_rollout_runs_the_gate_inside_its_block_before_resuming() -> None:
    node_tasks = yaml.safe_load((REPO / "playbooks" / "tasks" / "driver_rollout_node.yml").read_text())
    names = [t.get("name") for t in node_tasks]
    preflight = names.index("Check the node can pass the validation gate before draining it")
    assert preflight < names.index("Upgrade a node that differs from the pins")
    assert node_tasks[preflight]["ansible.builtin.include_tasks"] == "driver_rollout_preflight.yml"
    [probe] = yaml.safe_load((REPO / "playbooks" / "tasks" / "driver_rollout_preflight.yml").read_text())
    assert probe["block"][0]["ansible.builtin.include_role"] == {"name": "fleetops_audit",
                                                                  "tasks_from": "validate_probe"}
    # the batch's capacity check before the block, outside it (a refused batch has nothing to restore)
    capacity = names.index("Check the batch against the partitions' capacity")
    assert preflight < capacity < names.index("Upgrade a node that differs from the pins")
    assert node_tasks[capacity]["ansible.builtin.include_role"] == {"name": "slurm_drain", "tasks_from": "capacity"}
    [upgrade] = [t for t in node_tasks if t.get("name") == "Upgrade a node that differs from the pins"]
    # inside the block: the rollout's own drain, then (unless another owner's drain holds the
    # node) the upgrade, whose last step is the tail: the gates and the resume
    order = [t["name"] for t in upgrade["block"]]
    steps = {t["name"]: t for t in upgrade["block"]}
    drain = steps["Drain the node in Slurm"]
    assert drain["ansible.builtin.include_role"] == {"name": "slurm_drain"}
    assert drain["vars"]["slurm_drain_state"] == "drained" and drain["vars"]["slurm_drain_owner"] == "rollout"
    drained = steps["Upgrade the drained node"]
    assert drained["when"] == "not (slurm_drain_result.held | default(false))"
    assert order.index("Drain the node in Slurm") < order.index("Upgrade the drained node")
    assert drained["block"][-1]["ansible.builtin.include_tasks"] == "driver_rollout_resume.yml"
    assert "Leave the failed node drained and name it" in [t["name"] for t in upgrade["rescue"]]
    tail = yaml.safe_load((REPO / "playbooks" / "tasks" / "driver_rollout_resume.yml").read_text())
    names = [t["name"] for t in tail]
    assert names == ["Pass the audit gate", "Pass the validation gate", "Resume the node in Slurm"]
    assert tail[2]["vars"]["slurm_drain_state"] == "resumed" and tail[2]["vars"]["slurm_drain_owner"] == "rollout"
    gate = tail[1]["ansible.builtin.include_role"]
    assert gate == {"name": "fleetops_audit", "tasks_from": "validate"}
    assert "when" not in tail[1]  # it runs in check mode too, to say it would validate


@pytest.mark.root
def test_fleetops_validate_probe_names_the_node_without_a_backend_and_what_to_install(sim_fleet,
                                                                                    tmp_path: Path) -> None:
    """`fleetops validate --probe`: the same question from the controller, over SSH; the
    inventory's fleetops_agent_validate_backend is the backend asked for, as in the gate."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the simulated node would have the backend")
    inv = tmp_path / "inventory"
    (inv / "host_vars").mkdir(parents=True)
    shutil.copy(sim_fleet.inventory, inv / "inventory.yml")
    (inv / "host_vars" / "node002.yml").write_text(yaml.safe_dump({"fleetops_agent_validate_backend": "cupy"}))
    fleetops = os.path.join(BIN, "fleetops")
    done = subprocess.run([fleetops, "validate", "-i", str(inv), "--probe"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:-1]}
    assert rows["node001"].split()[1] == "sim" and rows["node003"].split()[1] == "sim"
    assert rows["node002"].split()[1] == "none"
    assert "--backend cupy: cupy is not installed" in rows["node002"] and "CuPy" in rows["node002"]
    assert done.stdout.splitlines()[-1] == "2 node(s) can be validated; 1 without a backend; 0 without an answer"
    as_json = subprocess.run([fleetops, "validate", "-i", str(inv), "--probe", "--format", "json"],
                             capture_output=True, text=True, timeout=120, check=False)
    doc = json.loads(as_json.stdout)
    assert doc["missing"] == ["node002"] and doc["unreachable"] == {}
    assert doc["nodes"]["node001"]["picked"] == "sim" and doc["nodes"]["node002"]["asked"] == "cupy"
