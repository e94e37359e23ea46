"""Drain and resume GPU nodes where Slurm is controlled, never on the node itself.

``scontrol`` runs on the controller (the machine running fleetops, the default) or, over SSH, on
the Slurm host the inventory names in ``fleetops_slurm_host`` (an inventory host name, or an
address reached with the node's own SSH user and key). Nothing runs on the GPU node, so a node
whose agent hangs or whose sshd is gone can still be drained: that is when a drain matters most.

Slurm's name for the node is ``fleetops_slurm_node_name``, or the inventory name up to its first
dot. The argv is passed as a list (no shell on the controller; ``shlex.join`` over SSH).

Resume lifts only drains fleetops made: it reads the node's State and Reason first and resumes
only when the Reason carries fleetops' marker (``fleetops.catalog.slurm``, the rule the Ansible
module follows too). Anyone else's drain is left alone and reported as refused, with who set it
and when where Slurm says.

Every call gives one ``ActionResult`` (action ``drain`` or ``resume``): done, refused (nothing
was changed: no scontrol, an unknown node, someone else's drain), failed (scontrol said no), or
unknown (the update was sent over SSH and no answer came: ``check`` is the command to look).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetops.catalog import slurm as rule
from fleetops.ops.results import DONE, FAILED, REFUSED, UNKNOWN, ActionResult

SLURM_HOST_VAR = "fleetops_slurm_host"
SLURM_NAME_VAR = "fleetops_slurm_node_name"
SCONTROL = "scontrol"
# scontrol answers from slurmctld's memory; a controller that needs longer is not answering.
SCONTROL_TIMEOUT_S = 30.0
# where Slurm's tools look for their configuration when SLURM_CONF is not set
DEFAULT_CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf")
_NOT_FOUND_STATUS = 127

Runner = Callable[[Any, Sequence[str]], Any]  # (SSH host or None for local, argv) -> transport.Result


def slurm_name(host: Any) -> str:
    """Slurm's name for the node: the inventory variable, else the short inventory name."""
    value = (getattr(host, "vars", None) or {}).get(SLURM_NAME_VAR)
    if value is not None and str(value).strip():
        return str(value).strip()
    return str(host.name).split(".", 1)[0]


def show_argv(name: str, scontrol: str = SCONTROL) -> list[str]:
    return [scontrol, "show", "node", "-o", name]


def drain_argv(name: str, reason: str | None, scontrol: str = SCONTROL) -> list[str]:
    """The drain, its Reason marked as fleetops' own (so resume can tell it from others')."""
    return [scontrol, "update", f"NodeName={name}", "State=DRAIN", f"Reason={rule.marked_reason(reason)}"]


def resume_argv(name: str, scontrol: str = SCONTROL) -> list[str]:
    return [scontrol, "update", f"NodeName={name}", "State=RESUME"]


@dataclass(frozen=True)
class Place:
    """Where scontrol runs for one node: ``host`` None is the controller itself."""

    host: Any | None
    where: str  # for messages: "the controller" or "Slurm host NAME"


class SlurmControl:
    """Drain and resume for the nodes of one inventory; holds how to reach a Slurm host."""

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
    ) -> None:
        if isinstance(inventory_hosts, Mapping):
            self.inventory = dict(inventory_hosts)
        else:
            self.inventory = {h.name: h for h in inventory_hosts}
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.known_hosts = known_hosts
        self.accept_new_hostkeys = accept_new_hostkeys
        self.scontrol = scontrol
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
        """Why scontrol cannot run for this node, known without asking anyone (no network):
        the controller has no scontrol, or no Slurm configuration to point it at a cluster."""
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
        if "not found" in text.lower() and "node" in text.lower():
            return ActionResult(
                host.name,
                action,
                REFUSED,
                f"{host.name}: Slurm (asked from {place.where}) knows no node named {name!r}: set "
                f"{SLURM_NAME_VAR} for {host.name} in the inventory to its Slurm name",
                detail=detail,
            )
        why = result.error or result.error_kind or "failed"
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        if last and last not in why:
            why = f"{why}: {last}"
        return ActionResult(
            host.name, action, FAILED, f"{host.name}: scontrol on {place.where} failed: {why}", detail=detail
        )

    def show(self, host: Any) -> tuple[Place, str, Any]:
        """(where, Slurm name, the ``scontrol show node`` result)."""
        place, name = self.place(host), slurm_name(host)
        return place, name, self._run(place, show_argv(name, self.scontrol))

    # --- actions ----------------------------------------------------------------------

    def drain(self, host: Any, reason: str | None) -> ActionResult:
        """Drain the node with fleetops' marked Reason; a node someone else drained keeps
        their drain and reason (refused, named), one fleetops drained stays as it is (done)."""
        place, name, shown = self.show(host)
        if not shown.ok:
            return self._problem(host, "drain", place, name, shown)
        state, current = rule.parse_node(shown.stdout)
        detail: dict[str, Any] = {"slurm_name": name, "where": place.where, "state": state, "reason": current}
        if rule.is_drained(state):
            if rule.is_ours(current):
                return ActionResult(
                    host.name,
                    "drain",
                    DONE,
                    f"{host.name}: already drained by fleetops ({current})",
                    detail=detail,
                )
            return ActionResult(
                host.name,
                "drain",
                REFUSED,
                f"{host.name}: already drained by someone else ({_by(current, shown.stdout)}); "
                "left as it is, fleetops' reason not set",
                detail=detail,
            )
        argv = drain_argv(name, reason, self.scontrol)
        done = self._run(place, argv)
        return self._updated(host, "drain", place, name, argv, done, detail, f"drained ({argv[-1][7:]})")

    def resume(self, host: Any) -> ActionResult:
        """Resume the node only when its current drain is one fleetops made."""
        place, name, shown = self.show(host)
        if not shown.ok:
            return self._problem(host, "resume", place, name, shown)
        state, current = rule.parse_node(shown.stdout)
        detail: dict[str, Any] = {"slurm_name": name, "where": place.where, "state": state, "reason": current}
        if not rule.is_drained(state):
            return ActionResult(
                host.name,
                "resume",
                REFUSED,
                f"{host.name}: not drained (Slurm state {state}): nothing to resume",
                detail=detail,
            )
        if not rule.is_ours(current):
            return ActionResult(
                host.name,
                "resume",
                REFUSED,
                f"{host.name}: drained by someone else ({_by(current, shown.stdout)}), not by fleetops: "
                f"left drained; resume it with scontrol if that drain is over",
                detail=detail,
            )
        argv = resume_argv(name, self.scontrol)
        done = self._run(place, argv)
        return self._updated(
            host, "resume", place, name, argv, done, detail, f"resumed (fleetops drained it: {current})"
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


def _by(reason: str | None, shown: str) -> str:
    """The reason, with who set it and when where Slurm says."""
    who, when = rule.reason_stamp(shown)
    text = f"reason {reason!r}" if reason else "no reason given"
    if who or when:
        text += f", set by {who or '?'}" + (f" at {when}" if when else "")
    return text
