"""One serving process for many simulated nodes: the shared loops (a handful of threads for any
number of nodes, a hung node not stopping the others) and the sim backend's reuse of an
unchanged state (changes still seen at once, reused snapshots equal to cold ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent.collect import collect
from fleetops.agent.serve.node import NodeService
from fleetops.agent.serve.ring import GPU_FIELDS, Ring
from fleetops.model import to_dict
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")
DEADLINE_S = 60.0
TIME_FIELDS = ("collected_at", "collect_ms", "uptime_s")


def _until(what: str, fn: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _snapshot(state: Path) -> dict[str, Any] | None:
    import socket

    path = str(state.with_suffix("")) + ".agent/agent.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5.0)
    try:
        s.connect(path)
        s.sendall(b"snapshot\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        s.close()
    doc: dict[str, Any] = json.loads(data)
    return doc if "daemon" in doc else None


def _nodes(tmp_path: Path, count: int) -> list[Path]:
    out = []
    for i in range(count):
        state = tmp_path / f"n{i:02d}.json"
        sim.init_state(str(state), f"n{i:02d}")
        out.append(state)
    return out


def _without_time(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k not in TIME_FIELDS}
    if out.get("fabric") is not None:  # when the ports were read: the snapshot's time, as collected_at
        out["fabric"] = {k: v for k, v in out["fabric"].items() if k != "read_at"}
    return out


# --- the sim backend's reuse ------------------------------------------------------------------


def test_steady_tells_time_dependent_states_apart(tmp_path: Path) -> None:
    state = sim.build_state("n1")
    assert sim.steady(state)
    sim.inject_into(state, "pcie-downgrade", 1)  # a fixed setting, no kernel-log line: still steady
    assert sim.steady(state)
    dbe = sim.build_state("n1")
    sim.inject_into(dbe, "ecc-dbe", 1)  # its XID 48 line in the kernel log
    assert not sim.steady(dbe)
    storm = sim.build_state("n1")
    sim.inject_into(storm, "ecc-sbe-storm", 0)  # grows by the minute
    assert not sim.steady(storm)
    loaded = sim.build_state("n1")
    sim.set_load(loaded, 2, 60.0)  # NVLink traffic grows with time
    assert not sim.steady(loaded)
    xid = sim.build_state("n1")
    sim.inject_into(xid, "xid:31", 0)  # kernel-log lines: their times come from the uptime
    assert not sim.steady(xid)


def test_reused_snapshot_equals_a_cold_collect(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    sim.inject(str(state), "pcie-downgrade", 3)
    backend = SimAccess(str(state))
    first = backend.full()
    time.sleep(0.05)
    again = backend.full()
    assert again.gpus is first.gpus  # reused, not rebuilt
    assert again.collected_at > first.collected_at
    cold = collect("sim", str(state))
    assert _without_time(to_dict(again)) == _without_time(to_dict(cold))
    assert again.uptime_s == pytest.approx(cold.uptime_s, abs=0.2)
    assert again.gpus[3].pcie_gen_current == 4
    # the ports as read when the state last changed, the very same object (converted once)
    assert again.fabric is not None and again.fabric is first.fabric


def test_a_changed_state_is_seen_at_the_next_call(tmp_path: Path) -> None:
    """Also a rewrite in place of the same size with the modification time put back, long after
    the text was trusted by its stat: the change time still moves, so the file is read again."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    old = time.time() - 100.0
    os.utime(state, (old, old))
    backend = SimAccess(str(state))
    assert {g.power_limit_w for g in backend.full().gpus} == {700}
    backend.full()  # read more than a second after the change: the stat is trusted from now on
    text = state.read_text()
    assert text.count('"power_limit_w": 700') == 8
    st = os.stat(state)
    with open(state, "r+", encoding="utf-8") as fh:  # in place: same inode, same size
        fh.write(text.replace('"power_limit_w": 700', '"power_limit_w": 650'))
    os.utime(state, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(state).st_size == st.st_size and os.stat(state).st_mtime_ns == st.st_mtime_ns
    assert {g.power_limit_w for g in backend.full().gpus} == {650}
    # an atomic rewrite (the simulator's own): a new file
    with sim.locked_state(str(state)) as s:
        s["gpus"][0]["temp_gpu_c"] = 81
    values, _ = backend.light()
    assert values[sim.read_state(str(state))["gpus"][0]["uuid"]]["temp_gpu_c"] == 81.0


def test_a_time_dependent_state_is_sampled_afresh(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    with sim.locked_state(str(state)) as s:
        sim.set_load(s, 0, 100.0)
    backend = SimAccess(str(state))
    uuid = sim.read_state(str(state))["gpus"][0]["uuid"]
    first = backend.light()[0][uuid]["nvlink0_tx_kib"]
    time.sleep(0.05)
    later = backend.light()[0][uuid]["nvlink0_tx_kib"]
    assert first is not None and later is not None and later > first
    a, b = backend.full(), backend.full()
    assert a.gpus is not b.gpus and (b.gpus[0].nvlinks or [])[0].tx_kib > (a.gpus[0].nvlinks or [])[0].tx_kib


# --- the ring's and the rate base's reuse -----------------------------------------------------


def test_ring_repeating_values_reads_like_every_sample_stored(tmp_path: Path) -> None:
    ring = Ring(16, GPU_FIELDS)  # three runs stay runs (four would make the column dense)
    row: dict[str, float | None] = {"temp_gpu_c": 40.0, "ecc_uncorrected_volatile": 0.0}
    series = [40.0, 40.0, 40.0, 41.0, 41.0] + [40.0] * 17
    for i, temp in enumerate(series):
        ring.append(float(i), {**row, "temp_gpu_c": temp})
        if i == 6:
            ring.add_field("nvlink0_tx_kib")  # a field first seen now
        if i == 12:  # the ring holds samples 0-12, the 41s among them
            assert ring.samples("temp_gpu_c", 0.0) == [(float(j), series[j]) for j in range(13)]
            assert not ring.same_as_now(8.0)
    assert ring.samples("temp_gpu_c", 0.0) == [(float(i), 40.0) for i in range(6, 22)]
    assert [v for _, v in ring.samples("nvlink0_tx_kib", 0.0)] == [None] * 16
    assert ring.sample_at(9.0) == ring.sample_at(21.0)
    assert ring.same_as_now(7.0) and ring.same_as_now(21.0)
    assert not ring.same_as_now(6.0)  # before the new field's first sample
    assert not ring.same_as_now(7.5)  # no sample at exactly that time
    ring.append(22.0, {**row, "temp_gpu_c": 42.0})
    assert not ring.same_as_now(21.0)
    assert ring.samples("temp_gpu_c", 21.0) == [(21.0, 40.0), (22.0, 42.0)]


def test_previous_reuses_its_gpus_only_while_no_counter_moved(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"),
                      str(tmp_path / "kmsg"), interval_s=10.0, full_interval_s=10.0)
    base = svc.backend.full()
    svc.full_history.append(base)
    uuid = base.gpus[0].uuid
    for t in (1000.0, 1010.0, 1020.0):
        svc.rings.setdefault(uuid, Ring(360, GPU_FIELDS)).append(t, {"pcie_replay_counter": 5.0})
    now = svc.backend.full()
    now.collected_at = 1000.0 + svc.rate_window_s()
    first = svc._previous(now)
    now.collected_at += 10.0
    second = svc._previous(now)
    assert first.collected_at == 1000.0 and second.collected_at == 1010.0
    assert second.gpus is first.gpus and first.gpus[0].pcie_replay_counter == 5
    svc.rings[uuid].append(1030.0, {"pcie_replay_counter": 9.0})  # the counter moved
    now.collected_at += 10.0
    third = svc._previous(now)
    assert third.collected_at == 1020.0 and third.gpus is not first.gpus
    assert third.gpus[0].pcie_replay_counter == 5
    now.collected_at += 10.0
    fourth = svc._previous(now)  # the base (1030) now shows the moved counter
    assert fourth.gpus[0].pcie_replay_counter == 9


# --- the shared loops, in a real daemon process ------------------------------------------------

HANGING = textwrap.dedent('''
    import os, time
    from fleetops.sim.access import SimAccess

    class Hanging(SimAccess):
        def light(self):
            while os.path.exists(self.state_path + ".hang"):
                time.sleep(0.05)
            return super().light()
''')


def _daemon(states: list[Path], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "0.5",
           "--hang-timeout", "1", "--states", *map(str, states)]
    return subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
        return proc.wait(timeout=30)
    return proc.returncode


def test_forty_nodes_take_a_handful_of_threads_and_each_node_is_served(tmp_path: Path) -> None:
    states = _nodes(tmp_path, 40)
    proc = _daemon(states)
    try:
        docs = [_until(f"{s.name}'s snapshot", lambda s=s: _snapshot(s)) for s in states]
        assert [d["hostname"] for d in docs] == [f"n{i:02d}" for i in range(40)]
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        assert threads <= 10, threads  # four per node (160) before the loops were shared
        sim.inject(str(states[17]), "ecc-dbe", 2)
        crit = _until("the DBE on n17", lambda: [f for f in (_snapshot(states[17]) or {}).get("daemon", {})
                                                  .get("findings", []) if f["severity"] == "crit"])
        assert crit and all(f["gpu"]["index"] == 2 for f in crit)
        assert not [f for f in (_snapshot(states[16]) or {})["daemon"]["findings"] if f["severity"] == "crit"]
    finally:
        assert _stop(proc) == 0
    assert not any(os.path.exists(str(s.with_suffix("")) + ".agent/agent.sock") for s in states)


def test_a_hung_node_does_not_stop_the_others(tmp_path: Path) -> None:
    (tmp_path / "hangmod.py").write_text(HANGING)
    env = {"FLEETOPS_AGENT_SERVE_BACKEND": "hangmod:Hanging",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    states = _nodes(tmp_path, 3)
    proc = _daemon(states, env)
    try:
        for s in states:
            _until(f"{s.name}'s snapshot", lambda s=s: _snapshot(s))
        Path(str(states[0]) + ".hang").write_text("")
        hung = _until("n00 degraded", lambda: (lambda d: d if d and d["daemon"]["degraded"] else None)(_snapshot(states[0])))
        assert hung["daemon"]["reason"].startswith("hung:")
        before = [(_snapshot(s) or {})["daemon"]["age_s"] for s in states[1:]]
        sim.inject(str(states[2]), "ecc-dbe", 0)  # the others still sample: n02's DBE shows
        _until("n02's DBE while n00 hangs", lambda: [f for f in (_snapshot(states[2]) or {})["daemon"]["findings"]
                                                     if f["severity"] == "crit"])
        after = [(_snapshot(s) or {})["daemon"] for s in states[1:]]
        assert all(not d["degraded"] and d["age_s"] < 5.0 for d in after), (before, after)
        Path(str(states[0]) + ".hang").unlink()
        _until("n00 recovered", lambda: not (_snapshot(states[0]) or {"daemon": {"degraded": True}})["daemon"]["degraded"])
    finally:
        assert _stop(proc) == 0


SLOW_FIRST = textwrap.dedent('''
    import os, time
    from fleetops.sim.access import SimAccess

    class SlowFirst(SimAccess):
        def full(self):
            while os.path.exists(self.state_path + ".slow"):
                time.sleep(0.05)
            return super().full()
''')


def test_watch_opened_before_the_first_snapshot_gets_the_whole_snapshot(tmp_path: Path) -> None:
    """A watcher that connected while the daemon was starting (its first line says so) gets the
    whole snapshot as its next line, not a change it would have nothing to merge into."""
    import socket

    (tmp_path / "slowmod.py").write_text(SLOW_FIRST)
    env = {"FLEETOPS_AGENT_SERVE_BACKEND": "slowmod:SlowFirst",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    (state,) = _nodes(tmp_path, 1)
    Path(str(state) + ".slow").write_text("")
    proc = _daemon([state], env)
    try:
        path = str(state.with_suffix("")) + ".agent/agent.sock"
        _until("the socket", lambda: os.path.exists(path))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(DEADLINE_S)
        s.connect(path)
        s.sendall(b"watch\n")
        fh = s.makefile("rb")
        first = json.loads(fh.readline())
        assert first["kind"] == "starting"
        Path(str(state) + ".slow").unlink()
        second = json.loads(fh.readline())
        assert "change" not in second and second["hostname"] == "n00" and len(second["gpus"]) == 8
        assert "age_s" in second["daemon"]
        sim.inject(str(state), "ecc-dbe", 1)
        while True:  # then changes, as before
            line = json.loads(fh.readline())
            assert set(line) == {"change", "at"}
            if any(f["severity"] == "crit" for f in line["change"].get("daemon", {}).get("findings", [])):
                break
        s.close()
    finally:
        assert _stop(proc) == 0
