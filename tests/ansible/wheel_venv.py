"""fleetops from its wheel alone, as a new user gets it: the built wheel installed into a fresh
virtual environment with no checkout on its sys.path, so its `fleetops` runs the playbooks, roles
and fleetops.gpu modules that the wheel carries.

Nothing is fetched: the wheel is built with this environment's setuptools (no build isolation)
and installed with --no-index --no-deps; the dependencies come from this environment through a
.pth file, and their console scripts (ansible-playbook, ...) are written into the new venv's bin as
pip would write them.

Shared by the tests that run the installed `fleetops` (test_installed_wheel.py against loopback
simulated nodes, test_ansible_realistic.py against systemd-nspawn hosts) through the
session-scoped ``wheel_venv`` fixture of this folder's conftest.py: one build per test session.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The dependencies whose console scripts a run needs (ansible-runner starts ansible-playbook).
SCRIPTS_OF = ("ansible-core", "ansible-runner")


def skip_reason() -> str | None:
    version = importlib.metadata.version("setuptools")
    if tuple(int(p) for p in version.split(".")[:2]) < (70, 1):
        return f"setuptools {version} has no built-in bdist_wheel to build offline: pip install -e '.[test]'"
    return None


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (
        f"{done.args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@dataclass
class WheelVenv:
    """The new venv; ``env`` is the environment its commands run in (its bin first on PATH, no
    PYTHON*, ANSIBLE_* or VIRTUAL_ENV of the test's own environment, a home of its own)."""

    base: Path
    venv: Path
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def fleetops(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run([self.bin("fleetops"), *args], self.base, self.env)

    def python(self, code: str) -> str:
        return ok(run([self.bin("python"), "-c", code], self.base, self.env))

    def under_venv(self, path: str) -> bool:
        return path.startswith(str(self.venv) + "/")

    @staticmethod
    def events(artifacts: Path) -> list[dict[str, Any]]:
        """ansible-runner's job events of every run whose artifacts went to ``artifacts``."""
        return [json.loads(p.read_text()) for p in sorted(artifacts.glob("artifacts/*/job_events/*.json"))]


def build(base: Path) -> WheelVenv:
    """Build the checkout's wheel and install it into a new venv under ``base``."""
    wheels = base / "wheels"
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
            "-w", str(wheels), str(REPO)], base))  # fmt: skip
    [wheel] = sorted(wheels.glob("fleetops-*.whl"))
    venv = base / "venv"
    ok(run([sys.executable, "-m", "venv", str(venv)], base))
    python = venv / "bin" / "python"
    ok(run([str(python), "-m", "pip", "install", "--no-index", "--no-deps", "-q", str(wheel)], base))
    # Only now the dependencies: with them on its path before, pip would find this environment's
    # fleetops and want to replace it.
    site = Path(
        ok(
            run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base)
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
    return WheelVenv(base, venv, env)
