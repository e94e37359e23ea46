"""``fleetops-agent reset``: reset one GPU safely, or say exactly why not.

The package's parts: ``backends`` (where the flow reads and changes a node: one ``Backend``, the
node's GPU access and its host services, for the simulator or NVML), ``host`` (the host
services: systemd units or the simulator's records, processes, the node's lock, journal and
daemon socket, with the few node-changing functions replaceable), ``preconditions`` (pure
checks of a snapshot), ``options`` (what the operator asked, parsed and checked), ``flow`` (the run, act and verify) and ``journal`` (the
audit-log line and syslog). The names other modules use are re-exported here; nothing heavy is imported.
"""

from __future__ import annotations

from fleetops.agent.reset.backends import (
    Backend,
    DryRunViolation,
    ResetError,
    make_backend,
    nvml_backend,
    sim_backend,
)
from fleetops.agent.reset.flow import REPORT_KIND, Interrupted, SignalGuard, main_args, run
from fleetops.agent.reset.host import (
    DEFAULT_LOG,
    LOCK_ENV,
    LOG_ENV,
    HostServices,
    SimHost,
    SystemdHost,
    end_pids,
)
from fleetops.agent.reset.options import (
    CLIENTS_ENV,
    Options,
    check_usage,
    parse_clients,
    parse_jobs,
    parse_pids,
    parse_selector,
)
from fleetops.agent.reset.preconditions import (
    FABRIC_MANAGER,
    PRECONDITIONS,
    REMEDY_INSPECT,
    REMEDY_PEERS,
    REMEDY_REBOOT,
    Check,
    check_clients,
    check_fabric_manager,
    check_identity,
    check_mig,
    check_nvlink_peers,
    check_processes,
    check_row_remap,
    is_nvswitch_system,
)
from fleetops.catalog.actions import DEFAULT_CLIENTS, DEFAULT_GRACE_S, KILL_WAIT_S, RESET_TIMEOUT_S

__all__ = [
    "CLIENTS_ENV",
    "DEFAULT_CLIENTS",
    "DEFAULT_GRACE_S",
    "DEFAULT_LOG",
    "FABRIC_MANAGER",
    "KILL_WAIT_S",
    "LOCK_ENV",
    "LOG_ENV",
    "PRECONDITIONS",
    "REMEDY_INSPECT",
    "REMEDY_PEERS",
    "REMEDY_REBOOT",
    "REPORT_KIND",
    "RESET_TIMEOUT_S",
    "Backend",
    "Check",
    "DryRunViolation",
    "HostServices",
    "Interrupted",
    "Options",
    "ResetError",
    "SignalGuard",
    "SimHost",
    "SystemdHost",
    "check_clients",
    "check_fabric_manager",
    "check_identity",
    "check_mig",
    "check_nvlink_peers",
    "check_processes",
    "check_row_remap",
    "check_usage",
    "end_pids",
    "is_nvswitch_system",
    "main_args",
    "make_backend",
    "nvml_backend",
    "parse_clients",
    "parse_jobs",
    "parse_pids",
    "parse_selector",
    "run",
    "sim_backend",
]
