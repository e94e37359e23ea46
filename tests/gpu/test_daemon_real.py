"""The resident agent on a real GPU, read-only: who holds the device files while it runs, the
quiesce a reset asks for through its socket, the reset's dry run with the daemon running, and
the daemon's snapshot against a cold collect. Never a reset, never a setting.

The daemon is this test's own ``fleetops-agent serve --backend nvml`` on a socket of its own
(``FLEETOPS_AGENT_SOCKET`` tells the reset flow where it is). Skipped (tests/conftest.py)
where NVML does not start or sees no GPU. ``FLEETOPS_GPU_TEST_OUT``: a folder to keep the
answers in (holders, dry run, both snapshots) for the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops.agent.serve import client
from fleetops.gpu import holders

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
# Telemetry that moves between two reads of one idle GPU a second apart: both snapshots must
# have the field (or both record it unreadable), its value may differ.
LIVE = {
    "temp_gpu_c", "temp_memory_c", "power_draw_w", "energy_mj", "clock_sm_mhz", "clock_mem_mhz",
    "clock_graphics_mhz", "clock_video_mhz", "utilization_gpu_pct", "utilization_memory_pct", "memory_used_mib",
    "memory_free_mib", "memory_reserved_mib", "pcie_tx_kbps", "pcie_rx_kbps", "clocks_event_mask",
    "clocks_event_reasons", "fan_speed_pct", "performance_state", "tx_kib", "rx_kib", "processes",
    "read_at",  # the fabric's: when the ports were read
}
MOMENT = {"collected_at", "collect_ms", "uptime_s", "daemon", "mig", "age_s"}
# The daemon's own: its job book (the records it reads each tick; a cold collect reads none and
# says None, "not collected"), compared by value in the test
DAEMON_ONLY = {"jobs"}


def _env(sock: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FLEETOPS_SIM_STATE", None)
    env["FLEETOPS_AGENT_SOCKET"] = str(sock)
    env["FLEETOPS_AGENT_STATE_DIR"] = str(sock.parent / "lib")
    env["FLEETOPS_JOBS_DIR"] = str(sock.parent / "jobs")  # job records of its own: none, not the machine's
    return env


def _keep(name: str, doc: Any) -> None:
    out = os.environ.get("FLEETOPS_GPU_TEST_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, name).write_text(json.dumps(doc, indent=1, default=str))


def _served(sock: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(client.ask(str(sock), b"snapshot\n", 10.0))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("gpus") else None


def _until(what: str, fn: Any, deadline_s: float = 60.0) -> Any:
    return polling.until(what, fn, deadline_s, step_s=0.2)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    run = tmp_path_factory.mktemp("agent")
    sock = run / "run" / "agent.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetops.agent.main", "serve", "--backend", "nvml", "--socket", str(sock),
         "--interval", "1", "--full-interval", "2"],
        cwd=ROOT, env=_env(sock), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _until("the daemon's first snapshot", lambda: _served(sock))
        yield proc, sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _held_by(pid: int) -> list[str]:
    return [d for h in holders.scan() if h.pid == pid for d in h.devices]


def test_the_daemon_holds_the_device_files_until_quiesced_and_takes_them_back(daemon: Any) -> None:
    proc, sock = daemon
    before = _held_by(proc.pid)
    assert "/dev/nvidiactl" in before and any(d[len("/dev/nvidia"):].isdigit() for d in before), before
    with client.Quiesce(str(sock), 60, "gpu test: quiesce") as pause:
        assert pause.answer is not None and pause.answer["pid"] == proc.pid
        time.sleep(0.5)
        during = _held_by(proc.pid)
        quiesced = (_served(sock) or {}).get("daemon", {}).get("quiesced")
    taken_back = _until("the daemon holding NVML again", lambda: _held_by(proc.pid), 30)
    fresh = _until("a snapshot sampled after the quiesce",
                   lambda: (lambda d: d if d and d["collected_at"] > time.time() - 5 else None)(_served(sock)), 30)
    _keep("holders.json", {"before": before, "during": during, "after": taken_back, "quiesced": quiesced})
    assert during == [], f"the quiesced daemon still holds {during}"
    assert quiesced is not None and quiesced["by"] == "gpu test: quiesce"
    assert fresh["daemon"]["quiesced"] is None and not fresh["daemon"]["degraded"], fresh["daemon"]


def test_the_reset_dry_run_names_the_daemon_as_a_holder_it_will_pause(daemon: Any) -> None:
    proc, sock = daemon
    served = _served(sock)
    assert served is not None
    uuid = served["gpus"][0]["uuid"]
    dry = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "reset", "--gpu", uuid, "--dry-run", "--json", "--backend", "nvml"],
        cwd=ROOT, env=_env(sock), capture_output=True, text=True, timeout=120, check=False,
    )
    doc = json.loads(dry.stdout)
    _keep("reset-dry-run.json", doc)
    (check,) = [c for c in doc["preconditions"] if c["name"] == "device_holders"]
    plan = {h["pid"]: h for h in check["holders"]}
    assert proc.pid in plan, check
    assert plan[proc.pid]["then"].startswith("fleetops-agent serve: paused through its socket"), plan[proc.pid]
    assert check["pause_daemon"] is True
    others = [h for h in plan.values() if h["then"] is None]
    if others:  # another process holds this GPU (a tool on the machine): the dry run must refuse
        assert check["status"] == "failed" and doc["result"] == "refused", doc["message"]
    else:
        assert check["status"] == "ok", check
    assert _held_by(proc.pid), "a dry run must not pause the daemon"


def _diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key in (MOMENT | DAEMON_ONLY) and path.count("/") == 0:
                continue
            if key not in a or key not in b:
                out.append(f"{path}/{key}: only in {'the daemon' if key in a else 'the cold collect'}")
            elif key in LIVE:
                if (a[key] is None) != (b[key] is None):
                    out.append(f"{path}/{key}: {a[key]!r} against {b[key]!r}")
            else:
                _diff(a[key], b[key], f"{path}/{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif a != b:
        out.append(f"{path}: {a!r} against {b!r}")


def test_the_daemons_snapshot_and_a_cold_collect_agree_on_every_field(daemon: Any) -> None:
    _, sock = daemon
    served = _served(sock)
    cold = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "collect", "--backend", "nvml", "--fresh"],
        cwd=ROOT, env=_env(sock), capture_output=True, text=True, timeout=120, check=False,
    )
    assert cold.returncode == 0, cold.stderr
    collected = json.loads(cold.stdout)
    _keep("snapshots.json", {"daemon": served, "cold": collected})
    differences: list[str] = []
    _diff(served, collected, "", differences)
    assert differences == []
    # the daemon reads this test's job folder (empty): no job, and a cold collect reads none at all
    assert (served["jobs"], collected.get("jobs")) == ([], None)
