"""The collection's set and MIG modules take an answer only from the backend their plan came
from: ``fleetops_gpu_mig`` compares each apply with its dry run, ``fleetops_gpu_set`` its change
with the fresh collect that verifies it. The agent is the real one on a simulated node, behind a
wrapper that makes the later answer come from NVML, as when the node's agent changed backend
between the plan and the action (a stray FLEETOPS_SIM_STATE set or cleared)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")

WRAPPER = """#!{python}
import json, subprocess, sys
argv = sys.argv[1:]
proc = subprocess.run([{agent!r}, *argv], capture_output=True, text=True, check=False)
out = proc.stdout
later = (argv[:2] == ["mig", "apply"] and "--dry-run" not in argv) or argv[:1] == ["collect"]
if later and out.strip():
    doc = json.loads(out)
    doc["backend"] = "nvml"
    out = json.dumps(doc) + "\\n"
sys.stdout.write(out)
sys.stderr.write(proc.stderr)
sys.exit(proc.returncode)
"""


@pytest.fixture
def switching_agent(tmp_path: Path) -> str:
    path = tmp_path / "fleetops-agent"
    path.write_text(WRAPPER.format(python=sys.executable, agent=AGENT))
    path.chmod(0o755)
    return str(path)


def test_a_mig_apply_answered_by_another_backend_than_its_dry_run_fails_the_task(
    run_module: Any, sim_state: str, switching_agent: str
) -> None:
    code, res = run_module("fleetops_gpu_mig", {"layout": ["3g.71gb", "3g.71gb"], "sim_state": sim_state,
                                                "agent": switching_agent})
    assert code == 1 and res["failed"] and res["kind"] == "backend-mismatch", res
    assert "mig apply: the answer came from the nvml backend, but the action was planned on the sim backend" \
        in res["msg"]
    assert res["planned_backend"] == ["sim"] and res["backend"] == ["nvml"]


def test_a_mig_apply_from_the_plans_backend_passes(run_module: Any, sim_state: str) -> None:
    code, res = run_module("fleetops_gpu_mig", {"layout": ["3g.71gb", "3g.71gb"], "sim_state": sim_state})
    assert code == 0 and res["backend"] == "sim" and res["changed"] is True


def test_a_setting_verified_by_a_collect_from_another_backend_fails_the_task(
    run_module: Any, sim_state: str, switching_agent: str
) -> None:
    code, res = run_module("fleetops_gpu_set", {"setting": "power", "value": "600", "sim_state": sim_state,
                                                "agent": switching_agent})
    assert code == 1 and res["failed"] and res["kind"] == "backend-mismatch", res
    assert res["backend"] == "sim" and "planned on the sim backend" in res["msg"]
    assert "verified" not in res


def test_the_helper_names_both_backends_and_passes_agreeing_ones() -> None:
    import importlib

    backend_mismatch = importlib.import_module(
        "ansible_collections.fleetops.gpu.plugins.module_utils.agent").backend_mismatch

    assert backend_mismatch({"backend": "nvml"}, {"backend": "nvml"}, "x") is None
    why = backend_mismatch({"backend": "nvml"}, {"backend": "sim"}, "reset")
    assert why is not None and why.startswith("reset: the answer came from the sim backend")
    assert "an unnamed" in str(backend_mismatch({"backend": "nvml"}, {}, "set"))
