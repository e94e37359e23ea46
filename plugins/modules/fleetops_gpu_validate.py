#!/usr/bin/python
"""Validate a node's GPUs through ``fleetops-agent validate --judge``: the rollout's gate."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_validate
short_description: Measure a node's GPUs and judge them against their model's floors
description:
  - Runs C(fleetops-agent validate --level LEVEL --judge) on the node. The agent measures every GPU (HBM
    bandwidth, GEMM, host copies) and judges each one against the floors of its model alone; mid-rollout
    there is no fleet median to compare with.
  - Fails when a GPU is below a floor or a figure never reached steady state, naming each such GPU.
  - Never changes a GPU setting; in check mode it only reports that it would validate.
  - With O(probe=true) it measures nothing. It asks C(fleetops-agent validate --probe) which validation backend
    the node has and fails, naming what to install, when none works. The rollout asks this before it drains a
    node. The probe reads only, so it runs in check mode too.
options:
  level:
    description: Validation level (quick takes about a minute per node).
    type: str
    default: quick
    choices: [quick, full]
  floors:
    description:
      - Floor overrides, the baseline's C(validation.floors) (GPU model name to metric to floor).
    type: dict
    default: {}
  validation_backend:
    description:
      - What measures. V(auto) takes the first that works on the node (PyTorch with a CUDA device, then CuPy,
        then DCGM; the simulator on a simulated node); the others insist on one.
      - The fleetops_agent role's C(fleetops_agent_validate_backend) is what gives the node one.
    type: str
    default: auto
    choices: [auto, torch, cupy, dcgm]
  probe:
    description: Only check that the node has the validation backend; measure nothing.
    type: bool
    default: false
extends_documentation_fragment:
  - fleetops.gpu.agent
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Pass the validation gate before resuming the node
  fleetops.gpu.fleetops_gpu_validate:
    level: quick
    floors: "{{ fleetops_baseline.validation.floors | default({}) }}"

- name: Refuse a node that could not be validated, before draining it
  fleetops.gpu.fleetops_gpu_validate:
    probe: true
"""

RETURN = r"""
gate:
  description: The agent's verdict (status ok/crit/unknown, passed, failed lines, per-GPU findings).
  returned: when not in check mode
  type: dict
provenance:
  description: Backend, versions and driver the figures were measured with.
  returned: when not in check mode
  type: dict
failed_gpus:
  description: One line per GPU that did not pass, naming it (index, UUID, bus id) and its failing figures.
  returned: always
  type: list
  elements: str
probe:
  description: The agent's probe (each backend usable or why not, the one validate would run, what to install).
  returned: with probe
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.agent import (
    AGENT_ARGUMENT_SPEC,
    agent_command,
    backend_args,
    error_line,
)


def probe(module, backend):
    """``validate --probe``: exits the module, ok with the backend validate would run, or failed
    naming what to install."""
    cmd = agent_command(module) + ["validate", "--probe"] + backend
    rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("kind") != "validate-probe":
        error = error_line(err)
        msg = str(error["error"]) if error else "exit %d: %s" % (rc, (err or out).strip()[-2000:])
        module.fail_json(msg="the validation probe could not run: %s" % msg, rc=rc, stderr=err, cmd=cmd,
                         failed_gpus=[])
    if rc != 0 or not doc.get("picked"):
        module.fail_json(
            msg="no validation backend on this node (%s): %s" % (doc.get("error"), doc.get("install")),
            kind="backend", probe=doc, failed_gpus=[],
        )
    module.exit_json(changed=False, probe=doc, failed_gpus=[],
                     msg="validation backend %s (%s)" % (doc["picked"], doc.get("python")))


def main():
    spec = dict(
        level=dict(type="str", default="quick", choices=["quick", "full"]),
        floors=dict(type="dict", default={}),
        validation_backend=dict(type="str", default="auto", choices=["auto", "torch", "cupy", "dcgm"]),
        probe=dict(type="bool", default=False),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    level = module.params["level"]
    chosen = module.params["validation_backend"]
    backend = backend_args(module) if chosen == "auto" else ["--backend", chosen]
    if module.params["probe"]:
        probe(module, backend)
    if module.check_mode:
        module.exit_json(changed=False, failed_gpus=[], msg="would validate (%s) and judge against the floors" % level)
    argv = ["validate", "--level", level, "--judge"] + backend
    if module.params["floors"]:
        argv += ["--floors", json.dumps(module.params["floors"])]
    # A gate that fails exits 1 with its verdict on stdout; run_agent would keep only the exit.
    cmd = agent_command(module) + argv
    rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("gate"), dict):
        error = error_line(err)
        if error:
            msg, kind = str(error["error"]), str(error.get("kind", "agent"))
        else:
            msg, kind = "exit %d: %s" % (rc, (err or out).strip()[-2000:]), "agent"
        module.fail_json(msg="validation could not run: %s" % msg, kind=kind, rc=rc, stderr=err, cmd=cmd,
                         failed_gpus=[])
    gate = doc["gate"]
    result = dict(changed=False, gate=gate, provenance=doc.get("provenance"), failed_gpus=list(gate.get("failed") or []))
    if rc != 0 or not gate.get("passed"):
        module.fail_json(
            msg="validation %s (%s, floors only): %s" % (gate.get("status"), level, "; ".join(result["failed_gpus"])),
            **result
        )
    result["msg"] = "%d GPU(s) passed the %s validation" % (len(gate.get("gpus") or []), level)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
