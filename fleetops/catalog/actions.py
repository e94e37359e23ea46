"""How long each node-side action may take, derived from its phases.

The agent uses these budgets for the maintenance lock's deadline; the controller uses the same
figures (plus a margin for SSH) as the command timeout, so a reset that runs long is waited for
instead of being reported as a timeout while it carries on unseen."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_CLIENTS: tuple[str, ...] = ("nvidia-persistenced", "nvidia-dcgm", "dcgm-exporter")
DEFAULT_GRACE_S = 10.0  # SIGTERM to SIGKILL, per process
KILL_WAIT_S = 5.0  # after SIGKILL, for the process to leave the GPU
SERVICE_TIMEOUT_S = 60.0  # one systemctl stop or start
RESET_TIMEOUT_S = 120.0  # nvidia-smi -r and the GPU's return (the verify phase waits this long too)
SNAPSHOT_ALLOWANCE_S = 15.0  # the snapshots the flow takes (before, under the lock, after)
SSH_MARGIN_S = 30.0  # connection, agent start, answer transfer


def reset_budget_s(
    grace_s: float = DEFAULT_GRACE_S,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    clients: Sequence[str] | int = DEFAULT_CLIENTS,
) -> float:
    """Worst case of the agent's reset flow: end processes, stop clients, reset, start clients, verify."""
    n = clients if isinstance(clients, int) else len(clients)
    return (
        grace_s
        + KILL_WAIT_S
        + 2 * n * SERVICE_TIMEOUT_S
        + reset_timeout_s  # the reset
        + reset_timeout_s  # the verify phase's wait for the GPU to come back
        + SNAPSHOT_ALLOWANCE_S
    )


def reset_command_timeout_s(
    grace_s: float = DEFAULT_GRACE_S,
    reset_timeout_s: float = RESET_TIMEOUT_S,
    clients: Sequence[str] | int = DEFAULT_CLIENTS,
) -> float:
    """What the controller waits for the agent's answer to a reset: its own budget plus SSH."""
    return reset_budget_s(grace_s, reset_timeout_s, clients) + SSH_MARGIN_S
