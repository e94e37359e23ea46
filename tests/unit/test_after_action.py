"""An action's answer comes with the daemon's snapshot taken after it: ``fleetops-agent set``
on a simulated node whose daemon runs asks it to sample at once, says it did, and from then on
the daemon serves the new value, not its last sample from before the change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from test_agent_serve import AGENT, Daemon, _ask, _until

from fleetops.sim import gpu as sim


def _set(state: Path, *args: str) -> dict[str, object]:
    proc = subprocess.run([AGENT, "set", *args, "--backend", "sim", "--state", str(state)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, object] = json.loads(proc.stdout)
    return doc


def test_a_setting_is_served_by_the_daemon_as_soon_as_it_is_answered(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    # a daemon that samples every 30 s and takes a full snapshot once a minute: only the
    # resample can show the change at once
    d = Daemon([state])
    d.proc = subprocess.Popen([AGENT, "serve", "--backend", "sim", "--interval", "30", "--full-interval", "60",
                               "--states", str(state)], env=d.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _until("the daemon's first snapshot", lambda: (_ask(state, "snapshot") or {}).get("daemon"))
    try:
        before = _ask(state, "snapshot")
        assert before is not None and {g["power_limit_w"] for g in before["gpus"]} == {700.0}
        doc = _set(state, "power", "500")
        assert doc["changed"] is True
        daemon = doc["daemon"]
        assert isinstance(daemon, dict) and daemon["resampled"] is True and daemon["backend"] == "sim"
        assert isinstance(daemon["collected_at"], float) and daemon["collected_at"] > before["collected_at"]
        served = _ask(state, "snapshot")
        assert served is not None and {g["power_limit_w"] for g in served["gpus"]} == {500.0}
        # nothing changed: nothing to resample
        again = _set(state, "power", "500")
        assert again["changed"] is False and "daemon" not in again
    finally:
        d.stop()


def test_without_a_daemon_the_answer_says_collects_run_cold(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    doc = _set(state, "power", "500")
    daemon = doc["daemon"]
    assert isinstance(daemon, dict) and daemon["resampled"] is False
    assert "collects of this node run cold" in str(daemon["detail"])
