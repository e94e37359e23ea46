"""fleetops from its wheel alone, as a new user gets it (wheel_venv.py: a fresh venv with the
built wheel installed and no checkout on sys.path): it finds the collection inside itself and runs
`fleetops apply power --check` against a loopback simulated fleet, with the playbooks, roles and
fleetops.gpu modules the wheel carries. The fleet is started by the new venv's own
`fleetops sim up`, so the nodes run its fleetops-agent too.

The driver rollout from the wheel runs against the realistic tier's systemd-nspawn hosts
(test_ansible_realistic.py): the package roles refuse loopback simulated nodes, which share the
controller's file system (test_ansible_simfleet.py shows that refusal).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from wheel_venv import WheelVenv, ok

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ADDRESS = os.environ.get("FLEETOPS_ANSIBLE_TEST_ADDRESS", "127.0.46.1")
DRIFTED = ("node002", 3)  # the node and GPU whose power cap drifts
NODES = ["node001", "node002", "node003"]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    from fleetops.sim import fleet

    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Fresh:
    """The new venv and the fleet it started."""

    wheel: WheelVenv
    fleet: Path

    @property
    def base(self) -> Path:
        return self.wheel.base

    @property
    def venv(self) -> Path:
        return self.wheel.venv

    def fleetops(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.wheel.fleetops(*args)

    @property
    def inventory(self) -> str:
        return str(self.fleet / "inventory.yml")

    def states(self) -> dict[str, bytes]:
        return {n: (self.fleet / "state" / f"{n}.json").read_bytes() for n in NODES}


@pytest.fixture(scope="module")
def fresh(wheel_venv: WheelVenv):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    fleet = wheel_venv.base / "sim-fleet"
    made = Fresh(wheel_venv, fleet)
    port = str(_free_port(ADDRESS))
    ok(
        made.fleetops(
            "sim", "up", "--nodes", "3", "--dir", str(fleet), "--first-address", ADDRESS, "--port", port
        )
    )
    try:
        yield made
    finally:
        made.fleetops("sim", "down", "--dir", str(fleet))


def test_the_new_venv_imports_fleetops_and_finds_the_collection_inside_itself(fresh: Fresh) -> None:
    probe = (
        "import json, sys, fleetops; from fleetops.rollout import runner; root = runner.ansible_dir(); "
        "print(json.dumps({'file': fleetops.__file__, 'root': str(root), "
        "'collections': str(runner.collections_dir(root)), 'path': sys.path}))"
    )
    seen = json.loads(fresh.wheel.python(probe))
    venv = str(fresh.venv)
    assert seen["file"].startswith(venv + "/"), seen["file"]
    assert seen["root"].startswith(venv + "/") and seen["root"].endswith("ansible_collections/fleetops/gpu")
    assert seen["collections"].startswith(venv + "/") and seen["collections"].endswith("fleetops/collections")
    assert not [p for p in seen["path"] if p and Path(p).resolve() == REPO], seen["path"]
    root = Path(seen["root"])
    assert (root / "plugins" / "module_utils" / "agent.py").is_file() and (root / "MANIFEST.json").is_file()
    assert not (root / "tests").exists() and not (root / "fleetops").exists()


def test_apply_power_check_reports_the_drifted_gpu_and_changes_nothing(fresh: Fresh) -> None:
    node, gpu = DRIFTED
    ok(fresh.fleetops("sim", "inject", "--dir", str(fresh.fleet), "--gpu", str(gpu), node, "power-cap-drift"))
    before = fresh.states()
    artifacts = fresh.base / "apply-artifacts"
    done = fresh.fleetops("apply", "power", "-i", fresh.inventory, "--check", "--artifacts", str(artifacts))
    out = ok(done)
    assert out.startswith("CHECK (nothing is changed)"), out[:500]
    cap_lines = [line for line in out.splitlines() if "Set the GPU power cap" in line and "WOULD CHANGE" in line]
    assert len(cap_lines) == 1 and node in cap_lines[0], out
    assert f"would change 1 of 8 GPUs ({gpu}: 500 W)" in cap_lines[0], cap_lines
    # a fleet never converged, at the GPUs' default cap: a reboot keeps that cap, so no node needs a
    # boot-time unit and only the drifted node would change
    summary = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("node00")}
    assert summary == {n: "would" if n == node else "ok" for n in NODES}, out  # "would change"
    assert fresh.states() == before, "check mode changed a node's state"
    assert not [n for n in NODES if (fresh.fleet / "state" / f"{n}.systemd").exists()]
    ran = [
        e["event_data"]
        for e in WheelVenv.events(artifacts)
        if e["event"] == "runner_on_ok"
        and e["event_data"].get("resolved_action") == "fleetops.gpu.fleetops_gpu_set"
    ]
    assert {e["host"] for e in ran} == set(NODES)
    assert all(e["task_path"].startswith(str(fresh.venv) + "/") for e in ran), [e["task_path"] for e in ran]
