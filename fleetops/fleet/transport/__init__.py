"""Run one command on many hosts in parallel: SSH through paramiko, or locally.

``run_all`` connects to every host (at most ``forks`` at a time), runs the command, and returns
one ``Result`` per host; ``SessionPool`` keeps one connection per host open and re-runs a command
on demand (a TUI refreshing every few seconds).

Every failure comes back as a ``Result`` with an ``error_kind``, never as an exception:

- ``unreachable``: refused, no route, unknown name, connection lost
- ``timeout``: TCP connect, SSH banner/negotiation, authentication or the command ran out of time.
  A host that accepts TCP but never says anything (a hung sshd) comes back after about
  ``connect_timeout`` and never holds up the others.
- ``auth``: the key was refused, or sudo refused the become (``ansible_become``: a password wanted)
- ``hostkey``: the host key is unknown (refused unless ``accept_new_hostkeys`` or
  StrictHostKeyChecking accept-new/no), changed, revoked (``@revoked``), or the host is covered only
  by a ``@cert-authority`` line (paramiko cannot verify host certificates). Always refused except
  the unknown case when accepting. Files: the ``known_hosts`` argument when given, else
  UserKnownHostsFile (inventory ssh args, then ssh_config), else ``~/.ssh/known_hosts``; plus
  GlobalKnownHostsFile (default ``/etc/ssh/ssh_known_hosts``). See ``hostkeys``.
- ``command``: it ran and exited non-zero (stderr kept; a missing program is exit 127, "not found")
- ``local``: a problem on this side (unreadable key file, cannot start a local process)
- ``outcome-unknown``: the command was sent, then the connection was lost before its answer came:
  it may have run, in part or in full. Never sent again by the transport; check the node.

A command is sent at most once. A pooled connection found dead before the command went out is
reopened and the command sent on the new one; once the exec request has gone out, a lost
connection is ``outcome-unknown``, unless the caller says the command only reads
(``idempotent=True``, e.g. a collect): then it is sent again once on a fresh connection by
``SessionPool`` and reported as ``unreachable`` if it still fails.

How a host is reached (address, port, user, key, ProxyJump chain, known_hosts files, become) is
resolved by ``sshconfig`` from the inventory and ssh_config as OpenSSH under Ansible would; a
ProxyJump hop is a paramiko connection whose ``direct-tcpip`` channel carries the next one.

The command is a list of arguments, quoted with ``shlex.join`` for the remote shell; ``env`` is
passed as ``env K=V ...`` in front of it (sshd drops most environment requests).

Long-lived streams (the TUI's daemon streams) have two openers with one contract:
``StreamOpener`` (a paramiko connection per stream) and ``OpenSSHStreamOpener`` (an ``ssh``
client process per stream, given the resolved Target as ``-o`` options with ``-F none``: the
handshake runs in C outside this interpreter and the stream is a pipe; targets behind jump
hosts go through paramiko). ``stream_opener`` picks one (``auto``: openssh where ``ssh`` is on
PATH).
"""

# The package's API is these names: every caller imports ``fleetops.fleet.transport`` and reads
# them from it (``transport.run_all``), so a caller's test may replace one here.
from fleetops.fleet.transport.common import (
    DEFAULT_KNOWN_HOSTS,
    ERROR_KINDS,
    GLOBAL_KNOWN_HOSTS,
    OUTCOME_UNKNOWN,
    Failure,
    Result,
    become_refused,
    command_line,
    readable,
)
from fleetops.fleet.transport.oneshot import run_all
from fleetops.fleet.transport.openssh import (
    FDS_PER_STREAM,
    FDS_SPARE,
    STREAM_STARTED,
    STREAM_TRANSPORTS,
    AnyStream,
    OpenSSHStreamOpener,
    ProcessStream,
    classify_ssh_exit,
    openssh_client,
    raise_open_files,
    ssh_argv,
    stream_opener,
)
from fleetops.fleet.transport.pool import SessionPool
from fleetops.fleet.transport.runner import HostKeyPolicy, Runner, classify_connect, set_default_ssh_config
from fleetops.fleet.transport.stream import Stream, StreamFailure, StreamOpener

__all__ = [
    "DEFAULT_KNOWN_HOSTS",
    "ERROR_KINDS",
    "FDS_PER_STREAM",
    "FDS_SPARE",
    "GLOBAL_KNOWN_HOSTS",
    "OUTCOME_UNKNOWN",
    "STREAM_STARTED",
    "STREAM_TRANSPORTS",
    "AnyStream",
    "OpenSSHStreamOpener",
    "ProcessStream",
    "Result",
    "SessionPool",
    "Stream",
    "StreamFailure",
    "StreamOpener",
    "Failure",
    "HostKeyPolicy",
    "Runner",
    "become_refused",
    "classify_connect",
    "classify_ssh_exit",
    "command_line",
    "openssh_client",
    "raise_open_files",
    "readable",
    "run_all",
    "set_default_ssh_config",
    "ssh_argv",
    "stream_opener",
]
