"""The node-pair RDMA bandwidth test of ``fleetops validate --level full``, its pure parts: which
nodes take part and which rails each has (``node_rails``, from the ``rdma`` section of each
node's validate answer and its baseline), how the nodes pair up (``plan``), which rails a pair
measures (``pair_rails``), and the judgement of the figures (``judge_pairs``) against the floor
(``floors.rail_floor``) and the fleet's other rails (the median/MAD rule of ``judge``).

A node without an RDMA device, without a compute port, or without perftest takes no part: the
test is not applicable there, never failed. The SSH side (server on one node, client on the
other) is ``validation/cli.py``'s.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetops import codec, model
from fleetops.checks import fabric as fabric_checks
from fleetops.validation import floors as floors_mod
from fleetops.validation.judge import STRAGGLER_K, STRAGGLER_PCT, Peers, against, worse

METRIC = floors_mod.IB_WRITE_BW
CABLE_ACTION = ("inspect rail {rail} between {a} and {b}: its cables and transceivers at both nodes and the "
                "switch ports they land on (mlxlink -d {rail} shows each lane), reseat or swap the cable, then the "
                "transceiver; then run fleetops validate --level full again")
PLACEMENT_ACTION = ("GPUDirect RDMA was off on rail {rail} ({why}): the figure went through host memory; check the "
                    "HCA/GPU placement (a GPU behind {rail}'s PCIe switch) and load nvidia_peermem (or use dma-buf), "
                    "then measure again; if it stays low, " + CABLE_ACTION)


@dataclass(frozen=True)
class RailEnd:
    device: str
    active: bool
    state: str | None
    rate_gbps: float | None


@dataclass
class NodeRails:
    """One node as the pair test sees it: its compute rails by device, the rate its baseline
    wants of them (None: the fleet's usual rate decides), its GPU model, or why it takes no part."""

    host: str
    rails: dict[str, RailEnd] = field(default_factory=dict)
    wanted_rate_gbps: float | None = None
    model: str | None = None
    not_applicable: str | None = None
    error: str | None = None


def node_rails(host: str, doc: Mapping[str, Any] | None, baseline: Any) -> NodeRails:
    """The compute rails of one node from its validate answer (``rdma``), by the same rule as
    the fabric checks (``checks.fabric.ports``: the baseline's exclusions, else the HCAs beside
    a GPU, else the InfiniBand ports)."""
    out = NodeRails(host)
    rdma = (doc or {}).get("rdma")
    names = {g.get("name") for g in (doc or {}).get("gpus") or [] if g.get("name")}
    out.model = str(next(iter(names))) if len(names) == 1 else None
    if not isinstance(rdma, Mapping):
        out.not_applicable = "the agent sent no rdma section (an agent older than the pair test)"
        return out
    if "error" in rdma:
        out.error = f"could not read its RDMA devices: {rdma['error']}"
        return out
    if "not_applicable" in rdma:
        out.not_applicable = str(rdma["not_applicable"])
        return out
    try:
        fabric = codec.build(model.Fabric, rdma.get("fabric"), "rdma.fabric")
    except codec.SchemaError as exc:
        out.error = f"rdma section not understood: {exc}"
        return out
    bus = {int(g["index"]): str(g["bus_id"]) for g in rdma.get("gpus") or []}
    node = model.Node(hostname=host, fabric=fabric,
                      gpus=[model.Gpu(index=i, uuid=f"gpu-{i}", bus_id=b, name=out.model) for i, b in bus.items()])
    for p in fabric_checks.ports(node, baseline):
        if p.compute and p.hca.name not in out.rails:
            out.rails[p.hca.name] = RailEnd(p.hca.name, p.port.active, p.port.state, p.port.rate_gbps)
    if not out.rails:
        out.not_applicable = "no compute port (its RDMA ports are management ports)"
        return out
    if baseline is not None:
        out.wanted_rate_gbps = fabric_checks.wanted(baseline, node).rate_gbps
    return out


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class Pair:
    """``client`` measures against ``server``; ``again``: the odd node out, paired with a node
    already measured in the first round."""

    client: str
    server: str
    again: bool = False

    @property
    def label(self) -> str:
        return f"{self.client}->{self.server}"


def plan(hosts: Sequence[str]) -> list[Pair]:
    """Pairs in name order: (1st, 2nd), (3rd, 4th), ...; an odd last node is paired with the
    first, which is then measured twice (``again``). One node alone: no pair."""
    names = sorted(hosts, key=_natural)
    pairs = [Pair(names[i], names[i + 1]) for i in range(0, len(names) - 1, 2)]
    if len(names) % 2 == 1 and len(names) > 1:
        pairs.append(Pair(names[-1], names[0], again=True))
    return pairs


def pair_rails(a: NodeRails, b: NodeRails) -> tuple[list[str], dict[str, str], list[str]]:
    """(rails both ends have up, rail -> why it failed without a run (a port not active), notes
    on rails only one end has)."""
    common = sorted(set(a.rails) & set(b.rails), key=_natural)
    run: list[str] = []
    failed: dict[str, str] = {}
    for rail in common:
        down = [f"port {rail}/1 on {n.host} is {n.rails[rail].state or 'not active'}"
                for n in (a, b) if not n.rails[rail].active]
        if down:
            failed[rail] = "; ".join(down) + ": not measured"
        else:
            run.append(rail)
    notes = [f"{rail}: a compute rail of {n.host} only; not measured" for n, o in ((a, b), (b, a))
             for rail in sorted(set(n.rails) - set(o.rails), key=_natural)]
    return run, failed, notes


def usual_rate(nodes: Sequence[NodeRails]) -> float | None:
    """The rate most of the fleet's compute rails run at: what a rail should train at where no
    baseline says (a degraded rail is the few, not the many)."""
    rates = collections.Counter(r.rate_gbps for n in nodes for r in n.rails.values()
                                if r.active and r.rate_gbps)
    return max(rates.items(), key=lambda kv: (kv[1], kv[0]))[0] if rates else None


@dataclass(frozen=True)
class RailVerdict:
    client: str
    server: str
    rail: str
    status: str  # ok | warn | crit | unknown
    value: float | None
    floor: float | None
    memory: str | None
    reason: str
    action: str | None


@dataclass
class PairVerdict:
    client: str
    server: str
    again: bool = False
    status: str = "ok"
    rails: list[RailVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client, "server": self.server, "again": self.again, "status": self.status,
            "findings": [v.__dict__ for v in self.rails if v.status != "ok"],
            "figures": {v.rail: v.value for v in self.rails if v.value is not None},
            "memory": {v.rail: v.memory for v in self.rails if v.memory is not None},
            "notes": list(self.notes),
        }


def _memory(entry: Mapping[str, Any]) -> str:
    return "GPUDirect" if entry.get("memory") == "cuda" else "host"


def judge_pairs(
    results: Sequence[Mapping[str, Any]],
    overrides: Mapping[str, Mapping[str, float]] | None,
    k: float = STRAGGLER_K,
    pct: float = STRAGGLER_PCT,
) -> list[PairVerdict]:
    """Judge measured pairs ``{"client", "server", "again", "model", "rate_gbps", "floors", "rails":
    {rail: {"gbps" | "failed" | "error", "memory", "memory_note"}}, "notes"}``: a rail below its
    floor is crit, one below the fleet's rails of the same rate and memory kind by more than
    max(k x MAD, pct x median) a straggler (warn), a failed one (a port down) crit, one that did
    not run unknown. ``floors``: the client's baseline's ``validation.floors`` (else ``overrides``)."""
    peers: dict[tuple[float | None, str], Peers] = {}
    for r in results:
        for entry in (r.get("rails") or {}).values():
            if isinstance(entry.get("gbps"), (int, float)):
                peers.setdefault((r.get("rate_gbps"), _memory(entry)), Peers()).add(float(entry["gbps"]))
    out: list[PairVerdict] = []
    for r in results:
        a, b = str(r["client"]), str(r["server"])
        pv = PairVerdict(a, b, bool(r.get("again")), notes=list(r.get("notes") or []))
        rate = r.get("rate_gbps")
        over = r.get("floors") if r.get("floors") is not None else overrides
        fl = floors_mod.floors_for(r.get("model"), {m: dict(v) for m, v in (over or {}).items()})
        at_ref = fl.ib_write_bw_gbps if fl is not None else floors_mod.IB_FLOOR_GBPS
        floor = floors_mod.rail_floor(at_ref, float(rate)) if rate else None
        if floor is None:
            pv.notes.append("no rail rate known (no baseline fabric.rate_gbps, no rail up): judged against peers only")
        for rail, entry in sorted((r.get("rails") or {}).items(), key=lambda kv: _natural(kv[0])):
            memory = _memory(entry) if "memory" in entry else None
            cable = CABLE_ACTION.format(rail=rail, a=a, b=b)
            if "failed" in entry:
                v = RailVerdict(a, b, rail, "crit", None, floor, memory, str(entry["failed"]), cable)
            elif not isinstance(entry.get("gbps"), (int, float)):
                v = RailVerdict(a, b, rail, "unknown", None, floor, memory,
                                f"did not run: {entry.get('error', 'no figure')}", None)
            else:
                value = float(entry["gbps"])
                stat = {"median": value, "min": value, "max": value}
                model_name = fl.model if fl is not None else "rail"
                jv = against(a, rail, METRIC, stat, floor, f"{model_name} {rate:g} Gb/s rail" if rate else model_name,
                              peers.get((rate, _memory(entry)), Peers()), k, pct)
                action = None
                if jv.status != "ok":
                    action = cable if memory == "GPUDirect" else PLACEMENT_ACTION.format(
                        rail=rail, a=a, b=b, why=entry.get("memory_note") or "host memory")
                v = RailVerdict(a, b, rail, jv.status, value, floor, memory,
                                f"{jv.reason} ({memory} memory)" if jv.reason else "", action)
            pv.rails.append(v)
            pv.status = worse(pv.status, v.status)
        if r.get("error"):
            pv.status = worse(pv.status, "unknown")
            pv.notes.append(str(r["error"]))
        out.append(pv)
    return out
