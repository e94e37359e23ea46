"""The SSH options every connecting command shares (audit, tui, reset, remediate).

Kept free of paramiko so that registering the subcommands stays cheap; the chosen ssh_config is
applied once per process by ``apply`` (``fleetops.cli.main``), before the command runs.
"""

from __future__ import annotations

import argparse

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
