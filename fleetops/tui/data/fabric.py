"""The node's RDMA fabric as the TUI shows it: the nodes view's FABRIC cell (compute ports active
/ expected) and the node screen's Fabric tab (one row per port, the fields the agent could not
read with their reasons). Which port is a compute port is the checks' rule
(``checks.fabric.ports``, with the node's baseline), never a second copy of it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from fleetops import model
from fleetops.checks import fabric as fabric_checks
from fleetops.checks.base import Item
from fleetops.tui.data.columns import DETAIL_FABRIC_COLUMNS, FAULT_SEVERITIES, Row, make_row

# The counters the tab shows on their own, and the fatal ones (the checks' list) in one cell.
KEY_COUNTERS = (
    ("downed", "link_downed"),
    ("symbol", "symbol_error"),
    ("recovery", "link_error_recovery"),
    ("rcverr", "port_rcv_errors"),
)
SHOWN_COUNTERS = (*(("counters", name) for _, name in KEY_COUNTERS), *fabric_checks.FATAL_COUNTERS)
# Which port cells a fabric finding is about, so the value at fault is coloured.
_FINDING_CELLS = {
    "fabric.port_down": ("state",),
    "fabric.drop": ("state",),
    "fabric.flap": ("state", "downed"),
    "fabric.port_degraded": ("rate",),
    "fabric.link_downed": ("downed",),
    "fabric.link_errors": ("symbol", "recovery"),
    "fabric.error_counters": ("fatal",),
    "fabric.firmware": ("fw",),
}
_LAYER = {"InfiniBand": "IB", "Ethernet": "Eth"}


@dataclass(frozen=True)
class PortView:
    """One RDMA port with its HCA and whether the checks count it as a compute port."""

    hca: model.Hca
    port: model.HcaPort
    compute: bool

    @property
    def key(self) -> str:
        return f"{self.hca.name}/{self.port.port}"


@dataclass(frozen=True)
class FabricView:
    """What the node's snapshot says of its fabric: ``known`` False when it has no fabric
    section (an agent older than it), ``readable`` False when the device class could not be
    listed (``note`` says why); ``ports`` every port, compute ones marked."""

    known: bool
    readable: bool = True
    ports: tuple[PortView, ...] = ()
    note: str | None = None
    hcas: tuple[model.Hca, ...] = ()
    # The baseline the node is judged under (the audit compares each node's port count with the
    # nodes of the same baseline) and whether it leaves the count to the fleet's majority.
    baseline: Any = field(default=None, compare=False, repr=False)
    fleet_counts: bool = True

    @cached_property
    def compute(self) -> tuple[PortView, ...]:
        # once per snapshot: the fleet's port count asks every node's after each change
        return tuple(p for p in self.ports if p.compute)

    @property
    def active(self) -> int:
        return sum(1 for p in self.compute if p.port.active)


UNKNOWN = FabricView(known=False, note="the snapshot has no fabric section (an agent older than the fabric)")


def view(snapshot: model.Node | None, baseline: Any = None) -> FabricView:
    if snapshot is None or snapshot.fabric is None:
        return UNKNOWN
    fabric = snapshot.fabric
    if fabric.hcas is None:
        return FabricView(known=True, readable=False, note=fabric.unavailable.get("hcas", "not read"))
    ports = tuple(PortView(p.hca, p.port, p.compute) for p in fabric_checks.ports(snapshot, baseline))
    return FabricView(known=True, ports=ports, note=fabric.note, hcas=tuple(fabric.hcas), baseline=baseline,
                      fleet_counts=fabric_checks.fleet_counts_ports(baseline, snapshot))


def fleet_port_counts(entries: Iterable[tuple[str, FabricView]]) -> dict[str, tuple[model.Finding, ...]]:
    """The audit's fleet check of the compute port count (``checks.fabric.port_count_findings``)
    over the nodes on screen, ``(name, fabric)`` each, grouped by baseline as the audit groups
    them: the ``fabric.port_count`` findings by node. Without it a node missing an HCA read
    ``IB 7/7`` (its ports there) where the audit says 7 of the fleet's 8."""
    groups: dict[int, list[Item]] = {}
    for name, fv in entries:
        if fv.known and fv.readable and fv.fleet_counts:
            groups.setdefault(id(fv.baseline), []).append(Item(name, len(fv.compute)))
    out: dict[str, tuple[model.Finding, ...]] = {}
    for items in groups.values():
        for f in fabric_checks.port_count_findings(items):
            out[f.node] = (*out.get(f.node, ()), f)
    return out


def fabric_findings(findings: Iterable[model.Finding]) -> tuple[model.Finding, ...]:
    return tuple(f for f in findings if f.check.startswith(fabric_checks.FAMILY + "."))


def expected_ports(fv: FabricView, findings: Iterable[model.Finding]) -> int:
    """The compute ports the node should have: those present, or more where ``fabric.port_count``
    says so (the baseline's number, or the fleet's majority)."""
    want = len(fv.compute)
    for f in findings:
        if f.check == "fabric.port_count" and isinstance(f.expected, int) and not isinstance(f.expected, bool):
            want = max(want, f.expected)
    return want


def node_cell(fv: FabricView, findings: Iterable[model.Finding]) -> tuple[str, str, Any]:
    """The nodes view's FABRIC cell: (text, style, sort value); the sort puts the node short of
    the most ports first, as the GPUS column does."""
    if not fv.known:
        return "-", "dim", (1, 0)
    if not fv.readable:
        return "n/a", "unknown", (0, 0)
    found = fabric_findings(findings)
    compute = fv.compute
    want = expected_ports(fv, found)
    if not want:
        return "none", "dim", (1, 0)
    layers = {p.port.link_layer for p in compute}
    prefix = "IB" if layers == {"InfiniBand"} else "RoCE" if layers == {"Ethernet"} else "RDMA"
    active = fv.active
    worst = model.worst(f.severity for f in found)
    style = "crit" if active < want else (worst if worst in FAULT_SEVERITIES else "")
    return f"{prefix} {active}/{want}", style, (active - want, active)


# --- the Fabric tab ---------------------------------------------------------------------


def _word(text: str | None) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    return (text or "").split(":", 1)[-1].strip()


def _state(p: PortView) -> str:
    port = p.port
    if port.state is None:
        return "n/a"
    text = _word(port.state)
    phys = _word(port.phys_state) if port.phys_state is not None else "n/a"
    return text if phys == "LinkUp" else f"{text} {phys}"


def _rate(port: model.HcaPort) -> str:
    layer = _LAYER.get(port.link_layer or "", port.link_layer or "n/a")
    if port.rate_gbps is None:
        return f"n/a {layer}"
    return f"{port.rate_gbps:g}G {port.width or 'n/a'} {layer}"


def _counter(port: model.HcaPort, group: str, name: str) -> str:
    value = (getattr(port, group) or {}).get(name)
    return "n/a" if value is None else str(value)


def _gpus(hca: model.Hca, by_bus: dict[str, model.Gpu]) -> str:
    if hca.gpus is None:
        return "n/a"
    if not hca.gpus:
        return "-"
    shown = []
    for bus in hca.gpus:
        gpu = by_bus.get(bus)
        shown.append(f"{gpu.index if gpu is not None else '?'} {bus}")
    return ", ".join(shown)


def _about(f: model.Finding) -> tuple[str, int] | None:
    obs = f.observed if isinstance(f.observed, dict) else {}
    device, port = obs.get("device"), obs.get("port")
    if isinstance(device, str) and isinstance(port, int):
        return device, port
    return None


def port_rows(snapshot: model.Node | None, fv: FabricView, findings: Iterable[model.Finding]) -> list[Row]:
    """One row per port, keyed ``<dev>/<port>``; a value that could not be read is ``n/a`` (its
    reason is in ``unavailable_lines``), never 0; the cells a fabric finding is about take its
    severity's colour."""
    by_bus = {g.bus_id: g for g in snapshot.gpus} if snapshot is not None else {}
    styles: dict[tuple[str, int], dict[str, str]] = {}
    for f in fabric_findings(findings):
        where = _about(f)
        if where is None or f.severity not in FAULT_SEVERITIES:
            continue
        marked = styles.setdefault(where, {})
        for col in _FINDING_CELLS.get(f.check, ()):
            marked[col] = model.worst([marked.get(col, "ok"), f.severity])
    rows = []
    for p in fv.ports:
        hca, port = p.hca, p.port
        lit = styles.get((hca.name, port.port), {})
        fatal = "/".join(_counter(port, group, name) for group, name in fabric_checks.FATAL_COUNTERS)
        down_style = "crit" if p.compute else "warn"
        cells: dict[str, tuple[str, str, Any]] = {
            "port": (p.key, "", (hca.name, port.port)),
            "role": ("compute" if p.compute else "mgmt", "" if p.compute else "dim", not p.compute),
            "state": (_state(p), lit.get("state") or ("" if port.active else down_style), port.active),
            "rate": (_rate(port), lit.get("rate", ""), port.rate_gbps or 0.0),
            "gpus": (_gpus(hca, by_bus), "", tuple(hca.gpus or ())),
            "fatal": (fatal, lit.get("fatal", ""), fatal),
            "netdev": (port.netdev or "n/a", "", port.netdev or ""),
            "pci": (hca.pci_address or "n/a", "", hca.pci_address or ""),
            "numa": ("n/a" if hca.numa_node is None else str(hca.numa_node), "", hca.numa_node or -1),
            "fw": (hca.fw_ver or "n/a", lit.get("fw", ""), hca.fw_ver or ""),
        }
        for key, name in KEY_COUNTERS:
            value = (port.counters or {}).get(name)
            cells[key] = ("n/a" if value is None else str(value), lit.get(key, ""), -1 if value is None else value)
        for key, (text, style, sort) in list(cells.items()):
            if text == "n/a" or text.startswith("n/a "):
                cells[key] = (text, style or "unknown", sort)
        fault = bool(lit) or not port.active
        hay = " ".join([p.key, port.netdev or "", hca.pci_address or ""]).lower()
        rows.append(make_row(p.key, cells, DETAIL_FABRIC_COLUMNS, fault, hay, snapshot.hostname if snapshot else ""))
    return rows


def unavailable_lines(fv: FabricView) -> list[str]:
    """``mlx5_3 port 1 rate: missing``: every field the agent could not read, with the reason."""
    lines = []
    for hca in fv.hcas:
        lines += [f"{hca.name} {name}: {why}" for name, why in sorted(hca.unavailable.items())]
        for port in hca.ports:
            why = dict(port.unavailable)
            for group, name in SHOWN_COUNTERS:  # a counter the driver does not list at all
                if group not in why and f"{group}.{name}" not in why and name not in (getattr(port, group) or {}):
                    why[f"{group}.{name}"] = "not in sysfs (the driver does not provide it)"
            lines += [f"{hca.name} port {port.port} {name}: {text}" for name, text in sorted(why.items())]
    return lines
