"""NVML's XID events on a real GPU, read-only (no XID is caused): every GPU registers for XID
events, a wait with none answers Timeout, handles of one GPU map to one key (the bus map a lost
GPU's event is attributed by), and the resident agent holds a registered set on every GPU,
none while quiesced, and one again after, with no error either way.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU. ``FLEETOPS_GPU_TEST_OUT``:
a folder to keep the daemon's events status in, for the record."""

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
from fleetops.gpu.nvml.access import _handle_key

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _keep(name: str, doc: Any) -> None:
    out = os.environ.get("FLEETOPS_GPU_TEST_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, name).write_text(json.dumps(doc, indent=1, default=str))


def test_every_gpu_registers_for_xid_events_and_a_quiet_wait_times_out() -> None:
    import pynvml as N

    N.nvmlInit()
    try:
        count = N.nvmlDeviceGetCount()
        es = N.nvmlEventSetCreate()
        try:
            keys = []
            for index in range(count):
                h = N.nvmlDeviceGetHandleByIndex(index)
                supported = N.nvmlDeviceGetSupportedEventTypes(h)
                assert supported & N.nvmlEventTypeXidCriticalError, f"GPU {index}: XID events not supported"
                N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
                again = N.nvmlDeviceGetHandleByIndex(index)
                assert again is not h and _handle_key(again) == _handle_key(h) is not None
                keys.append(_handle_key(h))
            assert len(set(keys)) == count
            start = time.monotonic()
            with pytest.raises(N.NVMLError_Timeout):
                N.nvmlEventSetWait_v2(es, 300)
            assert time.monotonic() - start >= 0.25
        finally:
            N.nvmlEventSetFree(es)
    finally:
        N.nvmlShutdown()


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    sock = tmp_path / "run" / "agent.sock"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FLEETOPS_SIM_STATE", None)
    env["FLEETOPS_AGENT_STATE_DIR"] = str(tmp_path / "lib")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetops.agent.main", "serve", "--backend", "nvml", "--socket", str(sock),
         "--interval", "1", "--full-interval", "2"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield proc, sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _daemon(sock: Path) -> dict[str, Any]:
    try:
        doc = json.loads(client.ask(str(sock), b"snapshot\n", 10.0))
    except (OSError, ValueError):
        return {}
    return doc.get("daemon") or {} if isinstance(doc, dict) else {}


def _until(what: str, fn: Any, deadline_s: float = 60.0) -> Any:
    return polling.until(what, fn, deadline_s, step_s=0.2)


def test_the_daemon_holds_xid_events_on_every_gpu_none_while_quiesced_and_again_after(daemon: Any) -> None:
    import pynvml as N

    N.nvmlInit()
    try:
        count = N.nvmlDeviceGetCount()
    finally:
        N.nvmlShutdown()
    _proc, sock = daemon

    def events() -> dict[str, Any]:
        return _daemon(sock).get("nvml_events") or {}

    before = _until("every GPU registered", lambda: (lambda e: e if e.get("registered") == count else None)(events()))
    with client.Quiesce(str(sock), 60, "gpu test: events") as pause:
        assert pause.answer is not None
        during = _until("no set while quiesced", lambda: (lambda d: d if (d.get("nvml_events") or {}).get("registered") == 0
                                                          else None)(_daemon(sock)), 30)
    after = _until("registered again", lambda: (lambda e: e if e.get("registered") == count else None)(events()))
    doc = _daemon(sock)
    _keep("xid_events.json", {"before": before, "during": during["nvml_events"], "after": after,
                              "degraded": doc.get("reason")})
    assert before["error"] is None and after["error"] is None
    assert during["nvml_events"]["error"] is None and not during["degraded"], during["reason"]
    assert not doc["degraded"], doc["reason"]
