"""The quick validation level on a real GPU, judged against the shipped floors. Read-only:
it runs workloads and changes no GPU setting.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.validation.floors import floors_for
from fleetops.validation.judge import judge

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_quick_level_meets_shipped_floors() -> None:
    env = dict(os.environ)
    env.pop("FLEETOPS_SIM_STATE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "validate", "--level", "quick", "--gpu", "0", "--backend", "torch"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["provenance"]["backend"] == "torch"
    gpu = doc["gpus"][0]
    if floors_for(gpu["name"]) is None:
        pytest.skip(f"no shipped floors for {gpu['name']}")
    for metric in ("hbm_copy_gbps", "hbm_triad_gbps", "gemm_bf16_tflops", "h2d_gbps", "d2h_gbps"):
        assert gpu["tests"][metric]["repeats"] == 10.0
    verdict = judge([{**gpu, "host": "local"}])[0]
    assert verdict.status == "ok", verdict.to_dict()
