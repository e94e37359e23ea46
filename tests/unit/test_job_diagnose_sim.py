"""The simulator's workload profiles through the daemon's real sampling path (``SimAccess.light``
into the daemon's ``Ring``, the job cgroup's ``cpu.stat`` read each tick) for five minutes of
simulated time, then ``jobs.diagnose``: each profile gets exactly its verdict on the right GPU, a
steady job none, across seeds. Also what a profile puts on the GPU and the cgroup, and that a GPU
without a workload looks as it always did."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from jobsim import cpu_stat_usage, run_job, run_nodes, verdict_keys

from fleetops.catalog import pcie
from fleetops.jobs import diagnose as dg
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess


@pytest.mark.parametrize("seed", [3, 11, 29])
@pytest.mark.parametrize("profile", sim.PROFILES)
def test_each_profile_gets_exactly_its_verdict_on_the_right_gpu(tmp_path: Path, profile: str, seed: int) -> None:
    job, expected = run_job(tmp_path, profile, seed)
    d = dg.diagnose(job)
    assert verdict_keys(d) == expected, [v.message for v in d.verdicts]
    assert d.notes == []
    assert all(v.confidence >= 0.9 for v in d.verdicts)


def test_a_straggler_on_two_gpus_is_the_one_the_seed_chose(tmp_path: Path) -> None:
    job, expected = run_job(tmp_path, "straggler", 5, gpus=(6, 7))
    [(code, _, (index,))] = expected
    assert code == "straggler" and index in (6, 7)
    assert verdict_keys(dg.diagnose(job)) == expected


def test_a_job_on_two_nodes_names_the_straggler_and_the_starved_node_only(tmp_path: Path) -> None:
    # the slow GPU is node017's GPU 2; node018's GPUs wait for it in the same windows
    job, slow = run_nodes(tmp_path, {"node017": ("straggler", (0, 1, 2, 3), "2"),
                                     "node018": ("straggler", (4, 5, 6, 7), "elsewhere")}, 23)
    assert slow == {"node017": (2,), "node018": ()}
    d = dg.diagnose(job)
    assert verdict_keys(d) == {("straggler", "node017", (2,))}
    waiting = [g for g in d.gpus if g.node == "node018"]
    assert all((g.utilization_pct.p5 or 100) < 60 for g in waiting)  # they dip while GPU 2 is slow
    (tmp_path / "b").mkdir()
    job, _ = run_nodes(tmp_path / "b", {"node017": ("steady", (0, 1), None),
                                        "node018": ("cpu-starved", (0, 1), None)}, 23)
    assert verdict_keys(dg.diagnose(job)) == {("cpu_starved", "node018", (0, 1))}


def _state(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "n1.json"
    return path, sim.init_state(str(path), "n1")


def test_a_gpu_without_a_workload_looks_as_before(tmp_path: Path) -> None:
    path, state = _state(tmp_path)
    now = time.time()
    before = sim.snapshot(copy.deepcopy(state), now + 60)
    with sim.locked_state(str(path)) as st:
        sim.set_job_workload(st, [g["uuid"] for g in st["gpus"][:4]], "steady", "7", now, cpus=8)
        after = sim.snapshot(st, now + 60)
    assert after["gpus"][4:] == before["gpus"][4:]
    assert after["gpus"][0] != before["gpus"][0]
    values, _ = SimAccess(str(path), clock=lambda: now + 60).light()
    idle = values[state["gpus"][5]["uuid"]]
    assert idle["pcie_rx_kbps"] is None and idle["pcie_tx_kbps"] is None and idle["utilization_gpu_pct"] == 0


def test_a_workload_ends_and_the_node_is_steady_again(tmp_path: Path) -> None:
    path, _ = _state(tmp_path)
    now = time.time()
    with sim.locked_state(str(path)) as st:
        uuids = [g["uuid"] for g in st["gpus"][:2]]
        sim.set_job_workload(st, uuids, "cpu-starved", "8", now)
        assert not sim.steady(st, now)
        links_busy = sim.nvlink_rows(st, st["gpus"][0], now + 100)[0]["tx_kib"]
        sim.set_job_workload(st, uuids, None, "8", now + 100)
        assert st[sim.JOBS_KEY] == {} and sim.steady(st, now + 100)
        # the counters keep what the job moved: they only ever grow
        assert sim.nvlink_rows(st, st["gpus"][0], now + 200)[0]["tx_kib"] == links_busy
    assert sim.read_state(str(path))["gpus"][0].get(sim.WORKLOAD_KEY) is None


def test_the_same_seed_gives_the_same_samples(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = run_job(tmp_path / "a", "straggler", 17, seconds=40.0)
    b, _ = run_job(tmp_path / "b", "straggler", 17, seconds=40.0)

    def shape(job: dg.Job) -> list[list[object]]:
        # times and NVLink counters start from the wall clock and the UUID: compare the rest
        return [[v for _, v in g.series[f]] for g in job.gpus
                for f in ("utilization_gpu_pct", "clock_sm_mhz", "clocks_event_mask", "power_draw_w", "pcie_rx_kbps")]

    assert shape(a) == shape(b)


def test_input_bound_reads_at_90_to_95_percent_of_the_link_and_steady_hits_the_power_cap(tmp_path: Path) -> None:
    link = pcie.link_kbps(5, 16) or 0.0
    job, _ = run_job(tmp_path, "input-bound", 1, seconds=60.0)
    rx = [v for _, v in job.gpus[0].series["pcie_rx_kbps"]]
    assert all(0.90 * link <= float(v or 0) <= 0.95 * link for v in rx)
    (tmp_path / "s").mkdir()
    steady, _ = run_job(tmp_path / "s", "steady", 1, seconds=120.0)
    g = dg.summarize(steady.gpus[0], steady.started_at, steady.ended_at or 0)
    assert 0.15 <= g.throttle_share.get("sw_power_cap", 0) <= 0.45 and g.slowdown_share == 0
    assert g.clock_sm_mhz.p95 == 1980 and (g.power_w.p95 or 0) <= 700.0 and (g.power_share or 0) > 0.85


def test_the_cgroup_cpu_stat_grows_with_the_profile_and_is_made_if_missing(tmp_path: Path) -> None:
    path, state = _state(tmp_path)
    now = float(int(time.time()))
    with sim.locked_state(str(path)) as st:
        sim.set_workload(st, st["gpus"][0]["uuid"], "cpu-starved", "9", now, cpus=12)
    stat = Path(sim.cgroup_dir(str(path), "9")) / "cpu.stat"
    assert not stat.exists()
    access = SimAccess(str(path), clock=lambda: now + 100)
    access.light()
    text = stat.read_text()
    assert text.splitlines()[0].startswith("usage_usec ") and "user_usec" in text and "system_usec" in text
    usage = cpu_stat_usage(stat) or 0
    assert 0.95 * 12 * 100e6 <= usage <= 1.0 * 12 * 100e6
    with sim.locked_state(str(path)) as st:  # the loader gets its CPUs back: the count keeps growing, slower
        sim.set_workload(st, st["gpus"][0]["uuid"], "steady", "9", now + 100)
    access = SimAccess(str(path), clock=lambda: now + 200)
    access.light()
    later = cpu_stat_usage(stat) or 0
    assert usage + 0.3 * 12 * 100e6 <= later <= usage + 0.5 * 12 * 100e6


def test_a_workload_is_refused_where_the_gpu_cannot_run_one(tmp_path: Path) -> None:
    path, state = _state(tmp_path)
    with sim.locked_state(str(path)) as st:
        uuid = st["gpus"][7]["uuid"]
        with pytest.raises(sim.SimError, match="unknown workload profile"):
            sim.set_workload(st, uuid, "fast", "1", 0.0)
        with pytest.raises(sim.SimError, match="job id"):
            sim.set_workload(st, uuid, "steady", None, 0.0)
        with pytest.raises(sim.SimError, match="no GPU"):
            sim.set_workload(st, "GPU-nope", "steady", "1", 0.0)
        sim.inject_into(st, "gpu-missing", 7)
        with pytest.raises(sim.SimError, match="GPU is lost"):
            sim.set_workload(st, uuid, "steady", "1", 0.0)


def test_a_reboot_ends_every_workload(tmp_path: Path) -> None:
    path, _ = _state(tmp_path)
    with sim.locked_state(str(path)) as st:
        sim.set_job_workload(st, [g["uuid"] for g in st["gpus"][:4]], "steady", "10", time.time())
        sim.inject_into(st, "reboot", None)
        assert all(g.get(sim.WORKLOAD_KEY) is None for g in st["gpus"]) and sim.JOBS_KEY not in st
        assert sim.steady(st)
