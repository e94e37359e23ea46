"""How the collection's modules start fleetops-agent on a node and read its JSON answer.

One copy for every module that calls the agent (fleetops_gpu_facts, _set, _reset, _validate):
Ansible bundles it into each module's payload, so the node needs nothing but the agent itself.
It runs with the node's Python, not the controller's: standard library and ansible.module_utils only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

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


def backend_mismatch(planned, answer, action):
    """Why the agent's ``answer`` cannot be taken for ``action`` planned on ``planned`` (the
    agent's earlier document: the plan's snapshot or dry run), or None: both must name the same
    backend (nvml, sim). An answer from the simulator is not about the GPUs a plan made on NVML
    saw, and the other way round a real GPU may have changed on a simulated plan."""
    want, got = planned.get("backend"), answer.get("backend")
    if want == got:
        return None
    return ("%s: the answer came from the %s backend, but the action was planned on the %s backend: "
            "not taken (check which backend fleetops-agent picks on this node: FLEETOPS_SIM_STATE, backend)"
            % (action, got or "an unnamed", want or "an unnamed"))


def run_agent(module, argv):
    """Run the agent with ``argv`` (after the command prefix) and return its JSON answer."""
    cmd = agent_command(module) + list(argv)
    try:
        rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    except Exception as exc:  # run_command raises on a missing binary only in odd setups
        raise AgentError("could not start %s: %s" % (cmd[0], exc), kind="missing-agent", cmd=cmd) from exc
    if rc != 0:
        error = error_line(err)
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


def error_line(stderr):
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
