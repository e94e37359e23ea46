"""``jobs.diagnose`` on hand-written series: each pathology gives exactly its verdict on the right
GPU, a steady job none, and every false-positive guard holds (short job, few samples, single GPU,
a whole node throttled, an idle job, GPUs without NVLink, busy CPUs with fed GPUs)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from fleetops.catalog import pcie
from fleetops.jobs import diagnose as dg

NODE = "node017"
T0 = 1_800_000_000.0
LINK = pcie.link_kbps(5, 16) or 0.0
FACTS = dg.GpuFacts(power_limit_w=700.0, clock_sm_max_mhz=1980, pcie_gen=5, pcie_width=16)
NVLINK_START = 8_700_000_000_000  # KiB, where a node that has run for weeks has them


def _jitter(k: int, salt: int) -> float:
    """A fixed pseudo-random value in [0, 1) per sample (no random module: the same every run)."""
    return (math.sin(k * 12.9898 + salt * 78.233) * 43758.5453) % 1.0


def gpu(
    index: int,
    *,
    n: int = 150,
    step: float = 2.0,
    node: str = NODE,
    util: Callable[[int], float] = lambda k: 93 + 5 * _jitter(k, 1),
    mask: Callable[[int], int] = lambda k: 0x4 if _jitter(k, 2) < 0.3 else 0,
    clock: Callable[[int], float] | None = None,
    rx_share: Callable[[int], float | None] = lambda k: 0.03 + 0.04 * _jitter(k, 3),
    tx_share: Callable[[int], float | None] = lambda k: 0.02,
    nvlink_kib_s: float | None = 11_000_000.0,
    links: int = 18,
    facts: dg.GpuFacts = FACTS,
    xids: tuple[tuple[float, int], ...] = (),
) -> dg.JobGpu:
    """A GPU's series as the daemon's ring answers them: a steady GEMM load unless told otherwise."""
    series: dict[str, list[dg.Sample]] = {}

    def put(name: str, t: float, v: dg.Value) -> None:
        series.setdefault(name, []).append((t, v))

    for k in range(n):
        t = T0 + (k + 1) * step
        m = mask(k)
        put("utilization_gpu_pct", t, int(round(util(k))))
        put("clocks_event_mask", t, m)
        put("clock_sm_mhz", t, clock(k) if clock else (1110 if m & 0x8 else 1900 if m & 0x4 else 1980))
        put("power_draw_w", t, 690.0 if m & 0x4 else 640.0)
        rx, tx = rx_share(k), tx_share(k)
        put("pcie_rx_kbps", t, None if rx is None else int(LINK * rx))
        put("pcie_tx_kbps", t, None if tx is None else int(LINK * tx))
        put("ecc_corrected_volatile", t, 0)
        put("ecc_uncorrected_volatile", t, 0)
        if nvlink_kib_s is not None:
            for link in range(links):
                moved = int(nvlink_kib_s / links * (k + 1) * step)
                put(f"nvlink{link}_tx_kib", t, NVLINK_START + moved)
                put(f"nvlink{link}_rx_kib", t, NVLINK_START + moved)
    return dg.JobGpu(node=node, uuid=f"GPU-{node}-{index}", index=index, series=series, facts=facts, xids=xids)


def cpu(node: str = NODE, *, cpus: int = 32, share: float = 0.4, n: int = 150, step: float = 2.0) -> dg.NodeCpu:
    usage = [(T0 + (k + 1) * step, int(cpus * share * (k + 1) * step * 1e6)) for k in range(n)]
    return dg.NodeCpu(node=node, usage_usec=usage, cpus=cpus)


def job(gpus: list[dg.JobGpu], cpus: list[dg.NodeCpu] | None = None, seconds: float = 300.0) -> dg.Job:
    return dg.Job(job_id="4242", started_at=T0, ended_at=T0 + seconds, gpus=gpus,
                  cpu=[cpu()] if cpus is None else cpus)


def keys(d: dg.Diagnosis) -> set[tuple[str, str, tuple[int, ...]]]:
    return {(v.code, v.node, tuple(sorted(g["index"] for g in v.gpus))) for v in d.verdicts}


def test_a_steady_job_gets_no_verdict_and_no_note() -> None:
    d = dg.diagnose(job([gpu(i) for i in range(4)]))
    assert d.verdicts == [] and d.notes == []
    g = d.gpus[0]
    assert g.samples == 150 and 93 <= (g.utilization_pct.mean or 0) <= 98
    assert 0.2 < g.throttle_share["sw_power_cap"] < 0.4 and g.slowdown_share == 0.0
    assert g.pcie_rx_share is not None and g.pcie_rx_share < 0.1
    assert g.nvlink_kib_s == pytest.approx(22_000_000, rel=0.01)  # TX + RX over the 18 links
    assert len(g.nvlink) == 18 and g.nvlink[0].tx_kib == int(11_000_000 / 18 * 150 * 2) - int(11_000_000 / 18 * 2)
    assert g.power_share == pytest.approx(0.94, abs=0.03) and g.ecc_corrected == 0
    assert d.cpu[0].share == pytest.approx(0.4, abs=0.01)


def test_the_gpu_in_hw_slowdown_is_the_straggler_the_others_wait_for() -> None:
    slow = gpu(2, mask=lambda k: 0x8 if k % 50 < 19 else 0)  # 38 % of the samples
    waiting = [gpu(i, util=lambda k: 45 if k % 50 < 19 else 95) for i in (0, 1, 3)]
    d = dg.diagnose(job([*waiting[:2], slow, waiting[2]]))
    assert keys(d) == {("straggler", NODE, (2,))}
    [v] = d.verdicts
    assert v.message == f"GPU 2 on {NODE} spent 38 % of the job in hw_slowdown: the straggler the others wait for."
    assert v.gpus == [{"index": 2, "uuid": f"GPU-{NODE}-2"}]
    assert v.evidence["slowdown_share"] == 0.38 and v.evidence["peers_median_share"] == 0.0
    assert v.evidence["clock_sm_mhz_mean"] < v.evidence["peers_clock_sm_mhz_mean"]
    assert v.evidence["peers_utilization_p5"] == 45
    assert v.confidence == 0.96  # (0.38 - 0.15) / 0.25 clear: margin 0.92; 150 samples: support 1


def test_a_whole_node_in_slowdown_has_no_straggler() -> None:
    hot = [gpu(i, mask=lambda k: 0x8 | 0x40 if k % 10 < 4 else 0) for i in range(4)]
    assert dg.diagnose(job(hot)).verdicts == []


def test_sw_power_cap_alone_is_no_slowdown() -> None:
    capped = gpu(1, mask=lambda k: 0x4)  # at the cap the whole job: a healthy GEMM load
    assert dg.diagnose(job([gpu(0), capped, gpu(2)])).verdicts == []


def test_a_single_gpu_job_gets_no_straggler_nor_nvlink_verdict() -> None:
    alone = gpu(0, mask=lambda k: 0x8 if k % 10 < 4 else 0, util=lambda k: 70, nvlink_kib_s=0.0)
    d = dg.diagnose(job([alone]))
    assert d.verdicts == []
    assert any("single-GPU job" in n for n in d.notes)


def test_input_bound_names_only_the_gpu_that_waits_for_the_host() -> None:
    starving = gpu(1, util=lambda k: 28 + 5 * _jitter(k, 4), rx_share=lambda k: 0.91 + 0.03 * _jitter(k, 5))
    d = dg.diagnose(job([gpu(0), starving, gpu(2), gpu(3)]))
    assert keys(d) == {("input_bound", NODE, (1,))}
    [v] = d.verdicts
    assert v.message.startswith(f"GPU 1 on {NODE} read from the host at 92 % of its PCIe Gen5 x16 link while its SMs")
    assert v.message.endswith("input-bound.")
    assert v.evidence["gpus"]["1"]["pcie_link_kbps"] == LINK


def test_a_busy_gpu_reading_fast_is_not_input_bound() -> None:
    busy = [gpu(i, rx_share=lambda k: 0.93) for i in range(2)]
    assert dg.diagnose(job(busy)).verdicts == []


def test_pcie_throughput_not_read_is_not_zero_nor_a_verdict() -> None:
    unread = [gpu(i, util=lambda k: 30, rx_share=lambda k: None, tx_share=lambda k: None) for i in range(2)]
    d = dg.diagnose(job(unread))
    assert d.verdicts == [] and d.gpus[0].pcie_rx_share is None and d.gpus[0].pcie_rx_kbps.samples == 0


def test_busy_gpus_that_move_nothing_over_nvlink_are_nvlink_unused() -> None:
    silent = [gpu(i, util=lambda k: 70, nvlink_kib_s=0.0, rx_share=lambda k: 0.45, tx_share=lambda k: 0.45)
              for i in range(4)]
    d = dg.diagnose(job(silent))
    assert keys(d) == {("nvlink_unused", NODE, (0, 1, 2, 3))}
    [v] = d.verdicts
    assert v.message == (f"GPUs 0-3 on {NODE} moved nothing over NVLink while busy 70 % of the time: "
                         "their collectives went over PCIe (45 % of the link).")


def test_no_nvlink_verdict_for_an_idle_job_a_pcie_card_or_one_gpu_per_node() -> None:
    idle = [gpu(i, util=lambda k: 2, nvlink_kib_s=0.0, mask=lambda k: 0x1) for i in range(4)]
    assert dg.diagnose(job(idle)).verdicts == []
    no_links = [gpu(i, util=lambda k: 70, nvlink_kib_s=None) for i in range(4)]  # H100 PCIe, a passthrough VM
    assert dg.diagnose(job(no_links)).verdicts == []
    spread = [gpu(0, node="node017", util=lambda k: 70, nvlink_kib_s=0.0),
              gpu(0, node="node018", util=lambda k: 70, nvlink_kib_s=0.0)]
    assert dg.diagnose(job(spread, cpus=[cpu("node017"), cpu("node018")])).verdicts == []


def test_one_gpu_using_nvlink_clears_the_node() -> None:
    mixed = [gpu(0, util=lambda k: 70), *(gpu(i, util=lambda k: 70, nvlink_kib_s=0.0) for i in (1, 2, 3))]
    assert dg.diagnose(job(mixed)).verdicts == []  # one link's silence is the daemon's nvlink.idle_link


def test_a_saturated_cgroup_with_swinging_gpus_is_cpu_starved() -> None:
    swinging = [gpu(i, util=lambda k: 10 + 80 * _jitter(k, 6)) for i in range(4)]
    d = dg.diagnose(job(swinging, cpus=[cpu(share=0.98)]))
    assert keys(d) == {("cpu_starved", NODE, (0, 1, 2, 3))}
    [v] = d.verdicts
    assert v.message.startswith(f"The job's 32 CPUs on {NODE} were 98 % busy while its GPUs 0-3 there swung between")
    assert v.evidence["cores_busy"] == pytest.approx(31.36, abs=0.01) and v.evidence["saturated_share"] == 1.0


def test_busy_cpus_with_fed_gpus_are_not_starved() -> None:
    assert dg.diagnose(job([gpu(i) for i in range(4)], cpus=[cpu(share=0.99)])).verdicts == []


def test_an_xid_just_before_the_end_is_the_likely_cause_and_an_early_one_is_not() -> None:
    end = T0 + 300
    d = dg.diagnose(job([gpu(0), gpu(1, xids=((end - 12, 79),)), gpu(2, xids=((T0 + 30, 13),))]))
    assert keys(d) == {("xid_end", NODE, (1,))}
    [v] = d.verdicts
    assert v.message == f"GPU 1 on {NODE} logged XID 79 12 s before the job ended: the job likely ended on it."
    assert v.confidence == 0.9  # 12 s into the 60 s window: margin 0.8, support 1
    assert d.gpus[2].xids == [(T0 + 30, 13)]  # in the summary, not a verdict


def test_a_short_job_gets_no_performance_verdict_and_says_why() -> None:
    slow = gpu(2, n=30, mask=lambda k: 0x8 if k % 10 < 4 else 0)
    d = dg.diagnose(job([gpu(0, n=30), gpu(1, n=30), slow], seconds=60.0))
    assert d.verdicts == []
    assert d.notes == ["the job ran 60 s, under 120 s: too short to judge its performance (start-up dominates it); "
                       "no performance verdict"]


def test_an_xid_at_the_end_of_a_short_job_still_counts() -> None:
    end = T0 + 40
    d = dg.diagnose(job([gpu(0, n=20), gpu(1, n=20, xids=((end - 2, 79),))], seconds=40.0))
    assert keys(d) == {("xid_end", NODE, (1,))} and d.notes  # a fact, not a statistic


def test_a_gpu_with_too_few_samples_is_not_judged() -> None:
    sparse = gpu(1, n=20, step=15.0, util=lambda k: 30, rx_share=lambda k: 0.93)  # 300 s, 20 samples
    d = dg.diagnose(job([gpu(0), sparse]))
    assert d.verdicts == []
    assert f"GPU 1 on {NODE}: 20 samples, under 30: not judged" in d.notes


def test_a_counter_reset_is_a_new_base_not_a_negative_rate() -> None:
    big = 2**60 + 1  # NVML's counters are unsigned 64-bit: past 2**53 a float loses the KiB
    values = [big, big + 100, big + 200, 50, 150]  # a GPU reset after the third
    series: dict[str, list[dg.Sample]] = {"nvlink0_tx_kib": [(T0 + 2 * k, v) for k, v in enumerate(values)]}
    s = dg.summarize(dg.JobGpu(NODE, "GPU-x", 0, series, FACTS), T0, T0 + 300)
    assert s.nvlink[0].tx_kib == 100 + 100 + 50 + 100  # exact integers past 2**53 too
    assert s.nvlink[0].rx_kib is None


def test_confidence_grows_with_margin_and_samples() -> None:
    assert dg._confidence(0.0, 30) == 0.3  # at the threshold, one minute of samples
    assert dg._confidence(1.0, 150) == 1.0
    assert dg._confidence(0.5, 150) < dg._confidence(1.0, 150)


def test_every_threshold_says_why() -> None:
    for name, th in dg.THRESHOLDS.items():
        assert th.why and th.unit, name
        assert th.clear >= 0 and th.value > 0, name
