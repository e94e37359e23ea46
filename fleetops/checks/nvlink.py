"""NVLink: links up against the expected count, and error-counter growth rates."""

from __future__ import annotations

from fleetops import model
from fleetops.baseline import Baseline
from fleetops.checks.base import (
    DEMAND_BASELINE,
    DEMAND_NONE,
    CheckSpec,
    Context,
    gpu_label,
    reset_action,
    reset_cmd,
)

FAMILY = "nvlink"
COUNTERS = ("crc_errors", "replay_errors", "recovery_errors")

MIG_NOTE = (
    "With MIG mode on, NVML reports every NVLink as down: that is not a fault and is not reported. "
    "A passthrough VM reports NVLink as Not Supported: silent unless nvlinks_per_gpu expects links."
)

SPECS = (
    CheckSpec(
        "nvlink.links_down", FAMILY, "NVLinks up",
        reads="nvmlDeviceGetNvLinkState for each link",
        threshold="links up at least nvlinks_per_gpu (without it: every link the GPU reports)",
        severities=("crit",),
        action="Check Fabric Manager and the link counters (nvidia-smi nvlink -s / -e), then reset the GPU "
        "(fleetops reset NODE GPU-UUID); links still down point at the baseboard or NVSwitch: drain and "
        "inspect.",
        not_a_fault=MIG_NOTE,
        applies=lambda n, b: _applies(n, b),
    ),
    CheckSpec(
        "nvlink.error_rate", FAMILY, "NVLink error counter growth",
        reads="NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT / REPLAY_ERROR_COUNT / RECOVERY_ERROR_COUNT per link, "
        "two snapshots",
        threshold="CRC/min above thresholds.nvlink_crc_per_min_warn (100) warn, nvlink_crc_per_min_crit (6000) "
        "crit; replays/min above nvlink_replays_per_min_warn (0); recoveries/min above "
        "nvlink_recoveries_per_min_warn (0); rates over at least thresholds.rate_min_interval_s (10 s); "
        "without a previous snapshot, non-zero totals are info",
        severities=("info", "warn", "crit"),
        action="Reset the GPU in a service window to retrain its links (fleetops reset NODE GPU-UUID); errors "
        "that return point at the baseboard or NVSwitch: drain and inspect.",
        not_a_fault="Counters accumulate since the driver loaded: totals without a rate are not a fault.",
        applies=lambda n, b: _applies(n, b),
    ),
)


def _applies(node: model.Node, b: Baseline | None) -> bool:
    return bool(b is not None and b.nvlinks_per_gpu) or any(g.nvlinks is not None for g in node.gpus)


def _expects_links(ctx: Context) -> int | None:
    b = ctx.baseline
    return b.nvlinks_per_gpu if b is not None else None


def run(ctx: Context) -> None:
    expected_n = _expects_links(ctx)
    for gpu in ctx.node.gpus:
        demand = DEMAND_BASELINE if expected_n else DEMAND_NONE
        if gpu.mig_mode_current:
            continue  # NVLink reports down under MIG: not a fault (see MIG_NOTE)
        links = ctx.get(FAMILY, gpu, "nvlinks", demand)
        if links is None:
            continue
        _links_down(ctx, gpu, links, expected_n)
        _error_rate(ctx, gpu, links)


def _links_down(ctx: Context, gpu: model.Gpu, links: list[model.NvLink], expected_n: int | None) -> None:
    expected = expected_n if expected_n is not None else len(links)
    if expected <= 0:
        return
    up = [lk.link for lk in links if lk.state == "up"]
    unknown = []
    for lk in links:
        if lk.state is None:
            ctx.get(FAMILY, lk, "state", DEMAND_BASELINE if expected_n else DEMAND_NONE,
                    label=f"GPU {gpu.index} link {lk.link}")
            unknown.append(lk.link)
    down = [lk.link for lk in links if lk.state is not None and lk.state != "up"]
    if len(up) + len(unknown) >= expected:
        return  # enough links up, or the shortfall is only unreadable links (reported as unknown)
    missing = expected - len(links) if len(links) < expected else 0
    details = []
    if down:
        details.append("down: link " + ", ".join(map(str, down)))
    if missing:
        details.append(f"{missing} link(s) not reported at all")
    ctx.add("nvlink.links_down", "crit",
            f"{gpu_label(gpu)}: {len(up)} of {expected} NVLinks up ({'; '.join(details)})",
            gpu=gpu, observed={"up": len(up), "down_links": down}, expected={"up": expected},
            action="Check that Fabric Manager runs and the link counters (nvidia-smi nvlink -s / -e), then "
            f"reset the GPU: {reset_cmd(ctx.host, gpu.uuid)}; links still down after that: drain the "
            "node and inspect the baseboard / NVSwitch.")


def _error_rate(ctx: Context, gpu: model.Gpu, links: list[model.NvLink]) -> None:
    th = ctx.th
    totals = {c: 0 for c in COUNTERS}
    for lk in links:
        for c in COUNTERS:
            v = getattr(lk, c)
            if v is not None:
                totals[c] += v
    prev = ctx.prev_gpu(gpu)
    dt = ctx.interval_s()
    prev_links = {lk.link: lk for lk in (prev.nvlinks or [])} if prev is not None else {}
    if prev is None or dt is None or not prev_links:
        if any(totals.values()):
            ctx.add("nvlink.error_rate", "info",
                    f"{gpu_label(gpu)}: NVLink error totals since the driver loaded: "
                    + ", ".join(f"{c.replace('_errors', '')} {v}" for c, v in totals.items())
                    + " (no previous snapshot to compute a rate from)",
                    gpu=gpu, observed={"totals": totals}, expected=None,
                    action="Audit again later (or with the previous snapshot) to get a rate.")
        return
    growth = {c: 0 for c in COUNTERS}
    per_link: dict[int, dict[str, int]] = {}
    for lk in links:
        p = prev_links.get(lk.link)
        if p is None:
            continue
        for c in COUNTERS:
            g = ctx.growth(getattr(lk, c), getattr(p, c))
            if g:
                growth[c] += g
                per_link.setdefault(lk.link, {})[c] = g
    rates = {c: growth[c] / dt * 60.0 for c in COUNTERS}
    sev = None
    reasons = []
    if rates["crc_errors"] > th.nvlink_crc_per_min_crit:
        sev = "crit"
        reasons.append(f"CRC {rates['crc_errors']:.0f}/min over {th.nvlink_crc_per_min_crit:g}/min")
    elif rates["crc_errors"] > th.nvlink_crc_per_min_warn:
        sev = "warn"
        reasons.append(f"CRC {rates['crc_errors']:.0f}/min over {th.nvlink_crc_per_min_warn:g}/min")
    if rates["replay_errors"] > th.nvlink_replays_per_min_warn:
        sev = sev or "warn"
        reasons.append(f"replays {rates['replay_errors']:.1f}/min over {th.nvlink_replays_per_min_warn:g}/min")
    if rates["recovery_errors"] > th.nvlink_recoveries_per_min_warn:
        sev = sev or "warn"
        reasons.append(
            f"recoveries {rates['recovery_errors']:.1f}/min over {th.nvlink_recoveries_per_min_warn:g}/min"
        )
    if sev is None:
        return
    where = ", ".join(f"link {n}" for n in sorted(per_link))
    ctx.add("nvlink.error_rate", sev,
            f"{gpu_label(gpu)}: NVLink errors growing ({'; '.join(reasons)}) on {where}",
            gpu=gpu,
            observed={"per_min": {c: round(r, 1) for c, r in rates.items()},
                      "links": {str(k): v for k, v in sorted(per_link.items())}},
            expected={"crc_per_min": th.nvlink_crc_per_min_warn, "replays_per_min": th.nvlink_replays_per_min_warn,
                      "recoveries_per_min": th.nvlink_recoveries_per_min_warn},
            action=reset_action(ctx.host, gpu.uuid, "in a service window, to retrain the links; errors that "
                                "return point at the baseboard or NVSwitch: drain and inspect"))
