"""What the fleet looks like to the TUI: per-node entries, view rows, filters, sorts, totals.

Pure Python with no Textual (or rich) import, so it is unit-testable and its heavy part runs in
the refresh thread: ``summarize`` turns one node's snapshot and findings into a ``NodeEntry``
holding every row that node contributes to every view, precomputed and immutable. The main
thread only swaps entries into ``FleetState`` and asks it for the rows of the current view,
which is cheap: it filters, sorts and fills in the few cells that depend on the clock (ages,
XIDs in the last hour).

A node that stops answering keeps its last good entry; ``mark_failed`` copies it with the
failure status and the transport finding, so the screen shows what the node looked like and
how long ago, with an unreachable mark.

The modules: ``columns`` (formatters, ``Column``, ``Row``, cells), ``entry`` (``NodeEntry``,
``summarize``, ``mark_failed``), ``state`` (``FleetState``, ``Filter``), ``fabric`` (the
FABRIC cell and the Fabric tab's port rows), ``jobs`` (the JOBS cells and one job across the
fleet, for the job filter). Callers import this
package; the submodules import one another directly.
"""

from fleetops.tui.data import fabric, jobs
from fleetops.tui.data.columns import (
    COLUMNS,
    DETAIL_FABRIC_COLUMNS,
    DETAIL_GPU_COLUMNS,
    DETAIL_XID_COLUMNS,
    FAULT_SEVERITIES,
    HEALTH_RANK,
    HISTORY_COLUMNS,
    STATE_WORDS,
    STATUS_LABEL,
    STATUS_OK,
    STATUS_PENDING,
    STATUS_STALE,
    THROTTLE_WORDS,
    VIEWS,
    XID_WINDOW_S,
    Column,
    Row,
    bad_since_cell,
    bad_since_text,
    column_index,
    finding_cells,
    fmt_ecc,
    fmt_finding,
    fmt_mig,
    fmt_nvlink,
    fmt_pcie,
    fmt_power,
    fmt_procs,
    fmt_remap,
    fmt_throttle,
    fmt_util,
    format_age,
    gpu_cells,
    health_label,
    kernel_line,
    make_row,
    natural_key,
    short_uuid,
    xid_cells,
)
from fleetops.tui.data.entry import (
    GpuView,
    NodeEntry,
    XidView,
    bad_since_shown,
    mark_failed,
    pending_entry,
    share_links,
    summarize,
)
from fleetops.tui.data.state import (
    DEFAULT_SORT,
    Filter,
    FleetState,
    Totals,
    ViewState,
    detail_gpu_rows,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_SORT",
    "DETAIL_FABRIC_COLUMNS",
    "DETAIL_GPU_COLUMNS",
    "DETAIL_XID_COLUMNS",
    "FAULT_SEVERITIES",
    "HEALTH_RANK",
    "HISTORY_COLUMNS",
    "STATUS_LABEL",
    "STATUS_OK",
    "STATUS_PENDING",
    "STATE_WORDS",
    "STATUS_STALE",
    "THROTTLE_WORDS",
    "VIEWS",
    "XID_WINDOW_S",
    "Column",
    "Filter",
    "FleetState",
    "GpuView",
    "NodeEntry",
    "Row",
    "Totals",
    "ViewState",
    "XidView",
    "bad_since_cell",
    "bad_since_shown",
    "bad_since_text",
    "column_index",
    "detail_gpu_rows",
    "fabric",
    "finding_cells",
    "fmt_ecc",
    "fmt_finding",
    "fmt_mig",
    "fmt_nvlink",
    "fmt_pcie",
    "fmt_power",
    "fmt_procs",
    "fmt_remap",
    "fmt_throttle",
    "fmt_util",
    "format_age",
    "gpu_cells",
    "health_label",
    "jobs",
    "kernel_line",
    "make_row",
    "mark_failed",
    "natural_key",
    "pending_entry",
    "share_links",
    "short_uuid",
    "summarize",
    "xid_cells",
]
