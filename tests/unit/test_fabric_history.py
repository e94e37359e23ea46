"""Flaps and drops of RDMA ports from the daemon's per-tick samples (gpud's definitions, the
baseline's thresholds), and the daemon's sampling of the simulated node's ports into its rings."""

from __future__ import annotations

import time
from pathlib import Path

from fleetops import baseline, model
from fleetops.agent.serve.node import NodeService
from fleetops.baseline import DEFAULT_THRESHOLDS
from fleetops.checks import fabric, verdict
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

T0 = 1_800_000_000.0
KEY = "mlx5_3/1"
REF = {KEY: {"device": "mlx5_3", "port": 1, "netdev": "ibp94s0", "pci_address": "0000:5e:00.0",
             "link_layer": "InfiniBand"}}


def ticks(pattern: list[tuple[float, bool, int]], step: float = 2.0) -> list[fabric.Sample]:
    """Every tick's sample: (seconds it lasts, active, link_downed) runs one after another."""
    out: list[fabric.Sample] = []
    t = T0
    for length, active, downed in pattern:
        for _ in range(int(length / step)):
            out.append((t, active, downed))
            t += step
    return out


def judge(samples: list[fabric.Sample], now: float, compute: bool = True,
          th: baseline.Thresholds = DEFAULT_THRESHOLDS) -> list[model.Finding]:
    return fabric.history_findings("n1", {KEY: samples}, {KEY} if compute else set(), REF, now, th)


def flapping(times: int, down_s: float) -> list[fabric.Sample]:
    pattern: list[tuple[float, bool, int]] = [(60, True, 1)]
    for i in range(times):
        pattern += [(down_s, False, 2 + i), (30, True, 2 + i)]
    return ticks(pattern)


def test_three_flaps_of_at_least_25_s_are_crit_on_a_compute_port() -> None:
    samples = flapping(3, 30)
    (f,) = judge(samples, samples[-1][0])
    assert (f.check, f.severity, f.gpu) == ("fabric.flap", "crit", None)
    assert f.observed["device"] == "mlx5_3" and f.observed["flaps"] == 3
    assert "transceiver" in (f.action or "")


def test_two_flaps_or_short_falls_are_not_a_flap() -> None:
    assert judge(flapping(2, 30), T0 + 500) == []
    assert judge(flapping(5, 20), T0 + 900) == []  # down 20 s: under gpud's 25 s


def test_a_flapping_excluded_port_is_warn_and_the_count_is_the_baselines() -> None:
    samples = flapping(3, 30)
    (f,) = judge(samples, samples[-1][0], compute=False)
    assert (f.check, f.severity) == ("fabric.flap", "warn")
    strict = baseline.from_mapping({"thresholds": {"fabric_flap_count": 2}}, "t").thresholds
    (f,) = judge(flapping(2, 30), T0 + 500, th=strict)
    assert f.check == "fabric.flap" and f.observed["flaps"] == 2


def test_a_port_down_four_minutes_with_link_downed_unchanged_is_a_drop_held_ten_minutes() -> None:
    down = ticks([(60, True, 1), (250, False, 2)])
    (f,) = judge(down, down[-1][0])
    assert (f.check, f.severity, f.observed["up_at"]) == ("fabric.drop", "crit", None)
    assert judge(ticks([(60, True, 1), (200, False, 2)]), T0 + 260) == []  # 200 s: not yet
    back = ticks([(60, True, 1), (250, False, 2), (300, True, 2)])
    up_at = T0 + 310
    (f,) = judge(back, up_at + 300)
    assert f.check == "fabric.drop" and f.observed["up_at"] == up_at and "back since" in f.message
    assert judge(back, up_at + 601) == []  # held 600 s after it came back, then gone


def test_a_port_that_keeps_training_and_falling_while_down_is_no_drop() -> None:
    samples = ticks([(60, True, 1), (100, False, 2), (100, False, 3), (60, False, 4)])
    assert [f.check for f in judge(samples, samples[-1][0])] == []


def test_changes_only_judge_as_every_tick_does() -> None:
    """The daemon keeps a port's changes, not every tick: the same findings."""
    samples = flapping(3, 30) + ticks([(300, False, 9)])
    changes = [s for i, s in enumerate(samples) if i == 0 or s[1:] != samples[i - 1][1:]]
    now = samples[-1][0]
    assert len(changes) < len(samples) / 10
    assert [(f.check, f.observed) for f in judge(changes, now)] == [(f.check, f.observed) for f in judge(samples, now)]


def test_the_daemon_samples_every_port_each_tick_and_reports_a_flap(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"), str(tmp_path / "kmsg"),
                      interval_s=2.0, full_interval_s=10.0)
    svc._tick()
    svc._tick()
    assert sorted(svc.port_rings) == [f"mlx5_{i}/1" for i in range(9)]
    assert all(len(r) == 1 and r[0][1] is True for r in svc.port_rings.values())  # steady: one entry each
    assert [f for f in svc.findings if f["check"].startswith("fabric.")] == []
    sim.inject(str(state), "ib-port-down", 3)
    svc._tick()
    ring = svc.port_rings[KEY]
    assert [e[1] for e in ring] == [True, False] and ring[1][2] == ring[0][2] + 1
    # the hour before, as the ring would hold it: three falls of 30 s
    now = time.time()
    ring.clear()
    for i in range(3):
        ring.extend([(now - 600 + 100 * i, False, 5 + i), (now - 570 + 100 * i, True, 5 + i)])
    svc._hold_findings()
    flap = [f for f in svc.findings if f["check"] == "fabric.flap"]
    assert [(f["severity"], f["observed"]["device"], f["observed"]["netdev"]) for f in flap] == [
        ("crit", "mlx5_3", "ibp94s0")]
    assert "fabric.flap" in verdict.HELD_CHECKS  # the audit takes it from the daemon's answer


def test_the_served_page_gives_each_port_the_role_the_daemons_baseline_judges(tmp_path: Path) -> None:
    """The endpoint's ``role`` label comes from the daemon's state, judged by the checks' port rule
    under the daemon's baseline: the port it excludes is ``excluded`` on the page, and a baseline
    reloaded without the exclusion makes it ``compute`` again."""
    from fleetops.agent.serve import exposition

    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    b = baseline.from_mapping({"fabric": {"exclude_devices": ["mlx5_2"], "exclude_link_layers": ["Ethernet"]}}, "t")
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"), str(tmp_path / "kmsg"),
                      interval_s=2.0, full_interval_s=10.0, baseline=b)
    svc._tick()

    def roles() -> dict[str, str]:
        svc._publish()
        page = exposition.metrics.render(exposition.metrics_input(svc.state()[1] or {}, time.time()))
        lines = [ln for ln in page.splitlines() if ln.startswith("fleetops_rdma_port_up{")]
        return {ln.split('device="')[1].split('"')[0]: ln.split('role="')[1].split('"')[0] for ln in lines}

    got = roles()
    assert got["mlx5_2"] == "excluded" and got["mlx5_8"] == "excluded"
    assert sorted(d for d, r in got.items() if r == "compute") == [f"mlx5_{i}" for i in (0, 1, 3, 4, 5, 6, 7)]
    svc.baseline = None  # a reload without a baseline: the default rule (the HCAs beside a GPU)
    got = roles()
    assert got["mlx5_2"] == "compute" and got["mlx5_8"] == "excluded"


def test_a_port_going_down_is_judged_at_the_next_tick_not_the_next_full_interval(tmp_path: Path) -> None:
    """As a new DBE: a port that changes state takes the daemon's full snapshot at once, so its
    finding reaches the watchers within a tick rather than up to a full interval later."""
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1")
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"), str(tmp_path / "kmsg"),
                      interval_s=2.0, full_interval_s=3600.0)
    svc._tick()  # the first tick takes the first full snapshot; the next is an hour away
    first = svc.node
    assert first is not None and [f for f in svc.findings if f["check"].startswith("fabric.")] == []
    svc._tick()
    assert svc.node is first  # a steady tick takes none
    sim.inject(str(state), "ib-port-down", 3)
    svc._tick()
    assert svc.node is not first
    down = [(f["check"], f["severity"], f["observed"]["device"]) for f in svc.findings if f["check"] == "fabric.port_down"]
    assert down == [("fabric.port_down", "crit", "mlx5_3")]
    again = svc.node
    svc._tick()
    assert svc.node is again  # still down: no change, no new snapshot
    sim.clear(str(state), "ib-port-down", 3)
    svc._tick()
    assert svc.node is not again and not [f for f in svc.findings if f["check"] == "fabric.port_down"]
