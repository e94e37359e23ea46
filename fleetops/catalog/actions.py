"""How long each node-side action may take, derived from its phases.

The agent uses these budgets for the maintenance lock's deadline; the controller uses the same
figures (plus a margin for SSH) as the command timeout, so a reset that runs long is waited for
instead of being reported as a timeout while it carries on unseen."""

from __future__ import annotations

from collections.abc import Sequence

# The GPU clients a reset stops (systemd units) and starts again. The resident agent
# (fleetops-agent serve, unit fleetops-agent) is a GPU client too, holding the device files
# while NVML is open, but it is not listed: the reset pauses it through its socket (quiesce:
# NVML released, kernel-log follower and endpoint kept; back on resume, on the reset's close or
# at its lease), so XIDs keep being counted through the reset. A driver reload, which has no
# NVML to come back to, stops its unit instead (roles/nvidia_driver, tasks/reload.yml).
DEFAULT_CLIENTS: tuple[str, ...] = ("nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter")
DEFAULT_GRACE_S = 10.0  # SIGTERM to SIGKILL, per process
KILL_WAIT_S = 5.0  # after SIGKILL, for the process to leave the GPU
SERVICE_TIMEOUT_S = 60.0  # one systemctl stop or start
RESET_TIMEOUT_S = 120.0  # nvidia-smi -r and the GPU's return (the verify phase waits this long too)
SNAPSHOT_ALLOWANCE_S = 15.0  # the snapshots the flow takes (before, under the lock, after)
SSH_MARGIN_S = 30.0  # connection, agent start, answer transfer
MIG_COMMAND_TIMEOUT_S = 120.0  # one nvidia-smi mig call (destroy CIs, destroy GIs, create)
MIG_COMMANDS_PER_GPU = 3

# The reset's phases in the order the agent runs them; the lock's deadline is refreshed at each.
RESET_PHASES = ("preconditions", "end_processes", "stop_clients", "reset", "start_clients", "verify")


def reset_budget_s(
    grace_s: float = DEFAULT_GRACE_S,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    clients: Sequence[str] | int = DEFAULT_CLIENTS,
) -> float:
    """Worst case of the agent's reset flow: end processes, stop clients, reset, start clients, verify."""
    return reset_remaining_s("preconditions", grace_s, reset_timeout_s, clients)


def _phase_cost(phase: str, grace_s: float, reset_timeout_s: float, n_clients: int) -> float:
    return {
        "preconditions": 0.0,  # the snapshots are counted once, in SNAPSHOT_ALLOWANCE_S
        "end_processes": grace_s + KILL_WAIT_S,
        "stop_clients": n_clients * SERVICE_TIMEOUT_S,
        "reset": reset_timeout_s,
        "start_clients": n_clients * SERVICE_TIMEOUT_S,
        "verify": reset_timeout_s,  # the wait for the GPU to come back
    }[phase]


def reset_remaining_s(
    phase: str,
    grace_s: float = DEFAULT_GRACE_S,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    clients: Sequence[str] | int = DEFAULT_CLIENTS,
) -> float:
    """Worst case of what is left of a reset when ``phase`` starts: the lock's new deadline then."""
    if phase not in RESET_PHASES:
        raise ValueError(f"unknown reset phase {phase!r}; one of {', '.join(RESET_PHASES)}")
    n = clients if isinstance(clients, int) else len(clients)
    rest = RESET_PHASES[RESET_PHASES.index(phase) :]
    return sum(_phase_cost(p, grace_s, reset_timeout_s, n) for p in rest) + SNAPSHOT_ALLOWANCE_S


def mig_budget_s(gpus: int) -> float:
    """Worst case of ``mig reset`` on ``gpus`` GPUs: three nvidia-smi calls each, and the read-back."""
    return gpus * MIG_COMMANDS_PER_GPU * MIG_COMMAND_TIMEOUT_S + SNAPSHOT_ALLOWANCE_S


def reset_command_timeout_s(
    grace_s: float = DEFAULT_GRACE_S,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    clients: Sequence[str] | int = DEFAULT_CLIENTS,
) -> float:
    """What the controller waits for the agent's answer to a reset: its own budget plus SSH."""
    return reset_budget_s(grace_s, reset_timeout_s, clients) + SSH_MARGIN_S


# The reset journal every ``fleetops-agent reset`` appends to (one JSON line per attempt), and
# the variable that moves it: written by the reset flow, read by collect (a recorded reset ends
# an XID that holds until the GPU is reset).
RESET_JOURNAL = "/var/log/fleetops/reset.jsonl"
RESET_JOURNAL_ENV = "FLEETOPS_RESET_LOG"
