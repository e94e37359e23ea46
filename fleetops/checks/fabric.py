"""The network fabric: the InfiniBand / RoCE HCAs beside the GPUs (ports up, at their rate and width, on the firmware the fleet runs, one beside every GPU).

The baseline's ``fabric`` key says what a node must have; a GPU model's ``gpu_models.*.fabric``
overrides its keys for the nodes whose GPUs are of that model (``Baseline.fabric_for``).
A port is a *compute* port unless the baseline excludes it (``fabric.exclude_devices``,
``fabric.exclude_link_layers``); without either list, a port is a compute port when its HCA
shares a PCIe switch with a GPU (the rail layout of HGX nodes), or, on a node where no HCA does,
when it is InfiniBand. An excluded port (management, storage) is reported at most as ``warn``: it
never drains a node. Rules and their sources (``docs/reference/checks.md``): gpud's InfiniBand
component, NVSentinel's NIC health monitor, Azure's AzNHC (``check_hw_ib``), Meta's GCM.
"""

from __future__ import annotations

import collections
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.baseline import Baseline, FabricBaseline, Thresholds
from fleetops.checks.base import SETTING_MIN_VOTERS, CheckSpec, Context, Item, gpu_label, setting_majority

FAMILY = "fabric"

SRC_GPUD = "gpud (accelerator-nvidia-infiniband: 8 ports LinkUp at 400 Gb/s or more on H100/H200)"
SRC_NVSENTINEL = "NVSentinel (NIC health monitor: port state, counters, fewer active ports than peers)"
SRC_NVSENTINEL_PEERS = "NVSentinel (NIC health monitor: comparison with peers)"
SRC_AZNHC = "AzNHC (check_hw_ib 400 on mlx5_ib0-7: state and rate)"
SRC_AZNHC_GDR = "AzNHC (check_ib_bw_gdr: GPUDirect RDMA bandwidth per HCA, each GPU beside its own)"
SRC_GCM = "GCM (check_ib_counters: link_downed critical on its own, error counters)"

CABLE_ACTION = (
    "Inspect the port: check the cable and transceiver at both ends (seated, not bent, the switch port "
    "lit); reseat them, then replace the cable or transceiver if the port stays {what}; the switch "
    "port's configuration and the subnet manager (opensm/UFM) come next."
)
FIRMWARE_ACTION = (
    "Update the HCA's firmware to {want} in a maintenance window (drain the node; mlxfwmanager or the "
    "vendor's bundle), then reboot or reset the HCA so the new firmware runs."
)
COUNT_ACTION = (
    "Find the missing HCA or port: lspci for the card, the mlx5 driver's kernel log, the card's seating and "
    "power; drain the node for the repair."
)
DEGRADED_ACTION = CABLE_ACTION.format(what="slow") + (
    " A port at 2X has lost lanes: the cable or transceiver is the usual cause."
)
MISSING_HCA_ACTION = (
    "The HCA beside this GPU is not enumerated: check that the card is seated and powered (lspci), the "
    "mlx5 driver's kernel log and the slot; until it is back, this GPU's RDMA traffic crosses the CPU "
    "and the node's jobs lose a rail: drain it for the repair."
)

_STATE_SPECS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "fabric.port_down", FAMILY, "An RDMA port is not active",
        reads="`/sys/class/infiniband/<dev>/ports/<n>/state` and `phys_state`",
        threshold="a compute port whose state is not 4: ACTIVE (crit); an excluded port (warn). Sources: "
        + "; ".join((SRC_GPUD, SRC_NVSENTINEL, SRC_AZNHC)),
        severities=("warn", "crit"),
        action=CABLE_ACTION.format(what="down") + " phys_state Disabled: the port was turned off (switch, "
        "subnet manager or an administrator); LinkUp but not ACTIVE: the subnet manager has not brought "
        "it up.",
        not_a_fault="A port excluded by the baseline (management, storage), or not a compute port by the "
        "default rule, is never crit: its finding is a warn that drains nothing.",
    ),
    CheckSpec(
        "fabric.port_degraded", FAMILY, "An RDMA port below its rate, width or link layer",
        reads="`/sys/class/infiniband/<dev>/ports/<n>/rate` (`400 Gb/sec (4X NDR)`) and `link_layer`",
        threshold="an active compute port below fabric.rate_gbps or fabric.width, or not on "
        "fabric.link_layer (crit); without them, below the rate or width a strict majority of the "
        "node's other compute ports run at (at least 3, warn). Sources: " + "; ".join((SRC_GPUD, SRC_AZNHC)),
        severities=("warn", "crit"),
        action=DEGRADED_ACTION,
        scope="node+fleet",
        fleet_applies=lambda b: _some_leave(b, "rate_gbps", "width"),
    ),
    CheckSpec(
        "fabric.firmware", FAMILY, "HCA firmware differs",
        reads="`/sys/class/infiniband/<dev>/fw_ver` and `board_id`",
        threshold="an HCA with a compute port whose fw_ver is not fabric.firmware; without it, not the "
        "firmware a strict majority of the fleet's HCAs of the same board_id run (at least 3). "
        "Source: " + SRC_NVSENTINEL_PEERS,
        severities=("warn",),
        action=FIRMWARE_ACTION.format(want="the baseline's (or the fleet's) version"),
        scope="node+fleet",
        requires="fabric.firmware (or the node's GPU model's gpu_models.*.fabric.firmware) for the node check; "
        "none for the fleet's majority",
        applies=lambda n, b: b is not None and wanted(b, n).firmware is not None,
        fleet_applies=lambda b: _some_leave(b, "firmware"),
    ),
    CheckSpec(
        "fabric.port_count", FAMILY, "Fewer compute ports than expected",
        reads="`/sys/class/infiniband` (every device and port)",
        threshold="fewer compute ports than fabric.compute_ports (crit); without it, fewer than a strict "
        "majority of the fleet's nodes have (at least 3 nodes, warn). A port that is there but down is "
        "fabric.port_down's. Sources: " + "; ".join((SRC_GPUD, SRC_NVSENTINEL)),
        severities=("warn", "crit"),
        action=COUNT_ACTION,
        scope="node+fleet",
        requires="fabric.compute_ports (or the node's GPU model's gpu_models.*.fabric.compute_ports) for the "
        "node check; none for the fleet's majority",
        applies=lambda n, b: b is not None and wanted(b, n).compute_ports is not None,
        fleet_applies=lambda b: _some_leave(b, "compute_ports"),
    ),
    CheckSpec(
        "fabric.gpu_without_hca", FAMILY, "A GPU with no HCA on its PCIe switch",
        reads="the PCI paths of `/sys/class/infiniband/<dev>/device` and `/sys/bus/pci/devices/<GPU>`",
        threshold="a GPU behind a PCIe switch that has no compute HCA, on a node where other GPUs' "
        "switches have one (the HGX rail layout). Source: " + SRC_AZNHC_GDR,
        severities=("warn",),
        action=MISSING_HCA_ACTION,
        not_a_fault="A node where no GPU shares a switch with an HCA (a VM, a PCIe server) has no rail "
        "layout to miss.",
    ),
)


COUNTER_ACTION = (
    "Inspect the port: errors on the wire point at the cable or transceiver (reseat, then replace it) or "
    "the switch port; drain the node if they keep growing."
)
# Counters whose every increase is fatal (NVSentinel): (sysfs folder, counter).
FATAL_COUNTERS = (
    ("counters", "excessive_buffer_overrun_errors"),
    ("counters", "local_link_integrity_errors"),
    ("hw_counters", "rnr_nak_retry_err"),
)

SPECS: tuple[CheckSpec, ...] = (
    *_STATE_SPECS,
    CheckSpec(
        "fabric.link_downed", FAMILY, "An RDMA port's link went down and came back",
        reads="`/sys/class/infiniband/<dev>/ports/<n>/counters/link_downed`, two snapshots",
        threshold="link_downed grew by thresholds.fabric_link_downed_crit (1) or more on an active compute "
        "port (crit; an excluded port: warn); a port that is down now is fabric.port_down's. Sources: "
        + "; ".join((SRC_NVSENTINEL, SRC_GCM)),
        severities=("warn", "crit"),
        action=COUNTER_ACTION,
        not_a_fault="The counter accumulates from the driver's load (a node that has run for months shows "
        "a few): only its growth between two snapshots is judged.",
    ),
    CheckSpec(
        "fabric.error_counters", FAMILY, "RDMA error counters that must never grow",
        reads="`counters/excessive_buffer_overrun_errors`, `counters/local_link_integrity_errors`, "
        "`hw_counters/rnr_nak_retry_err`, two snapshots",
        threshold="any growth on a compute port (crit; an excluded port: warn). Sources: "
        + "; ".join((SRC_NVSENTINEL, SRC_GCM)),
        severities=("warn", "crit"),
        action=COUNTER_ACTION,
    ),
    CheckSpec(
        "fabric.link_errors", FAMILY, "Symbol errors and link error recoveries on an RDMA port",
        reads="`counters/symbol_error`, `counters/link_error_recovery`, two snapshots (collected_at)",
        threshold="symbol errors: more than thresholds.fabric_symbol_errors_per_hour_crit (120) within an "
        "hour (crit), above thresholds.fabric_symbol_errors_per_s_warn (10/s, warn); link error recoveries "
        "above thresholds.fabric_link_recoveries_per_min_warn (5/min, warn); an excluded port at most warn; "
        "over at least thresholds.rate_min_interval_s. Sources: " + "; ".join((SRC_NVSENTINEL, SRC_GCM)),
        severities=("warn", "crit"),
        action=COUNTER_ACTION,
    ),
)


SPECS = (
    *SPECS,
    CheckSpec(
        "fabric.flap", FAMILY, "An RDMA port that keeps going down and coming back",
        reads="the daemon's samples of each port's state, every tick, over its hour (fleetops-agent serve only)",
        threshold="thresholds.fabric_flap_count (3) times down for at least thresholds.fabric_flap_down_s "
        "(25 s) and back to ACTIVE, on a compute port (crit; an excluded port: warn). Source: " + SRC_GPUD
        + "; AzNHC (check_ib_link_flapping)",
        severities=("warn", "crit"),
        action=CABLE_ACTION.format(what="unstable") + " A port that flaps breaks the NCCL jobs that use it "
        "each time it falls: drain the node for the repair.",
        not_a_fault="A cold collect or an audit without the daemon has no samples between snapshots: "
        "flaps and drops are the daemon's alone.",
    ),
    CheckSpec(
        "fabric.drop", FAMILY, "An RDMA port that went down and stayed down",
        reads="the daemon's samples of each port's state and link_downed, every tick (fleetops-agent serve only)",
        threshold="down for at least thresholds.fabric_drop_down_s (240 s) with link_downed unchanged "
        "(it never trained again), reported until thresholds.fabric_drop_hold_s (600 s) after it came "
        "back; a compute port crit, an excluded port warn. Source: " + SRC_GPUD,
        severities=("warn", "crit"),
        action=CABLE_ACTION.format(what="down"),
    ),
)


@dataclass(frozen=True)
class Port:
    hca: model.Hca
    port: model.HcaPort
    compute: bool

    @property
    def label(self) -> str:
        extra = ", ".join(x for x in (self.port.netdev, self.hca.pci_address) if x)
        return f"{self.hca.name} port {self.port.port}" + (f" ({extra})" if extra else "")

    @property
    def id(self) -> str:
        """The port's identity in a finding (``Finding.port``): ``<device>/<port>``."""
        return f"{self.hca.name}/{self.port.port}"

    def ref(self) -> dict[str, object]:
        return {"device": self.hca.name, "port": self.port.port, "netdev": self.port.netdev,
                "pci_address": self.hca.pci_address, "link_layer": self.port.link_layer}


def node_model(node: model.Node) -> str | None:
    """The GPU model of the node (the name its GPUs share), whose ``gpu_models.*.fabric`` it
    takes; None on a node with GPUs of several models, or none named."""
    names = {g.name for g in node.gpus if g.name}
    return next(iter(names)) if len(names) == 1 else None


def wanted(baseline: Baseline, node: model.Node) -> FabricBaseline:
    """What the baseline asks of this node's fabric: its GPU model's ``gpu_models.*.fabric``
    keys over the group's ``fabric`` (``Baseline.fabric_for``)."""
    return baseline.fabric_for(node_model(node))


def _some_leave(baseline: Baseline | None, *keys: str) -> bool:
    """Whether the fleet's majority judges some node under ``baseline``: the group's fabric, or
    a model's, leaves every one of ``keys`` unset."""
    if baseline is None:
        return True
    variants = [baseline.fabric, *(baseline.fabric_for(name) for name, m in baseline.gpu_models.items()
                                   if m.fabric is not None)]
    return any(all(getattr(fb, k) is None for k in keys) for fb in variants)


def _excluded_by(baseline: Baseline | None, node: model.Node) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    if baseline is None:
        return None
    fb = wanted(baseline, node)
    if fb.exclude_devices is None and fb.exclude_link_layers is None:
        return None
    return fb.exclude_devices or (), fb.exclude_link_layers or ()


def ports(node: model.Node, baseline: Baseline | None) -> Iterator[Port]:
    """Every port of the node, with whether it is a compute port (see the module docstring)."""
    hcas = (node.fabric.hcas if node.fabric is not None else None) or []
    rule = _excluded_by(baseline, node)
    railed = any(h.gpus for h in hcas)
    for hca in hcas:
        for port in hca.ports:
            if rule is not None:
                devices, layers = rule
                compute = not any(fnmatch.fnmatchcase(hca.name, p) for p in devices) and port.link_layer not in layers
            elif railed:
                compute = bool(hca.gpus)
            else:
                compute = port.link_layer == "InfiniBand"
            yield Port(hca, port, compute)


def run(ctx: Context) -> None:
    fabric = ctx.node.fabric
    if fabric is None:
        return  # not collected (an older agent): nothing is known, nothing is claimed
    if fabric.hcas is None:
        ctx.unreadable(FAMILY, "hcas", fabric.unavailable.get("hcas", "not read"), "node")
        return
    all_ports = list(ports(ctx.node, ctx.baseline))
    for hca in fabric.hcas:
        if "ports" in hca.unavailable:
            ctx.unreadable(FAMILY, "ports", hca.unavailable["ports"], hca.name)
    _down(ctx, all_ports)
    _degraded(ctx, all_ports)
    _firmware(ctx, all_ports)
    _count(ctx, all_ports)
    _rails(ctx, fabric, all_ports)
    _counters(ctx, all_ports)


def _down(ctx: Context, all_ports: list[Port]) -> None:
    for p in all_ports:
        if p.port.state is None:
            ctx.unreadable(FAMILY, "state", p.port.unavailable.get("state", "not read"), p.label)
            continue
        if p.port.active:
            continue
        phys = p.port.phys_state or "unknown"
        severity = "crit" if p.compute else "warn"
        kind = "compute port" if p.compute else "port (not a compute port)"
        ctx.add("fabric.port_down", severity,
                f"{kind} {p.label} is {p.port.state} (phys_state {phys})",
                observed={**p.ref(), "state": p.port.state, "phys_state": p.port.phys_state},
                expected="4: ACTIVE", action=_down_action(phys), port=p.id)


def _down_action(phys: str) -> str:
    word = phys.split(":", 1)[-1].strip()
    if word == "Disabled":
        return ("The port is disabled: inspect its configuration (the switch port, the subnet manager, an "
                "administrator's ibportstate); enable it, then reseat or replace the cable if it stays down.")
    if word == "LinkUp":
        return ("The link is up but the port is not active: check the subnet manager (opensm/UFM) and the "
                "switch port; the cable is not the cause.")
    return CABLE_ACTION.format(what="down")


def _majority(values: list[Any]) -> Any:
    """The value a strict majority of at least SETTING_MIN_VOTERS values hold, else None."""
    counts = collections.Counter(v for v in values if v is not None)
    total = sum(counts.values())
    if total < SETTING_MIN_VOTERS or not counts:
        return None
    value, top = counts.most_common(1)[0]
    return value if top * 2 > total else None


def _width_n(width: str | None) -> int | None:
    return int(width[:-1]) if width and width[:-1].isdigit() else None


def _degraded(ctx: Context, all_ports: list[Port]) -> None:
    fb = wanted(ctx.baseline, ctx.node) if ctx.baseline is not None else None
    compute = [p for p in all_ports if p.compute and p.port.active]
    want_rate = fb.rate_gbps if fb is not None else None
    want_width = fb.width if fb is not None else None
    want_layer = fb.link_layer if fb is not None else None
    pinned = want_rate is not None or want_width is not None
    if want_rate is None and want_width is None:
        want_rate = _majority([p.port.rate_gbps for p in compute])
        want_width = _majority([p.port.width for p in compute])
    for p in compute:
        problems = []
        rate, width = p.port.rate_gbps, p.port.width
        if rate is None or width is None:
            ctx.unreadable(FAMILY, "rate", p.port.unavailable.get("rate_gbps") or p.port.unavailable.get(
                "width", "not read"), p.label)
        whose = "the baseline's" if pinned else "the node's other compute ports'"
        if rate is not None and want_rate is not None and rate < want_rate:
            problems.append(f"{rate:g} Gb/s below {whose} {want_rate:g} Gb/s")
        wn, wantn = _width_n(width), _width_n(want_width)
        if wn is not None and wantn is not None and wn < wantn:
            problems.append(f"width {width} below {whose} {want_width}")
        against_baseline = pinned and bool(problems)
        if want_layer is not None and p.port.link_layer is not None and p.port.link_layer != want_layer:
            problems.append(f"link layer {p.port.link_layer}, the baseline's is {want_layer}")
            against_baseline = True
        if not problems:
            continue
        # crit where the baseline says what the port must be; against its peers only, warn
        ctx.add("fabric.port_degraded", "crit" if against_baseline else "warn",
                f"compute port {p.label} at {p.port.rate}: " + "; ".join(problems),
                observed={**p.ref(), "rate": p.port.rate, "rate_gbps": rate, "width": width},
                expected={k: v for k, v in (("rate_gbps", want_rate), ("width", want_width),
                                            ("link_layer", want_layer)) if v is not None},
                action=DEGRADED_ACTION, port=p.id)


def _compute_hcas(all_ports: list[Port]) -> list[model.Hca]:
    seen: dict[str, model.Hca] = {}
    for p in all_ports:
        if p.compute:
            seen.setdefault(p.hca.name, p.hca)
    return list(seen.values())


def _firmware(ctx: Context, all_ports: list[Port]) -> None:
    want = wanted(ctx.baseline, ctx.node).firmware if ctx.baseline is not None else None
    if want is None:
        return  # the fleet's majority judges (run_fleet)
    for hca in _compute_hcas(all_ports):
        if hca.fw_ver is None:
            ctx.unreadable(FAMILY, "fw_ver", hca.unavailable.get("fw_ver", "not read"), hca.name)
            continue
        if hca.fw_ver != want:
            ctx.add("fabric.firmware", "warn",
                    f"HCA {hca.name} ({hca.pci_address or '?'}, {hca.board_id or '?'}) runs firmware "
                    f"{hca.fw_ver}, the baseline's is {want}",
                    observed={"device": hca.name, "pci_address": hca.pci_address, "board_id": hca.board_id,
                              "fw_ver": hca.fw_ver},
                    expected=want, action=FIRMWARE_ACTION.format(want=want), port=hca.name)


def _count(ctx: Context, all_ports: list[Port]) -> None:
    want = wanted(ctx.baseline, ctx.node).compute_ports if ctx.baseline is not None else None
    if want is None:
        return  # the fleet's majority judges (run_fleet)
    have = [p for p in all_ports if p.compute]
    if len(have) >= want:
        return
    active = sum(1 for p in have if p.port.active)
    note = f"; {ctx.node.fabric.note}" if ctx.node.fabric is not None and ctx.node.fabric.note else ""
    ctx.add("fabric.port_count", "crit",
            f"{len(have)} compute ports ({active} active), the baseline expects {want}{note}",
            observed={"compute_ports": len(have), "active": active, "ports": [p.label for p in have]},
            expected=want, action=COUNT_ACTION)


def _rails(ctx: Context, fabric: model.Fabric, all_ports: list[Port]) -> None:
    """GPUs behind a switch without a compute HCA, where the node pairs GPUs and HCAs."""
    hcas = _compute_hcas(all_ports)
    railed = {sw for h in hcas for bus in (h.gpus or []) if (sw := fabric.gpu_switches.get(bus)) is not None}
    if not railed:
        return
    for gpu in ctx.node.gpus:
        switch = fabric.gpu_switches.get(gpu.bus_id)
        if switch is None or switch in railed:
            continue
        ctx.add("fabric.gpu_without_hca", "warn",
                f"{gpu_label(gpu)}: no HCA on its PCIe switch ({switch}); the node's other GPUs each have one",
                gpu=gpu, observed={"switch": switch, "hcas": None},
                expected="a compute HCA on the same PCIe switch", action=MISSING_HCA_ACTION)


def _key(hca: model.Hca, port: model.HcaPort) -> tuple[str, int]:
    """A port across two snapshots: by the HCA's GUID (device names may be given out anew at a
    reboot), else its name."""
    return (hca.node_guid or hca.name, port.port)


def _interval(ctx: Context, prev_fabric: model.Fabric) -> float | None:
    """Seconds between the two reads of the ports: their own ``read_at`` where both say (the
    daemon's rate base is an older full snapshot), else the snapshots'."""
    now_fabric = ctx.node.fabric
    if now_fabric is None or now_fabric.read_at is None or prev_fabric.read_at is None:
        return ctx.interval_s()
    dt = float(now_fabric.read_at) - float(prev_fabric.read_at)
    return dt if dt >= max(ctx.th.rate_min_interval_s, 1e-9) else None


def _counters(ctx: Context, all_ports: list[Port]) -> None:
    prev_fabric = ctx.previous.fabric if ctx.previous is not None else None
    if prev_fabric is None or not prev_fabric.hcas:
        return  # totals alone say nothing: the counters accumulate for months
    dt = _interval(ctx, prev_fabric)
    if dt is None:
        return
    before = {_key(h, p): p for h in prev_fabric.hcas for p in h.ports}
    for p in all_ports:
        old = before.get(_key(p.hca, p.port))
        if old is None or not p.port.active:
            continue  # new port, or one that is down now (fabric.port_down's)

        def grown(group: str, name: str, port: Port = p, prev: model.HcaPort = old) -> int | None:
            now_v = (getattr(port.port, group) or {}).get(name)
            was = (getattr(prev, group) or {}).get(name)
            return ctx.growth(now_v, was)

        bad = "crit" if p.compute else "warn"
        downs = grown("counters", "link_downed")
        if downs is not None and downs >= ctx.th.fabric_link_downed_crit:
            ctx.add("fabric.link_downed", bad,
                    f"{p.label}: the link went down {downs} time(s) in {dt:.0f} s and came back",
                    observed={**p.ref(), "link_downed_growth": downs}, expected=f"< {ctx.th.fabric_link_downed_crit}",
                    action=COUNTER_ACTION, port=p.id)
        grew = {name: g for group, name in FATAL_COUNTERS if (g := grown(group, name))}
        if grew:
            ctx.add("fabric.error_counters", bad,
                    f"{p.label}: " + ", ".join(f"{n} +{g}" for n, g in grew.items()) + f" in {dt:.0f} s",
                    observed={**p.ref(), **grew}, expected=0, action=COUNTER_ACTION, port=p.id)
        _link_errors(ctx, p, dt, grown("counters", "symbol_error"), grown("counters", "link_error_recovery"))


def _link_errors(ctx: Context, p: Port, dt: float, symbols: int | None, recoveries: int | None) -> None:
    th = ctx.th
    problems, severity = [], None
    if symbols:
        if symbols > th.fabric_symbol_errors_per_hour_crit * max(1.0, dt / 3600.0):
            problems.append(f"{symbols} symbol errors in {dt:.0f} s (more than "
                            f"{th.fabric_symbol_errors_per_hour_crit:g} within an hour)")
            severity = "crit"
        elif symbols / dt > th.fabric_symbol_errors_per_s_warn:
            problems.append(f"{symbols / dt:.1f} symbol errors/s")
            severity = "warn"
    if recoveries and recoveries / dt * 60.0 > th.fabric_link_recoveries_per_min_warn:
        problems.append(f"{recoveries / dt * 60.0:.1f} link error recoveries/min")
        severity = severity or "warn"
    if severity is None:
        return
    if not p.compute:
        severity = "warn"
    ctx.add("fabric.link_errors", severity, f"{p.label}: " + "; ".join(problems),
            observed={**p.ref(), "symbol_error_growth": symbols, "link_error_recovery_growth": recoveries,
                      "interval_s": round(dt, 1)},
            expected={"symbol_errors_per_s": f"<= {th.fabric_symbol_errors_per_s_warn:g}",
                      "symbol_errors_per_hour": f"<= {th.fabric_symbol_errors_per_hour_crit:g}",
                      "link_recoveries_per_min": f"<= {th.fabric_link_recoveries_per_min_warn:g}"},
            action=COUNTER_ACTION, port=p.id)


# --- across the fleet ------------------------------------------------------------------------


def port_count_findings(items: list[Item]) -> list[model.Finding]:
    """``fabric.port_count`` without a number in the baseline: each node (``Item(node, its
    compute ports)``, the nodes judged under one baseline) with fewer compute ports than a strict
    majority of them have (at least SETTING_MIN_VOTERS nodes). The audit's fleet check and the
    TUI's FABRIC column both ask this, so a node short of an HCA reads the same in both."""
    found = setting_majority(items)
    if found is None:
        return []
    majority, counts = found
    return [
        model.Finding(
            check="fabric.port_count", severity="warn", node=i.node,
            message=f"{i.value} compute ports on {i.node}, the fleet's majority has {majority} "
            f"({counts[majority]} of {len(items)} nodes)",
            observed={"compute_ports": i.value}, expected=majority, action=COUNT_ACTION)
        for i in items if i.value is not None and i.value < majority
    ]


def fleet_counts_ports(baseline: Baseline | None, node: model.Node) -> bool:
    """Whether the fleet's majority, not the baseline, says how many compute ports ``node``
    should have (neither its model's fabric key nor the group's gives a number)."""
    return baseline is None or wanted(baseline, node).compute_ports is None


def _unpinned(baseline: Baseline | None, node: model.Node, *keys: str) -> bool:
    if baseline is None:
        return True
    fb = wanted(baseline, node)
    return all(getattr(fb, k) is None for k in keys)


def run_fleet(nodes: list[model.Node], baseline: Baseline | None) -> list[model.Finding]:
    """What the baseline does not pin, against the fleet's strict majority: each node's number of
    compute ports, its compute ports' usual rate, and each compute HCA's firmware per board_id.
    A node whose baseline (its GPU model's fabric key, or the group's) pins a value is judged by
    the node check for it and neither votes nor is judged here."""
    out: list[model.Finding] = []
    known = [n for n in nodes if n.fabric is not None and n.fabric.hcas is not None]
    per_node = {n.hostname: list(ports(n, baseline)) for n in known}
    counted = [n for n in known if fleet_counts_ports(baseline, n)]
    if counted:
        out += port_count_findings([Item(n.hostname, sum(1 for p in per_node[n.hostname] if p.compute))
                                    for n in counted])
    rated = [n for n in known if _unpinned(baseline, n, "rate_gbps", "width")]
    if rated:
        rates = [Item(n.hostname, _majority([p.port.rate_gbps for p in per_node[n.hostname]
                                             if p.compute and p.port.active])) for n in rated]
        found = setting_majority(rates)
        if found is not None:
            majority, counts = found
            for i in rates:
                if i.value is not None and i.value < majority:
                    out.append(model.Finding(
                        check="fabric.port_degraded", severity="warn", node=i.node,
                        message=f"the compute ports of {i.node} run at {i.value:g} Gb/s, the fleet's majority "
                        f"at {majority:g} Gb/s ({counts[majority]} of {len(rates)} nodes)",
                        observed={"rate_gbps": i.value}, expected={"rate_gbps": majority},
                        action=DEGRADED_ACTION))
    versioned = [n for n in known if _unpinned(baseline, n, "firmware")]
    if versioned:
        by_board: dict[str | None, list[Item]] = collections.defaultdict(list)
        where: dict[int, model.Hca] = {}
        for n in versioned:
            for hca in _compute_hcas(per_node[n.hostname]):
                item = Item(n.hostname, hca.fw_ver)
                where[id(item)] = hca
                by_board[hca.board_id].append(item)
        for board, items in by_board.items():
            found = setting_majority(items)
            if found is None:
                continue
            majority, counts = found
            for i in items:
                if i.value is None or i.value == majority:
                    continue
                hca = where[id(i)]
                out.append(model.Finding(
                    check="fabric.firmware", severity="warn", node=i.node,
                    message=f"HCA {hca.name} ({hca.pci_address or '?'}, {board or '?'}) on {i.node} runs firmware "
                    f"{i.value}; the fleet's majority of {board or 'these'} HCAs runs {majority} "
                    f"({counts[majority]} of {len(items)})",
                    observed={"device": hca.name, "pci_address": hca.pci_address, "board_id": board,
                              "fw_ver": i.value},
                    expected=majority, action=FIRMWARE_ACTION.format(want=majority), port=hca.name))
    return out


# --- from the daemon's per-tick samples ------------------------------------------------------

# (epoch seconds, ACTIVE or not, link_downed) of one port at one tick
Sample = tuple[float, "bool | None", "int | None"]


@dataclass(frozen=True)
class DownRun:
    """One stretch with the port not ACTIVE: from the first sample that saw it down to the first
    that saw it ACTIVE again (``up_at`` None: still down at the last sample)."""

    since: float
    up_at: float | None
    downed_changed: bool  # link_downed moved while it was down: it trained and fell again


def down_runs(samples: list[Sample]) -> list[DownRun]:
    """The down stretches of a port's samples (every tick's, or only the ticks that changed)."""
    runs: list[DownRun] = []
    since: float | None = None
    first_downed: int | None = None
    changed = False
    for t, active, downed in samples:
        if active is None:
            continue  # unread: neither up nor down
        if not active:
            if since is None:
                since, first_downed, changed = t, downed, False
            elif first_downed is None:
                first_downed = downed
            elif downed is not None and downed != first_downed:
                changed = True
        elif since is not None:
            runs.append(DownRun(since, t, changed))
            since = None
    if since is not None:
        runs.append(DownRun(since, None, changed))
    return runs


def history_findings(
    host: str, samples: dict[str, list[Sample]], compute: set[str], labels: dict[str, dict[str, object]],
    now: float, th: Thresholds,
) -> list[model.Finding]:
    """Flaps and drops (gpud's definitions, thresholds configurable) from the daemon's samples of
    each port (``"<dev>/<port>"``); ``compute``: the ports that are compute ports; ``labels``: each
    port's device, port, netdev and PCI function for the finding."""
    out: list[model.Finding] = []
    for key, series in sorted(samples.items()):
        runs = down_runs(series)
        severity = "crit" if key in compute else "warn"
        ref = labels.get(key) or {"device": key.split("/")[0], "port": int(key.split("/")[1])}
        where = f"{ref['device']} port {ref['port']}"
        flaps = [r for r in runs if r.up_at is not None and r.up_at - r.since >= th.fabric_flap_down_s]
        if len(flaps) >= th.fabric_flap_count:
            out.append(model.Finding(
                check="fabric.flap", severity=severity, node=host,
                message=f"{where} went down for {th.fabric_flap_down_s:g} s or more and came back "
                f"{len(flaps)} times since {_clock(flaps[0].since)}",
                observed={**ref, "flaps": len(flaps), "first": flaps[0].since, "last_up": flaps[-1].up_at},
                expected=f"< {th.fabric_flap_count} flaps", action=SPECS_BY_ID["fabric.flap"].action,
                port=key))
        drops = [r for r in runs if not r.downed_changed
                 and ((r.up_at is None and now - r.since >= th.fabric_drop_down_s)
                      or (r.up_at is not None and r.up_at - r.since >= th.fabric_drop_down_s
                          and now - r.up_at <= th.fabric_drop_hold_s))]
        if drops:
            drop = drops[-1]
            state = "still down" if drop.up_at is None else f"back since {_clock(drop.up_at)}"
            out.append(model.Finding(
                check="fabric.drop", severity=severity, node=host,
                message=f"{where} went down at {_clock(drop.since)} and did not train again for "
                f"{((drop.up_at or now) - drop.since):.0f} s ({state})",
                observed={**ref, "down_since": drop.since, "up_at": drop.up_at},
                expected=f"down less than {th.fabric_drop_down_s:g} s",
                action=SPECS_BY_ID["fabric.drop"].action, port=key))
    return out


def _clock(epoch: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.gmtime(epoch)) + " UTC"


def port_labels(node: model.Node, baseline: Baseline | None) -> tuple[set[str], dict[str, dict[str, object]]]:
    """(the compute ports, each port's reference) by ``"<dev>/<port>"``, from a full snapshot."""
    compute: set[str] = set()
    refs: dict[str, dict[str, object]] = {}
    for p in ports(node, baseline):
        key = f"{p.hca.name}/{p.port.port}"
        refs[key] = p.ref()
        if p.compute:
            compute.add(key)
    return compute, refs


SPECS_BY_ID = {spec.id: spec for spec in SPECS}
