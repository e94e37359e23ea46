"""The node agent's Prometheus exposition: one text page rendered from one immutable input.

The resident daemon builds a ``MetricsInput`` from its latest snapshot, the findings of the
shared checks and its XID counters, and serves ``render(...)`` over ``start_server`` (or writes
it as a node_exporter textfile with ``write_textfile``). Nothing here keeps state: the same input
always renders the same page, and the HTTP server only reads.

Naming follows what ``promtool check metrics`` enforces: counters end in ``_total``, gauges do
not, values are in base units (seconds, bytes, hertz, watts, celsius, ratios). Label values are
bounded: GPU identity, check ids, severities, XID codes, link numbers, clocks-event reason names.
No process or message text ever becomes a label, so the series count stays fixed per node; the one
exception, ``fleetops_gpu_job_info`` (Slurm job id and user), lists only the jobs running now, so
it is bounded by what a node can run at once and shrinks back as jobs end.

Standard library only, and little of it: the daemon imports this and must stay small, so the
endpoint is written over ``socketserver`` (``http.server`` and ``importlib.metadata`` would
add about 6 MiB of modules to the daemon's resident size for what it needs). It is built to be
held by nobody: a deadline for the whole request, idle and slow clients read by one thread
without a thread each, caps on both, and TLS and basic auth from the exporters' web-config file
(``fleetops.agent.webconfig``, imported with ``ssl`` and ``bcrypt`` only when configured).

The modules: ``page`` (``MetricsInput``, ``render``, ``write_textfile``) and ``server``
(``MetricsServer``, ``start_server``). Callers import this package; ``server`` imports ``page``
directly.
"""

from fleetops.agent.metrics.page import (
    CONTENT_TYPE,
    DEFAULT_PORT,
    MHZ,
    MIB,
    PRESET_XIDS,
    SEVERITY_VALUE,
    AgentInfo,
    MetricsInput,
    XidKey,
    count_xid,
    escape_label,
    render,
    write_textfile,
    xid_counts_from_events,
)
from fleetops.agent.metrics.server import (
    LISTEN_BACKLOG,
    MAX_CONNECTIONS,
    MAX_PENDING,
    READ_TIMEOUT_S,
    WRITE_TIMEOUT_S,
    MetricsServer,
    start_server,
)

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "LISTEN_BACKLOG",
    "MAX_CONNECTIONS",
    "MAX_PENDING",
    "MHZ",
    "MIB",
    "PRESET_XIDS",
    "READ_TIMEOUT_S",
    "SEVERITY_VALUE",
    "WRITE_TIMEOUT_S",
    "AgentInfo",
    "MetricsInput",
    "MetricsServer",
    "XidKey",
    "count_xid",
    "escape_label",
    "render",
    "start_server",
    "write_textfile",
    "xid_counts_from_events",
]
