"""``fleetops_gpu_facts`` beside a resident agent: by default the daemon's snapshot answers (up to
its full interval old); with ``fresh: true`` the node is read now, which is what a task verifying
a change it just made needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
DEADLINE_S = 60.0


def _power(result: dict) -> list[float]:
    return [g["power_limit_w"] for g in result["ansible_facts"]["fleetops_gpu"]["gpus"]]


def test_fresh_reads_a_change_the_daemons_snapshot_does_not_show_yet(run_module, sim_state: str) -> None:
    sock = Path(sim_state[: -len(".json")] + ".agent/agent.sock")
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--full-interval", "600", "--states", sim_state],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        args = {"expect": {"power_limit_w": 700}, "sim_state": sim_state, "agent": AGENT, "full": True}
        end = time.monotonic() + DEADLINE_S
        while True:  # until the daemon has its (only) full snapshot and answers
            rc, served = run_module("fleetops_gpu_facts", args)
            if rc == 0 and "daemon" in served["ansible_facts"]["fleetops_snapshot"]:
                break
            assert time.monotonic() < end, f"no daemon answer at {sock}: {served}"
            time.sleep(0.2)
        assert served["compliant"] is True
        sim.inject(sim_state, "power-cap-drift", 2)  # the change, made after the daemon's full snapshot
        rc, stale = run_module("fleetops_gpu_facts", args)
        assert rc == 0 and "daemon" in stale["ansible_facts"]["fleetops_snapshot"]
        assert stale["compliant"] is True  # the daemon's snapshot predates the change
        rc, fresh = run_module("fleetops_gpu_facts", {**args, "fresh": True})
        assert rc == 0 and "daemon" not in fresh["ansible_facts"]["fleetops_snapshot"]
        assert fresh["compliant"] is False and _power(fresh)[2] == 500.0
        assert {(m["check"], m["gpu"]["index"]) for m in fresh["mismatches"]} == {("thermal_power.power_limit", 2)}
        assert served["agent_check"]["source"] == "daemon" and fresh["agent_check"]["source"] == "collect"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
