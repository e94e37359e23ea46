"""The options every module that calls fleetops-agent takes (module_utils/agent.py's
AGENT_ARGUMENT_SPEC), documented once."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  agent:
    description: Path of fleetops-agent; found on PATH, in /usr/local/bin or /opt/fleetops/venv/bin when unset.
    type: path
  sim_state:
    description: Simulator state file of a simulated node (passed as C(--backend sim --state)).
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
"""
