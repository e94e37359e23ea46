"""Integers stay integers: cumulative counters (NVLink data and error counters, ECC, PCIe replays)
are kept exactly in the daemon's ring and differenced exactly by the checks, past float32's
2**24 and float64's 2**53; a counter that goes down (a wrap at 2**32 or 2**64, a GPU reset or a
driver reload) is a reset of the base, never a negative rate or a burst of growth."""

from __future__ import annotations

import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from fleetops import model
from fleetops.agent.serve.node import NodeService
from fleetops.agent.serve.ring import GPU_FIELDS, LINK_FIELDS, NO_VALUE, Ring
from fleetops.checks import run_node_checks
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

T0 = 1_800_000_000.0
IDLE_KIB = 8_700_000_000_123  # an idle link of a node that has run for months (past 2**24)
PAST_2_53 = 2**53 + 1  # the first integer float64 cannot hold


def _fields() -> list[str]:
    return [*GPU_FIELDS, *(f"nvlink{n}_{f}" for n in range(4) for f in LINK_FIELDS)]


# --- the ring ---------------------------------------------------------------------------------


def test_ring_gives_back_counters_past_2_24_and_2_53_as_the_exact_ints_it_was_given() -> None:
    ring = Ring(40, _fields())
    rows = []
    for i in range(100):  # wraps the ring twice
        row: dict[str, Any] = {
            "temp_gpu_c": 36.0 + i % 3,
            "nvlink0_tx_kib": IDLE_KIB,  # idle: one run
            "nvlink1_tx_kib": PAST_2_53 + 7 * i,  # moves on every sample: a dense column
            "nvlink2_rx_kib": 2**64 - 2 - i,  # the largest counters NVML's unsigned 64 bits give
            "pcie_replay_counter": 3 + i // 30,  # seldom moves: runs
            "clocks_event_mask": 0x1,
        }
        rows.append(row)
        ring.append(T0 + 2 * i, row)
    assert ring.columns["nvlink1_tx_kib"].dense is not None and ring.columns["nvlink0_tx_kib"].dense is None
    for name in ("nvlink0_tx_kib", "nvlink1_tx_kib", "nvlink2_rx_kib", "pcie_replay_counter", "clocks_event_mask"):
        got = ring.samples(name, 0.0)
        assert got == [(T0 + 2 * i, rows[i][name]) for i in range(60, 100)], name
        assert all(type(v) is int for _, v in got), name
    first, last = ring.samples("nvlink1_tx_kib", 0.0)[0][1], ring.samples("nvlink1_tx_kib", 0.0)[-1][1]
    assert isinstance(first, int) and isinstance(last, int) and last - first == 7 * 39  # the exact growth
    assert ring.sample_at(T0 + 2 * 99) == {**dict.fromkeys(ring.columns), **rows[99]}
    # a field the backend did not read is None, in integer columns as in gauges
    assert [v for _, v in ring.samples("nvlink3_crc_errors", 0.0)] == [None] * 40


def test_an_idle_link_whose_column_went_dense_reads_its_exact_value_with_no_growth() -> None:
    """The case float32 got wrong: a link that carried traffic earlier in the hour (its column
    dense) and is idle now at 8.7e12 KiB read up to half a MiB-step away from NVML's value."""
    ring = Ring(60, _fields())
    for i in range(60):  # traffic on every sample: the column turns dense
        ring.append(T0 + 2 * i, {"nvlink0_tx_kib": IDLE_KIB - 60_000_000 + 1_000_000 * i})
    assert ring.columns["nvlink0_tx_kib"].dense is not None
    for i in range(60, 90):  # the job ended: the link is idle at IDLE_KIB
        ring.append(T0 + 2 * i, {"nvlink0_tx_kib": IDLE_KIB})
    idle = [v for t, v in ring.samples("nvlink0_tx_kib", T0 + 2 * 60)]
    assert idle == [IDLE_KIB] * 30 and idle[-1] - idle[0] == 0
    assert abs(array("f", [IDLE_KIB])[0] - IDLE_KIB) > 1024  # what float32 made of it: over the idle limit


def test_busy_counters_read_back_exact_through_wrap_arounds_gaps_and_resets() -> None:
    """Against a plain list of samples, checked after every sample: a growing counter (compact:
    a base per block and 32-bit differences), one with unread samples, one that a reset sends
    back to zero mid-block (the column goes plain, 8 bytes a sample) and one past 2**53."""
    import random

    rng = random.Random(11)
    capacity = 50  # not a multiple of the block: blocks straddle the ring's end
    names = ("nvlink0_tx_kib", "nvlink1_tx_kib", "nvlink2_tx_kib", "nvlink3_rx_kib")
    ring = Ring(capacity, names)
    kept: list[dict[str, Any]] = []
    now = {"nvlink0_tx_kib": IDLE_KIB, "nvlink1_tx_kib": IDLE_KIB, "nvlink2_tx_kib": IDLE_KIB,
           "nvlink3_rx_kib": PAST_2_53}
    for i in range(700):
        for name in now:
            now[name] += rng.randint(0, 50_000_000)  # up to 25 GB/s over 2 s, in KiB
        if i == 400:
            now["nvlink2_tx_kib"] = 17  # a GPU reset: from zero again, in the middle of a block
        row: dict[str, Any] = dict(now)
        if rng.random() < 0.2:
            row["nvlink1_tx_kib"] = None
        ring.append(T0 + i, row)
        kept = (kept + [row])[-capacity:]
        for name in names:
            assert [v for _, v in ring.samples(name, 0.0)] == [r[name] for r in kept], (i, name)
        if i == 100:  # every column is dense by now, and compact
            assert all(ring.columns[n].keys is not None and ring.columns[n].dense.itemsize == 4 for n in names)
        if i == 420:  # the reset, mid-block, made its column plain
            assert ring.columns["nvlink2_tx_kib"].keys is None and ring.columns["nvlink2_tx_kib"].dense.typecode == "Q"
    # the reset aged out of the ring: at the next lap the column is compact again
    assert all(ring.columns[n].keys is not None for n in names)
    assert all(ring.columns[n].nbytes() == 4 * capacity + 8 * (capacity // 32 + 2) for n in names)


def test_an_hour_of_eight_busy_gpus_costs_what_float32_cost() -> None:
    """Every link's TX and RX moving on every sample: 4 bytes a sample, as float32 took, exact."""
    names = [f"nvlink{n}_{f}" for n in range(18) for f in ("tx_kib", "rx_kib")]
    ring = Ring(1800, names)
    for i in range(1800):
        ring.append(T0 + 2 * i, {name: IDLE_KIB + 40_000_000 * i + j for j, name in enumerate(names)})
    assert ring.samples("nvlink17_rx_kib", 0.0)[-1][1] == IDLE_KIB + 40_000_000 * 1799 + 35
    links = ring.nbytes() - ring.times.itemsize * ring.capacity
    assert links == 36 * (4 * 1800 + 8 * (1800 // 32 + 2))  # 4 bytes a sample and a base per 32: 0.26 MiB a GPU


def test_a_value_no_unsigned_64_bit_column_holds_keeps_the_column_exact() -> None:
    ring = Ring(8, ["nvlink0_crc_errors"])
    values: list[Any] = [5, 6, NO_VALUE, 2**64 + 3, -1, 7.0, 1.5, None, 9]
    for i, v in enumerate(values):
        ring.append(float(i), {"nvlink0_crc_errors": v})
    assert [v for _, v in ring.samples("nvlink0_crc_errors", 0.0)] == values[1:]
    assert ring.columns["nvlink0_crc_errors"].kind == "o"
    ring.append(9.0, {"nvlink0_crc_errors": float("nan")})  # NaN is "not read" here too
    assert ring.samples("nvlink0_crc_errors", 9.0) == [(9.0, None)]
    plain = Ring(4, ["pcie_replay_counter"])
    plain.append(0.0, {"pcie_replay_counter": float("nan")})
    assert plain.samples("pcie_replay_counter", 0.0) == [(0.0, None)] and plain.columns["pcie_replay_counter"].kind == "Q"


def test_an_hour_of_eight_idle_gpus_stays_well_under_a_mib() -> None:
    names = [*GPU_FIELDS, *(f"nvlink{n}_{f}" for n in range(18) for f in LINK_FIELDS)]
    total = 0
    for g in range(8):
        ring = Ring(1800, names)  # an hour at 2 s
        for i in range(1800):
            row: dict[str, Any] = {"temp_gpu_c": 36.0 + (i // 300) % 2, "power_draw_w": 77.0 + (i % 7) / 10,
                                   "clocks_event_mask": 1, "pcie_replay_counter": 3}
            for n in range(18):
                row[f"nvlink{n}_tx_kib"] = IDLE_KIB + 1_000_003 * n + g
                row[f"nvlink{n}_rx_kib"] = IDLE_KIB - IDLE_KIB // 50
                row.update({f"nvlink{n}_{f}": 0 for f in ("crc_errors", "replay_errors", "recovery_errors")})
            ring.append(T0 + 2 * i, row)
        total += ring.nbytes()
    assert total < 256 * 1024, total  # 0.18 MiB measured


# --- the checks' differences ------------------------------------------------------------------


def _link(n: int, tx: int, replays: int = 0) -> model.NvLink:
    return model.NvLink(link=n, state="up", remote_bus_id=f"0000:05:00.{n}", remote_type="switch",
                        crc_errors=0, replay_errors=replays, recovery_errors=0, tx_kib=tx, rx_kib=tx)


def _pair(before: list[model.NvLink], after: list[model.NvLink], replays: tuple[int, int] = (0, 0),
          dt: float = 60.0) -> tuple[model.Node, model.Node]:
    ident = {"index": 0, "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "bus_id": "0000:18:00.0",
             "pcie_gen_current": 5, "pcie_width_current": 16}
    prev = model.Node(hostname="n1", backend="nvml", collected_at=T0,
                      gpus=[model.Gpu(**ident, nvlinks=before, pcie_replay_counter=replays[0])])
    cur = model.Node(hostname="n1", backend="nvml", collected_at=T0 + dt,
                     gpus=[model.Gpu(**ident, nvlinks=after, pcie_replay_counter=replays[1])])
    return prev, cur


def _by(findings: list[model.Finding], check: str) -> list[model.Finding]:
    return [f for f in findings if f.check == check]


def test_growth_past_2_53_is_the_exact_integer_difference() -> None:
    busy = 4 * 1024 * 1024  # KiB a busy link moves in the window
    before = [_link(0, PAST_2_53, replays=PAST_2_53), _link(1, PAST_2_53), _link(2, PAST_2_53 + 2)]
    after = [_link(0, PAST_2_53, replays=PAST_2_53 + 3), _link(1, PAST_2_53 + busy), _link(2, PAST_2_53 + 2 + busy)]
    prev, cur = _pair(before, after, replays=(PAST_2_53, PAST_2_53 + 100))
    findings = run_node_checks(cur, None, prev)
    [idle] = _by(findings, "nvlink.idle_link")
    assert idle.observed["links"]["0"]["moved_kib"] == 0  # float64 would read 2**53 for both ends
    assert idle.observed["links"]["0"]["peer_median_kib"] == 2 * busy
    [errors] = _by(findings, "nvlink.error_rate")
    assert errors.observed["links"] == {"0": {"replay_errors": 3}} and errors.observed["per_min"]["replay_errors"] == 3.0
    [replays] = _by(findings, "pcie.replay_rate")
    assert replays.observed["per_min"] == 100.0 and replays.observed["total"] == PAST_2_53 + 100


@pytest.mark.parametrize(("before", "after"), [
    (2**64 - 10, 5),  # NVML's unsigned 64-bit counter wrapped
    (2**32 - 3, 4),  # a 32-bit counter wrapped
    (IDLE_KIB, 1_000),  # a GPU reset or driver reload zeroed it; 1000 KiB since
], ids=["wrap-2-64", "wrap-2-32", "reset"])
def test_a_counter_that_went_down_is_a_reset_of_the_base_not_a_negative_rate_or_a_spike(
        before: int, after: int) -> None:
    busy = 4 * 1024 * 1024
    links_before = [_link(0, before, replays=before), _link(1, IDLE_KIB), _link(2, IDLE_KIB)]
    links_after = [_link(0, after, replays=after), _link(1, IDLE_KIB + busy), _link(2, IDLE_KIB + busy)]
    prev, cur = _pair(links_before, links_after, replays=(before, after))
    findings = run_node_checks(cur, None, prev)
    # the link that went back is neither idle (a negative move) nor erroring (a huge move)
    assert _by(findings, "nvlink.idle_link") == [] and _by(findings, "nvlink.error_rate") == []
    assert [f.severity for f in _by(findings, "pcie.replay_rate")] == ["info"]  # a total, no rate
    assert all(not isinstance(v, (int, float)) or v >= 0 for f in findings for v in _numbers(f.observed))
    # the next pair starts from the new base: its growth is exact again
    links_later = [_link(0, after + 2, replays=after + 2), _link(1, IDLE_KIB + 2 * busy),
                   _link(2, IDLE_KIB + 2 * busy)]
    later = model.Node(hostname="n1", backend="nvml", collected_at=T0 + 120, gpus=[
        model.Gpu(index=0, uuid=cur.gpus[0].uuid, bus_id=cur.gpus[0].bus_id, nvlinks=links_later,
                  pcie_gen_current=5, pcie_width_current=16, pcie_replay_counter=after + 100)])
    findings = run_node_checks(later, None, cur)
    [idle] = _by(findings, "nvlink.idle_link")
    assert idle.observed["links"]["0"]["moved_kib"] == 4  # 2 KiB each way, exact from the new base
    [errors] = _by(findings, "nvlink.error_rate")
    assert errors.observed["links"] == {"0": {"replay_errors": 2}}
    [replays] = _by(findings, "pcie.replay_rate")
    assert replays.severity == "warn" and replays.observed["per_min"] == 100.0


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value]


# --- through the daemon: the sim backend, the ring, the rate base, the checks ------------------


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: dict[str, Any]) -> tuple[
        NodeService, Path, Clock]:
    clock = Clock(time.time())
    # the daemon's sampling and full-snapshot cadence, the simulator and its faults share it
    monkeypatch.setattr(time, "time", clock)
    monkeypatch.setattr(time, "monotonic", clock)
    state = tmp_path / "n1.json"
    sim.init_state(str(state), "n1", scenario)
    svc = NodeService(SimAccess(str(state)), str(tmp_path / "s.sock"), str(tmp_path / "lib"),
                      str(tmp_path / "kmsg"), interval_s=10.0, full_interval_s=10.0)
    return svc, state, clock


def _ticks(svc: NodeService, clock: Clock, n: int) -> None:
    for _ in range(n):
        clock.now += svc.interval_s
        svc.tick()


def _daemon_findings(svc: NodeService, check: str) -> list[dict[str, Any]]:
    return [f for f in svc.findings if f["check"] == check]


def test_the_daemon_sees_an_idle_link_at_8_7e12_kib_move_exactly_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, state, clock = _service(tmp_path, monkeypatch, {"gpu": {"nvlink_start_kib": IDLE_KIB}})
    with sim.locked_state(str(state)) as s:
        sim.set_load(s, 2, 50, now=clock.now)  # a job on GPU 2: every link moves on every sample
    _ticks(svc, clock, 200)  # more changes than runs hold: the link columns are dense now
    uuid = sim.read_state(str(state))["gpus"][2]["uuid"]
    ring = svc.rings[uuid]
    assert ring.columns["nvlink5_tx_kib"].dense is not None and ring.columns["nvlink5_tx_kib"].kind == "Q"
    assert sim.inject(str(state), "nvlink-idle", 2)  # link 5 stops carrying, the others go on
    _ticks(svc, clock, 9)  # past the 60 s window
    [f] = _daemon_findings(svc, "nvlink.idle_link")
    assert f["gpu"]["uuid"] == uuid and f["observed"]["links"]["5"]["moved_kib"] == 0
    assert f["observed"]["window_s"] >= 60
    # the ring holds NVML's exact value: the one the snapshot shows, sample after sample
    [link] = [lk for lk in next(g for g in svc.node.gpus if g.uuid == uuid).nvlinks if lk.link == 5]
    assert link.tx_kib > 2**24 and link.tx_kib > IDLE_KIB
    idle = [v for _, v in ring.samples("nvlink5_tx_kib", clock.now - 50)]
    assert idle == [link.tx_kib] * len(idle) and len(idle) >= 5
    # a busy link's growth over the window is exact to the KiB: ring sample against snapshot
    base = ring.sample_at(svc.rate_since or 0.0)
    assert base is not None
    [busy] = [lk for lk in next(g for g in svc.node.gpus if g.uuid == uuid).nvlinks if lk.link == 4]
    grown = busy.tx_kib - base["nvlink4_tx_kib"]
    assert isinstance(grown, int) and 0 < grown < 2**31
    assert _daemon_findings(svc, "nvlink.error_rate") == [] and _daemon_findings(svc, "pcie.replay_rate") == []


def test_the_daemon_takes_a_gpu_reset_as_a_reset_of_the_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, state, clock = _service(tmp_path, monkeypatch, {"gpu": {"nvlink_start_kib": PAST_2_53}})
    with sim.locked_state(str(state)) as s:
        for pos in range(8):
            sim.set_load(s, pos, 80, now=clock.now)
    _ticks(svc, clock, 12)
    assert _daemon_findings(svc, "nvlink.idle_link") == []
    with sim.locked_state(str(state)) as s:  # every counter of GPU 3 back to zero
        sim.reset_gpu(s, 3, now=clock.now)
        sim.set_load(s, 3, 80, now=clock.now)
    uuid = sim.read_state(str(state))["gpus"][3]["uuid"]
    seen = []
    for _ in range(12):  # through the window that spans the reset, and past it
        _ticks(svc, clock, 1)
        seen += [f for f in svc.findings if f["check"].startswith(("nvlink.", "pcie.", "memory."))]
    assert seen == []  # no idle link (a negative move), no error burst (a huge one)
    after = [v for _, v in svc.rings[uuid].samples("nvlink0_tx_kib", clock.now - 100)]
    assert all(isinstance(v, int) and 0 <= v < 2**40 for v in after)
    assert all(b > a for a, b in zip(after, after[1:], strict=False))  # growing again from zero


def test_the_tui_shares_a_link_record_only_with_one_that_counted_exactly_the_same() -> None:
    """The TUI makes equal link records one object and keeps the snapshot as its rate base: a
    link merged with another GPU's would carry that link's KiB into the next rate."""
    from fleetops.tui import data

    def node(tx: list[int]) -> model.Node:
        gpus = [model.Gpu(index=i, uuid=f"GPU-{i}", bus_id=f"0000:{0x18 + i:02x}:00.0",
                          nvlinks=[_link(0, kib)]) for i, kib in enumerate(tx)]
        return model.Node(hostname="n1", backend="sim", collected_at=T0, gpus=gpus)

    a = node([IDLE_KIB, IDLE_KIB + 1, PAST_2_53])
    data.share_links(a)
    assert [g.nvlinks[0].tx_kib for g in a.gpus if g.nvlinks] == [IDLE_KIB, IDLE_KIB + 1, PAST_2_53]
    b = node([IDLE_KIB + 1])
    data.share_links(b)
    assert b.gpus[0].nvlinks is not None and a.gpus[1].nvlinks is not None
    assert b.gpus[0].nvlinks[0] is a.gpus[1].nvlinks[0]  # the very same record: still shared


def test_history_hands_a_counters_samples_on_as_exact_ints() -> None:
    from fleetops.agent.serve import history_cli

    assert history_cli._value(PAST_2_53) == PAST_2_53 and type(history_cli._value(PAST_2_53)) is int
    assert history_cli._value(36.5) == 36.5 and history_cli._value(float("nan")) is None


def test_the_exposition_and_the_json_report_print_every_digit_of_a_huge_counter() -> None:
    import json

    from fleetops.agent import metrics

    link = _link(0, PAST_2_53, replays=PAST_2_53 + 2)
    gpu = model.Gpu(index=0, uuid="GPU-0", bus_id="0000:18:00.0", nvlinks=[link],
                    ecc_corrected_volatile=PAST_2_53 + 4, pcie_replay_counter=2**64 - 2)
    node = model.Node(hostname="n1", backend="sim", collected_at=T0, gpus=[gpu])
    page = metrics.render(metrics.MetricsInput(
        node=node, agent=metrics.AgentInfo(T0, 2.0), nvlink_bytes={("GPU-0", 0, "tx"): PAST_2_53 * 1024}))
    lines = page.splitlines()
    for name, value in (("fleetops_gpu_ecc_corrected_volatile_errors_total", PAST_2_53 + 4),
                        ("fleetops_gpu_pcie_replays_total", 2**64 - 2),
                        ("fleetops_gpu_nvlink_replay_errors_total", PAST_2_53 + 2),
                        ("fleetops_gpu_nvlink_bytes_total", PAST_2_53 * 1024)):
        assert [line for line in lines if line.startswith(name + "{")][0].endswith(f" {value}"), name
    doc = json.loads(json.dumps(model.to_dict(node)))
    assert doc["gpus"][0]["nvlinks"][0]["tx_kib"] == PAST_2_53 and doc["gpus"][0]["pcie_replay_counter"] == 2**64 - 2


def test_the_audit_textfile_prints_a_counter_whole_not_in_six_significant_digits() -> None:
    from fleetops.checks import verdict
    from fleetops.fleet import audit
    from fleetops.report import prometheus

    gpu = model.Gpu(index=0, uuid="GPU-0", bus_id="0000:18:00.0", ecc_corrected_volatile=PAST_2_53,
                    pcie_replay_counter=1_234_567, power_draw_w=77.4, pcie_width_current=16)
    node = model.Node(hostname="n1", backend="sim", collected_at=T0, gpus=[gpu])
    result = audit.AuditResult(started_at=T0, duration_s=0.1, nodes=[verdict.NodeResult("n1", True, None, node)],
                               findings=[])
    lines = prometheus.render(result, 0).splitlines()

    def sample(name: str) -> str:
        return next(line for line in lines if line.startswith(name + "{")).rsplit(" ", 1)[1]

    assert sample("fleetops_gpu_ecc_corrected_volatile_errors") == str(PAST_2_53)
    assert sample("fleetops_gpu_pcie_replays") == "1234567"  # was 1.23457e+06
    assert sample("fleetops_gpu_power_draw_watts") == "77.4" and sample("fleetops_gpu_pcie_link_width") == "16"
