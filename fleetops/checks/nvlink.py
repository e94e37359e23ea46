"""NVLink: links up against the expected count, error-counter growth rates, and a link that
carries no traffic while its GPU's other links do."""

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
from fleetops.common import stats

FAMILY = "nvlink"
COUNTERS = ("crc_errors", "replay_errors", "recovery_errors")

MIG_NOTE = (
    "With MIG mode on, NVML reports every NVLink as down: MIG does not use NVLink, so that is not a fault and "
    "is not reported (the GPU's links are not judged, and the daemon exports no link state for it). "
    "A passthrough VM reports NVLink as Not Supported: silent unless nvlinks_per_gpu expects links."
)

SPECS = (
    CheckSpec(
        "nvlink.links_down", FAMILY, "NVLinks up",
        reads="nvmlDeviceGetNvLinkState for each link",
        threshold="links up at least nvlinks_per_gpu (without it: every link the GPU reports)",
        severities=("crit",),
        action="Check Fabric Manager and the link counters (nvidia-smi nvlink -s / -e), then reset the GPU "
        "(fleetops reset NODE GPU-UUID -i INVENTORY); links still down point at the baseboard or NVSwitch: drain and "
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
        action="Reset the GPU in a service window to retrain its links (fleetops reset NODE GPU-UUID -i INVENTORY); errors "
        "that return point at the baseboard or NVSwitch: drain and inspect.",
        not_a_fault="Counters accumulate since the driver loaded: totals without a rate are not a fault. A GPU in "
        "MIG mode is not judged: MIG does not use NVLink.",
        applies=lambda n, b: _applies(n, b),
    ),
    CheckSpec(
        "nvlink.idle_link", FAMILY, "NVLink carrying no traffic while the GPU's others do",
        reads="NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX per link (scopeId = link, KiB), two snapshots",
        threshold="over at least thresholds.nvlink_idle_window_s (60 s): an up link that moved (TX + RX) "
        "less than nvlink_idle_max_kib (1024 KiB) while the median of the GPU's other up links to the "
        "same kind of peer (NVSwitch; or the same GPU, for direct links) moved at least "
        "nvlink_idle_peer_min_kib (1048576 KiB, 1 GiB) is warn",
        severities=("warn",),
        action="Compare the link with its neighbours (nvidia-smi nvlink -gt d, nvidia-smi nvlink -s) and "
        "check Fabric Manager's log for that link; reset the GPU in a service window (fleetops reset NODE "
        "GPU-UUID -i INVENTORY); a link still idle under load after that points at the NVSwitch tray or the baseboard: "
        "drain and inspect.",
        not_a_fault="A GPU whose links are all idle is an idle GPU, and a job that talks to one peer over "
        "direct links leaves the links to other peers idle: links are compared only with links to the "
        "same kind of peer. Counters that went back (a GPU reset) give no evidence either way. A GPU in MIG mode "
        "is not judged: MIG does not use NVLink.",
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
        _idle_link(ctx, gpu, links)


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


def _peer_group(link: model.NvLink) -> tuple[str, str]:
    """Links that should carry alike: all links to NVSwitches (traffic is spread over them), or
    the links to one GPU; a job may leave the links to another GPU idle."""
    if link.remote_type == "gpu":
        return ("gpu", link.remote_bus_id or "?")
    return (link.remote_type or "unknown", "")


def _moved(ctx: Context, gpu: model.Gpu, link: model.NvLink, prev: model.NvLink) -> int | None:
    """KiB (TX + RX) over the window, or None: unreadable (recorded), or a counter that went back."""
    now = [ctx.get(FAMILY, link, name, DEMAND_NONE, label=f"GPU {gpu.index} link {link.link}")
           for name in ("tx_kib", "rx_kib")]
    if now[0] is None or now[1] is None:
        return None
    tx = ctx.growth(now[0], prev.tx_kib)
    rx = ctx.growth(now[1], prev.rx_kib)
    if tx is None or rx is None:
        return None
    return tx + rx


def _idle_link(ctx: Context, gpu: model.Gpu, links: list[model.NvLink]) -> None:
    th = ctx.th
    prev = ctx.prev_gpu(gpu)
    if prev is None or ctx.previous is None or not prev.nvlinks:
        return
    window = float(ctx.node.collected_at or 0) - float(ctx.previous.collected_at or 0)
    if not (ctx.node.collected_at and ctx.previous.collected_at) or window < max(th.nvlink_idle_window_s, 1e-9):
        return
    prev_links = {lk.link: lk for lk in prev.nvlinks}
    groups: dict[tuple[str, str], list[tuple[model.NvLink, int]]] = {}
    for lk in links:
        p = prev_links.get(lk.link)
        if lk.state != "up" or p is None or p.state != "up":
            continue  # a link down at either end of the window is nvlink.links_down's business
        moved = _moved(ctx, gpu, lk, p)
        if moved is not None:
            groups.setdefault(_peer_group(lk), []).append((lk, moved))
    idle: list[tuple[model.NvLink, int, float, int]] = []  # (link, moved, peers' median, peers)
    for members in groups.values():
        for i, (lk, moved) in enumerate(members):
            if moved >= th.nvlink_idle_max_kib:
                continue
            others = [m for j, (_, m) in enumerate(members) if j != i]
            if not others:
                continue
            median = stats.median(others)
            if median >= th.nvlink_idle_peer_min_kib:
                idle.append((lk, moved, median, len(others)))
    if not idle:
        return
    parts = []
    per_link: dict[str, dict[str, object]] = {}
    for lk, moved, median, peers in idle:
        remote = lk.remote_bus_id or "unknown remote"
        parts.append(f"link {lk.link} (to {lk.remote_type or 'unknown'} {remote}) moved {moved} KiB while "
                     f"the median of its {peers} peer link(s) moved {median:.0f} KiB")
        per_link[str(lk.link)] = {
            "remote_bus_id": lk.remote_bus_id, "remote_type": lk.remote_type, "moved_kib": moved,
            "peer_median_kib": round(median), "peer_links": peers,
        }
    ctx.add("nvlink.idle_link", "warn",
            f"{gpu_label(gpu)}: NVLink carrying no traffic over {window:.0f} s: " + "; ".join(parts),
            gpu=gpu, observed={"window_s": round(window, 1), "links": per_link},
            expected={"idle_max_kib": th.nvlink_idle_max_kib, "peer_min_kib": th.nvlink_idle_peer_min_kib,
                      "window_s": th.nvlink_idle_window_s},
            action="Compare the link with its neighbours (nvidia-smi nvlink -gt d) and check Fabric Manager's "
            "log for it. " + reset_action(ctx.host, gpu.uuid, "in a service window, to retrain the links; a link "
                                          "still idle under load after that points at the NVSwitch tray or the "
                                          "baseboard: drain and inspect"))
