"""What every check family shares: the check description (``CheckSpec``), the per-node
``Context`` that hands out values and records what could not be read, action texts, and the
fleet-majority helper used for drift without a baseline.

Rules the helpers enforce:
- A value that is ``None`` never reaches a comparison: ``Context.get`` returns ``None`` and
  records why; ``Context.finish`` turns the records into at most one ``unknown`` finding per
  node per family (``<family>.unreadable``).
- A value legitimately absent (``NotSupported`` in a passthrough VM, "MIG disabled", or simply
  not reported for an optional field) is silent unless the baseline asks for it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetops import model
from fleetops.baseline import DEFAULT_THRESHOLDS, Baseline, Thresholds

FAMILIES = ("versions", "memory", "pcie", "nvlink", "thermal_power", "xid", "config", "topology", "validation",
            "fabric")

# fleetops commands named in actions (one place to rename them).
CMD_RESET = "fleetops reset {node} {gpu} -i INVENTORY"  # INVENTORY: as for CMD_VALIDATE
CMD_ROLLOUT_DRIVER = "fleetops rollout driver"
CMD_ROLLOUT_FIRMWARE = "fleetops apply firmware"
CMD_APPLY_POWER = "fleetops apply power"
CMD_APPLY_PERSISTENCE = "fleetops apply power"  # gpu_power also enforces persistence mode
CMD_APPLY_MIG = "fleetops apply mig"


def _always(node: model.Node, baseline: Baseline | None) -> bool:
    return True


@dataclass(frozen=True)
class CheckSpec:
    """One check as the docs and the JUnit renderer see it."""

    id: str
    family: str
    title: str
    reads: str  # the NVML call, log source or snapshot field
    threshold: str  # default threshold / condition, as text
    severities: tuple[str, ...]  # severities it can raise
    action: str  # recommended action, as text
    not_a_fault: str | None = None  # what looks like this fault but is not
    scope: str = "node"  # "node", "fleet" or "node+fleet"
    requires: str = "always"  # baseline keys it needs, as text
    # The unit of its bare-number observed/expected values ("C", "W"), which the reports and the
    # TUI print after the number (report/values.py); None where the values carry no unit.
    unit: str | None = None
    applies: Callable[[model.Node, Baseline | None], bool] = field(default=_always, compare=False, repr=False)
    # For fleet-capable checks: whether run_fleet_checks can raise it under this baseline.
    fleet_applies: Callable[[Baseline | None], bool] | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "title": self.title,
            "reads": self.reads,
            "threshold": self.threshold,
            "severities": list(self.severities),
            "action": self.action,
            "not_a_fault": self.not_a_fault,
            "scope": self.scope,
            "requires": self.requires,
        }


def unreadable_spec(family: str) -> CheckSpec:
    return CheckSpec(
        id=f"{family}.unreadable",
        family=family,
        title=f"{family} values that could not be read",
        reads="the 'unavailable' reasons the collector recorded for this family's values",
        threshold="a value a check needs is null for a reason other than Not Supported, or the "
        "baseline asks for a value the node cannot report",
        severities=("unknown",),
        action="See the reasons in the finding (permissions, a lost GPU, an old driver); fix "
        "collection and audit again.",
        not_a_fault="Values a passthrough VM reports as Not Supported (NVLink, NUMA, retired pages) "
        "are silent unless the baseline expects them.",
    )


# ``Context.add``'s default for ``jobs``: the jobs running now on the finding's GPU.
RUNNING = object()


def running_job_ids(node: model.Node, gpu: dict[str, Any] | None) -> list[str] | None:
    """The ids of the jobs running now on ``gpu`` (a finding's GPU reference, MIG instances
    included); None for a finding on no GPU or a snapshot without job records."""
    uuid = (gpu or {}).get("uuid")
    if not uuid:
        return None
    on = model.gpu_jobs(node, uuid)
    return None if on is None else [j.job_id for j in on]


def attribute_jobs(nodes: Iterable[model.Node], findings: Iterable[model.Finding]) -> None:
    """Name the running jobs on each GPU finding that names none yet (the fleet checks' findings,
    built without a ``Context``), from its node's snapshot, found by host name."""
    by_host = {n.hostname: n for n in nodes}
    for f in findings:
        node = by_host.get(f.node)
        if f.jobs is None and node is not None:
            f.jobs = running_job_ids(node, f.gpu)


def gpu_label(gpu: model.Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.bus_id})"


def reset_cmd(node: str, uuid: str | None) -> str:
    return CMD_RESET.format(node=node, gpu=uuid or "GPU-UUID")


def reset_action(node: str, uuid: str | None, why: str = "") -> str:
    cmd = reset_cmd(node, uuid)
    return f"Drain the GPU's jobs, then reset it: {cmd}" + (f" ({why})" if why else "") + "."


def is_not_supported(reason: str | None) -> bool:
    """Reasons that mean "this hardware / mode cannot report it" rather than a failure."""
    if not reason:
        return False
    text = reason.lower().replace(" ", "").replace("_", "").replace("-", "")
    return "notsupported" in text or "mig" in text or text in ("n/a", "na", "notapplicable")


# --- per-node context ------------------------------------------------------------------

DEMAND_NONE = "none"  # optional value: silent when absent
DEMAND_EXPECTED = "expected"  # a health value every supported GPU reports: silent only if NotSupported
DEMAND_BASELINE = "baseline"  # the baseline asks for it: unknown whenever absent


def _whole(value: int | float | None) -> int | None:
    """A counter's value as an exact int: a whole float (a snapshot written by another tool)
    is taken at its exact value, anything else (NaN, a fraction, a bool) is no count."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class Context:
    def __init__(
        self,
        node: model.Node,
        baseline: Baseline | None,
        previous: model.Node | None,
        validations: Mapping[str, Any] | None = None,
    ) -> None:
        self.node = node
        # GPU UUID -> level -> latest stored validation (a dict); None: the caller has no history
        self.validations = validations
        self.host = node.hostname
        self.baseline = baseline
        self.previous = previous
        self.th: Thresholds = baseline.thresholds if baseline is not None else DEFAULT_THRESHOLDS
        self.findings: list[model.Finding] = []
        # family -> field -> reason -> [gpu label or "node"]
        self._unreadable: dict[str, dict[str, dict[str, list[str]]]] = {}
        self._prev_by_uuid = {g.uuid: g for g in previous.gpus} if previous is not None else {}

    # values ---------------------------------------------------------------------------

    def get(self, family: str, owner: Any, name: str, demand: str = DEMAND_NONE, label: str | None = None) -> Any:
        value = getattr(owner, name, None)
        if value is not None:
            return value
        reason = (getattr(owner, "unavailable", None) or {}).get(name)
        if reason == model.GPU_IS_LOST:
            return None  # a lost GPU is config.gpu_missing's crit, once, not an unknown per family
        if reason is None:
            record = demand != DEMAND_NONE
        elif is_not_supported(reason):
            record = demand == DEMAND_BASELINE
        else:
            record = True
        if record:
            self.unreadable(family, name, reason or "not collected", label or self._label(owner))
        return None

    def unreadable(self, family: str, name: str, reason: str, where: str) -> None:
        where_list = self._unreadable.setdefault(family, {}).setdefault(name, {}).setdefault(reason, [])
        if where not in where_list:
            where_list.append(where)

    @staticmethod
    def _label(owner: Any) -> str:
        if isinstance(owner, model.Gpu):
            return f"GPU {owner.index}"
        if isinstance(owner, model.NvLink):
            return f"link {owner.link}"
        return "node"

    # previous snapshot ------------------------------------------------------------------

    def prev_gpu(self, gpu: model.Gpu) -> model.Gpu | None:
        return self._prev_by_uuid.get(gpu.uuid)

    def interval_s(self) -> float | None:
        """Seconds between the previous snapshot and this one, when long enough for rates."""
        if self.previous is None:
            return None
        dt = float(self.node.collected_at or 0) - float(self.previous.collected_at or 0)
        if self.node.collected_at and self.previous.collected_at and dt >= max(self.th.rate_min_interval_s, 1e-9):
            return dt
        return None

    def growth(self, current: int | float | None, previous: int | float | None) -> int | None:
        """A cumulative counter's growth from ``previous`` to ``current``, as an exact integer
        difference; None when either is unknown or not a whole number. A counter that went
        down (a GPU reset or driver reload zeroed it, or it wrapped at 2**32 or 2**64) is a
        reset of the base: no growth is known for this pair, never a negative rate, and the
        next pair starts from the new value."""
        now, before = _whole(current), _whole(previous)
        if now is None or before is None or now < before:
            return None
        return now - before

    # findings ---------------------------------------------------------------------------

    def add(
        self,
        check: str,
        severity: str,
        message: str,
        gpu: model.Gpu | dict[str, Any] | None = None,
        observed: Any = None,
        expected: Any = None,
        action: str | None = None,
        port: str | None = None,
        jobs: list[str] | None | object = RUNNING,
    ) -> None:
        """One finding. ``jobs``: the ids of the jobs it hits; by default (``RUNNING``) those
        running now on its GPU, for a fault seen now; an XID passes its events' own."""
        ref = model.gpu_ref(gpu) if isinstance(gpu, model.Gpu) else gpu
        named = running_job_ids(self.node, ref) if jobs is RUNNING else jobs
        self.findings.append(
            model.Finding(
                check=check, severity=severity, node=self.host, message=message, gpu=ref,
                observed=observed, expected=expected, action=action, port=port,
                jobs=list(named) if isinstance(named, list) else None,
            )
        )

    def finish(self) -> list[model.Finding]:
        for family in FAMILIES:
            fields = self._unreadable.get(family)
            if not fields:
                continue
            parts = []
            observed: dict[str, dict[str, list[str]]] = {}
            for name, reasons in fields.items():
                observed[name] = {r: list(w) for r, w in reasons.items()}
                for reason, where in reasons.items():
                    parts.append(f"{name} on {_compact(where)} ({reason})")
            self.add(
                f"{family}.unreadable", "unknown",
                f"{family}: could not read " + "; ".join(parts),
                observed=observed,
                action="Fix collection (permissions, driver, a lost GPU) and audit again; these values "
                "were not checked.",
            )
        return self.findings


def _compact(where: list[str]) -> str:
    gpus = [w for w in where if w.startswith("GPU ") and w[4:].isdigit()]
    rest = [w for w in where if w not in gpus]
    out = []
    if gpus:
        out.append("GPU " + ", ".join(w[4:] for w in gpus))
    out.extend(rest)
    return ", ".join(out)


# --- fleet majority --------------------------------------------------------------------


@dataclass
class Item:
    """One observation for majority voting: a node value, or a GPU value (``gpu`` set)."""

    node: str
    value: Any
    gpu: model.Gpu | None = None


def majority_drift(
    check: str,
    what: str,
    group: str,
    items: Sequence[Item],
    action: str,
    severity: str = "warn",
    fmt: Callable[[Any], str] = str,
) -> list[model.Finding]:
    """Findings for the items whose value differs from the majority of ``items`` (one per
    minority node, or per minority GPU for GPU values). A tie names every side. ``what`` is the
    value's name ("driver", "VBIOS"); ``group`` says what was counted ("nodes",
    "NVIDIA H200 GPUs")."""
    items = [i for i in items if i.value is not None]
    counts = collections.Counter(i.value for i in items)
    if len(counts) < 2:
        return []
    ranked = counts.most_common()
    top_count = ranked[0][1]
    leaders = [v for v, c in ranked if c == top_count]
    total = len(items)
    out: list[model.Finding] = []
    by_value: dict[Any, list[str]] = collections.defaultdict(list)
    for i in items:
        if i.node not in by_value[i.value]:
            by_value[i.value].append(i.node)
    if len(leaders) == 1:
        majority = leaders[0]
        minority_nodes = sorted({i.node for i in items if i.value != majority})
        names = _names(minority_nodes)
        for i in items:
            if i.value == majority:
                continue
            where = f"{i.node} {gpu_label(i.gpu)}" if i.gpu is not None else i.node
            out.append(
                model.Finding(
                    check=check, severity=severity, node=i.node,
                    gpu=model.gpu_ref(i.gpu) if i.gpu is not None else None,
                    observed=i.value, expected=majority,
                    message=f"{what} {fmt(i.value)} on {where} differs from the fleet majority "
                    f"{fmt(majority)} ({counts[majority]} of {total} {group}); minority nodes: {names}",
                    action=action,
                )
            )
        return out
    split = "; ".join(f"{fmt(v)} on {_names(sorted(by_value[v]))}" for v, _ in ranked)
    for i in items:
        where = f"{i.node} {gpu_label(i.gpu)}" if i.gpu is not None else i.node
        out.append(
            model.Finding(
                check=check, severity=severity, node=i.node,
                gpu=model.gpu_ref(i.gpu) if i.gpu is not None else None,
                observed=i.value, expected=None,
                message=f"{what} {fmt(i.value)} on {where}: the fleet has no majority ({split}); "
                "pin it in the baseline",
                action=action,
            )
        )
    return out


def _names(nodes: Iterable[str], limit: int = 10) -> str:
    nodes = list(nodes)
    if len(nodes) <= limit:
        return ", ".join(nodes)
    return ", ".join(nodes[:limit]) + f" (+{len(nodes) - limit} more)"


# --- per-model settings majority -------------------------------------------------------

# Fewer GPUs of a model than this never make a majority: two GPUs that disagree say nothing
# about which one is right.
SETTING_MIN_VOTERS = 3


def setting_majority(items: Sequence[Item]) -> tuple[Any, collections.Counter[Any]] | None:
    """The value a strict majority (more than half) of ``items`` holds, with the counts of
    every value; ``None`` when there is nothing to report: fewer than ``SETTING_MIN_VOTERS``
    readable values, every value the same, or no value held by more than half (a tie)."""
    values = [i.value for i in items if i.value is not None]
    counts = collections.Counter(values)
    if len(values) < SETTING_MIN_VOTERS or len(counts) < 2:
        return None
    value, top = counts.most_common(1)[0]
    if top * 2 <= len(values):
        return None
    return value, counts


def setting_drift(
    check: str,
    what: str,
    model_name: str,
    items: Sequence[Item],
    action: Callable[[Item, Any], str],
    fmt: Callable[[Any], str] = str,
    observed: Callable[[Item], Any] | None = None,
    severity: str = "warn",
) -> list[model.Finding]:
    """One finding per GPU of ``model_name`` whose setting differs from the strict majority of
    that model's GPUs across the fleet. The message names the GPU and counts every value
    ("persistence_mode off on n3 GPU 2 (...) GPU-...; fleet NVIDIA H200: on 127, off 1"). Ties,
    fleets too small to vote and unanimous fleets give nothing (see ``setting_majority``)."""
    found = setting_majority(items)
    if found is None:
        return []
    majority, counts = found
    tally = ", ".join(f"{fmt(v)} {c}" for v, c in sorted(counts.items(), key=lambda vc: (-vc[1], str(vc[0]))))
    minority_nodes = sorted({i.node for i in items if i.value is not None and i.value != majority})
    out: list[model.Finding] = []
    for i in items:
        if i.value is None or i.value == majority:
            continue
        gpu = i.gpu
        where = f"{i.node} {gpu_label(gpu)} {gpu.uuid}" if gpu is not None else i.node
        out.append(
            model.Finding(
                check=check, severity=severity, node=i.node,
                gpu=model.gpu_ref(gpu) if gpu is not None else None,
                observed=observed(i) if observed is not None else i.value, expected=majority,
                message=f"{what} {fmt(i.value)} on {where}; fleet {model_name}: {tally} "
                f"(minority nodes: {_names(minority_nodes)})",
                action=action(i, majority),
            )
        )
    return out
