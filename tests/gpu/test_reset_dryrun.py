"""fleetops-agent reset --dry-run on a real GPU. Read-only: it runs ONLY
``fleetops-agent reset --gpu <UUID of GPU 0> --dry-run --json --backend nvml`` and checks the
preconditions it evaluated. Never a real reset.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU. Set
FLEETOPS_RESET_DRYRUN_OUT to a file name to keep the agent's JSON answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.agent import reset
from fleetops.catalog import actions

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
LOCK = Path("/run/fleetops/maintenance.lock")
LOG = Path(reset.DEFAULT_LOG)


def _uuid_of_gpu0() -> str:
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return out.split()[0].strip()
    import pynvml

    pynvml.nvmlInit()
    try:
        value = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        return value.decode() if isinstance(value, bytes) else str(value)
    finally:
        pynvml.nvmlShutdown()


def _snapshot(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def test_dry_run_on_gpu0_reports_every_precondition_and_changes_nothing() -> None:
    uuid = _uuid_of_gpu0()
    lock_before, log_before = _snapshot(LOCK), _snapshot(LOG)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FLEETOPS_SIM_STATE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "reset", "--gpu", uuid, "--dry-run", "--json", "--backend", "nvml"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    keep = os.environ.get("FLEETOPS_RESET_DRYRUN_OUT")
    if keep:
        Path(keep).write_text(json.dumps(doc, indent=2) + "\n")

    assert doc["kind"] == "fleetops.reset/v1"
    assert doc["budget_s"] == actions.reset_budget_s(actions.DEFAULT_GRACE_S, actions.RESET_TIMEOUT_S,
                                                     list(actions.DEFAULT_CLIENTS))
    assert doc["dry_run"] is True and doc["backend"] == "nvml"
    assert doc["gpu"]["uuid"] == uuid and doc["gpu"]["index"] == 0
    names = [p["name"] for p in doc["preconditions"]]
    assert names == list(reset.PRECONDITIONS)
    assert all(p["status"] in ("ok", "failed", "skipped") and p["detail"] for p in doc["preconditions"])
    by_name = {p["name"]: p for p in doc["preconditions"]}
    for name in ("gpu_exists", "uuid_matches_bus_id", "on_bus"):
        assert by_name[name]["status"] == "ok", by_name[name]
    assert "NVML by UUID" in by_name["uuid_matches_bus_id"]["detail"]  # two independent look-ups
    assert doc["actions"] == [] and doc["verified"] is False
    assert doc["result"] in ("would-reset", "refused")
    assert proc.returncode == (0 if doc["result"] == "would-reset" else 1)
    # nothing written: no lock taken, no audit log line
    assert _snapshot(LOCK) == lock_before and _snapshot(LOG) == log_before
    assert "log" not in doc
