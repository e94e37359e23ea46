"""The pure judgement of validation results: floors, the fleet-relative straggler rule and
steady state. It imports nothing from the GPU or agent layers so the controller can judge
results from any backend, and so tests can judge exact figures."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetops.validation.floors import PER_GPU_METRICS, floors_for

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
        }


def _worse(a: str, b: str) -> str:
    # crit beats warn beats unknown beats ok: an unknown metric must not hide a failed one.
    rank = {"ok": 0, "unknown": 1, "warn": 2, "crit": 3}
    return a if rank[a] >= rank[b] else b


def mad(values: Iterable[float]) -> float:
    vals = list(values)
    if not vals:
        return 0.0
    med = statistics.median(vals)
    return float(statistics.median(abs(v - med) for v in vals))


def summarize(samples: list[float]) -> dict[str, float]:
    """Median and spread of the kept repeats (warm-up already dropped by the caller)."""
    return {
        "median": float(statistics.median(samples)),
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
    by_model: dict[tuple[str | None, str], list[float]] = {}
    for g in gpus:
        for metric, stat in (g.get("tests") or {}).items():
            if isinstance(stat, Mapping) and "median" in stat and steady(stat, max_spread):
                by_model.setdefault((g.get("name"), metric), []).append(float(stat["median"]))

    out: list[GpuVerdict] = []
    for g in gpus:
        host, uuid, name = str(g.get("host", "")), str(g.get("uuid", "")), g.get("name")
        floors = floors_for(name, overrides)
        gv = GpuVerdict(host=host, gpu=uuid, model=floors.model if floors else name)
        for metric in PER_GPU_METRICS:
            stat = (g.get("tests") or {}).get(metric)
            if not isinstance(stat, Mapping):
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
                v = _judge_value(host, uuid, metric, float(stat["median"]), floors,
                                 by_model.get((name, metric), []), k, pct)
            gv.verdicts.append(v)
            gv.status = _worse(gv.status, v.status)
        out.append(gv)
    return out


def _judge_value(host: str, uuid: str, metric: str, value: float, floors: Any,
                 peers: list[float], k: float, pct: float) -> Verdict:
    floor = floors.metric(metric) if floors is not None else None
    if floor is not None and value < floor:
        return Verdict(host, uuid, metric, "crit", value, f"{value:.1f} below the {floors.model} floor {floor:.1f}")
    if len(peers) >= 3:
        med = float(statistics.median(peers))
        margin = max(k * mad(peers), pct * med)
        if value < med - margin:
            return Verdict(host, uuid, metric, "warn", value,
                           f"straggler: {value:.1f} < fleet median {med:.1f} - {margin:.1f}")
    return Verdict(host, uuid, metric, "ok", value, "")


def overall(verdicts: list[GpuVerdict]) -> str:
    status = "ok"
    for gv in verdicts:
        status = _worse(status, gv.status)
    return status
