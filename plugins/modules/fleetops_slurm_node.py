#!/usr/bin/python
"""Drain and resume a Slurm node through scontrol, resuming only drains fleetops made."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_slurm_node
short_description: Drain or resume a Slurm node, remembering who drained it
description:
  - C(state=drained) drains the node with C(scontrol update State=DRAIN) unless it is already drained. The Reason
    it sets starts with the marker C([fleetops]) (e.g. C([fleetops] fleetops driver rollout)); a marker file also
    records when and from which state.
  - C(state=resumed) resumes the node only when its current Reason still starts with C([fleetops]), a drain that
    fleetops made, from this module, the TUI or the controller. A node drained by someone else, before or after
    us, stays drained.
  - C(state=query) only reports the node's state.
  - Without scontrol on the host, or with an scontrol that has no cluster configuration, or a cluster that
    does not know the node, reports C(managed=false) and changes nothing, unless O(required) is set.
    A Slurm controller that does not answer is a failure.
options:
  name:
    description: Slurm node name.
    type: str
    required: true
  state:
    description: Desired drain state.
    type: str
    default: query
    choices: [drained, resumed, query]
  reason:
    description: Drain reason; set after the C([fleetops]) marker.
    type: str
    default: fleetops maintenance
  marker_dir:
    description: Folder of the marker files (one per node name).
    type: path
    default: /var/lib/fleetops/slurm_drain
  scontrol:
    description: scontrol command or path.
    type: str
    default: scontrol
  wait:
    description: After draining, wait until the node runs no more jobs (DRAINED).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for the node to become DRAINED.
    type: int
    default: 3600
  poll_interval:
    description: Seconds between polls while waiting.
    type: float
    default: 5
  required:
    description: Fail when scontrol is missing instead of reporting managed=false.
    type: bool
    default: false
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Drain for the driver upgrade
  fleetops.gpu.fleetops_slurm_node:
    name: "{{ inventory_hostname_short }}"
    state: drained
    reason: fleetops driver rollout
    wait: true
"""

RETURN = r"""
managed:
  description: False when the host has no scontrol.
  returned: always
  type: bool
slurm_state:
  description: The node's state as scontrol reported it before the change (e.g. IDLE+DRAIN).
  returned: when managed
  type: str
was_drained:
  description: The node was already drained before this task.
  returned: when managed
  type: bool
drained_by_us:
  description: The node carries a drain fleetops made (its Reason starts with the marker), after the task.
  returned: when managed
  type: bool
"""

import json
import os
import re
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

# The marker rule; fleetops/catalog/slurm.py holds the same (a unit test compares them).
MARKER = "[fleetops]"
DEFAULT_REASON = "fleetops maintenance"
DRAIN_FLAGS = ("DRAIN", "DRAINED", "DRAINING")
NO_CONFIG = ("Could not establish a configuration source", "fetch_config: DNS SRV lookup failed")
BUSY_STATES = ("ALLOCATED", "ALLOC", "MIXED", "COMPLETING")
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")  # "[root@2026-12-02T10:00:00]" appended by slurmctld


def parse_node(text):
    """State and Reason from ``scontrol show node NAME -o`` (one line of Key=Value pairs)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    state = None
    found = re.search(r"(?:^|\s)State=(\S+)", line)
    if found:
        state = found.group(1)
    reason = None
    found = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if found:
        reason = _STAMP.sub("", found.group(1)).strip()
        # later keys, if any, start with " Key=" in CamelCase
        later = re.search(r"\s[A-Z][A-Za-z]+=", reason)
        if later:
            reason = _STAMP.sub("", reason[: later.start()]).strip()
    return state, reason


def marked_reason(reason):
    """The Reason fleetops sets for a drain: the operator's words after the marker."""
    text = " ".join((reason or "").split()) or DEFAULT_REASON
    if is_ours(text):
        return text
    return "%s %s" % (MARKER, text)


def is_ours(reason):
    """The node's current Reason (stamp removed) is a drain fleetops set."""
    return (reason or "").strip().startswith(MARKER)


def is_drained(state):
    parts = re.split(r"[+*~#!%$@^-]", (state or "").upper())
    return any(p in DRAIN_FLAGS for p in parts)


def is_busy(state):
    parts = re.split(r"[+*~#!%$@^-]", (state or "").upper())
    return any(p in BUSY_STATES for p in parts)


class Node:
    def __init__(self, module):
        self.module = module
        self.name = module.params["name"]
        self.scontrol = module.params["scontrol"]

    def show(self):
        rc, out, err = self.module.run_command([self.scontrol, "show", "node", self.name, "-o"])
        text = "%s %s" % (out, err)
        if rc != 0 and not self.module.params["required"]:
            # scontrol without a cluster (no slurm.conf, no DNS SRV record), or a cluster that does
            # not know this node: Slurm does not manage it. A controller that does not answer is
            # not this case: that fails below, so no node is worked on undrained by accident.
            reason = None
            if any(m in text for m in NO_CONFIG):
                reason = "scontrol has no Slurm configuration on this host"
            elif "not found" in text and "Node" in text:
                reason = "Slurm does not know a node named %s" % self.name
            if reason:
                self.module.exit_json(
                    changed=False, managed=False, msg="%s: Slurm is not managed here" % reason
                )
        if rc != 0:
            self.module.fail_json(
                msg="scontrol show node %s failed: %s" % (self.name, (err or out).strip()), rc=rc
            )
        return parse_node(out)

    def update(self, *args):
        cmd = [self.scontrol, "update", "NodeName=%s" % self.name] + list(args)
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            self.module.fail_json(msg="%s failed: %s" % (" ".join(cmd), (err or out).strip()), rc=rc, cmd=cmd)


def _marker_path(module):
    return os.path.join(module.params["marker_dir"], module.params["name"] + ".json")


def _read_marker(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="query", choices=["drained", "resumed", "query"]),
            reason=dict(type="str", default="fleetops maintenance"),
            marker_dir=dict(type="path", default="/var/lib/fleetops/slurm_drain"),
            scontrol=dict(type="str", default="scontrol"),
            wait=dict(type="bool", default=False),
            wait_timeout=dict(type="int", default=3600),
            poll_interval=dict(type="float", default=5),
            required=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not (
        os.path.isabs(params["scontrol"]) and os.access(params["scontrol"], os.X_OK)
    ) and not shutil.which(params["scontrol"]):
        if params["required"]:
            module.fail_json(
                msg="scontrol not found on this host; cannot %s %s" % (params["state"], params["name"])
            )
        module.exit_json(
            changed=False, managed=False, msg="no scontrol on this host: Slurm is not managed here"
        )

    node = Node(module)
    state, reason = node.show()
    marker_path = _marker_path(module)
    marker = _read_marker(marker_path)
    result = dict(
        changed=False,
        managed=True,
        node=params["name"],
        slurm_state=state,
        slurm_reason=reason,
        was_drained=is_drained(state),
        drained_by_us=is_drained(state) and is_ours(reason),
    )

    if params["state"] == "drained":
        if is_drained(state):
            result["msg"] = "%s already drained (%s)%s" % (
                params["name"],
                reason,
                "" if is_ours(reason) else "; drained by someone else, it will stay drained",
            )
        else:
            result["changed"] = True
            result["drained_by_us"] = True
            if not module.check_mode:
                # Drain first: if the marker cannot be written the node stays drained (the safe side).
                node.update("State=DRAIN", "Reason=%s" % marked_reason(params["reason"]))
                os.makedirs(params["marker_dir"], exist_ok=True)
                tmp = marker_path + ".tmp"
                with open(tmp, "w") as fh:
                    json.dump(
                        {
                            "node": params["name"],
                            "reason": marked_reason(params["reason"]),
                            "since": time.time(),
                            "state_before": state,
                        },
                        fh,
                    )
                os.replace(tmp, marker_path)
            if module.check_mode:
                result["msg"] = "%s would be drained (is %s)" % (params["name"], state)
            else:
                result["msg"] = "%s drained (was %s)" % (params["name"], state)
        if params["wait"] and not module.check_mode:
            deadline = time.time() + params["wait_timeout"]
            current = state
            while True:
                current = node.show()[0]
                if not is_busy(current):
                    break
                if time.time() > deadline:
                    module.fail_json(
                        msg="%s still runs jobs after %ss (%s)"
                        % (params["name"], params["wait_timeout"], current),
                        **result,
                    )
                time.sleep(params["poll_interval"])
            result["slurm_state_after"] = current

    elif params["state"] == "resumed":
        if is_drained(state) and is_ours(reason):
            result["changed"] = True
            result["drained_by_us"] = False
            if not module.check_mode:
                node.update("State=RESUME")
                if marker is not None:
                    os.unlink(marker_path)
            result["msg"] = "%s %s (fleetops drained it: %s)" % (
                params["name"],
                "would be resumed" if module.check_mode else "resumed",
                reason,
            )
        else:
            # Never drained, drained by someone else, or our drain replaced by another reason
            # (or already resumed by hand): touch nothing, forget any drain we recorded.
            result["drained_by_us"] = False
            if marker is not None and not module.check_mode:
                os.unlink(marker_path)
            if not is_drained(state):
                result["msg"] = "%s is not drained" % params["name"]
            elif marker is not None:
                result["msg"] = "%s now drained for another reason (%s); left drained" % (params["name"], reason)
            else:
                result["msg"] = "%s was not drained by fleetops; left as it is (%s: %s)" % (
                    params["name"],
                    state,
                    reason,
                )
    else:
        result["msg"] = "%s is %s%s" % (params["name"], state, " (%s)" % reason if reason else "")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
