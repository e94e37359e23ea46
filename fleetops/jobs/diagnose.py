"""Why a job is slow, from its GPUs' samples: a summary per GPU and a list of verdicts with evidence.

Pure: the input is what the daemons' rings held over the job's life (``{field: [(t, value), ...]}``
per GPU, in the light sample's field names: ``gpu/backend.py`` ``GPU_FIELDS`` and
``nvlink<N>_tx_kib`` / ``_rx_kib``), each GPU's static facts, the XIDs during the job and the job
cgroup's CPU usage on each node; nothing is read here. The same function judges a simulated job
and a real one.

Verdicts (``THRESHOLDS`` holds every number, each with its reason):

- ``straggler``: one GPU of a multi-GPU job spends a share of the job's time in a slowdown reason
  (``hw_slowdown``, the thermal ones, the power brake: not ``sw_power_cap``, which a healthy GEMM
  load shows) well above what the job's other GPUs show; the others wait for it at every
  collective.
- ``input_bound``: the GPU reads from the host (PCIe RX) near its link's capacity while its SMs sit
  mostly idle.
- ``nvlink_unused``: two or more of the job's GPUs on a node, busy, and not one NVLink counter of
  any of them moved: their traffic went over PCIe (NCCL without P2P) or nowhere.
- ``cpu_starved``: the job's cgroup on a node used nearly all its allocated CPUs while its GPUs
  there were underfed (low or swinging utilisation).
- ``xid_end``: a GPU of the job logged an XID in the last ``xid_end_s`` seconds before the job
  ended (or within ``xid_end_grace_s`` after): the job likely ended because of it.

False-positive guards: a job shorter than ``min_job_s`` gets no performance verdict (start-up and
data loading dominate it; the reason is in ``notes``), nor does a GPU with fewer than
``min_samples`` samples (nor a node's CPU with fewer); a field NVML did not give (None, NaN) is not a zero; a
single-GPU job (and a node holding one GPU of the job) gets no ``nvlink_unused`` verdict, a GPU
without NVLink counters (PCIe cards, passthrough VMs) none either; the straggler's slowdown share is
compared with the median of the job's other GPUs, so a whole node running hot is not a straggler
and a single-GPU job never has one (its throttling is the daemon's ``thermal_power.throttle``
finding); ``cpu_starved`` asks for underfed GPUs besides a busy cgroup, so a CPU-heavy job whose
GPUs stay at 95 % gets nothing. ``xid_end`` is a fact, not a statistic: it holds for a short job too.

Confidence (0.25 to 1.0): ``(0.5 + 0.5 * margin) * (0.5 + 0.5 * support)``. ``margin`` is how far
the observed value is past its threshold, as a share of the threshold's ``clear`` distance (0 at
the threshold, 1 at or past threshold + clear; the smallest over a verdict's conditions, the
largest over alternatives such as cpu_starved's low-or-swinging utilisation);
``support`` is the samples behind it over FULL_SUPPORT_SAMPLES (five minutes at the daemon's 2 s),
at most 1. A verdict at its thresholds on one minute of samples has 0.30; a clear one over five
minutes 1.0. ``xid_end``: margin is 1 for an XID at the job's end, falling to 0 at ``xid_end_s``
before it; support 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetops.catalog import pcie, throttle
from fleetops.common import stats

Value = float | int | None
Sample = tuple[float, Value]


@dataclass(frozen=True)
class Threshold:
    value: float
    clear: float  # past value + clear, the margin counts in full (see the module's confidence)
    unit: str
    why: str


THRESHOLDS: dict[str, Threshold] = {
    "min_job_s": Threshold(120.0, 0.0, "s",
                           "shorter jobs are dominated by start-up (imports, NCCL init, the first batches): no "
                           "performance verdict"),
    "min_samples": Threshold(30.0, 0.0, "samples",
                             "one minute at the daemon's 2 s: fewer make a share or a percentile noise"),
    "straggler_share": Threshold(0.15, 0.25, "share of samples",
                                 "a GPU in a hardware slowdown for more than a sixth of the job slows every "
                                 "collective it takes part in by that much; brief episodes are the daemon's "
                                 "throttle finding"),
    "straggler_margin": Threshold(0.10, 0.20, "share over the peers' median",
                                  "the slowdown must be this GPU's, not the node's or the job's: a whole "
                                  "node running hot makes no straggler"),
    "input_rx_share": Threshold(0.75, 0.15, "share of the link, PCIe RX",
                                "past three quarters of the link's raw rate the link is near what PCIe "
                                "delivers after its protocol overhead (80-95 %)"),
    "input_max_util": Threshold(60.0, 30.0, "% utilisation (mean)",
                                "a GPU busy most of the time is not waiting for its input, however much it reads"),
    "nvlink_max_kib_s": Threshold(100.0, 0.0, "KiB/s over all links (mean)",
                                  "an NCCL job moves gigabytes per second per link; 100 KiB/s is nothing "
                                  "(NVML's counters hold still on an unused link)"),
    "nvlink_min_util": Threshold(20.0, 30.0, "% utilisation (mean)",
                                 "an idle job moves nothing anywhere; only a busy one's silence on NVLink says "
                                 "its traffic went elsewhere"),
    "cpu_share": Threshold(0.90, 0.08, "share of the allocated CPUs (mean)",
                           "a cgroup at 90 % of its CPUs has no room left for the data loader's bursts"),
    "cpu_gpu_util": Threshold(75.0, 25.0, "% utilisation (mean), or p95 - p5 >= cpu_gpu_swing",
                              "a busy cgroup matters only where the GPUs wait: low or swinging utilisation"),
    "cpu_gpu_swing": Threshold(50.0, 30.0, "percentage points, p95 - p5",
                               "utilisation that swings this far is bursts of work between late batches"),
    "xid_end_s": Threshold(60.0, 0.0, "s before the job's end",
                           "a fatal XID ends the job within seconds to a minute (the process dies on its "
                           "next CUDA call, Slurm tears the step down)"),
    "xid_end_grace_s": Threshold(5.0, 0.0, "s after the job's end",
                                 "the kernel log's stamp and the scheduler's end time are seconds apart"),
}

FULL_SUPPORT_SAMPLES = 150  # five minutes at 2 s

# The clocks-event reasons that make a GPU slower than its peers: hardware and thermal slowdowns
# and the power brake. sw_power_cap is left out: a GEMM-bound job at its power cap shows it on
# every GPU, a healthy state.
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")

_LINK_FIELD = re.compile(r"^nvlink(\d+)_(tx|rx)_kib$")


# --- the input --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuFacts:
    """What does not change over a job: its power cap (W), maximum SM clock (MHz), and the PCIe
    generation and width the link trained to (current, not maximum)."""

    power_limit_w: float | None = None
    clock_sm_max_mhz: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True)
class JobGpu:
    node: str
    uuid: str
    index: int
    series: Mapping[str, Sequence[Sample]]
    facts: GpuFacts = GpuFacts()
    xids: Sequence[tuple[float, int]] = ()  # (time, code) logged during the job


@dataclass(frozen=True)
class NodeCpu:
    """The job's cgroup on one node: ``usage_usec`` samples (cpu.stat, cumulative) and the CPUs
    allocated there."""

    node: str
    usage_usec: Sequence[Sample]
    cpus: int


@dataclass(frozen=True)
class Job:
    job_id: str
    started_at: float
    ended_at: float | None  # None: still running (judged up to its last sample)
    gpus: Sequence[JobGpu]
    cpu: Sequence[NodeCpu] = ()


# --- the output -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    mean: float | None
    p5: float | None
    p95: float | None
    samples: int


@dataclass(frozen=True)
class LinkSummary:
    link: int
    tx_kib: int | None  # moved during the job (a counter reset is a new base, not a negative)
    rx_kib: int | None
    tx_kib_s: float | None
    rx_kib_s: float | None


@dataclass(frozen=True)
class GpuSummary:
    node: str
    uuid: str
    index: int
    samples: int
    seconds: float
    utilization_pct: Stat
    clock_sm_mhz: Stat
    clock_sm_share: float | None  # mean SM clock / maximum
    # reason -> share of the job's samples (evenly spaced by the daemon: a share of its time)
    throttle_share: dict[str, float]
    slowdown_share: float  # share of samples with any SLOWDOWN_REASONS bit
    slowdown_reason: str | None  # the one seen most
    power_w: Stat
    power_share: float | None  # mean power / cap
    pcie_gen: int | None
    pcie_width: int | None
    pcie_link_kbps: float | None
    pcie_tx_kbps: Stat
    pcie_rx_kbps: Stat
    pcie_tx_share: float | None  # mean / link capacity
    pcie_rx_share: float | None
    nvlink: list[LinkSummary]
    nvlink_kib_s: float | None  # TX + RX over every link, mean
    ecc_corrected: int | None  # volatile counts gained during the job
    ecc_uncorrected: int | None
    xids: list[tuple[float, int]]


@dataclass(frozen=True)
class CpuSummary:
    node: str
    cpus: int
    samples: int
    cores: float | None  # mean CPUs busy
    share: float | None  # cores / cpus
    saturated_share: float | None  # share of intervals at >= cpu_share of the allocation


@dataclass(frozen=True)
class Verdict:
    code: str
    node: str
    gpus: list[dict[str, Any]]  # [{"index", "uuid"}], the subject
    message: str
    evidence: dict[str, Any]
    confidence: float


@dataclass(frozen=True)
class Diagnosis:
    job_id: str
    seconds: float
    gpus: list[GpuSummary]
    cpu: list[CpuSummary]
    verdicts: list[Verdict]
    notes: list[str] = field(default_factory=list)  # why something was not judged

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- arithmetic -------------------------------------------------------------------------


def _number(value: Value) -> float | int | None:
    """A sampled value, or None where it was not read (None, NaN). An int stays an int: a counter
    past 2**53 keeps every digit."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    f = float(value)
    return None if math.isnan(f) else f


def _window(samples: Iterable[Sample], start: float, end: float) -> list[tuple[float, float | int]]:
    out: list[tuple[float, float | int]] = []
    for t, v in samples:
        f = _number(v)
        if f is not None and start <= t <= end:
            out.append((float(t), f))
    out.sort(key=lambda p: p[0])
    return out


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest rank on sorted values."""
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _stat(values: list[float]) -> Stat:
    if not values:
        return Stat(None, None, None, 0)
    ordered = sorted(values)
    return Stat(round(sum(values) / len(values), 2), _percentile(ordered, 5), _percentile(ordered, 95), len(values))


def _growth(points: list[tuple[float, float | int]]) -> int | None:
    """What a cumulative counter gained over the points, exactly: a value below the one before
    is a reset (a GPU reset, a driver reload, a new cgroup), counted from zero."""
    if len(points) < 2:
        return None
    total = 0
    prev = int(points[0][1])
    for _, v in points[1:]:
        cur = int(v)
        total += cur - prev if cur >= prev else cur
        prev = cur
    return total


def _span(points: list[tuple[float, float | int]]) -> float:
    return points[-1][0] - points[0][0] if len(points) >= 2 else 0.0


def _margin(observed: float, threshold: Threshold, below: bool = False) -> float:
    """How far past its threshold ``observed`` is, 0-1 of the threshold's clear distance."""
    if threshold.clear <= 0:
        return 1.0
    past = (threshold.value - observed) if below else (observed - threshold.value)
    return max(0.0, min(1.0, past / threshold.clear))


def _confidence(margin: float, samples: int) -> float:
    support = max(0.0, min(1.0, samples / FULL_SUPPORT_SAMPLES))
    return round((0.5 + 0.5 * margin) * (0.5 + 0.5 * support), 2)


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def _gpus_text(indices: list[int]) -> str:
    """``GPU 3``, ``GPUs 0-3``, ``GPUs 0, 2 and 5``."""
    ordered = sorted(indices)
    if len(ordered) == 1:
        return f"GPU {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"GPUs {ordered[0]}-{ordered[-1]}"
    return "GPUs " + ", ".join(str(i) for i in ordered[:-1]) + f" and {ordered[-1]}"


def _ref(g: JobGpu | GpuSummary) -> dict[str, Any]:
    return {"index": g.index, "uuid": g.uuid}


# --- the summary ------------------------------------------------------------------------


def summarize(gpu: JobGpu, start: float, end: float) -> GpuSummary:
    """One GPU's figures over [start, end]."""
    s = gpu.series

    def points(name: str) -> list[tuple[float, float | int]]:
        return _window(s.get(name, ()), start, end)

    util = points("utilization_gpu_pct")
    clock = points("clock_sm_mhz")
    power = points("power_draw_w")
    masks = points("clocks_event_mask")
    tx, rx = points("pcie_tx_kbps"), points("pcie_rx_kbps")
    counts: dict[str, int] = {}
    for _, m in masks:
        for reason in throttle.decode(int(m)):
            counts[reason] = counts.get(reason, 0) + 1
    shares = {r: round(c / len(masks), 3) for r, c in sorted(counts.items())} if masks else {}
    slow_bits = throttle.encode(list(SLOWDOWN_REASONS))
    slowed = sum(1 for _, m in masks if int(m) & slow_bits)
    seen = {r: counts[r] for r in SLOWDOWN_REASONS if counts.get(r)}
    facts = gpu.facts
    clock_stat = _stat([v for _, v in clock])
    power_stat = _stat([v for _, v in power])
    link_kbps = pcie.link_kbps(facts.pcie_gen, facts.pcie_width)
    tx_stat, rx_stat = _stat([v for _, v in tx]), _stat([v for _, v in rx])

    def share(stat: Stat, whole: float | None) -> float | None:
        return round(stat.mean / whole, 3) if stat.mean is not None and whole else None

    links: dict[int, dict[str, list[tuple[float, float | int]]]] = {}
    for name in s:
        found = _LINK_FIELD.match(name)
        if found:
            links.setdefault(int(found.group(1)), {})[found.group(2)] = points(name)
    link_rows = []
    moved_total, moved_known, span = 0, False, 0.0
    for link in sorted(links):
        row: dict[str, Any] = {}
        for direction in ("tx", "rx"):
            pts = links[link].get(direction, [])
            grown = _growth(pts)
            row[f"{direction}_kib"] = grown
            row[f"{direction}_kib_s"] = round(grown / _span(pts), 1) if grown is not None and _span(pts) > 0 else None
            if grown is not None and _span(pts) > 0:
                moved_total += grown
                moved_known = True
                span = max(span, _span(pts))
        link_rows.append(LinkSummary(link=link, **row))
    all_points = [p for name in ("utilization_gpu_pct", "clocks_event_mask", "clock_sm_mhz") for p in points(name)]
    times = sorted({t for t, _ in all_points})
    return GpuSummary(
        node=gpu.node,
        uuid=gpu.uuid,
        index=gpu.index,
        samples=max(len(util), len(masks), len(clock)),
        seconds=round(times[-1] - times[0], 1) if len(times) >= 2 else 0.0,
        utilization_pct=_stat([v for _, v in util]),
        clock_sm_mhz=clock_stat,
        clock_sm_share=share(clock_stat, facts.clock_sm_max_mhz),
        throttle_share=shares,
        slowdown_share=round(slowed / len(masks), 3) if masks else 0.0,
        slowdown_reason=max(seen, key=lambda r: seen[r]) if seen else None,
        power_w=power_stat,
        power_share=share(power_stat, facts.power_limit_w),
        pcie_gen=facts.pcie_gen,
        pcie_width=facts.pcie_width,
        pcie_link_kbps=link_kbps,
        pcie_tx_kbps=tx_stat,
        pcie_rx_kbps=rx_stat,
        pcie_tx_share=share(tx_stat, link_kbps),
        pcie_rx_share=share(rx_stat, link_kbps),
        nvlink=link_rows,
        nvlink_kib_s=round(moved_total / span, 1) if moved_known and span > 0 else None,
        ecc_corrected=_growth(points("ecc_corrected_volatile")),
        ecc_uncorrected=_growth(points("ecc_uncorrected_volatile")),
        xids=[(t, c) for t, c in gpu.xids if start <= t <= end + THRESHOLDS["xid_end_grace_s"].value],
    )


def _cpu_summary(cpu: NodeCpu, start: float, end: float) -> CpuSummary:
    pts = _window(cpu.usage_usec, start, end)
    grown, span = _growth(pts), _span(pts)
    if grown is None or span <= 0 or cpu.cpus <= 0:
        return CpuSummary(cpu.node, cpu.cpus, len(pts), None, None, None)
    cores = grown / 1e6 / span
    limit = THRESHOLDS["cpu_share"].value
    busy = 0
    for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False):
        step = (v1 - v0 if v1 >= v0 else v1) / 1e6 / max(t1 - t0, 1e-9)
        busy += step / cpu.cpus >= limit
    return CpuSummary(cpu.node, cpu.cpus, len(pts), round(cores, 2), round(cores / cpu.cpus, 3),
                      round(busy / (len(pts) - 1), 3))


# --- the verdicts -----------------------------------------------------------------------


def _stragglers(judged: list[GpuSummary], everyone: list[GpuSummary]) -> list[Verdict]:
    if len(everyone) < 2:
        return []
    t_share, t_margin = THRESHOLDS["straggler_share"], THRESHOLDS["straggler_margin"]
    slow = {g.uuid: (g.slowdown_share, g.slowdown_reason) for g in everyone}
    out = []
    for g in judged:
        share, reason = slow[g.uuid]
        peers = [slow[p.uuid][0] for p in everyone if p.uuid != g.uuid]
        base = stats.median(peers)
        if reason is None or share < t_share.value or share - base < t_margin.value:
            continue
        peer_clock = [p.clock_sm_mhz.mean for p in everyone if p.uuid != g.uuid and p.clock_sm_mhz.mean is not None]
        peer_util = [p.utilization_pct.p5 for p in everyone if p.uuid != g.uuid and p.utilization_pct.p5 is not None]
        margin = min(_margin(share, t_share), _margin(share - base, t_margin))
        out.append(Verdict(
            code="straggler", node=g.node, gpus=[_ref(g)],
            message=f"GPU {g.index} on {g.node} spent {_pct(share)} of the job in {reason}: "
                    "the straggler the others wait for.",
            evidence={"slowdown_share": share, "reason": reason,
                      "reasons": {r: g.throttle_share[r] for r in SLOWDOWN_REASONS if r in g.throttle_share},
                      "peers_median_share": round(base, 3), "clock_sm_mhz_mean": g.clock_sm_mhz.mean,
                      "peers_clock_sm_mhz_mean": round(sum(peer_clock) / len(peer_clock), 1) if peer_clock else None,
                      "peers_utilization_p5": min(peer_util) if peer_util else None, "samples": g.samples},
            confidence=_confidence(margin, g.samples),
        ))
    return out


def _input_bound(judged: list[GpuSummary]) -> list[Verdict]:
    t_rx, t_util = THRESHOLDS["input_rx_share"], THRESHOLDS["input_max_util"]
    hits: dict[str, list[GpuSummary]] = {}
    for g in judged:
        util = g.utilization_pct.mean
        if g.pcie_rx_share is None or util is None or g.pcie_rx_kbps.samples < THRESHOLDS["min_samples"].value:
            continue
        if g.pcie_rx_share >= t_rx.value and util <= t_util.value:
            hits.setdefault(g.node, []).append(g)
    out = []
    for node, gs in hits.items():
        rx = sum(g.pcie_rx_share or 0.0 for g in gs) / len(gs)
        util = sum(g.utilization_pct.mean or 0.0 for g in gs) / len(gs)
        margin = min(min(_margin(g.pcie_rx_share or 0.0, t_rx), _margin(g.utilization_pct.mean or 0.0, t_util, True))
                     for g in gs)
        many = len(gs) > 1
        out.append(Verdict(
            code="input_bound", node=node, gpus=[_ref(g) for g in gs],
            message=f"{_gpus_text([g.index for g in gs])} on {node} read from the host at {_pct(rx)} of "
                    f"{'their' if many else 'its'} {_link_text(gs[0])} while {'their' if many else 'its'} SMs "
                    f"were busy {util:.0f} % of the time: input-bound.",
            evidence={"gpus": {str(g.index): {"pcie_rx_share": g.pcie_rx_share, "pcie_rx_kbps_mean": g.pcie_rx_kbps.mean,
                                              "pcie_link_kbps": g.pcie_link_kbps,
                                              "utilization_pct_mean": g.utilization_pct.mean} for g in gs}},
            confidence=_confidence(margin, min(g.pcie_rx_kbps.samples for g in gs)),
        ))
    return out


def _link_text(g: GpuSummary) -> str:
    return f"PCIe Gen{g.pcie_gen} x{g.pcie_width} link" if g.pcie_gen and g.pcie_width else "PCIe link"


def _nvlink_unused(judged: list[GpuSummary], everyone: list[GpuSummary]) -> list[Verdict]:
    t_kib, t_util = THRESHOLDS["nvlink_max_kib_s"], THRESHOLDS["nvlink_min_util"]
    out = []
    for node in sorted({g.node for g in everyone}):
        here = [g for g in everyone if g.node == node]
        gs = [g for g in judged if g.node == node]
        # every GPU of the job on the node judged, with NVLink counters, silent on all of them, busy
        if len(here) < 2 or len(gs) != len(here):
            continue
        if any(g.nvlink_kib_s is None or g.nvlink_kib_s > t_kib.value for g in gs):
            continue
        utils = [g.utilization_pct.mean for g in gs]
        if any(u is None or u < t_util.value for u in utils):
            continue
        util = sum(u or 0.0 for u in utils) / len(utils)
        pcie_shares = [max(g.pcie_tx_share or 0.0, g.pcie_rx_share or 0.0) for g in gs
                       if g.pcie_tx_share is not None or g.pcie_rx_share is not None]
        where = (f"their collectives went over PCIe ({_pct(sum(pcie_shares) / len(pcie_shares))} of the link)"
                 if pcie_shares else "NVLink unused")
        margin = min(_margin(u or 0.0, t_util) for u in utils)
        out.append(Verdict(
            code="nvlink_unused", node=node, gpus=[_ref(g) for g in gs],
            message=f"{_gpus_text([g.index for g in gs])} on {node} moved nothing over NVLink while busy "
                    f"{util:.0f} % of the time: {where}.",
            evidence={"gpus": {str(g.index): {"nvlink_kib_s": g.nvlink_kib_s, "links": len(g.nvlink),
                                              "utilization_pct_mean": g.utilization_pct.mean,
                                              "pcie_tx_share": g.pcie_tx_share, "pcie_rx_share": g.pcie_rx_share}
                               for g in gs}},
            confidence=_confidence(margin, min(g.samples for g in gs)),
        ))
    return out


def _cpu_starved(cpus: list[CpuSummary], judged: list[GpuSummary]) -> list[Verdict]:
    t_cpu, t_util, t_swing = THRESHOLDS["cpu_share"], THRESHOLDS["cpu_gpu_util"], THRESHOLDS["cpu_gpu_swing"]
    out = []
    for c in cpus:
        gs = [g for g in judged if g.node == c.node and g.utilization_pct.mean is not None]
        if c.share is None or c.samples < THRESHOLDS["min_samples"].value or not gs or c.share < t_cpu.value:
            continue
        mean = sum(g.utilization_pct.mean or 0.0 for g in gs) / len(gs)
        p5 = min(g.utilization_pct.p5 or 0.0 for g in gs)
        p95 = max(g.utilization_pct.p95 or 0.0 for g in gs)
        swing = sum((g.utilization_pct.p95 or 0.0) - (g.utilization_pct.p5 or 0.0) for g in gs) / len(gs)
        if mean > t_util.value and swing < t_swing.value:
            continue  # the CPUs are busy, but the GPUs are fed
        underfed = max(_margin(mean, t_util, below=True), _margin(swing, t_swing))
        margin = min(_margin(c.share, t_cpu), underfed)
        shape = (f"swung between {p5:.0f} % and {p95:.0f} % utilisation" if swing >= t_swing.value
                 else f"averaged {mean:.0f} % utilisation")
        out.append(Verdict(
            code="cpu_starved", node=c.node, gpus=[_ref(g) for g in gs],
            message=f"The job's {c.cpus} CPUs on {c.node} were {_pct(c.share)} busy while its "
                    f"{_gpus_text([g.index for g in gs])} there {shape}: CPU-starved.",
            evidence={"cpus": c.cpus, "cores_busy": c.cores, "cpu_share": c.share,
                      "saturated_share": c.saturated_share, "gpu_utilization_mean": round(mean, 1),
                      "gpu_utilization_p5": p5, "gpu_utilization_p95": p95, "gpu_utilization_swing": round(swing, 1),
                      "samples": c.samples},
            confidence=_confidence(margin, c.samples),
        ))
    return out


def _xid_end(job: Job, summaries: list[GpuSummary]) -> list[Verdict]:
    if job.ended_at is None:
        return []
    window, grace = THRESHOLDS["xid_end_s"].value, THRESHOLDS["xid_end_grace_s"].value
    out = []
    for g in summaries:
        near = [(t, c) for t, c in g.xids if job.ended_at - window <= t <= job.ended_at + grace]
        if not near:
            continue
        t, code = max(near)  # the last one before the end
        before = max(0.0, job.ended_at - t)
        when = f"{before:.0f} s before the job ended" if before >= 1 else "as the job ended"
        out.append(Verdict(
            code="xid_end", node=g.node, gpus=[_ref(g)],
            message=f"GPU {g.index} on {g.node} logged XID {code} {when}: the job likely ended on it.",
            evidence={"xid": code, "at": t, "ended_at": job.ended_at, "seconds_before_end": round(before, 1),
                      "xids_near_end": [c for _, c in sorted(near)]},
            confidence=_confidence(1.0 - min(1.0, before / window), FULL_SUPPORT_SAMPLES),
        ))
    return out


# --- the entry --------------------------------------------------------------------------


def diagnose(job: Job) -> Diagnosis:
    """The job's per-GPU summaries, its nodes' CPU, its verdicts (by code, in the order
    straggler, input_bound, nvlink_unused, cpu_starved, xid_end) and why anything was not judged.
    Samples outside [started_at, ended_at] are left out; a running job (ended_at None) is judged up
    to its newest sample."""
    last = max((t for g in job.gpus for series in g.series.values() for t, _ in series), default=job.started_at)
    end = job.ended_at if job.ended_at is not None else last
    summaries = [summarize(g, job.started_at, end) for g in job.gpus]
    cpus = [_cpu_summary(c, job.started_at, end) for c in job.cpu]
    notes: list[str] = []
    seconds = round(end - job.started_at, 1)
    min_job, min_samples = THRESHOLDS["min_job_s"].value, THRESHOLDS["min_samples"].value
    judged: list[GpuSummary] = []
    if seconds < min_job:
        notes.append(f"the job ran {seconds:.0f} s, under {min_job:.0f} s: too short to judge its performance "
                     "(start-up dominates it); no performance verdict")
    else:
        for g in summaries:
            if g.samples < min_samples:
                notes.append(f"GPU {g.index} on {g.node}: {g.samples} samples, under {min_samples:.0f}: not judged")
            else:
                judged.append(g)
        for c in cpus:
            if c.samples < min_samples:
                notes.append(f"CPU of the job on {c.node}: {c.samples} samples of cpu.stat, under "
                             f"{min_samples:.0f}: not judged")
        if len(summaries) < 2:
            notes.append("a single-GPU job: no straggler or NVLink verdict (no peer to wait or talk to)")
    verdicts = (_stragglers(judged, summaries if judged else []) + _input_bound(judged)
                + _nvlink_unused(judged, summaries) + _cpu_starved(cpus, judged) + _xid_end(job, summaries))
    return Diagnosis(job.job_id, seconds, summaries, cpus, verdicts, notes)


def series_from_samples(rows: Iterable[tuple[float, Mapping[str, Value]]]) -> dict[str, list[Sample]]:
    """``{field: [(t, value), ...]}`` from ``(t, light-sample row)`` pairs, oldest first: the
    shape the daemon's ring answers a history query in."""
    out: dict[str, list[Sample]] = {}
    for t, row in rows:
        for name, value in row.items():
            out.setdefault(name, []).append((t, value))
    return out
