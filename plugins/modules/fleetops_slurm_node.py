#!/usr/bin/python
"""Drain, resume, query a Slurm node and check a batch against the partition's capacity, through
scontrol, with the owner of every drain written in its Reason (module_utils/slurm_rule.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_slurm_node
short_description: Drain or resume a Slurm node under a named owner and run
description:
  - >-
    Every drain names its owner in Slurm's Reason, C([fleetops] KIND/RUN: PURPOSE) (e.g.
    C([fleetops] rollout/20261206T071502Z-3f9a: driver rollout 580.163.01)). Whose drain it is, and
    who may lift it, is read from that Reason by the collection's slurm_rule (the same file as
    fleetops/catalog/slurm.py), never from a file on some host.
  - >-
    C(state=drained) drains a node that is not drained. A node already drained by this owner and
    run is left as it is; one drained by an earlier run of the same planned kind (a rollout rerun
    after a failure) is taken over (its Reason re-marked with this run); one drained by anyone else
    (the health program, an operator, another kind of run, someone outside fleetops) is C(held)
    and left as it is, Reason unchanged.
  - >-
    C(state=resumed) resumes the node only when its drain is this owner's (this run's; the health
    program and operators own theirs by kind). Any other drain stays, and the result says whose.
  - >-
    C(state=capacity) reads every node (C(scontrol show nodes -o)) and waits until draining
    O(names) would keep each of their partitions within O(max_share) out of service (counting every
    node out, whoever took it out); fails with the partitions and counts at O(wait_timeout).
  - >-
    C(state=query) reports the node's state, Reason and drain owner.
  - >-
    A node Slurm does not know, a host without a Slurm configuration, no scontrol, or a controller
    that does not answer is a failure naming the node. Only O(managed=false) skips Slurm.
options:
  name:
    description: Slurm node name (required except for O(state=capacity)).
    type: str
  host:
    description: The inventory host the node stands for; named in messages.
    type: str
  state:
    description: Desired drain state, or C(capacity) for the batch check, or C(query).
    type: str
    default: query
    choices: [drained, resumed, capacity, query]
  owner:
    description: The owner kind of this run's drains (required for C(drained) and C(resumed)).
    type: str
    choices: [rollout, mig, firmware, power, reset, health, operator]
  run:
    description: This run's id, written into the Reason (required for C(drained) and C(resumed)).
    type: str
  reason:
    description: "The drain's purpose, written after C([fleetops] KIND/RUN:)."
    type: str
    default: ""
  managed:
    description: False for a host Slurm does not manage (host variable fleetops_slurm_managed); nothing is done.
    type: bool
    default: true
  names:
    description: Slurm node names the batch will drain (O(state=capacity)).
    type: list
    elements: str
    default: []
  max_share:
    description: Largest fraction of a partition's nodes out of service at once (O(state=capacity)).
    type: float
    default: 0.1
  marker_dir:
    description: Unused; kept so that older role variables still pass. The Reason is the record.
    type: path
  scontrol:
    description: scontrol command or path.
    type: str
    default: scontrol
  wait:
    description: After draining, wait until the node runs no more jobs (DRAINED).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for DRAINED, or for capacity.
    type: int
    default: 3600
  poll_interval:
    description: Seconds between polls while waiting.
    type: float
    default: 5
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Drain for the driver upgrade
  fleetops.gpu.fleetops_slurm_node:
    name: "{{ inventory_hostname_short }}"
    host: "{{ inventory_hostname }}"
    state: drained
    owner: rollout
    run: "{{ fleetops_run_id }}"
    reason: driver rollout 580.163.01
    wait: true

- name: Check the batch against the partitions' capacity
  fleetops.gpu.fleetops_slurm_node:
    state: capacity
    names: [node101, node102]
    max_share: 0.1
  run_once: true
"""

RETURN = r"""
managed:
  description: False only when O(managed=false) skipped Slurm.
  returned: always
  type: bool
owner:
  description: The drain's owner before the task (kind, run, purpose, describe); null when the node was not drained.
  returned: always
  type: dict
action:
  description: The decision (drain, ours, adopt, held; resume, leave, not_drained; query; capacity).
  returned: when managed
  type: str
held:
  description: The node is drained by another owner and was left as it is.
  returned: when managed
  type: bool
held_by:
  description: Who holds the node, in words.
  returned: when held
  type: str
adopted_from:
  description: The earlier run whose drain this run took over, in words.
  returned: when the drain was adopted
  type: str
slurm_state:
  description: The node's state as scontrol reported it before the change (e.g. IDLE+DRAIN).
  returned: when managed and name is set
  type: str
slurm_reason:
  description: The node's Reason before the change, without slurmctld's stamp.
  returned: when managed and name is set
  type: str
fault:
  description: The node's drain is a fault drain (only an operator, or the health program for its own, lifts it).
  returned: for query
  type: bool
problems:
  description: The capacity problems left (empty when the batch may drain).
  returned: for capacity
  type: list
counts:
  description: Per partition of the batch, nodes in it and nodes out of service.
  returned: for capacity
  type: dict
"""

import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.slurm_rule import (
    OWNER_KINDS,
    capacity_problems,
    check_owner,
    drain_decision,
    drain_reason,
    is_busy,
    is_drained,
    is_out,
    owner_of,
    parse_node,
    parse_nodes,
    resume_decision,
)

__all__ = ["is_busy", "is_drained", "main", "parse_node"]


def owner_dict(reason, state):
    """The owner of the node's drain as a plain dict (None when not drained)."""
    if not is_drained(state):
        return None
    owner = owner_of(reason)
    return dict(
        kind=owner.kind,
        run=owner.run,
        purpose=owner.purpose,
        legacy=owner.legacy,
        fault=owner.fault,
        describe=owner.describe(),
    )


class Slurm:
    def __init__(self, module):
        self.module = module
        self.scontrol = module.params["scontrol"]
        self.name = module.params["name"]
        host = module.params["host"]
        self.who = (
            "%s (Slurm node name %s)" % (host, self.name) if host and host != self.name else str(self.name)
        )

    def _run(self, args, what):
        cmd = [self.scontrol] + args
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            text = " ".join((err or out or "no output").split())
            self.module.fail_json(
                msg="%s: %s failed (rc %s): %s" % (what, " ".join(cmd), rc, text), rc=rc, cmd=cmd, owner=None
            )
        return out

    def show(self):
        cmd = [self.scontrol, "show", "node", "-o", self.name]
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            text = " ".join(("%s %s" % (out, err)).split()) or "no output"
            if "not found" in text and "Node" in text:
                msg = (
                    "%s: Slurm does not know a node named %s (%s: %s). Set the host's fleetops_slurm_node_name "
                    "to its Slurm name, or fleetops_slurm_managed: false for a host Slurm does not manage"
                    % (self.who, self.name, " ".join(cmd), text)
                )
            else:
                msg = "%s: cannot read Slurm node %s (%s, rc %s): %s" % (
                    self.who,
                    self.name,
                    " ".join(cmd),
                    rc,
                    text,
                )
            self.module.fail_json(msg=msg, rc=rc, cmd=cmd, node=self.name, owner=None)
        state, reason = parse_node(out)
        if state is None:
            self.module.fail_json(
                msg="%s: %s gave no State: %r" % (self.who, " ".join(cmd), out.strip()[:300]),
                node=self.name,
                owner=None,
            )
        return state, reason

    def update(self, *args):
        self._run(["update", "NodeName=%s" % self.name] + list(args), self.who)

    def nodes(self):
        return parse_nodes(self._run(["show", "nodes", "-o"], "reading every Slurm node"))


def _find_scontrol(module):
    scontrol = module.params["scontrol"]
    if (os.path.isabs(scontrol) and os.access(scontrol, os.X_OK)) or shutil.which(scontrol):
        return
    where = module.params["host"] or module.params["name"] or "this host"
    module.fail_json(
        msg="scontrol not found (tried %r on the host that runs it, for %s); install the Slurm client there, "
        "point slurm_drain_scontrol at it, or set fleetops_slurm_managed: false for a host Slurm does not manage"
        % (scontrol, where),
        owner=None,
    )


def _wait_drained(module, node, result):
    deadline = time.time() + module.params["wait_timeout"]
    while True:
        current = node.show()[0]
        if not is_busy(current):
            return current
        if time.time() > deadline:
            module.fail_json(
                msg="%s still runs jobs after %ss (%s)" % (node.who, module.params["wait_timeout"], current),
                **result,
            )
        time.sleep(module.params["poll_interval"])


def drained(module, node, state, reason, result):
    p = module.params
    decision = drain_decision(state, reason, p["owner"], p["run"])
    new_reason = drain_reason(p["owner"], p["run"], p["reason"])
    result.update(action=decision.action, held=False, why=decision.why)
    verb = "would be" if module.check_mode else "was"
    if decision.action == "drain":
        result["changed"] = True
        if not module.check_mode:
            node.update("State=DRAIN", "Reason=%s" % new_reason)
        result["msg"] = (
            "%s would be drained (is %s)" % (node.name, state)
            if module.check_mode
            else "%s drained (was %s): %s" % (node.name, state, new_reason)
        )
    elif decision.action == "adopt":
        result["changed"] = True
        result["adopted_from"] = decision.owner.describe()
        if not module.check_mode:
            node.update("State=DRAIN", "Reason=%s" % new_reason)
        result["msg"] = "%s %s taken over from %s" % (node.name, verb, decision.owner.describe())
    elif decision.action == "ours":
        result["msg"] = "%s already drained by this run (%s)" % (node.name, reason)
    else:  # held
        result.update(held=True, held_by=decision.owner.describe())
        result["msg"] = "held: %s drained by %s; left drained, Reason unchanged" % (
            node.who,
            decision.owner.describe(),
        )
    if p["wait"] and not module.check_mode and decision.action in ("drain", "adopt"):
        result["slurm_state_after"] = _wait_drained(module, node, result)


def resumed(module, node, state, reason, result):
    p = module.params
    decision = resume_decision(state, reason, p["owner"], p["run"], force=False)
    result.update(action=decision.action, held=False, why=decision.why)
    if decision.action == "resume":
        result["changed"] = True
        if not module.check_mode:
            node.update("State=RESUME")
        result["msg"] = "%s %s (%s)" % (
            node.name,
            "would be resumed" if module.check_mode else "resumed",
            decision.why,
        )
    elif decision.action == "leave":
        result.update(held=True, held_by=decision.owner.describe())
        result["msg"] = "held: %s %s" % (node.who, decision.why)
    else:
        result["msg"] = "%s is not drained (%s): nothing to resume" % (node.name, state)


def capacity(module, node, result):
    p = module.params
    share = p["max_share"]
    if not 0 < share <= 1:
        module.fail_json(msg="max_share %r: a fraction above 0 and at most 1" % share, **result)
    names = sorted(set(p["names"]))
    deadline = time.time() + p["wait_timeout"]
    waited = 0.0
    while True:
        nodes = node.nodes()
        known = {n.name for n in nodes}
        unknown = [n for n in names if n not in known]
        if unknown:
            module.fail_json(
                msg="Slurm does not know %s (scontrol show nodes -o): set fleetops_slurm_node_name, or "
                "fleetops_slurm_managed: false for a host Slurm does not manage" % ", ".join(unknown),
                **result,
            )
        problems = capacity_problems(nodes, names, share)
        parts = sorted({part for n in nodes if n.name in names for part in n.partitions})
        result["counts"] = {
            part: dict(
                nodes=len([n for n in nodes if part in n.partitions]),
                out=len([n for n in nodes if part in n.partitions and is_out(n.state)]),
            )
            for part in parts
        }
        result.update(problems=problems, waited_s=round(waited, 1), action="capacity")
        if not problems:
            result["msg"] = "capacity: %s may drain (%s)" % (
                ", ".join(names) or "no node",
                "; ".join("%s %d of %d out" % (k, v["out"], v["nodes"]) for k, v in result["counts"].items())
                or "no partition",
            )
            return
        if time.time() >= deadline:
            module.fail_json(
                msg="capacity: waited %ss; %s" % (p["wait_timeout"], "; ".join(problems)), **result
            )
        time.sleep(p["poll_interval"])
        waited += p["poll_interval"]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str"),
            host=dict(type="str"),
            state=dict(type="str", default="query", choices=["drained", "resumed", "capacity", "query"]),
            owner=dict(type="str", choices=list(OWNER_KINDS)),
            run=dict(type="str"),
            reason=dict(type="str", default=""),
            managed=dict(type="bool", default=True),
            names=dict(type="list", elements="str", default=[]),
            max_share=dict(type="float", default=0.1),
            marker_dir=dict(type="path"),
            scontrol=dict(type="str", default="scontrol"),
            wait=dict(type="bool", default=False),
            wait_timeout=dict(type="int", default=3600),
            poll_interval=dict(type="float", default=5),
        ),
        required_if=[
            ("state", "drained", ("name", "owner", "run")),
            ("state", "resumed", ("name", "owner", "run")),
            ("state", "query", ("name",)),
        ],
        supports_check_mode=True,
    )
    p = module.params
    who = p["host"] or p["name"] or ", ".join(p["names"]) or "this batch"
    if not p["managed"]:
        module.exit_json(
            changed=False,
            managed=False,
            owner=None,
            msg="%s: fleetops_slurm_managed is false: Slurm is not asked and nothing is drained or resumed"
            % who,
        )
    if p["state"] in ("drained", "resumed"):
        try:
            check_owner(p["owner"], p["run"])
        except ValueError as exc:
            module.fail_json(msg="%s: %s" % (who, exc), owner=None)
    _find_scontrol(module)
    node = Slurm(module)
    result = dict(changed=False, managed=True, owner=None)
    if p["state"] == "capacity":
        capacity(module, node, result)
        module.exit_json(**result)

    state, reason = node.show()
    result.update(node=p["name"], slurm_state=state, slurm_reason=reason, owner=owner_dict(reason, state))
    if p["state"] == "drained":
        drained(module, node, state, reason, result)
    elif p["state"] == "resumed":
        resumed(module, node, state, reason, result)
    else:
        owner = result["owner"]
        result.update(action="query", fault=bool(owner and owner["fault"]))
        result["msg"] = "%s is %s%s" % (
            p["name"],
            state,
            " (%s)" % owner["describe"] if owner else (" (%s)" % reason if reason else ""),
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
