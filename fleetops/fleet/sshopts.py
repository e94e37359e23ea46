"""The SSH options every connecting command shares (audit, tui, reset, remediate).

Kept free of paramiko so that registering the subcommands stays cheap; the chosen ssh_config is
applied once per process by ``apply`` (``fleetops.cli.main``), before the command runs.
"""

from __future__ import annotations

import argparse

# SSH sessions opened at once by every command that collects from the nodes over SSH (audit,
# remediate's audit and dry runs, tui's cold collections, validate): one number for all of
# them. 50 is the fan-out bench/RESULTS.md measured (100 hosts: 4.1 s at 50, 4.6 s at 16, 5.1 s
# at 8; docs/runbooks/scaling.md); nothing measured the TUI's former 64. Ansible's forks
# (rollout, apply) are processes and stay with ansible.cfg.
FORKS = 50

SSH_CONFIG_HELP = (
    "ssh_config file to read Host blocks from, as ssh -F (default ~/.ssh/config when it exists; "
    "'none': read none); the inventory's variables and ssh args win over it"
)


def add_ssh_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("-F", "--ssh-config", metavar="FILE", help=SSH_CONFIG_HELP)


def apply(args: argparse.Namespace) -> None:
    """Make ``--ssh-config`` the default of every connection this process opens; a missing file
    is a usage error naming it."""
    path = getattr(args, "ssh_config", None)
    if path is None:
        return
    from fleetops.common.errors import UsageError
    from fleetops.fleet import sshconfig, transport

    try:
        transport.set_default_ssh_config(path)
    except sshconfig.ConfigError as exc:
        raise UsageError(f"--ssh-config: {exc}") from exc
