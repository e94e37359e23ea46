"""100 XIDs through a real daemon: every kernel-log line counted once on the endpoint and on
the socket, none lost, none twice (the XID latency benchmark, bench/xid_latency.py, times the
same path; nothing here is timed)."""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_agent_serve import _ask, _until

from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
HOST = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.0.1")
XID_LINE = re.compile(r'^fleetops_gpu_xid_total\{gpu="(\d+)",[^}]*code="(\d+)"\} (\d+)$', re.M)
CODES = (13, 31, 43, 45, 94)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[int, int], int]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as resp:  # loopback only
            page = resp.read().decode()
    except OSError:
        return {}
    return {(int(g), int(c)): int(n) for g, c, n in XID_LINE.findall(page)}


def _socket_events(state: Path) -> list[dict[str, object]]:
    doc = _ask(state, "snapshot")
    assert doc is not None, "the daemon's socket did not answer"
    events: list[dict[str, object]] = doc["daemon"]["xid_events"]
    return events


def test_a_hundred_injected_xids_are_all_counted_and_none_twice(tmp_path: Path) -> None:
    state = tmp_path / "x1.json"
    sim.init_state(str(state), "x1")
    gpus = len(sim.read_state(str(state))["gpus"])
    port = _free_port()
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--states", str(state),
         "--metrics-address", f"{HOST}:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        before = _until("the endpoint's preset XID counters", lambda: _scrape(port))
        assert set(before.values()) == {0}
        injected: collections.Counter[tuple[int, int]] = collections.Counter()
        for i in range(100):  # as fast as the simulator writes them: the follower reads batches
            gpu, code = i % gpus, CODES[(i // gpus) % len(CODES)]
            sim.clear(str(state), f"xid:{code}", gpu)  # so a repeat writes a new kernel-log record
            assert sim.inject(str(state), f"xid:{code}", gpu)
            injected[(gpu, code)] += 1
        with open(sim.kmsg_path(str(state)), encoding="utf-8") as fh:
            assert sum(1 for line in fh if "NVRM: Xid" in line) == 100

        def counted() -> dict[tuple[int, int], int] | None:
            page = _scrape(port)
            return page if sum(page.values()) >= 100 else None

        page = _until("100 XIDs on the endpoint", counted)
        time.sleep(1.5)  # three sampling intervals: a late second count would show by now
        page = _scrape(port)
        assert {k: v for k, v in page.items() if v} == dict(injected)
        events = _socket_events(state)
        assert len(events) == 100
        assert sorted(int(str(e["seq"])) for e in events) == list(range(100))  # each record once
        assert collections.Counter(int(str(e["code"])) for e in events) == collections.Counter(
            code for (_, code), n in injected.items() for _ in range(n))
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


@pytest.mark.promtool
def test_textfile_is_the_page_written_whole_and_passes_promtool(tmp_path: Path) -> None:
    from promtool_util import assert_clean

    state = tmp_path / "t1.json"
    sim.init_state(str(state), "t1")
    out = tmp_path / "textfile"
    out.mkdir()
    prom = out / "fleetops.prom"
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--states", str(state), "--textfile", str(prom)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _until("the textfile", prom.exists)
        for _ in range(2):
            sim.clear(str(state), "xid:31", 0)
            assert sim.inject(str(state), "xid:31", 0)

        def counted() -> str | None:
            text = prom.read_text()
            return text if re.search(r'^fleetops_gpu_xid_total\{gpu="0",[^}]*code="31"\} 2$', text, re.M) else None

        text = _until("2 XID 31 in the textfile", counted)
        assert text.startswith("# HELP fleetops_agent_up ") and text.endswith("\n")
        assert_clean(text)
        assert sorted(p.name for p in out.iterdir()) == ["fleetops.prom"]  # no temporary left beside it
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_textfile_with_several_nodes_is_refused_naming_the_flag(tmp_path: Path) -> None:
    states = []
    for name in ("r1", "r2"):
        sim.init_state(str(tmp_path / f"{name}.json"), name)
        states.append(str(tmp_path / f"{name}.json"))
    proc = subprocess.run([AGENT, "serve", "--backend", "sim", "--states", *states, "--textfile",
                           str(tmp_path / "x.prom")], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == {
        "error": f"--textfile {tmp_path / 'x.prom'}: one served node only, got 2", "kind": "usage"}
