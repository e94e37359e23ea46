"""Topology: the GPU-to-GPU link matrix against the expected link type, and GPU-to-NUMA
placement compared across the fleet where NUMA is known."""

from __future__ import annotations

from fleetops import model
from fleetops.baseline import Baseline
from fleetops.checks.base import (
    DEMAND_BASELINE,
    CheckSpec,
    Context,
    Item,
    gpu_label,
    majority_drift,
    reset_cmd,
)

FAMILY = "topology"

SPECS = (
    CheckSpec(
        "topology.links", FAMILY, "GPU-to-GPU link type",
        reads="nvmlDeviceGetTopologyCommonAncestor / NVLink counts (nvidia-smi topo -m)",
        threshold="every GPU pair shows expected_topology (e.g. NV18)",
        severities=("warn",),
        action="Check NVLink state and Fabric Manager; a pair that falls back to PCIe (SYS/NODE) has lost its "
        "NVLink path: reset the GPUs or drain and inspect the baseboard.",
        not_a_fault="Pairs with a GPU in MIG mode are skipped (NVLink reports down under MIG).",
        requires="expected_topology",
        applies=lambda n, b: b is not None and b.expected_topology is not None,
    ),
    CheckSpec(
        "topology.numa", FAMILY, "GPU NUMA node across the fleet",
        reads="nvmlDeviceGetNumaNodeId (or sysfs numa_node), per PCI bus id",
        threshold="a GPU's NUMA node equals the fleet majority for its model and bus id",
        severities=("warn",),
        action="Check the node's BIOS NUMA settings (NPS, sub-NUMA clustering) and the GPUs' slots against its "
        "peers.",
        not_a_fault="Passthrough VMs report NUMA as Not Supported: such GPUs are left out of the vote.",
        scope="fleet",
        applies=lambda n, b: False,
        fleet_applies=lambda b: True,
    ),
)


def run(ctx: Context) -> None:
    b = ctx.baseline
    if b is None or b.expected_topology is None:
        return
    want = b.expected_topology
    topo = ctx.get(FAMILY, ctx.node, "topology", DEMAND_BASELINE)
    if topo is None:
        return
    if not topo.gpus or not topo.links:
        reason = topo.unavailable.get("links") or ctx.node.unavailable.get("topology") or "not collected"
        ctx.unreadable(FAMILY, "topology.links", reason, "node")
        return
    by_bus = {g.bus_id: g for g in ctx.node.gpus}
    for i, bus in enumerate(topo.gpus):
        gpu = by_bus.get(bus)
        if gpu is not None and gpu.mig_mode_current:
            continue
        row = topo.links[i] if i < len(topo.links) else []
        bad: dict[str, list[str]] = {}
        for j, other in enumerate(topo.gpus):
            if i == j:
                continue
            peer = by_bus.get(other)
            if peer is not None and peer.mig_mode_current:
                continue
            if any(g is not None and model.gpu_lost(g) for g in (gpu, peer)):
                continue  # a lost GPU's links went with it: config.gpu_missing reports it
            link = row[j] if j < len(row) else None
            if link is None:
                ctx.unreadable(FAMILY, "topology.links", topo.unavailable.get("links", "not reported"),
                               f"GPU {gpu.index if gpu else bus}")
                continue
            if link != want:
                name = f"GPU {peer.index}" if peer is not None else other
                bad.setdefault(link, []).append(name)
        if not bad:
            continue
        what = "; ".join(f"{link} to {', '.join(names)}" for link, names in sorted(bad.items()))
        label = gpu_label(gpu) if gpu is not None else bus
        ctx.add("topology.links", "warn", f"{label}: {what} (expected {want})",
                gpu=gpu, observed={link: names for link, names in sorted(bad.items())}, expected=want,
                action="Check NVLink state (nvidia-smi nvlink -s) and Fabric Manager; reset the GPUs "
                f"({reset_cmd(ctx.host, None)}) or drain and inspect the baseboard.")


def run_fleet(nodes: list[model.Node], b: Baseline | None) -> list[model.Finding]:
    groups: dict[tuple[str, str], list[Item]] = {}
    for n in nodes:
        for g in n.gpus:
            if g.name is None or g.numa_node is None or g.numa_node < 0:
                continue
            groups.setdefault((g.name, g.bus_id), []).append(Item(n.hostname, g.numa_node, g))
    out: list[model.Finding] = []
    for (model_name, bus), items in sorted(groups.items()):
        out += majority_drift(
            "topology.numa", "NUMA node", f"{model_name} GPUs at {bus}", items,
            "Check the node's BIOS NUMA settings (NPS, sub-NUMA clustering) and GPU slots against its peers.",
        )
    return out

