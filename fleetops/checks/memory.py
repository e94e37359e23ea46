"""GPU memory health: ECC error counters, row remapping (Ampere and later) and retired pages
(earlier GPUs; Hopper reports retired pages as Not Supported, which is not a fault)."""

from __future__ import annotations

from fleetops import model
from fleetops.checks.base import (
    DEMAND_EXPECTED,
    CheckSpec,
    Context,
    gpu_label,
    reset_action,
    reset_cmd,
)

FAMILY = "memory"

INSPECT_ACTION = (
    "Drain the node and have the GPU inspected: a failed row remap means no spare rows are left "
    "(field diagnostics, then RMA)."
)

SPECS = (
    CheckSpec(
        "memory.ecc_dbe_volatile", FAMILY, "Uncorrectable (double-bit) ECC errors since driver load",
        reads="nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)",
        threshold="at or above thresholds.ecc_dbe_volatile_crit (1)",
        severities=("crit",),
        action="Drain the GPU's jobs, then reset it: fleetops reset NODE GPU-UUID -i INVENTORY; repeated DBEs after a "
        "reset mean hardware service.",
    ),
    CheckSpec(
        "memory.ecc_sbe_volatile", FAMILY, "Corrected (single-bit) ECC errors since driver load",
        reads="nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)",
        threshold="warn at thresholds.ecc_sbe_volatile_warn (10000), crit at ecc_sbe_volatile_crit (5e7)",
        severities=("warn", "crit"),
        action="Watch the row-remap counters; reset the GPU in a service window to apply pending remaps.",
    ),
    CheckSpec(
        "memory.ecc_sbe_rate", FAMILY, "Corrected ECC error growth between snapshots",
        reads="nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC), two snapshots",
        threshold="more than thresholds.ecc_sbe_growth_per_hour_warn (1000/h), over at least "
        "thresholds.rate_min_interval_s (10 s)",
        severities=("warn",),
        action="Corrected errors are arriving fast: plan a GPU reset to remap the failing rows and "
        "watch for uncorrectable errors.",
        not_a_fault="A counter that went down was reset (GPU reset, driver reload): no rate is computed.",
        unit="/h",
    ),
    CheckSpec(
        "memory.row_remap_pending", FAMILY, "Row remap waiting for a GPU reset",
        reads="nvmlDeviceGetRemappedRows (isPending)",
        threshold="pending is true",
        severities=("warn",),
        action="Reset the GPU to apply the remap when it is idle: fleetops reset NODE GPU-UUID -i INVENTORY.",
    ),
    CheckSpec(
        "memory.row_remap_failure", FAMILY, "Row remap failed",
        reads="nvmlDeviceGetRemappedRows (failureOccurred)",
        threshold="failure is true",
        severities=("crit",),
        action=INSPECT_ACTION,
    ),
    CheckSpec(
        "memory.row_remap_uncorrectable", FAMILY, "Rows remapped for uncorrectable errors",
        reads="nvmlDeviceGetRemappedRows (uncorrRows)",
        threshold="at or above thresholds.remapped_rows_uncorrectable_warn (512)",
        severities=("warn",),
        action="Many rows remapped for uncorrectable errors: plan hardware service for the GPU.",
        not_a_fault="Rows remapped for corrected errors are routine (a healthy H200 can show 2).",
    ),
    CheckSpec(
        "memory.retired_pages", FAMILY, "Retired pages (pre-Ampere page retirement)",
        reads="nvmlDeviceGetRetiredPages / nvmlDeviceGetRetiredPagesPendingStatus",
        threshold="crit at thresholds.retired_pages_total_crit (63) or retired_pages_dbe_crit (16); "
        "warn when a retirement is pending",
        severities=("warn", "crit"),
        action="Pending: reset the GPU to retire the pages (fleetops reset NODE GPU-UUID -i INVENTORY). Over the limit: "
        "drain the node and RMA the GPU.",
        not_a_fault="Hopper (H100/H200) reports retired pages as Not Supported: it remaps rows instead.",
        applies=lambda n, b: any(
            v is not None for g in n.gpus for v in (g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending)
        ),
    ),
)


def run(ctx: Context) -> None:
    th = ctx.th
    dt = ctx.interval_s()
    for gpu in ctx.node.gpus:
        label = gpu_label(gpu)
        dbe = ctx.get(FAMILY, gpu, "ecc_uncorrected_volatile", DEMAND_EXPECTED)
        if dbe is not None and dbe >= th.ecc_dbe_volatile_crit:
            ctx.add("memory.ecc_dbe_volatile", "crit",
                    f"{label}: {dbe} uncorrectable ECC errors since the driver loaded; its jobs may have "
                    "read corrupted memory",
                    gpu=gpu, observed=dbe, expected=f"< {th.ecc_dbe_volatile_crit}",
                    action=reset_action(ctx.host, gpu.uuid, "repeated DBEs after a reset mean RMA"))

        sbe = ctx.get(FAMILY, gpu, "ecc_corrected_volatile", DEMAND_EXPECTED)
        if sbe is not None and sbe >= th.ecc_sbe_volatile_warn:
            sev = "crit" if sbe >= th.ecc_sbe_volatile_crit else "warn"
            limit = th.ecc_sbe_volatile_crit if sev == "crit" else th.ecc_sbe_volatile_warn
            ctx.add("memory.ecc_sbe_volatile", sev,
                    f"{label}: {sbe} corrected ECC errors since the driver loaded (limit {limit})",
                    gpu=gpu, observed=sbe, expected=f"< {limit}",
                    action="Watch row remapping; reset the GPU in a service window: "
                    f"{reset_cmd(ctx.host, gpu.uuid)}.")
        prev = ctx.prev_gpu(gpu)
        if dt is not None and prev is not None and sbe is not None:
            grown = ctx.growth(sbe, prev.ecc_corrected_volatile)
            if grown is not None:
                per_hour = grown / dt * 3600.0
                if per_hour > th.ecc_sbe_growth_per_hour_warn:
                    ctx.add("memory.ecc_sbe_rate", "warn",
                            f"{label}: corrected ECC errors growing at {per_hour:.0f}/h "
                            f"(+{grown} in {dt:.0f} s; limit {th.ecc_sbe_growth_per_hour_warn:g}/h)",
                            gpu=gpu, observed=round(per_hour, 1),
                            expected=f"<= {th.ecc_sbe_growth_per_hour_warn:g}/h",
                            action="Plan a GPU reset to remap the failing rows: "
                            f"{reset_cmd(ctx.host, gpu.uuid)}; watch for uncorrectable errors.")

        pending = ctx.get(FAMILY, gpu, "remapped_rows_pending", DEMAND_EXPECTED)
        if pending:
            ctx.add("memory.row_remap_pending", "warn",
                    f"{label}: a row remap is pending; it takes effect at the next GPU reset",
                    gpu=gpu, observed=True, expected=False,
                    action=reset_action(ctx.host, gpu.uuid, "when idle, to apply the remap"))
        failure = ctx.get(FAMILY, gpu, "remapped_rows_failure", DEMAND_EXPECTED)
        if failure:
            ctx.add("memory.row_remap_failure", "crit",
                    f"{label}: a row remap failed: the GPU has no spare rows left for failing memory",
                    gpu=gpu, observed=True, expected=False, action=INSPECT_ACTION)
        unc_rows = ctx.get(FAMILY, gpu, "remapped_rows_uncorrected", DEMAND_EXPECTED)
        if unc_rows is not None and unc_rows >= th.remapped_rows_uncorrectable_warn:
            ctx.add("memory.row_remap_uncorrectable", "warn",
                    f"{label}: {unc_rows} rows remapped for uncorrectable errors "
                    f"(limit {th.remapped_rows_uncorrectable_warn})",
                    gpu=gpu, observed=unc_rows, expected=f"< {th.remapped_rows_uncorrectable_warn}",
                    action="Plan hardware service for the GPU (drain, field diagnostics, RMA).")

        _retired_pages(ctx, gpu, label)


def _retired_pages(ctx: Context, gpu: model.Gpu, label: str) -> None:
    th = ctx.th
    sbe = ctx.get(FAMILY, gpu, "retired_pages_sbe")
    dbe = ctx.get(FAMILY, gpu, "retired_pages_dbe")
    pending = ctx.get(FAMILY, gpu, "retired_pages_pending")
    total = (sbe or 0) + (dbe or 0) if (sbe is not None or dbe is not None) else None
    if (total is not None and total >= th.retired_pages_total_crit) or (
        dbe is not None and dbe >= th.retired_pages_dbe_crit
    ):
        ctx.add("memory.retired_pages", "crit",
                f"{label}: {total} retired pages ({dbe if dbe is not None else '?'} for double-bit errors; "
                f"limits {th.retired_pages_total_crit} total, {th.retired_pages_dbe_crit} double-bit)",
                gpu=gpu, observed={"sbe": sbe, "dbe": dbe},
                expected={"total_below": th.retired_pages_total_crit, "dbe_below": th.retired_pages_dbe_crit},
                action="Drain the node and RMA the GPU: it has retired too many pages.")
    elif pending:
        ctx.add("memory.retired_pages", "warn",
                f"{label}: a page retirement is pending; it takes effect at the next GPU reset",
                gpu=gpu, observed={"pending": True, "sbe": sbe, "dbe": dbe}, expected={"pending": False},
                action=reset_action(ctx.host, gpu.uuid, "to retire the pages"))
