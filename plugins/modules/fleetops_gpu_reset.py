#!/usr/bin/python
"""Reset one GPU safely through ``fleetops-agent reset``."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_reset
short_description: Reset one GPU through fleetops-agent, every precondition checked first
description:
  - Runs C(fleetops-agent reset --gpu GPU --json) on the node. The agent checks and reports each
    precondition (the GPU exists and its UUID matches its bus id, the node's maintenance lock, no
    compute processes, no MIG instance in use, no NVLink peer set, Fabric Manager on NVSwitch
    systems, the GPU clients it stops and restarts), resets the GPU, and verifies it came back healthy.
  - A refusal fails the task with the agent's remedy (reboot the node, drain and inspect, reset the
    peer set, ...).
  - In check mode the agent runs with C(--dry-run); it evaluates every precondition and changes nothing.
options:
  gpu:
    description: The GPU's UUID or PCI bus id. Never an index (indices change when a GPU falls off the bus).
    type: str
    required: true
  bus_id:
    description: The bus id the GPU named by UUID is expected at; the reset is refused when it is elsewhere.
    type: str
  kill_processes:
    description:
      - End the GPU's compute processes first (SIGTERM, then SIGKILL after I(grace)).
      - Only the processes listed in I(expect_pids) are ended, and only when the GPU runs exactly
        those; the reset is refused, naming them, when a process is missing or another one runs.
    type: bool
    default: false
  expect_pids:
    description:
      - The compute processes (PIDs) the operator confirmed may be ended; required with I(kill_processes).
      - An empty list confirms that no process runs on the GPU.
    type: list
    elements: int
  grace:
    description: Seconds between SIGTERM and SIGKILL (the agent's C(--grace)).
    type: int
    default: 10
  clients:
    description: Systemd units stopped before and restarted after the reset; the agent's default when unset.
    type: list
    elements: str
  timeout:
    description: Seconds the agent may take (unused by the agent; kept for the shared options).
    type: int
    default: 120
extends_documentation_fragment:
  - fleetops.gpu.agent
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Reset the GPU that logged XID 48, ending the two processes the operator confirmed
  fleetops.gpu.fleetops_gpu_reset:
    gpu: GPU-589545c7-6f94-1a58-7729-1bca2ce1a718
    kill_processes: true
    expect_pids: [48213, 48214]
"""

RETURN = r"""
result:
  description: The agent's verdict, C(reset), C(would-reset) (check mode), C(refused), C(failed), C(interrupted) or C(error).
  returned: always
  type: str
preconditions:
  description: Each precondition the agent evaluated (name, status ok/failed/skipped, detail, remedy).
  returned: always
  type: list
  elements: dict
actions:
  description: What the agent did (ended processes, stopped and started services, the reset).
  returned: always
  type: list
  elements: dict
verified:
  description: Whether the GPU came back with the same UUID and no critical finding.
  returned: always
  type: bool
remedy:
  description: What to do instead, when the reset was refused or failed.
  returned: always
  type: str
expect_pids:
  description: The processes the operator confirmed (null without I(kill_processes)).
  returned: always
  type: list
  elements: int
budget_s:
  description: The agent's worst case for the whole reset, in seconds (its lock's first deadline).
  returned: always
  type: float
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.agent import (
    AGENT_ARGUMENT_SPEC,
    agent_command,
    backend_args,
    error_line,
)


def main():
    spec = dict(
        gpu=dict(type="str", required=True),
        bus_id=dict(type="str"),
        kill_processes=dict(type="bool", default=False),
        expect_pids=dict(type="list", elements="int"),
        grace=dict(type="int", default=10),
        clients=dict(type="list", elements="str"),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(
        argument_spec=spec,
        supports_check_mode=True,
        required_if=[("kill_processes", True, ("expect_pids",))],
        required_by={"expect_pids": ("kill_processes",)},
    )
    p = module.params
    if p["expect_pids"] is not None and not p["kill_processes"]:
        module.fail_json(msg="expect_pids names the processes kill_processes may end: set kill_processes too",
                         kind="usage")
    argv = ["reset", "--gpu", p["gpu"], "--json", "--grace", str(p["grace"])] + backend_args(module)
    if p["bus_id"]:
        argv += ["--bus-id", p["bus_id"]]
    if p["kill_processes"]:
        # only the processes the operator confirmed: the agent refuses when the GPU runs others
        argv += ["--kill-processes", "--expect-pids", ",".join(str(pid) for pid in p["expect_pids"])]
    if p["clients"] is not None:
        argv += ["--clients", ",".join(p["clients"])]
    if module.check_mode:
        argv.append("--dry-run")
    cmd = agent_command(module) + argv
    rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        error = error_line(err) or {}
        module.fail_json(
            msg=error.get("error") or "fleetops-agent reset failed (exit %d): %s" % (rc, (err or out).strip()[-2000:]),
            kind=error.get("kind", "agent"),
            rc=rc,
            cmd=cmd,
        )
    result = dict(
        changed=doc.get("result") == "reset" or any(a.get("ok") for a in doc.get("actions") or []),
        result=doc.get("result"),
        gpu=doc.get("gpu"),
        preconditions=doc.get("preconditions") or [],
        actions=doc.get("actions") or [],
        verified=bool(doc.get("verified")),
        verification=doc.get("verification"),
        remedy=doc.get("remedy"),
        expect_pids=doc.get("expect_pids"),
        budget_s=doc.get("budget_s"),
        msg=doc.get("message") or doc.get("result"),
    )
    if module._diff:
        gpu = doc.get("gpu") or {}
        name = "%s (%s)" % (gpu.get("uuid"), gpu.get("bus_id"))
        result["diff"] = dict(
            before="%s: not reset\n" % name,
            after="%s: %s\n" % (name, "reset" if doc.get("result") in ("reset", "would-reset") else "not reset"),
        )
    if rc != 0:
        module.fail_json(rc=rc, **result)
    if module.check_mode:
        result["changed"] = True  # it would reset the GPU
    module.exit_json(**result)


if __name__ == "__main__":
    main()
