"""Drain and resume GPU nodes where Slurm is controlled, never on the node itself.

``scontrol`` runs on the controller (the machine running fleetops, the default) or, over SSH, on
the Slurm host the inventory names in ``fleetops_slurm_host`` (an inventory host name, or an
address reached with the node's own SSH user and key). Nothing runs on the GPU node, so a node
whose agent hangs or whose sshd is gone can still be drained: that is when a drain matters most.

Slurm's name for the node is ``fleetops_slurm_node_name``, or the inventory name up to its first
dot. The argv is passed as a list (no shell on the controller; ``shlex.join`` over SSH). A host
with ``fleetops_slurm_managed: false`` is not a Slurm node: nothing is run for it.

Every drain names its owner (``fleetops.catalog.slurm``, the rule the health program and the
Ansible module follow too): the Reason is ``[fleetops] KIND/RUN: PURPOSE``. Before anything is
sent the node's State and Reason are read and the rule decides: a drain by the same owner is left
as it is, an earlier run of the same planned kind is taken over, any other owner's drain is held
(named, with who set it and when where Slurm says); a resume lifts only its own owner's drain (an
operator may ``force``). A drain also passes the capacity guard first: every node of the node's
partitions is listed (``scontrol show nodes -o``) and a drain that would take more than
``max_share`` of a partition out of service, whoever took the others out, is refused.

Every call gives one ``ActionResult`` (action ``drain`` or ``resume``): done, dry-run (what would
be sent), refused (nothing was changed: no scontrol, an unknown node, another owner's drain, the
capacity guard), failed (scontrol said no), or unknown (the update was sent over SSH and no answer
came: ``check`` is the command to look). ``detail`` carries the decision and the drain's owner.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetops.catalog import slurm as rule
from fleetops.common.errors import UsageError
from fleetops.ops.results import DONE, DRY_RUN, FAILED, REFUSED, UNKNOWN, ActionResult

SLURM_HOST_VAR = "fleetops_slurm_host"
SLURM_NAME_VAR = "fleetops_slurm_node_name"
SLURM_MANAGED_VAR = "fleetops_slurm_managed"
SCONTROL = "scontrol"
# scontrol answers from slurmctld's memory; a controller that needs longer is not answering.
SCONTROL_TIMEOUT_S = 30.0
# the share of a partition that may be out of service at once (never fewer than one node)
DEFAULT_MAX_SHARE = 0.10
# where Slurm's tools look for their configuration when SLURM_CONF is not set
DEFAULT_CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")
_NOT_FOUND_STATUS = 127
_FALSE = ("false", "no", "off", "0", "n")

Runner = Callable[[Any, Sequence[str]], Any]  # (SSH host or None for local, argv) -> transport.Result


def slurm_name(host: Any) -> str:
    """Slurm's name for the node: the inventory variable, else the short inventory name."""
    value = (getattr(host, "vars", None) or {}).get(SLURM_NAME_VAR)
    if value is not None and str(value).strip():
        return str(value).strip()
    return str(host.name).split(".", 1)[0]


def slurm_managed(host: Any) -> bool:
    """False only when the inventory says ``fleetops_slurm_managed: false`` (YAML or INI)."""
    value = (getattr(host, "vars", None) or {}).get(SLURM_MANAGED_VAR, True)
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE
    return bool(value)


# the argv lists are the rule's, shared with the health program on the node
show_argv = rule.show_argv
show_all_argv = rule.show_all_argv
drain_argv = rule.drain_argv
resume_argv = rule.resume_argv


def operator_run(user: str | None = None, host: str | None = None) -> str:
    """An operator's run id: ``USER@HOST`` (the person, the controller's short host name), made
    to fit the rule's RUN_RE. Under sudo the person is ``$SUDO_USER``, not root."""
    if user is None:
        import getpass

        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid (a container)
            user = f"uid{os.getuid()}"
        if user == "root" and os.environ.get("SUDO_USER"):
            user = os.environ["SUDO_USER"]
    if host is None:
        import socket

        host = socket.gethostname()
    who = re.sub(r"[^A-Za-z0-9._:-]+", "-", user).strip("-._:") or "operator"
    where = re.sub(r"[^A-Za-z0-9_:-]+", "-", host.split(".", 1)[0]).strip("-_:") or "controller"
    run = f"{who[:40]}@{where[:23]}"
    rule.check_owner("operator", run)
    return run


def purpose_refusal(kind: str, run: str, purpose: str | None) -> str | None:
    """Why ``purpose`` cannot be the PURPOSE of a drain's Reason as given (None: it can): empty,
    or longer than fits before ``rule.MAX_REASON`` with the owner in front (``drain_reason``
    would cut it there, and the next shift would read half a sentence)."""
    text = " ".join((purpose or "").split())
    if not text:
        return "a reason is needed: it is what Slurm's Reason (sinfo -R) tells the next person"
    room = rule.MAX_REASON - len(_reason(kind, run, "x")) + 1
    if len(text) > room:
        return (
            f"the reason is {len(text)} characters; at most {room} fit after "
            f"'{rule.MARKER} {kind}/{run}: ' (Slurm's Reason is kept to {rule.MAX_REASON})"
        )
    return None


def owner_detail(owner: rule.Owner | None) -> dict[str, Any] | None:
    """The owner of a drain, for results and JSON."""
    if owner is None:
        return None
    return {"kind": owner.kind, "run": owner.run, "purpose": owner.purpose, "fault": owner.fault}


@dataclass(frozen=True)
class Place:
    """Where scontrol runs for one node: ``host`` None is the controller itself."""

    host: Any | None
    where: str  # for messages: "the controller" or "Slurm host NAME"


@dataclass(frozen=True)
class NodeReading:
    """One node as Slurm shows it, read for a front end (``SlurmControl.read``): its State and
    Reason, the drain's owner by the rule, who set the Reason and when (slurmctld's stamp).
    ``managed`` False: not a Slurm node (the inventory says so, or Slurm knows no such node);
    ``problem``: why Slurm was not read (or, unmanaged, why it is not a Slurm node)."""

    node: str
    slurm_name: str | None = None
    where: str | None = None
    state: str | None = None
    reason: str | None = None
    owner: rule.Owner | None = None
    set_by: str | None = None
    set_at: str | None = None
    managed: bool = True
    problem: str | None = None

    @property
    def drained(self) -> bool:
        return rule.is_drained(self.state)

    @property
    def draining(self) -> bool:
        """Drained, with jobs still running (Slurm's DRAINING)."""
        return self.drained and rule.is_busy(self.state)


class SlurmControl:
    """Drain and resume for the nodes of one inventory; holds how to reach a Slurm host and the
    share of a partition a drain may take out of service."""

    def __init__(
        self,
        inventory_hosts: Mapping[str, Any] | Sequence[Any] = (),
        *,
        connect_timeout: float = 5.0,
        timeout: float = SCONTROL_TIMEOUT_S,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        scontrol: str = SCONTROL,
        runner: Runner | None = None,
        max_share: float = DEFAULT_MAX_SHARE,
    ) -> None:
        if isinstance(inventory_hosts, Mapping):
            self.inventory = dict(inventory_hosts)
        else:
            self.inventory = {h.name: h for h in inventory_hosts}
        if not 0 < float(max_share) <= 1:
            raise UsageError(f"max drain share {max_share!r}: a fraction above 0 and at most 1 (10% is 0.10)")
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.known_hosts = known_hosts
        self.accept_new_hostkeys = accept_new_hostkeys
        self.scontrol = scontrol
        self.max_share = float(max_share)
        self._runner = runner or self._transport_run

    # --- where ------------------------------------------------------------------------

    def place(self, host: Any) -> Place:
        """The controller, or the Slurm host the node's inventory names (by name or address)."""
        value = (getattr(host, "vars", None) or {}).get(SLURM_HOST_VAR)
        target = str(value).strip() if value is not None else ""
        if not target:
            return Place(None, "the controller")
        known = self.inventory.get(target)
        if known is None:
            # an address (or a name) outside the inventory: reached as the node is reached
            from fleetops.fleet.inventory import Host

            known = Host(
                name=target,
                address=target,
                user=getattr(host, "user", None),
                key_file=getattr(host, "key_file", None),
                vars=dict(getattr(host, "vars", None) or {}),
            )
        if getattr(known, "connection", "ssh") == "local":
            return Place(None, "the controller")
        return Place(known, f"Slurm host {target}")

    def precheck(self, host: Any) -> str | None:
        """Why scontrol cannot run for this node, known without asking anyone (no network): the
        inventory says it is not a Slurm node, the controller has no scontrol, or no Slurm
        configuration to point it at a cluster."""
        if not slurm_managed(host):
            return f"{host.name} is not managed by Slurm ({SLURM_MANAGED_VAR}: false)"
        place = self.place(host)
        if place.host is not None:
            return None
        if shutil.which(self.scontrol) is None:
            return (
                f"scontrol not found on {place.where}: install Slurm's client there, or set "
                f"{SLURM_HOST_VAR} for {host.name} to a host that has it"
            )
        conf = os.environ.get("SLURM_CONF")
        paths = (conf,) if conf else DEFAULT_CONF_PATHS
        if not any(os.path.exists(p) for p in paths):
            return (
                f"no Slurm configuration on {place.where} ({', '.join(paths)} missing): set SLURM_CONF, "
                f"or {SLURM_HOST_VAR} for {host.name} to a host of the cluster"
            )
        return None

    # --- running ----------------------------------------------------------------------

    def _transport_run(self, ssh_host: Any | None, argv: Sequence[str]) -> Any:
        from fleetops.fleet import inventory, transport

        target = ssh_host or inventory.Host(name="controller", address="localhost", connection="local")
        results = transport.run_all(
            [target],
            list(argv),
            forks=1,
            connect_timeout=self.connect_timeout,
            command_timeout=self.timeout,
            known_hosts=self.known_hosts,
            accept_new_hostkeys=self.accept_new_hostkeys,
            idempotent=argv[1:2] == ["show"],  # a show only reads; an update is sent once
        )
        return results[target.name]

    def _run(self, place: Place, argv: Sequence[str]) -> Any:
        return self._runner(place.host, argv)

    def _problem(self, host: Any, action: str, place: Place, name: str, result: Any) -> ActionResult:
        """Why an scontrol call did not give an answer, as the action's result."""
        detail = {"slurm_name": name, "where": place.where}
        text = f"{result.stderr or ''} {result.stdout or ''}".strip()
        if result.exit_status == _NOT_FOUND_STATUS:
            return ActionResult(
                host.name, action, REFUSED, f"{host.name}: scontrol not found on {place.where}", detail=detail
            )
        if _names_unknown_node(result):
            return self._unknown_node(host, action, place, name)
        why = result.error or result.error_kind or "failed"
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        if last and last not in why:
            why = f"{why}: {last}"
        return ActionResult(
            host.name, action, FAILED, f"{host.name}: scontrol on {place.where} failed: {why}", detail=detail
        )

    def _unknown_node(self, host: Any, action: str, place: Place, name: str) -> ActionResult:
        return ActionResult(
            host.name,
            action,
            REFUSED,
            f"{host.name}: Slurm (asked from {place.where}) knows no node named {name!r}: set "
            f"{SLURM_NAME_VAR} for {host.name} in the inventory to its Slurm name",
            detail={"slurm_name": name, "where": place.where},
        )

    def _refused_before(self, host: Any, action: str) -> ActionResult | None:
        """The refusal known before anything is sent: not a Slurm node, or ``precheck``'s reason
        (no scontrol, or no Slurm configuration, on the controller), which the TUI's gate gives
        too; a real scontrol without a configuration would fail the same way, later."""
        if not slurm_managed(host):
            return ActionResult(
                host.name,
                action,
                REFUSED,
                f"{host.name}: not managed by Slurm ({SLURM_MANAGED_VAR}: false): nothing to {action}",
                detail={"slurm_managed": False},
            )
        why = self.precheck(host)
        if why is None:
            return None
        return ActionResult(host.name, action, REFUSED, f"{host.name}: nothing sent: {why}", detail={"precheck": why})

    def show(self, host: Any) -> tuple[Place, str, Any]:
        """(where, Slurm name, the ``scontrol show node`` result)."""
        place, name = self.place(host), slurm_name(host)
        return place, name, self._run(place, show_argv(name, self.scontrol))

    def read(self, host: Any) -> NodeReading:
        """The node as Slurm shows it now (State, Reason, the drain's owner by the rule, who set
        the Reason and when), for a front end to show; the same ``show`` and parse the drain and
        resume decide on. Never raises for Slurm trouble: ``problem`` says why it was not read,
        and ``managed`` False says the node is no Slurm node at all."""
        if not slurm_managed(host):
            return NodeReading(host.name, managed=False, problem=f"{SLURM_MANAGED_VAR}: false in the inventory")
        refusal = self.precheck(host)
        if refusal is not None:
            return NodeReading(host.name, problem=refusal)
        place, name, shown = self.show(host)
        if not shown.ok:
            failed = self._problem(host, "read", place, name, shown)
            unknown = _names_unknown_node(shown) and shown.exit_status != _NOT_FOUND_STATUS
            return NodeReading(
                host.name, name, place.where, managed=not unknown, problem=failed.message.removeprefix(f"{host.name}: ")
            )
        state, reason = rule.parse_node(shown.stdout)
        who, when = rule.reason_stamp(shown.stdout)
        owner = rule.owner_of(reason) if reason else None
        return NodeReading(host.name, name, place.where, state, reason, owner, who, when)

    def nodes(self, host: Any) -> tuple[Place, Any, list[rule.SlurmNode]]:
        """(where, the ``scontrol show nodes -o`` result, its nodes) at the node's Slurm place."""
        place = self.place(host)
        shown = self._run(place, show_all_argv(self.scontrol))
        return place, shown, rule.parse_nodes(shown.stdout) if shown.ok else []

    # --- actions ----------------------------------------------------------------------

    def drain(
        self, host: Any, purpose: str | None, *, kind: str, run: str, dry_run: bool = False
    ) -> ActionResult:
        """Drain the node for ``purpose``, owned by (``kind``, ``run``), as the rule decides:
        not drained -> drained (after the capacity guard); already this owner's -> done, nothing
        sent; an earlier run of the same planned kind -> re-marked as this run's; another owner's
        -> refused, named, their Reason kept. ``dry_run`` says what would be sent, sends nothing."""
        reason = _reason(kind, run, purpose)
        refused = self._refused_before(host, "drain")
        if refused is not None:
            return refused
        place, name, shown = self.show(host)
        if not shown.ok:
            return self._problem(host, "drain", place, name, shown)
        state, current = rule.parse_node(shown.stdout)
        decision = rule.drain_decision(state, current, kind, run)
        detail = _detail(name, place, state, current, decision, shown.stdout)
        detail["new_reason"] = reason
        message = f"{host.name}: {_why(decision, shown.stdout)}"
        if decision.action == "held":
            return ActionResult(host.name, "drain", REFUSED, message, detail=detail)
        if decision.action == "ours":
            return ActionResult(host.name, "drain", DONE, message + "; nothing sent", detail=detail)
        if decision.action == "drain":
            refused = self._capacity(host, place, name, [name])
            if refused is not None:
                return dataclasses.replace(refused, detail={**detail, **refused.detail})
        argv = drain_argv(name, reason, self.scontrol)
        verb = "drained" if decision.action == "drain" else "taken over (re-marked)"
        if dry_run:
            return ActionResult(
                host.name,
                "drain",
                DRY_RUN,
                f"{host.name}: would be {verb} with Reason {reason!r} ({decision.why})",
                detail={**detail, "command": argv},
            )
        done = self._run(place, argv)
        return self._updated(host, "drain", place, name, argv, done, detail, f"{verb} ({reason})")

    def drain_many(
        self, hosts: Sequence[Any], purpose: str | None, *, kind: str, run: str, dry_run: bool = False
    ) -> list[ActionResult]:
        """Drain several nodes through one capacity guard: every Slurm place is asked for its nodes
        once, and when the whole set would take more than the allowed share of a partition out,
        every node is refused and nothing is sent. Otherwise each node is drained in turn (each
        drain checks again, so a node taken out meanwhile by someone else still counts)."""
        _reason(kind, run, purpose)
        refused: dict[str, ActionResult] = {}
        problems: list[str] = []
        by_place: dict[str, tuple[Any, list[Any]]] = {}
        for host in hosts:
            if self._refused_before(host, "drain") is None:
                by_place.setdefault(self.place(host).where, (host, []))[1].append(host)
        for first, members in by_place.values():
            place, shown, listed = self.nodes(first)
            if not shown.ok:
                for host in members:
                    refused[host.name] = self._problem(host, "drain", place, slurm_name(host), shown)
                continue
            known = {n.name for n in listed}
            wanted = []
            for host in members:
                name = slurm_name(host)
                if name not in known:
                    refused[host.name] = self._unknown_node(host, "drain", place, name)
                else:
                    wanted.append(name)
            problems += rule.capacity_problems(listed, wanted, self.max_share)
        if problems:
            text = "; ".join(problems)
            return [
                ActionResult(
                    h.name,
                    "drain",
                    REFUSED,
                    f"{h.name}: not drained, the set would take too much out of service: {text}",
                    detail={"capacity": problems, "max_share": self.max_share},
                )
                for h in hosts
            ]
        return [
            refused.get(h.name) or self.drain(h, purpose, kind=kind, run=run, dry_run=dry_run) for h in hosts
        ]

    def plan_drains(self, hosts: Sequence[Any], purpose: str | None, *, kind: str, run: str) -> list[ActionResult]:
        """What draining ``hosts`` one at a time would do, sending nothing: each Slurm place is
        asked for its nodes once (``scontrol show nodes -o``). Each node gets its own decision
        (another owner's drain is held; one already this owner's needs nothing), then the
        capacity guard (``rule.capacity_problems``, the check ``drain`` and ``drain_many`` make)
        over the nodes allowed before it plus this one, in the order given: a node that would take
        a partition past the share is refused with the guard's words, and the ones before it stay
        allowed. Outcomes: DRY_RUN (would be drained), DONE (already this owner's: nothing to
        send), REFUSED (why in the message). ``drain`` decides again when each is sent, so a node
        someone took out meanwhile still counts. ``drain_many`` refuses a set as a whole instead:
        a front end that drains only the allowed part shows this plan first."""
        reason = _reason(kind, run, purpose)
        planned: dict[str, ActionResult] = {}
        by_place: dict[str, tuple[Any, list[Any]]] = {}
        for host in hosts:
            refused = self._refused_before(host, "drain")
            if refused is not None:
                planned[host.name] = refused
            else:
                by_place.setdefault(self.place(host).where, (host, []))[1].append(host)
        for first, members in by_place.values():
            place, shown, listed = self.nodes(first)
            by_name = {n.name: n for n in listed}
            allowed: list[str] = []
            for host in members:
                name = slurm_name(host)
                node = by_name.get(name)
                if not shown.ok:
                    planned[host.name] = self._problem(host, "drain", place, name, shown)
                    continue
                if node is None:
                    planned[host.name] = self._unknown_node(host, "drain", place, name)
                    continue
                decision = rule.drain_decision(node.state, node.reason, kind, run)
                detail = {
                    "slurm_name": name,
                    "where": place.where,
                    "state": node.state,
                    "reason": node.reason,
                    "decision": decision.action,
                    "why": decision.why,
                    "owner": owner_detail(decision.owner),
                    "new_reason": reason,
                }
                if decision.action == "held":
                    planned[host.name] = ActionResult(host.name, "drain", REFUSED, f"{host.name}: {decision.why}", detail=detail)
                    continue
                if decision.action == "ours":
                    planned[host.name] = ActionResult(
                        host.name, "drain", DONE, f"{host.name}: {decision.why}; nothing to send", detail=detail
                    )
                    continue
                problems = (
                    rule.capacity_problems(listed, [*allowed, name], self.max_share) if decision.action == "drain" else []
                )
                if problems:
                    planned[host.name] = ActionResult(
                        host.name,
                        "drain",
                        REFUSED,
                        f"{host.name}: not drained: {'; '.join(problems)}",
                        detail={**detail, "capacity": problems, "max_share": self.max_share},
                    )
                    continue
                if decision.action == "drain":
                    allowed.append(name)
                planned[host.name] = ActionResult(
                    host.name, "drain", DRY_RUN, f"{host.name}: would be drained with Reason {reason!r}", detail=detail
                )
        return [planned[h.name] for h in hosts]

    def resume(
        self, host: Any, *, kind: str, run: str, force: bool = False, dry_run: bool = False
    ) -> ActionResult:
        """Resume the node only when its drain is this owner's (an operator may ``force`` over
        another owner's); anyone else's drain is refused, named, with who set it and when."""
        _reason(kind, run, None)
        refused = self._refused_before(host, "resume")
        if refused is not None:
            return refused
        place, name, shown = self.show(host)
        if not shown.ok:
            return self._problem(host, "resume", place, name, shown)
        state, current = rule.parse_node(shown.stdout)
        decision = rule.resume_decision(state, current, kind, run, force)
        detail = _detail(name, place, state, current, decision, shown.stdout)
        if decision.action != "resume":
            return ActionResult(
                host.name, "resume", REFUSED, f"{host.name}: {_why(decision, shown.stdout)}", detail=detail
            )
        argv = resume_argv(name, self.scontrol)
        if dry_run:
            return ActionResult(
                host.name,
                "resume",
                DRY_RUN,
                f"{host.name}: would be resumed ({decision.why})",
                detail={**detail, "command": argv},
            )
        done = self._run(place, argv)
        return self._updated(host, "resume", place, name, argv, done, detail, f"resumed ({decision.why})")

    def _capacity(self, host: Any, place: Place, name: str, names: list[str]) -> ActionResult | None:
        """The capacity guard for draining ``names`` (Slurm names at ``place``): None when it may
        go ahead, else the refusal (or the failure to list the nodes)."""
        shown = self._run(place, show_all_argv(self.scontrol))
        if not shown.ok:
            return self._problem(host, "drain", place, name, shown)
        problems = rule.capacity_problems(rule.parse_nodes(shown.stdout), names, self.max_share)
        if not problems:
            return None
        return ActionResult(
            host.name,
            "drain",
            REFUSED,
            f"{host.name}: not drained: {'; '.join(problems)}",
            detail={"capacity": problems, "max_share": self.max_share},
        )

    def _updated(
        self,
        host: Any,
        action: str,
        place: Place,
        name: str,
        argv: list[str],
        result: Any,
        detail: dict[str, Any],
        what: str,
    ) -> ActionResult:
        detail = {**detail, "command": argv}
        if result.ok:
            return ActionResult(host.name, action, DONE, f"{host.name}: {what}", detail=detail)
        if result.error_kind in ("outcome-unknown", "timeout"):
            check = " ".join(show_argv(name, self.scontrol))
            return ActionResult(
                host.name,
                action,
                UNKNOWN,
                f"{host.name}: {action} sent on {place.where}, no answer ({result.error}); check with: {check}",
                check=check,
                detail=detail,
            )
        problem = self._problem(host, action, place, name, result)
        return dataclasses.replace(problem, detail={**problem.detail, **detail})


def _names_unknown_node(result: Any) -> bool:
    """scontrol's answer says Slurm knows no such node (``Node NAME not found``)."""
    text = f"{result.stderr or ''} {result.stdout or ''}".lower()
    return "not found" in text and "node" in text


def _reason(kind: str, run: str, purpose: str | None) -> str:
    """The Reason this owner writes; a kind or run that cannot be written is a usage error."""
    try:
        return rule.drain_reason(kind, run, purpose)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _detail(
    name: str, place: Place, state: str | None, reason: str | None, decision: rule.Decision, shown: str
) -> dict[str, Any]:
    who, when = rule.reason_stamp(shown)
    return {
        "slurm_name": name,
        "where": place.where,
        "state": state,
        "reason": reason,
        "reason_set_by": who,
        "reason_set_at": when,
        "decision": decision.action,
        "why": decision.why,
        "owner": owner_detail(decision.owner),
    }


def _why(decision: rule.Decision, shown: str) -> str:
    """The decision's why, the owner followed by who set the Reason and when, where Slurm says
    (``... an operator (run alice@ctl01): xid.79 [set by root at 2026-...]; left as it is``)."""
    who, when = rule.reason_stamp(shown)
    if decision.owner is None or not (who or when):
        return decision.why
    described = decision.owner.describe()
    stamp = f" [set by {who or '?'}" + (f" at {when}" if when else "") + "]"
    if described in decision.why:
        return decision.why.replace(described, described + stamp, 1)
    return decision.why + stamp
