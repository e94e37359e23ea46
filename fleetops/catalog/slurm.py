"""Whose drain is it: how fleetops reads a Slurm node, names the owner of every drain it makes,
and decides who may lift one.

Every drain fleetops makes carries its owner in Slurm's Reason, where slurmctld keeps it and
every place that can run scontrol reads the same answer::

    [fleetops] KIND/RUN: PURPOSE
    [fleetops] rollout/20261206T071502Z-3f9a: driver rollout 580.163.01
    [fleetops] health/20261206T031207Z-node017: memory.ecc_dbe_volatile on GPU GPU-5d3e... 0000:18:00.0

KIND is one of ``OWNER_KINDS``; RUN names the run that drained (a rollout, a MIG run, one
remediate, one health-check pass). The rules, one implementation for the controller (ops.slurm,
the TUI, remediate, ``fleetops drain``/``resume``), the Ansible module and the health program:

- a resume lifts only a drain its own run set (``resume_decision``); the health program and
  operators own their drains by kind (any health pass may lift the health program's drain once
  the node is clean; any operator may lift an operator's drain);
- a fault drain (``FAULT_KINDS``: health, operator, reset) is lifted only by an operator's
  resume (another owner's needs ``force``) or by the health program, for its own;
- a planned run (``PLANNED_KINDS``) that finds an earlier run of its own kind's drain takes it
  over (``adopt``: a rollout rerun after a failure); any other owner's drain is ``held``: the run
  leaves the node alone and names the drain;
- a drain made before owners existed (``[fleetops] healthcheck: ...`` is the health program's,
  any other ``[fleetops] ...`` an operator's) is read on the safe side: no automation lifts it.

Capacity: ``capacity_problems`` counts, per partition, every node that is out of service
(drained or down, whoever did it) and refuses a drain that would take more than the allowed
share out; ``breaker`` is the health program's circuit breaker over its recent drains.

This file is standard library only. The collection's modules carry a byte-identical copy as
``plugins/module_utils/slurm_rule.py`` (written by ``fleetops docs``; a unit test fails when
the two differ and holds both to the same answers on a table of Reasons).
"""

from __future__ import annotations

import calendar
import math
import re
import time
from dataclasses import dataclass

MARKER = "[fleetops]"
OWNER_KINDS = ("rollout", "mig", "firmware", "power", "reset", "health", "operator")
# Drains set because something is wrong: no planned run lifts them.
FAULT_KINDS = ("health", "operator", "reset")
# Drains set for planned work: a later run of the same kind takes an earlier run's over.
PLANNED_KINDS = ("rollout", "mig", "firmware", "power")
# Kinds that own their drains by kind, not by run: every pass of the health program on a node is
# the same program, and one operator may lift another operator's drain.
OWN_BY_KIND = ("health", "operator")
# Not fleetops' at all: an operator's scontrol, another tool, slurmctld itself.
OTHER = "other"
LEGACY_HEALTH_PREFIX = "healthcheck:"
DRAIN_FLAGS = ("DRAIN", "DRAINED", "DRAINING")
# States in which a node takes no jobs, whoever put it there.
# scontrol writes a node whose slurmd stopped answering as IDLE+NOT_RESPONDING (sinfo as IDLE*);
# FUTURE nodes are configured but not yet in service.
OUT_FLAGS = (
    "DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "NOT_RESPONDING",
    "FUTURE",
)
BUSY_STATES = ("ALLOCATED", "ALLOC", "MIXED", "COMPLETING")
MAX_REASON = 200  # Slurm keeps longer ones; sinfo -R and the people reading it do not
RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$")
_OWNER = re.compile(r"^\[fleetops\]\s+([a-z]+)/(\S+?):\s?(.*)$")
# slurmctld appends who set the reason and when: "[root@2026-12-02T10:00:00]"
_STAMP = re.compile(r"\s*\[([^\]]*)@([^\]]*)\]\s*$")
_STATE_SPLIT = re.compile(r"[+*~#!%$@^-]")
_RUN_TIME = re.compile(r"^(\d{8}T\d{6})Z")


@dataclass(frozen=True)
class Owner:
    """Who drained a node, read from its Reason."""

    kind: str  # one of OWNER_KINDS, or OTHER
    run: str | None
    purpose: str
    legacy: bool = False  # a fleetops drain from before owners were written

    @property
    def ours(self) -> bool:
        return self.kind != OTHER

    @property
    def fault(self) -> bool:
        """Set for a fault: only an operator (or the health program, for its own) lifts it."""
        return self.kind in FAULT_KINDS or self.kind == OTHER or self.legacy

    def describe(self) -> str:
        """For messages: ``the health program (run R): PURPOSE``."""
        if self.kind == OTHER:
            return (
                f"someone outside fleetops (reason {self.purpose!r})"
                if self.purpose
                else "someone outside fleetops (no reason given)"
            )
        who = {
            "rollout": "a driver rollout",
            "mig": "a MIG run",
            "firmware": "a firmware run",
            "power": "a power-cap run",
            "reset": "remediate, for a GPU reset",
            "health": "the health program",
            "operator": "an operator",
        }.get(self.kind, self.kind)
        run = f" (run {self.run})" if self.run else (" (before owners were recorded)" if self.legacy else "")
        return "{}{}: {}".format(who, run, self.purpose or "no purpose given")


@dataclass(frozen=True)
class Decision:
    """What a drain or resume should do on a node, and why (for the report)."""

    action: str  # drain: drain | ours | adopt | held ; resume: resume | leave | not_drained
    owner: Owner | None
    why: str


def new_run_id(now: float | None = None) -> str:
    """A run id: UTC time to the second and four random hex digits."""
    # secrets here, not at the top: it loads hashlib and with it OpenSSL's libcrypto (3.5 MiB
    # resident), and the resident agent imports this module (its health-program metrics)
    # without ever making a run id.
    import secrets

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def run_time(run: str | None) -> float | None:
    """When a run started, from a run id made by ``new_run_id`` (None for other ids)."""
    found = _RUN_TIME.match(run or "")
    if not found:
        return None
    return float(calendar.timegm(time.strptime(found.group(1), "%Y%m%dT%H%M%S")))


def check_owner(kind: str, run: str) -> None:
    """Raise ValueError naming the field when kind or run cannot be written into a Reason."""
    if kind not in OWNER_KINDS:
        raise ValueError("owner kind {!r} is not one of {}".format(kind, ", ".join(OWNER_KINDS)))
    if not RUN_RE.match(run or ""):
        raise ValueError(
            f"run id {run!r}: 1-64 characters of letters, digits and . _ : @ -, starting with a letter or digit"
        )


def drain_reason(kind: str, run: str, purpose: str | None) -> str:
    """The Reason of a drain fleetops makes: owner kind, run id and purpose, on one line."""
    check_owner(kind, run)
    # "Key=" inside a Reason would read as a later field of scontrol's one-line output
    text = " ".join((purpose or "").split()).replace("=", ":") or f"fleetops {kind}"
    return (f"{MARKER} {kind}/{run}: {text}")[:MAX_REASON]


def owner_of(reason: str | None) -> Owner:
    """The owner of a drain from the node's current Reason (slurmctld's stamp removed, as
    ``parse_node`` gives it)."""
    text = (reason or "").strip()
    if not text.startswith(MARKER):
        return Owner(OTHER, None, text)
    found = _OWNER.match(text)
    if found and found.group(1) in OWNER_KINDS and RUN_RE.match(found.group(2)):
        return Owner(found.group(1), found.group(2), found.group(3).strip())
    rest = text[len(MARKER) :].strip()
    if rest.startswith(LEGACY_HEALTH_PREFIX):
        return Owner("health", None, rest[len(LEGACY_HEALTH_PREFIX) :].strip(), legacy=True)
    return Owner("operator", None, rest, legacy=True)


def _same_owner(owner: Owner, kind: str, run: str | None) -> bool:
    if owner.kind != kind:
        return False
    return kind in OWN_BY_KIND or (owner.run is not None and owner.run == run)


def drain_decision(state: str | None, reason: str | None, kind: str, run: str | None) -> Decision:
    """What a drain by (kind, run) does on a node in ``state`` with ``reason``: ``drain`` (not
    drained), ``ours`` (already this owner's), ``adopt`` (an earlier run of the same planned kind:
    re-mark it as this run's), ``held`` (another owner's drain: leave it, name it)."""
    if not is_drained(state):
        return Decision("drain", None, f"not drained (Slurm state {state})")
    owner = owner_of(reason)
    if _same_owner(owner, kind, run):
        return Decision("ours", owner, f"already drained by {owner.describe()}")
    if kind in PLANNED_KINDS and owner.kind == kind and not owner.legacy:
        return Decision(
            "adopt", owner, f"drained by an earlier run of the same kind, taken over: {owner.describe()}"
        )
    return Decision("held", owner, f"drained by {owner.describe()}; left as it is")


def resume_decision(
    state: str | None, reason: str | None, kind: str, run: str | None, force: bool = False
) -> Decision:
    """Whether a resume by (kind, run) lifts the node's drain: ``resume``, ``leave`` (another
    owner's; an operator may pass ``force``) or ``not_drained``."""
    if not is_drained(state):
        return Decision("not_drained", None, f"not drained (Slurm state {state}): nothing to resume")
    owner = owner_of(reason)
    if _same_owner(owner, kind, run):
        return Decision("resume", owner, f"drained by {owner.describe()}")
    if force and kind == "operator":
        return Decision("resume", owner, f"forced by an operator over {owner.describe()}")
    hint = "; an operator can lift it with: fleetops resume --force" if kind == "operator" else ""
    if kind != "operator" and owner.fault:
        hint = "; a fault drain: only an operator lifts it (fleetops resume)"
    return Decision("leave", owner, f"drained by {owner.describe()}, not by this run; left drained{hint}")


# --- the scontrol calls (argv lists, no shell sees them) --------------------------------------


def show_argv(name: str, scontrol: str = "scontrol") -> list[str]:
    """One node, one line of Key=Value pairs."""
    return [scontrol, "show", "node", "-o", name]


def show_all_argv(scontrol: str = "scontrol") -> list[str]:
    """Every node, one line each (State, Reason, Partitions): what capacity and the breaker count."""
    return [scontrol, "show", "nodes", "-o"]


def drain_argv(name: str, reason: str, scontrol: str = "scontrol") -> list[str]:
    """The drain with its Reason as given: one argument, whatever it holds. ``drain_reason``
    makes the Reason that names the owner."""
    return [scontrol, "update", "NodeName=" + name, "State=DRAIN", "Reason=" + reason]


def resume_argv(name: str, scontrol: str = "scontrol") -> list[str]:
    return [scontrol, "update", "NodeName=" + name, "State=RESUME"]


# --- reading scontrol ---------------------------------------------------------------------


def _field(line: str, key: str) -> str | None:
    found = re.search(rf"(?:^|\s){key}=(\S*)", line)
    return found.group(1) if found else None


def parse_node(text: str) -> tuple[str | None, str | None]:
    """State and Reason from ``scontrol show node -o NAME`` (one line of Key=Value pairs); the
    Reason without slurmctld's ``[user@time]`` stamp."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    state = _field(line, "State")
    reason = None
    found = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if found:
        reason = _STAMP.sub("", found.group(1)).strip()
        # later keys, if any, start with " Key=" in CamelCase
        later = re.search(r"\s[A-Z][A-Za-z]+=", reason)
        if later:
            reason = _STAMP.sub("", reason[: later.start()]).strip()
    return state, reason


def reason_stamp(text: str) -> tuple[str | None, str | None]:
    """Who set the node's Reason and when, from slurmctld's ``[user@time]`` stamp in
    ``scontrol show node -o`` output; (None, None) when Slurm did not say."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    found = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if not found:
        return None, None
    value = found.group(1)
    later = re.search(r"\s[A-Z][A-Za-z]+=", value)
    if later:
        value = value[: later.start()]
    stamp = _STAMP.search(value)
    if not stamp:
        return None, None
    return stamp.group(1).strip() or None, stamp.group(2).strip() or None


@dataclass(frozen=True)
class SlurmNode:
    """One node of ``scontrol show nodes -o``."""

    name: str
    state: str | None
    reason: str | None
    partitions: tuple[str, ...]


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node of ``scontrol show nodes -o`` (one line per node)."""
    nodes = []
    for line in text.splitlines():
        name = _field(line, "NodeName")
        if not name:
            continue
        state, reason = parse_node(line)
        parts = _field(line, "Partitions")
        nodes.append(SlurmNode(name, state, reason, tuple(p for p in (parts or "").split(",") if p)))
    return nodes


def _flags(state: str | None) -> list[str]:
    return [p for p in _STATE_SPLIT.split((state or "").upper()) if p]


def is_drained(state: str | None) -> bool:
    """A drain is set (DRAIN, DRAINING or DRAINED, with any other flags)."""
    return any(p in DRAIN_FLAGS for p in _flags(state))


def is_busy(state: str | None) -> bool:
    """The node still runs jobs."""
    return any(p in BUSY_STATES for p in _flags(state))


def is_out(state: str | None) -> bool:
    """The node takes no new jobs: drained, down, failed, in maintenance, or not responding."""
    flags = _flags(state)
    return "*" in (state or "") or any(p in DRAIN_FLAGS or p in OUT_FLAGS for p in flags)


def allowed_out(total: int, share: float) -> int:
    """How many of a partition's ``total`` nodes may be out at once: ``share`` of them, rounded
    down, and never fewer than one (a partition of three can still be worked on, one at a time)."""
    return max(1, int(math.floor(total * share + 1e-9)))


def capacity_problems(nodes: list[SlurmNode], to_drain: list[str], share: float) -> list[str]:
    """Why draining ``to_drain`` now would take more than ``share`` of a partition out of service,
    counting every node already out, whoever drained it; empty when it may go ahead."""
    if not 0 < share <= 1:
        raise ValueError(f"max drain share {share!r}: a fraction above 0 and at most 1")
    by_name = {n.name: n for n in nodes}
    wanted = set(to_drain)
    problems = []
    partitions = sorted({p for n in to_drain if n in by_name for p in by_name[n].partitions})
    for part in partitions:
        members = [n for n in nodes if part in n.partitions]
        new = sorted(n.name for n in members if n.name in wanted and not is_out(n.state))
        if not new:
            continue
        already = sorted(n.name for n in members if is_out(n.state))
        limit = allowed_out(len(members), share)
        if len(already) + len(new) > limit:
            listed = ", ".join(already[:8]) + (" ..." if len(already) > 8 else "") if already else "none"
            problems.append(
                f"partition {part}: {len(already)} of {len(members)} nodes are out of service already ({listed}); "
                f"draining {', '.join(new)} would make {len(already) + len(new)}, more than the allowed {limit} "
                f"({share * 100:g}%)"
            )
    return problems


def breaker(nodes: list[SlurmNode], node: str, share: float) -> tuple[bool, str]:
    """The health program's circuit breaker: (open, why). Open when one more health drain would
    make the health program's standing drains more than ``share`` of the nodes it watches (the
    nodes of this node's partitions, every node when it has none). Every standing health drain
    counts, however old: a fleet-wide false positive that lasts must not drain another share of
    the partition every few minutes, so the breaker stays open until drains are lifted."""
    me = next((n for n in nodes if n.name == node), None)
    parts = set(me.partitions) if me else set()
    watched = [n for n in nodes if not parts or parts & set(n.partitions)] or nodes
    standing = sorted(
        n.name
        for n in watched
        if n.name != node and is_drained(n.state) and owner_of(n.reason).kind == "health"
    )
    limit = allowed_out(len(watched), share)
    names = ", ".join(standing[:8]) + (" ..." if len(standing) > 8 else "") if standing else "none"
    text = (
        f"{len(standing)} of {len(watched)} watched nodes stand drained by the health program ({names}); "
        f"the limit is {limit} ({share * 100:g}%)"
    )
    return len(standing) + 1 > limit, text
