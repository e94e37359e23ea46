"""The pure judgement of validation results: floors, the fleet-relative straggler rule and
steady state. It imports nothing from the GPU or agent layers so the controller can judge
results from any backend, and so tests can judge exact figures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetops.common import stats
from fleetops.validation.floors import PER_GPU_METRICS, ModelFloors, floors_for

# A GPU is a straggler when it is below its model's fleet median by more than
# max(STRAGGLER_K x MAD, STRAGGLER_PCT x median).
STRAGGLER_K = 5.0
STRAGGLER_PCT = 0.05
# A test whose repeats spread (max - min) by more than this fraction of the median never
# reached steady state: its figure says nothing, so it is unknown rather than failed.
MAX_SPREAD = 0.15

SEVERITY_ORDER = {"ok": 0, "warn": 1, "crit": 2, "unknown": 3}


@dataclass(frozen=True)
class Verdict:
    host: str
    gpu: str
    metric: str
    status: str  # ok | warn | crit | unknown
    value: float | None
    reason: str


@dataclass
class GpuVerdict:
    host: str
    gpu: str
    model: str | None
    status: str = "ok"
    verdicts: list[Verdict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "gpu": self.gpu,
            "model": self.model,
            "status": self.status,
            "findings": [v.__dict__ for v in self.verdicts if v.status != "ok"],
            # every measured figure, ok or not: how far a GPU sits from its peers shows only here
            "figures": {v.metric: v.value for v in self.verdicts if v.value is not None},
        }


def worse(a: str, b: str) -> str:
    # crit beats warn beats unknown beats ok: an unknown metric must not hide a failed one.
    rank = {"ok": 0, "unknown": 1, "warn": 2, "crit": 3}
    return a if rank[a] >= rank[b] else b


def mad(values: Iterable[float]) -> float:
    vals = list(values)
    if not vals:
        return 0.0
    med = stats.median(vals)
    return stats.median(abs(v - med) for v in vals)


class Peers:
    """The steady figures one comparison group holds (a model's GPUs for a metric, a model's P2P
    pairs, the nodes that ran one all_reduce shape), with their median and MAD computed once
    however many figures are judged against them: recomputed per figure, a 1000-node fleet's
    56,000 P2P pairs each sorted the 56,000 (bench/validate_judge.py)."""

    __slots__ = ("values", "_stats")

    def __init__(self) -> None:
        self.values: list[float] = []
        self._stats: tuple[float, float] | None = None

    def add(self, value: float) -> None:
        self.values.append(value)
        self._stats = None

    def __len__(self) -> int:
        return len(self.values)

    def median_and_mad(self) -> tuple[float, float]:
        if self._stats is None:
            self._stats = (stats.median(self.values), mad(self.values))
        return self._stats


NO_PEERS = Peers()


def summarize(samples: list[float]) -> dict[str, float]:
    """Median and spread of the kept repeats (warm-up already dropped by the caller)."""
    return {
        "median": stats.median(samples),
        "min": float(min(samples)),
        "max": float(max(samples)),
        "mad": mad(samples),
        "repeats": float(len(samples)),
    }


def steady(stat: Mapping[str, Any], max_spread: float = MAX_SPREAD) -> bool:
    med = float(stat.get("median", 0.0))
    if med <= 0:
        return False
    return (float(stat.get("max", med)) - float(stat.get("min", med))) / med <= max_spread


def judge(
    gpus: Sequence[Mapping[str, Any]],
    overrides: dict[str, dict[str, float]] | None = None,
    k: float = STRAGGLER_K,
    pct: float = STRAGGLER_PCT,
    max_spread: float = MAX_SPREAD,
) -> list[GpuVerdict]:
    """Judge per-GPU results ``{"host", "uuid", "name", "tests": {metric: summary}}``.

    The fleet median is taken per model over the GPUs whose test reached steady state, so one
    noisy GPU cannot drag its peers' reference."""
    by_model: dict[tuple[str | None, str], Peers] = {}
    for g in gpus:
        for metric, stat in (g.get("tests") or {}).items():
            if isinstance(stat, Mapping) and "median" in stat and steady(stat, max_spread):
                by_model.setdefault((g.get("name"), metric), Peers()).add(float(stat["median"]))

    out: list[GpuVerdict] = []
    for g in gpus:
        host, uuid, name = str(g.get("host", "")), str(g.get("uuid", "")), g.get("name")
        floors = floors_for(name, overrides)
        gv = GpuVerdict(host=host, gpu=uuid, model=floors.model if floors else name)
        tests = g.get("tests") or {}
        # Figures by name, then the pass/fail tests of a backend that gives outcomes (DCGM).
        extra = [m for m, st in tests.items() if m not in PER_GPU_METRICS and isinstance(st, Mapping)
                 and ("outcome" in st or "error" in st)]
        for metric in (*PER_GPU_METRICS, *extra):
            stat = tests.get(metric)
            if not isinstance(stat, Mapping):
                continue
            if "outcome" in stat:
                v = _judge_outcome(host, uuid, metric, stat)
                gv.verdicts.append(v)
                gv.status = worse(gv.status, v.status)
                continue
            if "skipped" in stat:
                gv.verdicts.append(Verdict(host, uuid, metric, "ok", None, f"skipped: {stat['skipped']}"))
                continue
            if "median" not in stat:
                v = Verdict(host, uuid, metric, "unknown", None, str(stat.get("error", "no figure")))
            elif not steady(stat, max_spread):
                med = float(stat["median"])
                spread = (float(stat["max"]) - float(stat["min"])) / med if med > 0 else float("inf")
                v = Verdict(host, uuid, metric, "unknown", med,
                            f"no steady state: spread {spread:.0%} > {max_spread:.0%}")
            else:
                v = _judge_value(host, uuid, metric, stat, floors, by_model.get((name, metric), NO_PEERS), k, pct)
            gv.verdicts.append(v)
            gv.status = worse(gv.status, v.status)
        out.append(gv)
    return out


OUTCOME_STATUS = {"pass": "ok", "skip": "ok", "warn": "warn", "fail": "crit"}


def _judge_outcome(host: str, uuid: str, metric: str, stat: Mapping[str, Any]) -> Verdict:
    """A test that reports pass/fail itself (DCGM diag): its outcome is the verdict, its
    messages the reason; a skip is ok with the reason kept, anything else unknown."""
    outcome = str(stat.get("outcome"))
    reason = "; ".join(str(m) for m in stat.get("messages") or [])
    if outcome == "skip":
        reason = f"skipped: {reason}" if reason else "skipped"
    return Verdict(host, uuid, metric, OUTCOME_STATUS.get(outcome, "unknown"), None,
                   reason or (f"dcgm: {outcome}" if outcome != "pass" else ""))


def _judge_value(host: str, uuid: str, metric: str, stat: Mapping[str, Any], floors: Any,
                 peers: Peers, k: float, pct: float) -> Verdict:
    floor = floors.metric(metric) if floors is not None else None
    return against(host, uuid, metric, stat, floor, floors.model if floors is not None else "model", peers, k, pct)


def against(host: str, label: str, metric: str, stat: Mapping[str, Any], floor: float | None, model: str,
             peers: Peers, k: float, pct: float) -> Verdict:
    """The one rule for a steady figure: below the floor is crit, below the peers' median by
    more than max(k x MAD, pct x median) is a straggler (warn).

    Steady state allows repeats to spread by MAX_SPREAD, three times the straggler percentage:
    a median under the straggler line whose best repeat is on or over it does not say which side
    the GPU is on, so that is unknown, not a straggler."""
    value = float(stat["median"])
    if floor is not None and value < floor:
        return Verdict(host, label, metric, "crit", value, f"{value:.1f} below the {model} floor {floor:.1f}")
    if len(peers) >= 3:
        ref, spread = peers.median_and_mad()
        margin = max(k * spread, pct * ref)
        line = ref - margin
        if value < line:
            best = float(stat.get("max", value))
            if best >= line:
                return Verdict(host, label, metric, "unknown", value,
                               f"undecided: {value:.1f} < fleet median {ref:.1f} - {margin:.1f}, but its best "
                               f"repeat {best:.1f} is not: the repeats straddle the straggler line")
            return Verdict(host, label, metric, "warn", value,
                           f"straggler: {value:.1f} < fleet median {ref:.1f} - {margin:.1f}")
    return Verdict(host, label, metric, "ok", value, "")


@dataclass
class NodeVerdict:
    """The node-level tests (P2P matrix, NCCL all_reduce) of one host. ``gpu`` in a pair's
    verdict reads ``SRC->DST`` (one direction) or ``A<->B`` (both at once), by UUID."""

    host: str
    model: str | None
    status: str = "ok"
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "model": self.model,
            "status": self.status,
            "findings": [v.__dict__ for v in self.verdicts if v.status != "ok"],
            "figures": _node_figures(self.verdicts),
            "notes": list(self.notes),
        }


def _node_figures(verdicts: Sequence[Verdict]) -> dict[str, dict[str, float]]:
    """metric -> pair (or all_reduce shape) -> figure, for every measured node test."""
    out: dict[str, dict[str, float]] = {}
    for v in verdicts:
        if v.value is not None:
            out.setdefault(v.metric, {})[v.gpu] = v.value
    return out


def _node_model(doc: Mapping[str, Any]) -> str | None:
    names = {g.get("name") for g in doc.get("gpus") or [] if g.get("name")}
    return str(next(iter(names))) if len(names) == 1 else None


def _pair_entries(doc: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(metric, pair label, summary) for every measured pair of one node."""
    p2p = (doc.get("node") or {}).get("p2p") or {}
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for pair in p2p.get("pairs") or []:
        stat = pair.get("p2p_gbps")
        if isinstance(stat, Mapping):
            out.append(("p2p_gbps", f"{pair.get('src_uuid')}->{pair.get('dst_uuid')}", stat))
    for pair in p2p.get("bidirectional") or []:
        stat = pair.get("p2p_bidir_gbps")
        if isinstance(stat, Mapping):
            out.append(("p2p_bidir_gbps", f"{pair.get('a_uuid')}<->{pair.get('b_uuid')}", stat))
    return out


def _allreduce_shape(ar: Mapping[str, Any]) -> tuple[int, str, int]:
    return int(ar.get("gpus", 0)), str(ar.get("algorithm", "default")), int(ar.get("message_bytes", 0))


def judge_nodes(
    nodes: Sequence[Mapping[str, Any]],
    overrides: dict[str, dict[str, float]] | None = None,
    k: float = STRAGGLER_K,
    pct: float = STRAGGLER_PCT,
    max_spread: float = MAX_SPREAD,
) -> list[NodeVerdict]:
    """Judge the node-level tests of agent results ``{"host", "gpus", "node": {"p2p",
    "allreduce"}}``.

    P2P: a pair below its model's floor is crit; a pair below the median of every steady pair
    of that model in the fleet (all nodes together: one node's eight GPUs give 56 pairs, enough
    for a median of its own) by more than max(k x MAD, pct) is a straggler. all_reduce: the
    floor that fits its GPU count, algorithm and message size, and the straggler rule across
    the nodes that ran the same shape. A node with one GPU has neither test: that is a note,
    not a finding."""
    pair_peers: dict[tuple[str | None, str], Peers] = {}
    ar_peers: dict[tuple[str | None, tuple[int, str, int]], Peers] = {}
    for doc in nodes:
        model = _node_model(doc)
        for metric, _label, stat in _pair_entries(doc):
            if "median" in stat and steady(stat, max_spread):
                pair_peers.setdefault((model, metric), Peers()).add(float(stat["median"]))
        ar = (doc.get("node") or {}).get("allreduce") or {}
        ar_stat = ar.get("allreduce_busbw_gbps")
        if isinstance(ar_stat, Mapping) and "median" in ar_stat and steady(ar_stat, max_spread):
            ar_peers.setdefault((model, _allreduce_shape(ar)), Peers()).add(float(ar_stat["median"]))

    out: list[NodeVerdict] = []
    for doc in nodes:
        host, model = str(doc.get("host", "")), _node_model(doc)
        floors = floors_for(model, overrides)
        nv = NodeVerdict(host=host, model=floors.model if floors else model)
        node = doc.get("node") or {}
        for part in node:
            section = node.get(part) or {}
            for why in ("not_applicable", "skipped"):
                if why in section:
                    nv.notes.append(f"{part}: {why.replace('_', ' ')}: {section[why]}")
            if "error" in section:
                v = Verdict(host, "", part, "unknown", None, f"{part} did not run: {section['error']}")
                nv.verdicts.append(v)
                nv.status = worse(nv.status, v.status)
        for metric, label, stat in _pair_entries(doc):
            floor = floors.metric(metric) if floors is not None and metric == "p2p_gbps" else None
            v = _node_value(host, label, metric, stat, floor, floors, pair_peers.get((model, metric), NO_PEERS),
                            k, pct, max_spread)
            nv.verdicts.append(v)
            nv.status = worse(nv.status, v.status)
        ar = node.get("allreduce") or {}
        ar_stat = ar.get("allreduce_busbw_gbps")
        if isinstance(ar_stat, Mapping):
            shape = _allreduce_shape(ar)
            fl = floors.allreduce_floor(*shape) if floors is not None else None
            if fl is None:
                nv.notes.append(f"allreduce: no shipped floor for {shape[0]} GPUs, algorithm {shape[1]}, "
                                f"{shape[2] >> 20} MiB: judged against its fleet peers only")
            v = _node_value(host, f"{shape[0]} GPUs {shape[1]} {shape[2] >> 20} MiB", "allreduce_busbw_gbps",
                            ar_stat, fl.busbw_gbps if fl else None, floors, ar_peers.get((model, shape), NO_PEERS),
                            k, pct, max_spread)
            nv.verdicts.append(v)
            nv.status = worse(nv.status, v.status)
        out.append(nv)
    return out


def _node_value(host: str, label: str, metric: str, stat: Mapping[str, Any], floor: float | None,
                floors: ModelFloors | None, peers: Peers, k: float, pct: float,
                max_spread: float) -> Verdict:
    if "median" not in stat:
        return Verdict(host, label, metric, "unknown", None, str(stat.get("error", "no figure")))
    med = float(stat["median"])
    if not steady(stat, max_spread):
        spread = (float(stat["max"]) - float(stat["min"])) / med if med > 0 else float("inf")
        return Verdict(host, label, metric, "unknown", med, f"no steady state: spread {spread:.0%} > {max_spread:.0%}")
    return against(host, label, metric, stat, floor, floors.model if floors is not None else "model", peers, k, pct)


def overall(verdicts: Sequence[GpuVerdict | NodeVerdict]) -> str:
    status = "ok"
    for gv in verdicts:
        status = worse(status, gv.status)
    return status
