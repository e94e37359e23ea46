"""``fleetops-agent validate --probe`` as a real subprocess: the question the rollout asks before
it drains a node. The agent's interpreter here has neither torch nor CuPy (this venv); a stand-in
``torch`` package on PYTHONPATH and a stand-in ``dcgmi`` on PATH play a node that has them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.sim import gpu as sim

ROOT = Path(__file__).resolve().parents[2]


def _probe(tmp_path: Path, *args: str, torch_cuda: bool | None = None, dcgmi: bool = False,
           ) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
    """Exit code, the report on stdout, the error line on stderr (None without one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETOPS_SIM_STATE", "PYTHONPATH")}
    paths = [str(ROOT)]
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    if torch_cuda is not None:
        pkg = tmp_path / "site" / "torch"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            "class cuda:\n"
            f"    @staticmethod\n    def is_available():\n        return {torch_cuda}\n"
        )
        paths.append(str(tmp_path / "site"))
    if dcgmi:
        tool = bindir / "dcgmi"
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(bindir), "/usr/bin", "/bin"])
    proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", "validate", "--probe", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    return proc.returncode, json.loads(proc.stdout), (lines[-1] if lines else None)


def test_a_node_without_any_backend_is_refused_naming_what_to_install(tmp_path: Path) -> None:
    rc, doc, error = _probe(tmp_path)
    assert rc == 1
    assert doc["kind"] == "validate-probe" and doc["picked"] is None
    assert {n: b["usable"] for n, b in doc["backends"].items()} == {"torch": False, "cupy": False, "dcgm": False}
    assert doc["backends"]["torch"]["why_not"] == "torch is not installed"
    assert doc["backends"]["dcgm"]["why_not"] == "dcgmi (DCGM) is not on PATH"
    assert error is not None and error["kind"] == "backend"
    for needed in ("PyTorch", "CuPy", "DCGM", "fleetops_agent_validate_backend"):
        assert needed in error["error"] and needed in doc["install"]


def test_torch_without_a_cuda_device_is_not_a_backend(tmp_path: Path) -> None:
    rc, doc, error = _probe(tmp_path, torch_cuda=False)
    assert rc == 1 and doc["picked"] is None
    assert doc["backends"]["torch"] == {"usable": False, "why_not": "torch has no CUDA device"}
    assert error is not None and "install one of" in error["error"]


def test_the_probe_picks_what_validate_would_run(tmp_path: Path) -> None:
    rc, doc, error = _probe(tmp_path, torch_cuda=True, dcgmi=True)
    assert rc == 0 and error is None
    assert doc["picked"] == "torch" and doc["install"] is None
    assert doc["backends"]["torch"]["usable"] and doc["backends"]["dcgm"]["usable"]
    rc, doc, _ = _probe(tmp_path / "dcgm-only", dcgmi=True)
    assert rc == 0 and doc["picked"] == "dcgm" and not doc["backends"]["torch"]["usable"]


def test_an_explicit_backend_that_is_missing_names_only_itself(tmp_path: Path) -> None:
    rc, doc, error = _probe(tmp_path, "--backend", "cupy", dcgmi=True)
    assert rc == 1 and doc["asked"] == "cupy" and doc["picked"] is None
    assert doc["backends"]["dcgm"]["usable"]  # usable, but not what was asked for
    assert error is not None and error["error"].startswith("--backend cupy: cupy is not installed")
    assert "CuPy" in doc["install"] and "PyTorch" not in doc["install"] and "DCGM" not in doc["install"]


def test_a_simulated_node_validates_with_the_simulator(tmp_path: Path) -> None:
    path = tmp_path / "node001.json"
    sim.write_state(str(path), sim.build_state("node001"))
    rc, doc, error = _probe(tmp_path, "--state", str(path))
    assert rc == 0 and error is None and doc["picked"] == "sim"
    assert doc["backends"]["sim"] == {"usable": True, "why_not": None}


@pytest.mark.parametrize("broken", ["raise RuntimeError('libcudart.so.12: cannot open shared object file')"])
def test_a_backend_that_breaks_on_import_is_a_reason_not_a_traceback(tmp_path: Path, broken: str) -> None:
    pkg = tmp_path / "site" / "cupy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(broken + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETOPS_SIM_STATE", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path / "site")])
    env["PATH"] = "/usr/bin:/bin"
    proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", "validate", "--probe"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backends"]["cupy"]["usable"] is False
    assert "RuntimeError" in doc["backends"]["cupy"]["why_not"] and "libcudart" in doc["backends"]["cupy"]["why_not"]
    assert "Traceback" not in proc.stderr
