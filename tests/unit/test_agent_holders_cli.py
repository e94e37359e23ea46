"""``fleetops-agent holders`` as a real subprocess: the processes holding a node's device files
(here a simulated node's), what the driver reload names when the module stays loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleetops.sim import gpu as sim

ROOT = Path(__file__).resolve().parents[2]
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); time.sleep(60)"


def _holders(*args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "FLEETOPS_SIM_STATE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "fleetops.agent.main", "holders", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=True)
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_holders_names_each_process_holding_the_device_files_by_pid_user_and_command(tmp_path: Path) -> None:
    state = str(tmp_path / "node001.json")
    sim.write_state(state, sim.build_state("node001"))
    prefix = sim.device_prefix(state)
    os.makedirs(os.path.dirname(prefix))
    Path(prefix + "0").touch()
    assert _holders("--state", state) == {"kind": "fleetops.holders/v1", "prefix": prefix,
                                          "complete": os.geteuid() == 0, "holders": []}
    workload = subprocess.Popen([sys.executable, "-c", HOLD, prefix + "0"])
    try:
        deadline = time.monotonic() + 10
        while True:
            doc = _holders("--prefix", prefix)
            if doc["holders"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        workload.kill()
        workload.wait()
    [holder] = doc["holders"]
    assert holder["pid"] == workload.pid and holder["devices"] == [prefix + "0"]
    assert holder["command"].startswith(f"{sys.executable} -c import os")
    assert holder["line"].startswith(f"pid {workload.pid} (") and holder["line"].endswith(f"holds {prefix}0")
