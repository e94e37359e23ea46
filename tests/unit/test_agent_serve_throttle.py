"""Throttle clearing: the rule (``checks.thermal_power.ThrottleHold``) sample by sample, and a real
``fleetops-agent serve`` holding a slowdown seen only between two full snapshots until
``--clear-after`` clean samples; and the rate base of ``NodeService._previous`` taken from one
ring sample even when the oldest full snapshot is older than it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from test_agent_serve import AGENT, _ask, _until

from fleetops import model
from fleetops.agent.serve.node import NodeService
from fleetops.agent.serve.ring import GPU_FIELDS, Ring
from fleetops.catalog import throttle
from fleetops.checks.thermal_power import ThrottleHold, held_throttle_findings, throttle_hold
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

IDLE = throttle.encode(["gpu_idle"])
CAP = throttle.encode(["sw_power_cap"])  # normal operation: a clean sample
HOT = throttle.encode(["hw_slowdown", "hw_thermal_slowdown"])
BRAKE = throttle.encode(["hw_slowdown", "hw_power_brake_slowdown"])


def test_hold_lasts_until_exactly_n_clean_samples() -> None:
    hold = ThrottleHold()
    hold.observe(1.0, IDLE, 3)
    assert not hold.active(3)  # nothing seen yet
    hold.observe(2.0, HOT, 3)  # a one-sample blip
    for i, t in enumerate((3.0, 4.0)):
        hold.observe(t, CAP, 3)
        assert hold.active(3) and hold.clean == i + 1
    hold.observe(5.0, IDLE, 3)
    assert not hold.active(3) and hold.clean == 3
    assert hold.reasons == ["hw_slowdown", "hw_thermal_slowdown"] and hold.first_seen == hold.last_seen == 2.0


def test_unread_samples_neither_clear_nor_extend_and_a_new_episode_starts_afresh() -> None:
    hold = throttle_hold([(1.0, HOT), (2.0, None), (3.0, float("nan")), (4.0, IDLE), (5.0, None)], 2)
    assert hold.active(2) and hold.clean == 1 and hold.samples == 1
    hold.observe(6.0, IDLE, 2)
    assert not hold.active(2)
    hold.observe(7.0, BRAKE, 2)  # after a cleared episode: its own reasons and times only
    assert hold.active(2) and hold.reasons == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert hold.first_seen == 7.0 and hold.samples == 1
    hold.observe(8.0, HOT, 2)  # within the episode: reasons accumulate, first_seen stays
    assert hold.reasons == ["hw_slowdown", "hw_power_brake_slowdown", "hw_thermal_slowdown"]
    assert hold.first_seen == 7.0 and hold.last_seen == 8.0 and hold.samples == 2


def test_a_larger_clear_after_read_later_keeps_the_episode() -> None:
    """``clear_after`` is read when judged (a SIGHUP may change it): the same samples are held
    under a longer hold and cleared under a shorter one."""
    hold = throttle_hold([(1.0, HOT), (2.0, IDLE), (3.0, IDLE)], 5)
    assert hold.active(5) and not hold.active(2)


def _gpu(index: int, mask: int) -> model.Gpu:
    return model.Gpu(index=index, uuid=f"GPU-{index}", bus_id=f"00000000:0{index}:00.0",
                     clocks_event_mask=mask, clocks_event_reasons=throttle.decode(mask))


def test_held_findings_skip_gpus_whose_snapshot_already_throttles() -> None:
    node = model.Node(hostname="n1", backend="sim", collected_at=10.0, gpus=[_gpu(0, IDLE), _gpu(1, HOT)])
    holds = {"GPU-0": throttle_hold([(1.0, BRAKE), (2.0, IDLE)], 4), "GPU-1": throttle_hold([(1.0, HOT)], 4)}
    current = [model.Finding(check="thermal_power.throttle", severity="warn", node="n1", message="now",
                             gpu=model.gpu_ref(node.gpus[1]))]
    held = held_throttle_findings(node, holds, current, 4)
    assert [(f.check, f.severity, (f.gpu or {})["uuid"]) for f in held] == [("thermal_power.throttle", "warn", "GPU-0")]
    assert held[0].observed["reasons"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert held[0].observed["clean_samples"] == 1
    assert "power supplies" in (held[0].action or "")  # the power-brake action, as the snapshot check gives it
    assert held_throttle_findings(node, holds, current, 1) == []  # one clean sample clears under N=1


def _throttle(node: Path, uuid: str) -> dict[str, Any] | None:
    doc = _ask(node, "snapshot") or {}
    for f in doc.get("daemon", {}).get("findings", []):
        if f["check"] == "thermal_power.throttle" and (f["gpu"] or {}).get("uuid") == uuid:
            return dict(f)
    return None


def test_a_blip_between_full_snapshots_is_held_until_n_clean_samples(tmp_path: Path) -> None:
    """Full snapshots a minute apart (the change of reasons takes one at once, both ways): the
    slowdown is reported while it lasts, still reported (and answered to ``collect``) after the
    GPU recovered and the snapshot is clean, and cleared once ``--clear-after`` clean samples
    followed it."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    uuid = sim.read_state(str(state))["gpus"][2]["uuid"]
    n = 8
    proc = subprocess.Popen(
        [AGENT, "serve", "--backend", "sim", "--interval", "0.2", "--full-interval", "60", "--hang-timeout", "5",
         "--clear-after", str(n), "--states", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _until("the first full snapshot", lambda: (_ask(state, "snapshot") or {}).get("gpus"))
        assert _throttle(state, uuid) is None
        assert sim.inject(str(state), "thermal-slowdown", 2)
        # a new clocks-event reason takes a full snapshot at once: the snapshot's own finding
        _until("the slowdown judged", lambda: _throttle(state, uuid))
        sim.clear(str(state), "thermal-slowdown", 2)

        cleans: list[int] = []

        def recovered_but_held() -> dict[str, Any] | None:
            f = _throttle(state, uuid)
            held = f is not None and isinstance(f.get("observed"), dict) and "clean_samples" in f["observed"]
            if held:
                cleans.append(f["observed"]["clean_samples"])
            return f if held and f["observed"]["clean_samples"] >= 1 else None

        held = _until("a clean sample with the finding still held", recovered_but_held)
        assert "hw_thermal_slowdown" in held["observed"]["reasons"]
        assert held["message"].startswith("GPU 2 ") and "held until 8 consecutive clean samples" in held["message"]
        env = {**os.environ, "FLEETOPS_SIM_STATE": str(state)}
        served = json.loads(subprocess.run([AGENT, "collect"], env=env, capture_output=True, check=True).stdout)
        gpu2 = next(g for g in served["gpus"] if g["uuid"] == uuid)
        assert "hw_thermal_slowdown" not in gpu2["clocks_event_reasons"]  # the snapshot itself is clean
        assert any(f["check"] == "thermal_power.throttle" and f["gpu"]["uuid"] == uuid
                   for f in served["daemon"]["findings"])

        def cleared() -> bool:
            f = _throttle(state, uuid)
            if f is not None:
                cleans.append(f["observed"]["clean_samples"])
            return f is None

        _until("the hold cleared", cleared)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert cleans and max(cleans) < n and cleans == sorted(cleans)


def test_previous_takes_its_time_and_counters_from_one_ring_sample(tmp_path: Path) -> None:
    """The oldest full snapshot (t=1000) is older than the ring's base sample (t=1050, the newest
    at least a window before the snapshot at t=1120): the base's time is the sample's, and so are
    its counters, link counters included."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"), str(tmp_path / "kmsg"),
                      interval_s=10.0, full_interval_s=10.0)
    assert svc.rate_window_s() == 60.0  # the default nvlink_idle_window_s
    old = svc.backend.full()
    old.collected_at = 1000.0
    svc.full_history.append(old)
    now = svc.backend.full()
    now.collected_at = 1120.0
    for g in now.gpus:
        ring = svc.rings[g.uuid] = Ring(360, GPU_FIELDS)
        for i, t in enumerate((1040.0, 1050.0, 1065.0, 1120.0)):
            # counters at the magnitudes of a node that has run for months, past 2**53 for the KiB
            row: dict[str, float | None] = {"pcie_replay_counter": 3 + 100 * i, "ecc_corrected_volatile": 7 * i}
            for link in g.nvlinks or []:
                row[f"nvlink{link.link}_crc_errors"] = i
                row[f"nvlink{link.link}_tx_kib"] = 2**53 + 1 + 1000 * i
                ring.add_field(f"nvlink{link.link}_crc_errors")
                ring.add_field(f"nvlink{link.link}_tx_kib")
            ring.append(t, row)
    prev = svc._previous(now)
    assert prev is not None and prev.collected_at == 1050.0
    assert {g.pcie_replay_counter for g in prev.gpus} == {103}
    assert {g.ecc_corrected_volatile for g in prev.gpus} == {7}
    links = [lk for g in prev.gpus for lk in g.nvlinks or []]
    assert links and {lk.crc_errors for lk in links} == {1} and {lk.tx_kib for lk in links} == {2**53 + 1001}
    assert old.collected_at == 1000.0 and old.gpus[0].pcie_replay_counter == 0  # the retained snapshot is untouched
    # a GPU the ring has no sample of at that time: no counters, so no rate from mixed times
    del svc.rings[now.gpus[0].uuid]
    prev = svc._previous(now)
    assert prev is not None and prev.gpus[0].pcie_replay_counter is None and prev.gpus[1].pcie_replay_counter == 103
