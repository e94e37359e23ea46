"""fleetops from its wheel alone, as a new user gets it: a fresh virtual environment with the built
wheel installed and no checkout on sys.path runs `fleetops rollout driver --check` and
`fleetops apply power --check` against a simulated fleet, with the playbooks, roles and
fleetops.gpu modules the wheel carries.

Nothing is fetched: the wheel is built with this environment's setuptools (no build isolation)
and installed with --no-index --no-deps; the dependencies come from this environment through a
.pth file, and their console scripts (ansible-playbook, ...) are written into the new venv's bin as
pip would write them. The fleet is started by the new venv's own `fleetops sim up`, so the nodes
run its fleetops-agent too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetops.rollout.cli import EXIT_HOSTS_FAILED

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ADDRESS = os.environ.get("FLEETOPS_ANSIBLE_TEST_ADDRESS", "127.0.46.1")
# The dependencies whose console scripts a run needs (ansible-runner starts ansible-playbook).
SCRIPTS_OF = ("ansible-core", "ansible-runner")
DRIFTED = ("node002", 3)  # the node and GPU whose power cap drifts
NODES = ["node001", "node002", "node003"]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes"
    from fleetops.sim import fleet

    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    version = importlib.metadata.version("setuptools")
    if tuple(int(p) for p in version.split(".")[:2]) < (70, 1):
        return f"setuptools {version} has no built-in bdist_wheel to build offline: pip install -e '.[test]'"
    return None


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (
        f"{done.args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Fresh:
    """The new venv and the fleet it started."""

    base: Path
    venv: Path
    env: dict[str, str]
    fleet: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def fleetops(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([self.bin("fleetops"), *args], self.base, self.env)

    @property
    def inventory(self) -> str:
        return str(self.fleet / "inventory.yml")

    def states(self) -> dict[str, bytes]:
        return {n: (self.fleet / "state" / f"{n}.json").read_bytes() for n in NODES}

    def events(self, artifacts: Path) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(artifacts.glob("artifacts/*/job_events/*.json"))]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("fresh-wheel")
    wheels = base / "wheels"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "-w", str(wheels), str(REPO)], base))  # fmt: skip
    [wheel] = sorted(wheels.glob("fleetops-*.whl"))
    venv = base / "venv"
    _ok(_run([sys.executable, "-m", "venv", str(venv)], base))
    python = venv / "bin" / "python"
    _ok(_run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "-q", str(wheel)], base))
    # Only now the dependencies: with them on its path before, pip would find this environment's
    # fleetops and want to replace it.
    site = Path(
        _ok(
            _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base)
        ).strip()
    )
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "fleetops_test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    for dist in SCRIPTS_OF:
        for entry in importlib.metadata.distribution(dist).entry_points:
            if entry.group == "console_scripts":
                module, func = entry.value.split(":")
                script = venv / "bin" / entry.name
                script.write_text(
                    f"#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"
                )
                script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ANSIBLE_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", HOME=str(base / "home"))
    (base / "home").mkdir()
    fleet = base / "fleet"
    made = Fresh(base, venv, env, fleet)
    port = str(_free_port(ADDRESS))
    _ok(
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
    seen = json.loads(_ok(_run([fresh.bin("python"), "-c", probe], fresh.base, fresh.env)))
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
    _ok(
        fresh.fleetops("sim", "inject", "--dir", str(fresh.fleet), "--gpu", str(gpu), node, "power-cap-drift")
    )
    before = fresh.states()
    artifacts = fresh.base / "apply-artifacts"
    done = fresh.fleetops("apply", "power", "-i", fresh.inventory, "--check", "--artifacts", str(artifacts))
    out = _ok(done)
    assert out.startswith("CHECK (nothing is changed)"), out[:500]
    cap_lines = [line for line in out.splitlines() if "Set the GPU power cap" in line and "CHANGED" in line]
    assert len(cap_lines) == 1 and node in cap_lines[0], out
    assert f"would change 1 of 8 GPUs ({gpu}: 500 W)" in cap_lines[0], cap_lines
    # a fleet never converged, at the GPUs' default cap: a reboot keeps that cap, so no node needs a
    # boot-time unit and only the drifted node would change
    summary = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("node00")}
    assert summary == {n: "changed" if n == node else "ok" for n in NODES}, out
    assert fresh.states() == before, "check mode changed a node's state"
    assert not [n for n in NODES if (fresh.fleet / "state" / f"{n}.systemd").exists()]
    ran = [
        e["event_data"]
        for e in fresh.events(artifacts)
        if e["event"] == "runner_on_ok"
        and e["event_data"].get("resolved_action") == "fleetops.gpu.fleetops_gpu_set"
    ]
    assert {e["host"] for e in ran} == set(NODES)
    assert all(e["task_path"].startswith(str(fresh.venv) + "/") for e in ran), [e["task_path"] for e in ran]


def test_rollout_driver_check_runs_the_canary_from_the_wheel_and_stops_at_the_loopback_refusal(
    fresh: Fresh,
) -> None:
    """The canary goes through the installed playbook up to the driver role, which refuses a
    loopback node (it shares the controller's file system); the run stops there, as documented."""
    before = fresh.states()
    artifacts = fresh.base / "rollout-artifacts"
    done = fresh.fleetops(
        "rollout",
        "driver",
        "--version",
        "580.159.04",
        "-i",
        fresh.inventory,
        "--check",
        "--artifacts",
        str(artifacts),
    )
    out = done.stdout
    assert done.returncode == EXIT_HOSTS_FAILED, out[-3000:] + done.stderr[-3000:]
    assert out.startswith("CHECK (nothing is changed): roll out NVIDIA driver 580.159.04"), out[:500]
    assert "FAILED: node001" in out and "NOT REACHED (run stopped): node002, node003" in out, out
    assert "node001 is a loopback simulated node" in out
    assert fresh.states() == before
    facts = [
        e["event_data"]
        for e in fresh.events(artifacts)
        if e["event"] == "runner_on_ok"
        and e["event_data"].get("resolved_action") == "fleetops.gpu.fleetops_gpu_facts"
    ]
    assert [e["host"] for e in facts] == ["node001"]
    assert facts[0]["task_path"].startswith(str(fresh.venv) + "/"), facts[0]["task_path"]
    assert len(facts[0]["res"]["ansible_facts"]["fleetops_gpu"]) == 8
