#!/usr/bin/python
"""Validate a node's GPUs through ``fleetops-agent validate --judge``: the rollout's gate."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_validate
short_description: Measure a node's GPUs and judge them against their model's floors
description:
  - Runs C(fleetops-agent validate --level LEVEL --judge) on the node. The agent measures every GPU (HBM
    bandwidth, GEMM, host copies) and judges each one against the floors of its model alone: mid-rollout
    there is no fleet median to compare with.
  - Fails when a GPU is below a floor or a figure never reached steady state, naming each such GPU.
  - Never changes a GPU setting; in check mode it only reports that it would validate.
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
  agent:
    description: Path of fleetops-agent; searched for when unset.
    type: path
  sim_state:
    description: Simulator state file of a simulated node.
    type: path
    aliases: [state_file]
  backend:
    description: Agent backend.
    type: str
    default: auto
    choices: [auto, nvml, sim]
  timeout:
    description: Seconds the agent may take.
    type: int
    default: 120
author: fleetops
"""

EXAMPLES = r"""
- name: Pass the validation gate before resuming the node
  fleetops_gpu_validate:
    level: quick
    floors: "{{ fleetops_baseline.validation.floors | default({}) }}"
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
"""

import importlib.util
import json
import os
import sys

from ansible.module_utils.basic import AnsibleModule

# --- agent helper: identical in fleetops_gpu_facts.py, _set.py, _reset.py and _validate.py (a test checks) ---
# Self-contained on purpose: ansible-lint and the unit tests import modules in-process, where a
# playbook-adjacent module_utils folder is not importable.

AGENT_ARGUMENT_SPEC = dict(
    agent=dict(type="path"),
    sim_state=dict(type="path", aliases=["state_file"]),
    backend=dict(type="str", default="auto", choices=["auto", "nvml", "sim"]),
    timeout=dict(type="int", default=120),
)

# Where the fleetops_agent role links or installs the agent, then this interpreter's own bin.
AGENT_DIRS = ("/usr/local/bin", "/opt/fleetops/venv/bin", "/opt/fleetops/bin")


class AgentError(Exception):
    def __init__(self, message, kind="agent", rc=None, stderr="", cmd=None):
        super().__init__(message)
        self.kind = kind
        self.rc = rc
        self.stderr = stderr
        self.cmd = cmd


def agent_command(module):
    """The argv prefix that starts the agent on this node."""
    explicit = module.params.get("agent")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            module.fail_json(
                msg="fleetops-agent not found or not executable at %s" % explicit, kind="missing-agent"
            )
        return [explicit]
    dirs = list(AGENT_DIRS) + [os.path.dirname(sys.executable)]
    found = module.get_bin_path("fleetops-agent", required=False, opt_dirs=dirs)
    if found:
        return [found]
    if importlib.util.find_spec("fleetops") is not None:
        return [sys.executable, "-m", "fleetops.agent.main"]
    module.fail_json(
        msg="fleetops-agent is not installed on this node (searched PATH, %s and this Python's packages); "
        "run the fleetops_agent role first" % ", ".join(dirs),
        kind="missing-agent",
    )
    return []  # not reached


def backend_args(module):
    """``--backend``/``--state``: the simulator's state file is passed explicitly because
    Ansible does not always forward the environment the node's sshd sets."""
    args = []
    state = module.params.get("sim_state")
    backend = module.params.get("backend") or "auto"
    if state:
        args += ["--backend", "sim" if backend == "auto" else backend, "--state", state]
    elif backend != "auto":
        args += ["--backend", backend]
    return args


def run_agent(module, argv):
    """Run the agent with ``argv`` (after the command prefix) and return its JSON answer."""
    cmd = agent_command(module) + list(argv)
    try:
        rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    except Exception as exc:  # run_command raises on a missing binary only in odd setups
        raise AgentError("could not start %s: %s" % (cmd[0], exc), kind="missing-agent", cmd=cmd) from exc
    if rc != 0:
        error = _error_line(err)
        if error:
            message, kind = str(error["error"]), str(error.get("kind", "agent"))
        else:
            message, kind = "exit %d: %s" % (rc, (err or out).strip()[-2000:]), "agent"
        raise AgentError(message, kind=kind, rc=rc, stderr=err, cmd=cmd)
    try:
        return json.loads(out)
    except ValueError as exc:
        raise AgentError(
            "the agent printed something that is not JSON (%s): %r" % (exc, out[:300]),
            kind="bad-output",
            cmd=cmd,
        ) from exc


def _error_line(stderr):
    """The agent's last ``{"error": ..., "kind": ...}`` line on stderr, as a dict, or None."""
    for line in reversed((stderr or "").strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "error" in doc:
            return doc
    return None


def fail_from(module, exc, **extra):
    module.fail_json(msg=str(exc), kind=exc.kind, rc=exc.rc, stderr=exc.stderr, cmd=exc.cmd, **extra)


def gpu_label(gpu):
    return "GPU %s %s %s" % (gpu.get("index"), gpu.get("uuid"), gpu.get("bus_id"))


# --- end of agent helper ---


def main():
    spec = dict(
        level=dict(type="str", default="quick", choices=["quick", "full"]),
        floors=dict(type="dict", default={}),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    level = module.params["level"]
    if module.check_mode:
        module.exit_json(changed=False, failed_gpus=[], msg="would validate (%s) and judge against the floors" % level)
    argv = ["validate", "--level", level, "--judge"] + backend_args(module)
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
        error = _error_line(err)
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
