"""The fleetops_agent role's validation backend (tasks/validate_backend.yml) through the real
ansible-playbook over SSH on a simulated node.

The role refuses to install packages on a loopback node (it shares this machine's file system),
so this drives the backend's own task file against a virtualenv made for the test: the switch
for the system's site-packages (system-torch) follows the inventory both ways and is idempotent,
and the check after it is the agent's own ``validate --probe`` (this machine's Python has no
PyTorch, so system-torch is refused naming what to install; a ``dcgmi`` on PATH satisfies dcgm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
AGENT = os.path.join(BIN, "fleetops-agent")


def _run(fleet: Any, tmp_path: Path, backend: str, path: str, check: bool = False,
         extra: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    play = [{
        "name": "Give the agent its validation backend",
        "hosts": "node001",
        "gather_facts": False,
        "environment": {"PATH": path},
        "tasks": [{
            "name": "Validation backend",
            "ansible.builtin.include_role": {"name": "fleetops_agent", "tasks_from": "validate_backend"},
            "vars": {"fleetops_agent_venv": str(tmp_path / "venv"), "fleetops_agent_link": AGENT,
                     "fleetops_agent_validate_backend": backend, **(extra or {})},
        }],
    }]
    book = tmp_path / "backend.yml"
    book.write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    argv = [os.path.join(BIN, "ansible-playbook"), "-v", "-i", fleet.inventory, str(book)]
    if check:
        argv.append("--check")
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False,
                          stdin=subprocess.DEVNULL)


def _site_packages(tmp_path: Path) -> str:
    lines = (tmp_path / "venv" / "pyvenv.cfg").read_text().splitlines()
    return next(line for line in lines if line.startswith("include-system-site-packages"))


def _changed(done: subprocess.CompletedProcess[str]) -> int:
    recap = done.stdout.split("PLAY RECAP")[-1]
    return int(recap.split("changed=")[1].split()[0])


def test_system_torch_opens_the_venv_to_the_system_and_is_refused_without_pytorch(sim_fleet: Any,
                                                                                   tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=False)
    assert _site_packages(tmp_path) == "include-system-site-packages = false"
    path = os.pathsep.join([BIN, "/usr/sbin", "/usr/bin", "/sbin", "/bin"])

    check = _run(sim_fleet, tmp_path, "system-torch", path, check=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert _changed(check) == 1 and _site_packages(tmp_path) == "include-system-site-packages = false"

    done = _run(sim_fleet, tmp_path, "system-torch", path)
    out = done.stdout + done.stderr
    # the switch is made, then the agent's probe finds no PyTorch here and says what to install
    assert _site_packages(tmp_path) == "include-system-site-packages = true"
    assert done.returncode == 2, out
    assert "no validation backend on this node (--backend torch: torch is not installed)" in out
    assert "PyTorch with CUDA" in out and "system-torch" in out

    back = _run(sim_fleet, tmp_path, "none", path)
    assert back.returncode == 0, back.stdout + back.stderr
    assert _changed(back) == 1 and _site_packages(tmp_path) == "include-system-site-packages = false"
    again = _run(sim_fleet, tmp_path, "none", path)
    assert again.returncode == 0 and _changed(again) == 0, again.stdout


def test_dcgm_is_checked_on_the_node(sim_fleet: Any, tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=False)
    plain = os.pathsep.join([BIN, "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    done = _run(sim_fleet, tmp_path, "dcgm", plain)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--backend dcgm: dcgmi (DCGM) is not on PATH" in done.stdout and "install one of: dcgm" in done.stdout

    tools = tmp_path / "dcgm-bin"
    tools.mkdir()
    (tools / "dcgmi").write_text("#!/bin/sh\nexit 0\n")
    (tools / "dcgmi").chmod(0o755)
    done = _run(sim_fleet, tmp_path, "dcgm", os.pathsep.join([str(tools), plain]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validation backend dcgm" in done.stdout
    assert _site_packages(tmp_path) == "include-system-site-packages = false"


def _purelib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return Path(out.strip())


def test_system_torch_finds_pytorch_in_a_system_python_that_is_itself_a_virtualenv(sim_fleet: Any,
                                                                                    tmp_path: Path) -> None:
    """A node image whose python3 is a virtualenv holding PyTorch: a virtualenv made from it
    with the system's site-packages sees its base interpreter's packages, not PyTorch. The role
    asks that Python where its PyTorch is and points the agent's virtualenv there."""
    system = tmp_path / "system-python"
    venv.create(system, with_pip=False)
    torch = _purelib(system / "bin" / "python") / "torch"
    torch.mkdir()
    (torch / "__init__.py").write_text(
        "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n")
    venv.create(tmp_path / "venv", with_pip=False)
    agent_python = tmp_path / "venv" / "bin" / "python"
    path = os.pathsep.join([BIN, "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    extra = {"fleetops_agent_validate_torch_python": str(system / "bin" / "python"),
             "fleetops_agent_validate_verify": False}

    done = _run(sim_fleet, tmp_path, "system-torch", path, extra=extra)
    assert done.returncode == 0, done.stdout + done.stderr
    pointer = _purelib(agent_python) / "fleetops-system-torch.pth"
    assert pointer.read_text() == f"{torch.parent}\n"
    # the agent's own interpreter, as validate runs it, now picks that PyTorch
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETOPS_SIM_STATE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    probe = subprocess.run([str(agent_python), "-m", "fleetops.agent.main", "validate", "--probe"],
                           capture_output=True, text=True, env=env, timeout=60, check=False)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert json.loads(probe.stdout)["picked"] == "torch"
    again = _run(sim_fleet, tmp_path, "system-torch", path, extra=extra)
    assert again.returncode == 0 and _changed(again) == 0, again.stdout

    back = _run(sim_fleet, tmp_path, "none", path, extra=extra)
    assert back.returncode == 0, back.stdout + back.stderr
    assert not pointer.exists()
