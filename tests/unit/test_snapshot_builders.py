"""The daemon's NVML snapshot and the cold collect's are one builder's: on the fake NVML, a
running ``fleetops-agent serve`` and a ``fleetops-agent collect --fresh`` of the same node give
the same snapshot, field by field, services and ``last_reset_at`` included. Only what is about
the moment of reading (timestamps, the uptime, the daemon's own block) may differ."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from test_agent_serve import AGENT, _ask_path, _nvml_daemon, _until

# What is about the moment the snapshot was taken, not about the node: left out of the comparison.
MOMENT = {"collected_at", "collect_ms", "uptime_s", "daemon", "source", "age_s"}


def _systemctl(bin_dir: Path) -> None:
    """A ``systemctl`` that answers ``is-active`` as a node with the Fabric Manager stopped
    does: every unit active but ``nvidia-fabricmanager`` (the state a crit finding is about)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import sys\n"
        "units = sys.argv[2:]\n"
        "print('\\n'.join('inactive' if u == 'nvidia-fabricmanager' else 'active' for u in units))\n"
        "sys.exit(3 if 'nvidia-fabricmanager' in units else 0)\n"
    )
    script.chmod(0o755)


def _journal(path: Path, uuid: str, at: float) -> None:
    """One successful reset of ``uuid`` in the agent's reset journal."""
    path.write_text(json.dumps({"kind": "fleetops.reset/v1", "result": "reset", "dry_run": False, "time": at,
                                "elapsed_s": 2.5, "gpu": {"uuid": uuid}}) + "\n")


def _node_fields(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k not in MOMENT}
    if out.get("fabric") is not None:  # when the ports were read: the moment too
        out["fabric"] = {k: v for k, v in out["fabric"].items() if k != "read_at"}
    return out


def test_the_daemon_and_the_cold_collect_build_the_same_nvml_snapshot(tmp_path: Path, monkeypatch: Any) -> None:
    bin_dir = tmp_path / "bin"
    _systemctl(bin_dir)
    journal = tmp_path / "reset.jsonl"
    reset_at = time.time() - 3600.0
    _journal(journal, "GPU-fake-1", reset_at)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FLEETOPS_RESET_LOG", str(journal))
    d, control, kmsg_file, sock = _nvml_daemon(tmp_path, full_interval_s=0.5)
    try:
        served = _until("the daemon's full snapshot", lambda: (lambda x: x if x and x.get("gpus") else None)(
            _ask_path(sock)))
        # the cold collect imports pynvml itself: a module of that name that is the fake
        shim = tmp_path / "shim"
        shim.mkdir()
        (shim / "pynvml.py").write_text("import sys\nimport fake_nvml\n\nsys.modules[__name__] = fake_nvml\n")
        env = {**d.env, "PYTHONPATH": os.pathsep.join([str(shim), d.env["PYTHONPATH"]])}
        cold = subprocess.run([AGENT, "collect", "--backend", "nvml", "--fresh"], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert cold.returncode == 0, cold.stderr
        collected = json.loads(cold.stdout)
    finally:
        d.stop()
    # the fields that were missing from the daemon's snapshot before it went through one builder
    assert collected["services"]["nvidia-fabricmanager"] == "inactive"
    assert served["services"] == collected["services"]
    assert "services" not in served.get("unavailable", {})
    by_uuid = {g["uuid"]: g for g in served["gpus"]}
    assert by_uuid["GPU-fake-1"]["last_reset_at"] == reset_at + 2.5
    assert by_uuid["GPU-fake-0"]["last_reset_at"] is None
    # and every other field, GPU by GPU
    # the served document's own view of the GPUs' MIG instances (a key a watcher reads) is
    # derived from the same GPUs
    from fleetops.gpu import instances

    assert served.pop("mig") == instances.table(collected["gpus"])
    # the daemon reads the node's job records (none here); a cold collect reads none
    assert served.pop("jobs") == []
    assert collected.pop("jobs") is None
    mine, theirs = _node_fields(served), _node_fields(collected)
    assert mine.keys() == theirs.keys(), sorted(set(mine) ^ set(theirs))
    different = {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
    assert different == {}
