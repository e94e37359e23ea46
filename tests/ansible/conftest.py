"""Fixtures for the Ansible half: module loading, fake scontrol/nvfwupd, a small simulated fleet.

Tests that start sshd are marked ``root``; where root or sshd is missing they skip with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "plugins" / "modules"
# The modules import their shared helper as the collection's
# ``ansible_collections.fleetops.gpu.plugins.module_utils``; .collections links the checkout in as
# that collection, so the tests load the modules in-process as Ansible does on the node.
COLLECTIONS = REPO / ".collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.append(str(COLLECTIONS))
AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
# An address block of its own: the audit tests use 127.0.20.x, the demo 127.0.10.x.
FLEET_FIRST_ADDRESS = os.environ.get("FLEETOPS_ANSIBLE_TEST_ADDRESS", "127.0.46.1")


def load_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"fleetops_test_{name}", LIBRARY / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory):
    """The checkout's wheel installed into a fresh venv (wheel_venv.py); built once per session
    for the test files that run the installed `fleetops`."""
    import wheel_venv as wv

    reason = wv.skip_reason()
    if reason:
        pytest.skip(reason)
    return wv.build(tmp_path_factory.mktemp("fresh-wheel"))


@pytest.fixture
def library_module():
    """Load a module from plugins/modules (tests import no conftest by name: several
    conftest.py files exist and which one `import conftest` finds depends on test order)."""
    return load_module


@pytest.fixture
def run_module(capsys: pytest.CaptureFixture[str]):
    """Run one of the collection's modules in-process: returns (exit code, result dict)."""
    from ansible.module_utils.testing import patch_module_args

    def run(
        name: str, args: dict[str, Any], check: bool = False, diff: bool = False
    ) -> tuple[int, dict[str, Any]]:
        module = load_module(name)
        full = dict(args)
        full["_ansible_check_mode"] = check
        full["_ansible_diff"] = diff
        capsys.readouterr()
        with patch_module_args(full), pytest.raises(SystemExit) as stop:
            module.main()
        out = capsys.readouterr().out
        return int(stop.value.code or 0), json.loads(out)

    return run


@pytest.fixture
def sim_state(tmp_path: Path) -> str:
    from fleetops.sim import gpu as sim

    path = str(tmp_path / "node001.json")
    sim.init_state(path, "node001")
    return path


@pytest.fixture
def fake_slurm(tmp_path: Path):
    """The strict stand-in scontrol (tests/fake_scontrol.py): ``FakeSlurm`` in tmp_path/slurm.
    Give it nodes with ``.set(...)`` (or ``fake_scontrol.cluster``), its ``.env()`` to the
    process that runs it, ``.scontrol`` as the command; ``.calls()``/``.updates()`` read its log
    (one JSON argv per line)."""
    import fake_scontrol

    folder = tmp_path / "slurm"
    folder.mkdir()
    return fake_scontrol.FakeSlurm(folder)


# --- the simulated fleet ------------------------------------------------------------------


def fleet_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    from fleetops.sim import fleet

    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


@dataclass
class Fleet:
    directory: Path
    nodes: list[str]
    artifacts: Path

    @property
    def inventory(self) -> str:
        return str(self.directory / "inventory.yml")

    def state_path(self, node: str) -> Path:
        return self.directory / "state" / f"{node}.json"

    def state_bytes(self) -> dict[str, bytes]:
        return {n: self.state_path(n).read_bytes() for n in self.nodes}

    def inject(self, node: str, fault: str, gpu: int | None = None) -> None:
        from fleetops.sim import fleet

        fleet.inject(str(self.directory), node, fault, gpu)

    def collect(self, node: str) -> dict[str, Any]:
        import subprocess

        done = subprocess.run(
            [AGENT, "collect", "--backend", "sim", "--state", str(self.state_path(node))],
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory):
    reason = fleet_skip_reason()
    if reason:
        pytest.skip(reason)
    from fleetops.sim import fleet

    directory = tmp_path_factory.mktemp("ansible-fleet")
    port = free_port(FLEET_FIRST_ADDRESS)
    info = fleet.up(3, str(directory), first_address=FLEET_FIRST_ADDRESS, port=port)
    try:
        yield Fleet(directory, sorted(info["nodes"]), tmp_path_factory.mktemp("runner"))
    finally:
        fleet.down(str(directory))
