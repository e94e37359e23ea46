"""PCIe: the link each GPU trained to, and the replay rate (link-level retransmissions)."""

from __future__ import annotations

import math

from fleetops import model
from fleetops.catalog.pcie import LANE_GTS  # transfer rate per lane, GT/s, by generation
from fleetops.checks.base import (
    DEMAND_BASELINE,
    DEMAND_EXPECTED,
    CheckSpec,
    Context,
    gpu_label,
    reset_cmd,
)

FAMILY = "pcie"

REFERENCE_GEN, REFERENCE_WIDTH = 5, 16  # thresholds.pcie_replays_per_min is stated for Gen5 x16

RESEAT_ACTION = (
    "Reset the GPU to retrain the link (fleetops reset NODE GPU-UUID -i INVENTORY); if it stays degraded, drain the "
    "node and check the riser/cable/slot (BIOS PCIe settings, reseat, swap)."
)

SPECS = (
    CheckSpec(
        "pcie.link_degraded", FAMILY, "PCIe link generation and width",
        reads="nvmlDeviceGetCurrPcieLinkGeneration/Width, nvmlDeviceGetMaxPcieLinkGeneration/Width",
        threshold="current generation and width at least pcie.gen/pcie.width and at least the GPU's own maximum",
        severities=("warn",),
        action=RESEAT_ACTION,
    ),
    CheckSpec(
        "pcie.replay_rate", FAMILY, "PCIe replay rate",
        reads="nvmlDeviceGetPcieReplayCounter, two snapshots (collected_at)",
        threshold="more than thresholds.pcie_replays_per_min (31/min at Gen5 x16, scaled to the current "
        "link: Gen4 x16 16/min), over at least thresholds.rate_min_interval_s (10 s); without a previous "
        "snapshot only the total is reported (info)",
        severities=("info", "warn"),
        action="Replays mean a marginal link: check the riser/cable/slot in the next service window; if the "
        "rate keeps rising, drain the node.",
        not_a_fault="The counter accumulates since the driver loaded: a total without a rate is not a fault.",
    ),
)


def replay_threshold(per_min_gen5_x16: float, gen: int | None, width: int | None) -> int:
    """The replay-per-minute limit for a link: DCGM's 1e-12 BER rule scales with lane rate and
    lanes, so scale the Gen5 x16 figure the same way and round up."""
    rate = LANE_GTS.get(gen or REFERENCE_GEN, LANE_GTS[REFERENCE_GEN])
    lanes = width or REFERENCE_WIDTH
    factor = (rate * lanes) / (LANE_GTS[REFERENCE_GEN] * REFERENCE_WIDTH)
    return max(1, math.ceil(per_min_gen5_x16 * factor - 1e-9))


def run(ctx: Context) -> None:
    b = ctx.baseline
    want_gen = b.pcie.gen if b is not None else None
    want_width = b.pcie.width if b is not None else None
    for gpu in ctx.node.gpus:
        _link(ctx, gpu, want_gen, want_width)
        _replays(ctx, gpu)


def _link(ctx: Context, gpu: model.Gpu, want_gen: int | None, want_width: int | None) -> None:
    demand = DEMAND_BASELINE if (want_gen or want_width) else DEMAND_EXPECTED
    gen = ctx.get(FAMILY, gpu, "pcie_gen_current", demand)
    width = ctx.get(FAMILY, gpu, "pcie_width_current", demand)
    gen_max = ctx.get(FAMILY, gpu, "pcie_gen_max")
    width_max = ctx.get(FAMILY, gpu, "pcie_width_max")
    problems = []
    if gen is not None:
        if want_gen is not None and gen < want_gen:
            problems.append(f"Gen{gen} below the baseline's Gen{want_gen}")
        elif gen_max is not None and gen < gen_max:
            problems.append(f"Gen{gen} below the GPU's maximum Gen{gen_max}")
    if width is not None:
        if want_width is not None and width < want_width:
            problems.append(f"x{width} below the baseline's x{want_width}")
        elif width_max is not None and width < width_max:
            problems.append(f"x{width} below the GPU's maximum x{width_max}")
    if not problems:
        return
    exp_gen = max(x for x in (want_gen, gen_max, gen) if x is not None) if gen is not None else want_gen
    exp_width = max(x for x in (want_width, width_max, width) if x is not None) if width is not None else want_width
    ctx.add("pcie.link_degraded", "warn",
            f"{gpu_label(gpu)}: PCIe link Gen{gen if gen is not None else '?'} "
            f"x{width if width is not None else '?'}: " + "; ".join(problems),
            gpu=gpu, observed={"gen": gen, "width": width}, expected={"gen": exp_gen, "width": exp_width},
            action=RESEAT_ACTION.replace("fleetops reset NODE GPU-UUID -i INVENTORY", reset_cmd(ctx.host, gpu.uuid)))


def _replays(ctx: Context, gpu: model.Gpu) -> None:
    total = ctx.get(FAMILY, gpu, "pcie_replay_counter", DEMAND_EXPECTED)
    if total is None:
        return
    dt = ctx.interval_s()
    prev = ctx.prev_gpu(gpu)
    grown = ctx.growth(total, prev.pcie_replay_counter) if (prev is not None and dt is not None) else None
    if grown is None:
        if total > 0:
            ctx.add("pcie.replay_rate", "info",
                    f"{gpu_label(gpu)}: {total} PCIe replays since the driver loaded (no previous snapshot to "
                    "compute a rate from)",
                    gpu=gpu, observed={"total": total}, expected=None,
                    action="Audit again later (or with the previous snapshot) to get a rate.")
        return
    assert dt is not None
    per_min = grown / dt * 60.0
    limit = replay_threshold(ctx.th.pcie_replays_per_min, gpu.pcie_gen_current, gpu.pcie_width_current)
    if per_min > limit:
        ctx.add("pcie.replay_rate", "warn",
                f"{gpu_label(gpu)}: {per_min:.0f} PCIe replays/min (+{grown} in {dt:.0f} s) over the "
                f"{limit}/min limit for Gen{gpu.pcie_gen_current} x{gpu.pcie_width_current}",
                gpu=gpu, observed={"per_min": round(per_min, 1), "total": total},
                expected=f"<= {limit}/min",
                action="A marginal PCIe link: check riser/cable/slot in the next service window; drain the "
                "node if the rate keeps rising.")
