"""nvlink.idle_link on model nodes and on simulated snapshots, and the simulator's NVLink
traffic (load, the nvlink-idle fault, a reset, a clear)."""

from __future__ import annotations

import time

import pytest

from fleetops import baseline, model
from fleetops.checks import run_node_checks
from fleetops.sim import gpu as sim

T0 = 1_800_000_000.0
GIB = 1024 * 1024  # KiB


def _gpu(moved: list[int], base: int = 5_000_000, remote_type: str = "switch",
         remotes: list[str] | None = None) -> tuple[model.Gpu, model.Gpu]:
    """(previous, current) of one GPU whose link i moved ``moved[i]`` KiB (split TX/RX)."""
    def links(extra: list[int]) -> list[model.NvLink]:
        out = []
        for i, m in enumerate(extra):
            remote = remotes[i] if remotes else f"0000:{0x05 + i // 3:02x}:00.{i % 3}"
            out.append(model.NvLink(link=i, state="up", remote_bus_id=remote, remote_type=remote_type,
                                    crc_errors=0, replay_errors=0, recovery_errors=0,
                                    tx_kib=base + m // 2, rx_kib=base + m - m // 2))
        return out

    ident = {"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "bus_id": "0000:18:00.0"}
    return model.Gpu(**ident, nvlinks=links([0] * len(moved))), model.Gpu(**ident, nvlinks=links(moved))


def _nodes(prev_gpu: model.Gpu, cur_gpu: model.Gpu, dt: float = 60.0) -> tuple[model.Node, model.Node]:
    prev = model.Node(hostname="n1", backend="nvml", collected_at=T0, gpus=[prev_gpu])
    cur = model.Node(hostname="n1", backend="nvml", collected_at=T0 + dt, gpus=[cur_gpu])
    return prev, cur


def _idle(findings: list[model.Finding]) -> list[model.Finding]:
    return [f for f in findings if f.check == "nvlink.idle_link"]


def test_one_idle_link_among_busy_ones_is_warn_naming_link_remote_and_figures() -> None:
    moved = [40 * GIB + i for i in range(18)]
    moved[5] = 0
    prev, cur = _nodes(*_gpu(moved))
    [f] = _idle(run_node_checks(cur, None, prev))
    assert f.severity == "warn" and f.gpu == {"index": 0, "uuid": cur.gpus[0].uuid, "bus_id": "0000:18:00.0"}
    assert "link 5 (to switch 0000:06:00.2) moved 0 KiB" in f.message
    link = f.observed["links"]["5"]
    assert link["remote_bus_id"] == "0000:06:00.2" and link["moved_kib"] == 0 and link["peer_links"] == 17
    assert link["peer_median_kib"] == 40 * GIB + 9  # median of links 0-4 and 6-17
    assert list(f.observed["links"]) == ["5"] and f.observed["window_s"] == 60.0
    assert "fleetops reset n1 " + cur.gpus[0].uuid in f.action


def test_a_link_that_moved_a_little_less_than_the_limit_is_idle_and_one_at_the_limit_is_not() -> None:
    moved = [2 * GIB] * 4
    moved[1], moved[2] = 1023, 1024  # nvlink_idle_max_kib: 1024 KiB
    prev, cur = _nodes(*_gpu(moved))
    [f] = _idle(run_node_checks(cur, None, prev))
    assert list(f.observed["links"]) == ["1"]


def test_a_gpu_whose_links_are_all_idle_is_not_a_finding() -> None:
    prev, cur = _nodes(*_gpu([0] * 18))
    assert _idle(run_node_checks(cur, None, prev)) == []


def test_one_busy_link_with_the_others_idle_flags_nothing() -> None:
    moved = [0] * 18
    moved[2] = 80 * GIB
    prev, cur = _nodes(*_gpu(moved))
    assert _idle(run_node_checks(cur, None, prev)) == []


def test_peers_below_the_peer_minimum_flag_nothing_and_a_lower_minimum_does() -> None:
    moved = [512 * 1024] * 18  # 512 MiB each over the window: under the 1 GiB default
    moved[9] = 0
    prev, cur = _nodes(*_gpu(moved))
    assert _idle(run_node_checks(cur, None, prev)) == []
    b = baseline.from_mapping({"thresholds": {"nvlink_idle_peer_min_kib": 256 * 1024}}, "t")
    [f] = _idle(run_node_checks(cur, b, prev))
    assert list(f.observed["links"]) == ["9"]


def test_a_window_shorter_than_the_threshold_judges_nothing() -> None:
    moved = [40 * GIB] * 18
    moved[5] = 0
    prev, cur = _nodes(*_gpu(moved), dt=59.0)
    assert _idle(run_node_checks(cur, None, prev)) == []
    b = baseline.from_mapping({"thresholds": {"nvlink_idle_window_s": 30}}, "t")
    assert len(_idle(run_node_checks(cur, b, prev))) == 1


def test_without_a_previous_snapshot_nothing_is_judged() -> None:
    moved = [40 * GIB] * 18
    moved[5] = 0
    _, cur = _nodes(*_gpu(moved))
    assert _idle(run_node_checks(cur, None, None)) == []


def test_missing_counters_are_unreadable_not_a_finding() -> None:
    moved = [40 * GIB] * 18
    moved[5] = 0
    prev_gpu, cur_gpu = _gpu(moved)
    idle = cur_gpu.nvlinks[5]
    idle.tx_kib = idle.rx_kib = None
    idle.unavailable.update({"tx_kib": "NoPermission", "rx_kib": "NoPermission"})
    prev, cur = _nodes(prev_gpu, cur_gpu)
    findings = run_node_checks(cur, None, prev)
    assert _idle(findings) == []
    [u] = [f for f in findings if f.check == "nvlink.unreadable"]
    assert u.severity == "unknown" and u.observed == {
        "tx_kib": {"NoPermission": ["GPU 0 link 5"]}, "rx_kib": {"NoPermission": ["GPU 0 link 5"]}}


def test_counters_not_supported_or_absent_from_an_older_snapshot_are_silent() -> None:
    prev_gpu, cur_gpu = _gpu([40 * GIB] * 18)
    for lk in cur_gpu.nvlinks:
        lk.tx_kib = lk.rx_kib = None
        lk.unavailable.update({"tx_kib": "NotSupported", "rx_kib": "NotSupported"})
    for lk in prev_gpu.nvlinks:  # a snapshot written before the keys existed
        lk.tx_kib = lk.rx_kib = None
    prev, cur = _nodes(prev_gpu, cur_gpu)
    assert [f for f in run_node_checks(cur, None, prev) if f.check.startswith("nvlink.")] == []


def test_a_counter_that_went_back_is_a_reset_not_an_idle_link() -> None:
    moved = [40 * GIB] * 18
    prev_gpu, cur_gpu = _gpu(moved)
    cur_gpu.nvlinks[5].tx_kib = cur_gpu.nvlinks[5].rx_kib = 0  # the GPU was reset in between
    prev, cur = _nodes(prev_gpu, cur_gpu)
    assert _idle(run_node_checks(cur, None, prev)) == []


def test_a_link_down_at_either_end_of_the_window_is_left_to_links_down() -> None:
    moved = [40 * GIB] * 18
    moved[5] = 0
    prev_gpu, cur_gpu = _gpu(moved)
    prev_gpu.nvlinks[5].state = "down"
    prev, cur = _nodes(prev_gpu, cur_gpu)
    assert _idle(run_node_checks(cur, None, prev)) == []


def test_direct_links_compare_only_with_links_to_the_same_gpu() -> None:
    # 4 links to GPU B, 4 to GPU C; the job talks to B only: C's links are idle, not faulty
    remotes = ["0000:2a:00.0"] * 4 + ["0000:3a:00.0"] * 4
    moved = [30 * GIB] * 4 + [0] * 4
    prev, cur = _nodes(*_gpu(moved, remote_type="gpu", remotes=remotes))
    assert _idle(run_node_checks(cur, None, prev)) == []
    moved[1] = 0  # one of B's links carries nothing while B's other three do
    prev, cur = _nodes(*_gpu(moved, remote_type="gpu", remotes=remotes))
    [f] = _idle(run_node_checks(cur, None, prev))
    assert list(f.observed["links"]) == ["1"] and "to gpu 0000:2a:00.0" in f.message


def test_mig_gpus_are_not_judged() -> None:
    moved = [40 * GIB] * 18
    moved[5] = 0
    prev_gpu, cur_gpu = _gpu(moved)
    cur_gpu.mig_mode_current = True
    prev, cur = _nodes(prev_gpu, cur_gpu)
    assert _idle(run_node_checks(cur, None, prev)) == []


# --- simulated snapshots: an audit of two -----------------------------------------------------


def test_audit_of_two_sim_snapshots_flags_the_idle_link_of_the_injected_gpu(sim_node) -> None:
    state = sim.build_state("n1", {"faults": ["nvlink-idle@4"]})
    t0 = time.time()
    prev, cur = sim_node(state=state, now=t0), sim_node(state=state, now=t0 + 120)
    findings = run_node_checks(cur, None, prev)
    [f] = _idle(findings)
    assert f.gpu["uuid"] == state["gpus"][4]["uuid"] and list(f.observed["links"]) == ["5"]
    # 50 % load: 10 GB/s per link and direction, TX + RX over two minutes
    assert f.observed["links"]["5"]["peer_median_kib"] == pytest.approx(
        2 * 120 * sim.NVLINK_KIB_PER_S_FULL * sim.IDLE_FAULT_LOAD_PCT / 100, rel=0.03)
    assert [x for x in findings if model.SEVERITY_RANK[x.severity] >= model.SEVERITY_RANK["warn"]] == [f]


def test_a_loaded_healthy_sim_node_has_no_idle_link(sim_node) -> None:
    state = sim.build_state("n1")
    t0 = time.time()
    for pos in range(8):
        sim.set_load(state, pos, 90, now=t0)
    prev, cur = sim_node(state=state, now=t0 + 1), sim_node(state=state, now=t0 + 120)
    assert _idle(run_node_checks(cur, None, prev)) == []
    assert cur.gpus[0].nvlinks[0].tx_kib > prev.gpus[0].nvlinks[0].tx_kib + 100 * GIB


# --- the simulator's traffic ---------------------------------------------------------------


def _link_kib(state: dict, pos: int, now: float) -> list[tuple[int, int]]:
    gpu = next(g for g in sim.snapshot(state, now=now)["gpus"] if g["uuid"] == state["gpus"][pos]["uuid"])
    return [(lk["tx_kib"], lk["rx_kib"]) for lk in gpu["nvlinks"]]


def test_idle_gpus_move_nothing_and_traffic_grows_with_load() -> None:
    state = sim.build_state("n1")
    t0 = time.time()
    start0, start1 = _link_kib(state, 0, t0), _link_kib(state, 1, t0)
    # months of traffic already counted, past float32's exact range, each link its own count
    assert all(2**24 < sim.NVLINK_START_KIB_MIN <= tx <= sim.NVLINK_START_KIB_MAX + 18 * sim.NVLINK_START_STEP_KIB
               for tx, _ in start0 + start1)
    assert len({tx for tx, _ in start0}) == 18
    assert _link_kib(state, 0, t0 + 600) == start0  # idle for ten minutes: not one KiB more
    sim.set_load(state, 0, 25, now=t0)
    sim.set_load(state, 1, 100, now=t0)
    low = _link_kib(state, 0, t0 + 10)[0][0] - start0[0][0]
    high = _link_kib(state, 1, t0 + 10)[0][0] - start1[0][0]
    assert low == 10 * sim.NVLINK_KIB_PER_S_FULL * 0.25 == 50_000_000  # the exact growth, on top of ~1e12
    assert high == 4 * low
    sim.set_load(state, 0, 0, now=t0 + 10)  # the counters keep what they counted
    assert _link_kib(state, 0, t0 + 50)[0][0] == start0[0][0] + low
    with pytest.raises(sim.SimError, match="0-100"):
        sim.set_load(state, 0, 150)


def test_a_scenario_starts_the_counters_past_2_53_and_they_stay_exact() -> None:
    start = 2**53 + 1  # not a float64: only integers hold it
    state = sim.build_state("n1", {"gpu": {"nvlink_start_kib": start}})
    t0 = time.time()
    links = _link_kib(state, 0, t0)
    assert links[0] == (start, start - start // 50)
    assert links[17][0] == start + 17 * sim.NVLINK_START_STEP_KIB
    assert _link_kib(state, 0, t0 + 3600) == links  # idle: exact, not rounded to a float64 step
    sim.set_load(state, 0, 100, now=t0)
    assert _link_kib(state, 0, t0 + 1)[0][0] - start == sim.NVLINK_KIB_PER_S_FULL == 20_000_000
    assert "nvlink_start_kib" not in sim.snapshot(state, now=t0)["gpus"][0]  # the simulator's own bookkeeping


def test_nvlink_idle_freezes_one_link_and_a_clear_resumes_it_without_a_jump() -> None:
    state = sim.build_state("n1")
    sim.inject_into(state, "nvlink-idle", 2)
    t0 = state["faults"][-1]["since"]
    start = _link_kib(state, 2, t0)
    during = _link_kib(state, 2, t0 + 60)
    assert during[5] == start[5] and all(now[0] > then[0] for now, then in zip(during[:5] + during[6:],
                                                                                 start[:5] + start[6:], strict=True))
    sim.clear_from(state, "nvlink-idle", 2)
    now = time.time()
    after = _link_kib(state, 2, now + 60)
    assert after[5] == start[5]  # the load went with the job: nothing moves, nothing jumps
    sim.set_load(state, 2, 100, now=now + 60)
    later = _link_kib(state, 2, now + 70)
    assert later[5][0] - start[5][0] == pytest.approx(10 * sim.NVLINK_KIB_PER_S_FULL * (1 - 0.01), rel=1e-3)
    assert later[0][0] - start[0][0] > later[5][0] - start[5][0]  # link 0 kept what it carried during the fault


def test_a_reset_zeroes_the_counters_and_keeps_nvlink_idle() -> None:
    assert "nvlink-idle" in sim.RESET_KEEPS and "nvlink-idle" not in sim.RESET_CLEARS
    state = sim.build_state("n1", {"faults": ["nvlink-idle@3"]})
    now = time.time()
    assert all(tx >= sim.NVLINK_START_KIB_MIN for tx, _ in _link_kib(state, 3, now))  # months counted
    record = sim.reset_gpu(state, 3, now=now + 60)
    assert record["kept"] == ["nvlink-idle"]
    links = _link_kib(state, 3, now + 60)
    assert set(links) == {(0, 0)}  # KiB since the driver loaded or the GPU was reset: from zero again
    links = _link_kib(state, 3, now + 120)
    assert links[5] == (0, 0) and links[0][0] > 0  # still idle while the others carry the job
