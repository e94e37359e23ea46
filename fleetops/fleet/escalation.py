"""Escalation that learns from history: which faults outlived the repairs meant to end them,
which XIDs are the application's rather than a GPU's, and how often each node has incidents.

Pure: it reads audit points (one reachable audit of one node: its findings, uptime and each
GPU's ``last_reset_at``) that ``Store.timelines`` gives, and the findings a plan is built from.
It never opens the store (the store imports this module for ``AuditPoint``, not the other way
round): ``store.escalations`` reads the history and runs ``analyse`` on it.

- A fault is one finding check on one GPU (or the node), and for ``xid.recent`` one XID code.
  It *survived* a reboot (a GPU reset) when it was present in an audit, the node rebooted (the
  GPU was reset) and it was present again afterwards. As gpud does (its threshold.go), a fault
  that survived ``Policy.reboots`` reboots (2) is sent for hardware inspection
  (``drain_and_inspect``) instead of another reboot or reset; resets count alike
  (``Policy.resets``, 3). Only a fault whose planned action was a repair (reset, reboot, drain)
  is escalated: a configuration drift that comes back after a reboot is not the hardware's.
- A reboot is seen as a new boot time. Snapshots carry no boot time field: it is
  ``collected_at - uptime_s``; a reboot between two audits is an uptime that fell, or a boot
  time that moved by more than ``BOOT_SLACK_S`` (the rounding of both and clock slew).
  Two reboots between the same two audits look like one.
- The same XID code on GPUs of ``Policy.app_nodes`` (3) or more nodes within
  ``Policy.app_window_s`` (10 min) points at the application (NVSentinel's analyzer): the plan
  says so once and does not drain those GPUs for that code.
- An incident is a node going from no warn/crit finding to one across its audits; the time
  between incidents (MTBI, NVSentinel's breakfix design) is given as p50 and p90.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleetops import model
from fleetops.catalog.durations import GRAMMAR, duration_arg, retention_arg

DEFAULT_REBOOTS = 2  # gpud's reboot threshold
DEFAULT_RESETS = 3
DEFAULT_APP_NODES = 3
DEFAULT_APP_WINDOW_S = 600.0
DEFAULT_LOOKBACK_S = 7 * 86400.0
# a boot time (collected_at - uptime_s) that moved by more than this is another boot
BOOT_SLACK_S = 30.0
# planned actions that are repairs: a fault that outlives them goes to hardware inspection
ESCALATE_FROM = ("drain", "reset_gpu", "reboot_node")
ESCALATED = "drain_and_inspect"
# findings that are no fault of the hardware, or only restate another finding's XIDs
_NOT_FAULTS = ("transport.", "versions.")


@dataclass(frozen=True)
class Policy:
    reboots: int = DEFAULT_REBOOTS
    resets: int = DEFAULT_RESETS
    app_nodes: int = DEFAULT_APP_NODES
    app_window_s: float = DEFAULT_APP_WINDOW_S
    lookback_s: float | None = DEFAULT_LOOKBACK_S  # None: every stored audit

    def describe(self) -> str:
        return (
            f"a fault that survived {self.reboots} reboots or {self.resets} GPU resets goes to hardware "
            f"inspection; the same XID on {self.app_nodes}+ nodes within {_span(self.app_window_s)} is the "
            "application's"
        )


@dataclass(frozen=True)
class AuditPoint:
    """One reachable audit of one node, as the analysis reads it."""

    audit_id: int
    collected_at: float
    uptime_s: float | None
    resets: Mapping[str, float] = field(default_factory=dict)  # GPU UUID -> last_reset_at
    findings: tuple[model.Finding, ...] = ()  # warn and crit only

    @property
    def boot_at(self) -> float | None:
        return None if self.uptime_s is None else self.collected_at - self.uptime_s


@dataclass
class FaultHistory:
    node: str
    gpu: dict[str, Any] | None
    fault: str  # check id, or xid:<code>
    check: str
    first_seen: float
    last_seen: float
    audits: int  # audits it was present in
    reboots: list[float] = field(default_factory=list)  # boot times of the reboots it survived
    resets: list[float] = field(default_factory=list)  # GPU resets it survived
    current: bool = False  # present in the node's latest audit

    def escalated(self, policy: Policy) -> bool:
        return len(self.reboots) >= policy.reboots or (
            self.gpu is not None and len(self.resets) >= policy.resets
        )

    def survived_text(self) -> str:
        parts = []
        if self.reboots:
            parts.append(_plural(len(self.reboots), "reboot"))
        if self.resets:
            parts.append(_plural(len(self.resets), "GPU reset"))
        return (
            "survived " + (" and ".join(parts) or "no reboot or reset") + f" since {stamp(self.first_seen)}"
        )

    def text(self, policy: Policy) -> str:
        return self.survived_text() + (": hardware inspection" if self.escalated(policy) else "")

    def to_dict(self, policy: Policy) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "fault": self.fault,
            "check": self.check,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "audits": self.audits,
            "reboots": len(self.reboots),
            "resets": len(self.resets),
            "reboot_times": self.reboots,
            "reset_times": self.resets,
            "current": self.current,
            "escalated": self.escalated(policy),
            "text": self.text(policy),
        }


@dataclass(frozen=True)
class AppWideXid:
    code: int
    nodes: tuple[str, ...]
    first: float
    last: float

    @property
    def text(self) -> str:
        return f"application-wide XID {self.code} on {len(self.nodes)} nodes: look at the job, not the GPUs"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "nodes": list(self.nodes),
            "first": self.first,
            "last": self.last,
            "text": self.text,
        }


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


# --- faults ----------------------------------------------------------------------------------


def _xid_entries(f: model.Finding) -> list[dict[str, Any]]:
    observed = f.observed if isinstance(f.observed, list) else []
    return [
        e
        for e in observed
        if isinstance(e, dict)
        and isinstance(e.get("code"), int)
        and e.get("severity") in model.FAULT_SEVERITIES
    ]


def faults_of(f: model.Finding) -> list[str]:
    """The fault ids a warn/crit finding stands for: its check id, or one per XID code."""
    if f.severity not in model.FAULT_SEVERITIES or f.check.startswith(_NOT_FAULTS):
        return []
    if f.check.endswith(".unreadable") or f.check == "xid.storm":  # the storm restates xid.recent's codes
        return []
    if f.check == "xid.recent":
        return [("sxid:" if e.get("sxid") else "xid:") + str(e["code"]) for e in _xid_entries(f)]
    return [f.check]


def rebooted(before: AuditPoint, after: AuditPoint) -> bool:
    """Whether the node booted between two of its audits (by uptime; unknown uptime: no)."""
    if before.uptime_s is None or after.uptime_s is None:
        return False
    if after.uptime_s < before.uptime_s:
        return True
    return abs((after.boot_at or 0.0) - (before.boot_at or 0.0)) > BOOT_SLACK_S


def fault_histories(node: str, points: Iterable[AuditPoint]) -> list[FaultHistory]:
    """Every fault of ``node`` across its audits (oldest first), with the reboots and resets
    each survived: those that fell between its first and its last presence."""
    pts = sorted(points, key=lambda p: p.audit_id)
    if not pts:
        return []
    boots: list[tuple[int, float]] = []  # (index of the first audit after the reboot, its boot time)
    last_known: AuditPoint | None = None
    for i, p in enumerate(pts):
        if p.uptime_s is None:
            continue
        if last_known is not None and rebooted(last_known, p):
            boots.append((i, p.boot_at or p.collected_at))
        last_known = p
    seen: dict[tuple[str, str], list[int]] = {}
    info: dict[tuple[str, str], tuple[dict[str, Any] | None, str]] = {}
    for i, p in enumerate(pts):
        for f in p.findings:
            uuid = (f.gpu or {}).get("uuid") or ""
            for fault in faults_of(f):
                key = (uuid, fault)
                at = seen.setdefault(key, [])
                if not at or at[-1] != i:
                    at.append(i)
                info[key] = (dict(f.gpu) if uuid and f.gpu else None, f.check)
    out = []
    for (uuid, fault), at in seen.items():
        first, last = at[0], at[-1]
        gpu, check = info[(uuid, fault)]
        reboots = [t for i, t in boots if first < i <= last]
        resets: list[float] = []
        if uuid:
            lo, hi = pts[first].collected_at, pts[last].collected_at
            stamps = {p.resets[uuid] for p in pts[first + 1 : last + 1] if p.resets.get(uuid) is not None}
            resets = sorted(r for r in stamps if lo < r <= hi)
        out.append(
            FaultHistory(
                node,
                gpu,
                fault,
                check,
                pts[first].collected_at,
                pts[last].collected_at,
                len(at),
                reboots,
                resets,
                current=last == len(pts) - 1,
            )
        )
    out.sort(key=lambda h: ((h.gpu or {}).get("index", -1), h.fault))
    return out


# --- application-wide XIDs -------------------------------------------------------------------


def app_wide_xids(
    findings: Iterable[model.Finding], times: Mapping[str, float], policy: Policy
) -> list[AppWideXid]:
    """XID codes seen on GPUs of ``policy.app_nodes`` or more nodes within ``app_window_s``.
    An event's time is its node's snapshot time (``times``) less the code's last age."""
    events: dict[int, list[tuple[float, str]]] = {}
    for f in findings:
        if f.check != "xid.recent" or not f.gpu:
            continue
        at = times.get(f.node)
        for e in _xid_entries(f):
            if e.get("sxid") or at is None:
                continue
            age = e.get("last_age_s")
            events.setdefault(e["code"], []).append(
                (at - float(age) if isinstance(age, int | float) else at, f.node)
            )
    out = []
    for code, evs in sorted(events.items()):
        evs.sort()
        hit: set[str] = set()
        first = last = 0.0
        for i, (start, _) in enumerate(evs):
            window = [(t, n) for t, n in evs[i:] if t - start <= policy.app_window_s]
            nodes = {n for _, n in window}
            if len(nodes) >= policy.app_nodes:
                first = start if not hit else min(first, start)
                last = max(last, window[-1][0])
                hit |= nodes
        if hit:
            out.append(AppWideXid(code, tuple(sorted(hit)), first, last))
    return out


# --- time between incidents ------------------------------------------------------------------


def incidents(points: Iterable[AuditPoint]) -> list[float]:
    """When the node went from no warn/crit finding to one (the first audit starts nothing:
    what came before it is not known)."""
    starts = []
    before: bool | None = None
    for p in sorted(points, key=lambda p: p.audit_id):
        faulty = any(f.severity in model.FAULT_SEVERITIES for f in p.findings)
        if before is False and faulty:
            starts.append(p.collected_at)
        before = faulty
    return starts


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Mtbi:
    incidents: int
    intervals: tuple[float, ...]

    @property
    def p50(self) -> float | None:
        return percentile(list(self.intervals), 0.5)

    @property
    def p90(self) -> float | None:
        return percentile(list(self.intervals), 0.9)

    def to_dict(self) -> dict[str, Any]:
        return {
            "incidents": self.incidents,
            "intervals_s": list(self.intervals),
            "p50_s": self.p50,
            "p90_s": self.p90,
        }


def mtbi(starts: list[float]) -> Mtbi:
    return Mtbi(len(starts), tuple(b - a for a, b in zip(starts, starts[1:], strict=False)))


# --- the whole analysis, and what a plan asks of it ------------------------------------------


@dataclass
class Escalations:
    """What ``remedy.plan.build(..., escalations=...)`` consults: ``adjust`` per finding and
    ``notes`` for the plan as a whole."""

    policy: Policy
    histories: dict[tuple[str, str, str], FaultHistory] = field(default_factory=dict)  # (node, uuid, fault)
    app_wide: list[AppWideXid] = field(default_factory=list)
    mtbi: dict[str, Mtbi] = field(default_factory=dict)

    @property
    def notes(self) -> list[str]:
        return [a.text for a in self.app_wide]

    def _app_codes(self, node: str) -> dict[int, AppWideXid]:
        return {a.code: a for a in self.app_wide if node in a.nodes}

    def adjust(
        self, f: model.Finding, action: str, action_for: Callable[[model.Finding], str]
    ) -> tuple[str, list[dict[str, Any]]]:
        """(the action for ``f`` in the light of history, notes that say why it changed)."""
        notes: list[dict[str, Any]] = []
        app: dict[int, AppWideXid] = {}
        if f.check == "xid.recent" and isinstance(f.observed, list):
            app = {
                c: a
                for c, a in self._app_codes(f.node).items()
                if any(e["code"] == c and not e.get("sxid") for e in _xid_entries(f))
            }
            if app:
                observed = [
                    dict(e, action="restart_app")
                    if isinstance(e, dict) and e.get("code") in app and not e.get("sxid")
                    else e
                    for e in f.observed
                ]
                action = action_for(replace(f, observed=observed))
                notes += [{"kind": "application_wide_xid", **a.to_dict()} for a in app.values()]
        if action not in ESCALATE_FROM:
            return action, notes
        uuid = (f.gpu or {}).get("uuid") or ""
        for fault in faults_of(f):
            if fault.startswith("xid:") and int(fault[4:]) in app:
                continue
            h = self.histories.get((f.node, uuid, fault))
            if h is not None and h.current and h.escalated(self.policy):
                action = ESCALATED
                notes.append({"kind": "survived", **h.to_dict(self.policy)})
        return action, notes

    def for_node(self, node: str) -> list[FaultHistory]:
        return [h for (n, _, _), h in self.histories.items() if n == node]

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": {
                "reboots": self.policy.reboots,
                "resets": self.policy.resets,
                "app_nodes": self.policy.app_nodes,
                "app_window_s": self.policy.app_window_s,
                "lookback_s": self.policy.lookback_s,
            },
            "faults": [h.to_dict(self.policy) for h in self.histories.values()],
            "application_wide": [a.to_dict() for a in self.app_wide],
            "incidents": {n: m.to_dict() for n, m in sorted(self.mtbi.items())},
            "fleet_incidents": fleet_mtbi(self.mtbi.values()).to_dict(),
        }


def fleet_mtbi(per_node: Iterable[Mtbi]) -> Mtbi:
    """Every node's intervals pooled: the fleet's distribution of time between a node's incidents."""
    nodes = list(per_node)
    return Mtbi(sum(m.incidents for m in nodes), tuple(x for m in nodes for x in m.intervals))


def analyse(
    timelines: Mapping[str, list[AuditPoint]], policy: Policy, current: Iterable[model.Finding] | None = None
) -> Escalations:
    """The analysis of every node's audits. ``current``: the findings a plan is built from (the
    application-wide rule reads them); default the latest audit of each node."""
    out = Escalations(policy)
    times: dict[str, float] = {}
    latest: list[model.Finding] = []
    for node, points in timelines.items():
        for h in fault_histories(node, points):
            out.histories[(node, (h.gpu or {}).get("uuid") or "", h.fault)] = h
        out.mtbi[node] = mtbi(incidents(points))
        if points:
            newest = max(points, key=lambda p: p.audit_id)
            times[node] = newest.collected_at
            latest.extend(newest.findings)
    out.app_wide = app_wide_xids(latest if current is None else current, times, policy)
    return out


# --- the command line's side: flags, and the one call that reads the store -------------------


def add_arguments(p: Any) -> None:
    """The thresholds as flags (``fleetops remediate`` and ``fleetops history``)."""
    p.add_argument(
        "--escalate-reboots",
        type=int,
        default=DEFAULT_REBOOTS,
        metavar="N",
        help="a fault that survived N node reboots goes to hardware inspection (drain_and_inspect; "
        f"gpud's threshold, default {DEFAULT_REBOOTS})",
    )
    p.add_argument(
        "--escalate-resets",
        type=int,
        default=DEFAULT_RESETS,
        metavar="N",
        help=f"... or N GPU resets (default {DEFAULT_RESETS})",
    )
    p.add_argument(
        "--app-xid-nodes",
        type=int,
        default=DEFAULT_APP_NODES,
        metavar="N",
        help="the same XID on GPUs of N or more nodes within --app-xid-window is the application's: "
        f"no drains for it (default {DEFAULT_APP_NODES})",
    )
    p.add_argument(
        "--app-xid-window",
        type=duration_arg("--app-xid-window"),
        default=DEFAULT_APP_WINDOW_S,
        metavar="DURATION",
        help=f"see --app-xid-nodes ({GRAMMAR}; default {DEFAULT_APP_WINDOW_S:g})",
    )
    p.add_argument(
        "--escalation-lookback",
        type=retention_arg("--escalation-lookback"),
        default="7d",
        metavar="DURATION",
        help=f"how far back the history counts reboots, resets and incidents ({GRAMMAR}; 'forever': "
        "every stored audit; default 7d)",
    )


def policy_from_args(args: Any) -> Policy:
    """The policy the flags give (their defaults where a command has none of them)."""
    from fleetops.common.errors import UsageError

    for name in ("escalate_reboots", "escalate_resets", "app_xid_nodes", "app_xid_window"):
        if getattr(args, name, 1) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number")
    lookback = getattr(args, "escalation_lookback", DEFAULT_LOOKBACK_S)  # parsed by retention_arg
    return Policy(
        reboots=getattr(args, "escalate_reboots", DEFAULT_REBOOTS),
        resets=getattr(args, "escalate_resets", DEFAULT_RESETS),
        app_nodes=getattr(args, "app_xid_nodes", DEFAULT_APP_NODES),
        app_window_s=float(getattr(args, "app_xid_window", DEFAULT_APP_WINDOW_S)),
        lookback_s=lookback,
    )
