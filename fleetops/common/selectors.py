"""The one rule for naming a GPU, for every front end and for the agent.

A GPU is named by its UUID (``GPU-...``) or its PCI bus id (any spelling
``model.normalize_bus_id`` knows); an index is accepted as operator input but is only ever
*resolved*: against a fresh snapshot, to the UUID and bus id that the front end shows before
anything acts. Indices move when a GPU falls off the bus, so nothing is ever sent to a node by
index alone.

Light on purpose (only ``fleetops.model``): the agent's cold path imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetops import model
from fleetops.common.errors import UsageError

UUID = "uuid"
BUS_ID = "bus_id"
INDEX = "index"


class SelectorError(UsageError):
    """A GPU selector that names no GPU, or names one in a form this rule does not take."""


@dataclass(frozen=True)
class Selector:
    text: str  # as the operator wrote it
    form: str  # UUID | BUS_ID | INDEX
    uuid: str | None = None
    bus_id: str | None = None  # normalized
    index: int | None = None


def parse(text: str) -> Selector:
    """UUID, bus id (normalized) or index; anything else is a SelectorError that says which forms
    are taken."""
    raw = (text or "").strip()
    if not raw:
        raise SelectorError("GPU selector is empty: give the GPU's UUID (GPU-...), PCI bus id or index")
    if raw.upper().startswith("MIG-"):
        raise SelectorError(f"GPU {raw!r}: a MIG device, not a GPU (MIG instances are reset with `mig reset`)")
    if raw.upper().startswith("GPU-"):
        return Selector(raw, UUID, uuid=raw)
    if raw.isdigit():
        return Selector(raw, INDEX, index=int(raw))
    try:
        return Selector(raw, BUS_ID, bus_id=model.normalize_bus_id(raw))
    except ValueError:
        raise SelectorError(
            f"GPU {raw!r}: not a UUID (GPU-...), a PCI bus id (0000:18:00.0) or an index"
        ) from None


def present(node: model.Node) -> str:
    """The node's GPUs as ``index=UUID@bus``: what an error shows so the operator can pick."""
    return ", ".join(f"{g.index}={g.uuid}@{g.bus_id}" for g in node.gpus) or "none"


@dataclass(frozen=True)
class ResolvedGpu:
    """A selector resolved against a fresh snapshot: what the front end shows and the agent gets.

    ``enumerated`` is False for a GPU that answers nothing: one NVML lists as lost (fallen off
    the bus: it keeps its index and answers GpuIsLost), or a UUID or bus id the driver does not
    list now (never for an index). It is still sent, so the agent can say why and what to do."""

    selector: Selector
    uuid: str | None
    bus_id: str | None
    index: int | None = None
    name: str | None = None
    enumerated: bool = True
    processes: tuple[model.GpuProcess, ...] | None = field(default=None)  # None: not reported

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes or ())

    def label(self) -> str:
        """``UUID at BUS (GPU i, name)``, as the confirmation shows it."""
        text = str(self.uuid or self.bus_id or self.selector.text)
        if self.uuid and self.bus_id:
            text += f" at {self.bus_id}"
        if self.index is not None:
            text += f" (GPU {self.index}, {self.name or 'unnamed'})"
        return text


def find(node: model.Node, sel: Selector) -> model.Gpu | None:
    if sel.form == UUID:
        return node.gpu_by_uuid(sel.uuid or "")
    if sel.form == BUS_ID:
        return node.gpu_by_bus_id(sel.bus_id or "")
    return next((g for g in node.gpus if g.index == sel.index), None)


def fallen_off(node: model.Node) -> list[str]:
    """Bus ids the kernel logged Xid 79 (fallen off the bus) for that no listed GPU holds: GPUs
    the driver no longer lists at all, which only their bus id can still name."""
    listed = {g.bus_id for g in node.gpus}
    return sorted({x.bus_id for x in node.xids if x.code == 79 and x.bus_id and x.bus_id not in listed})


def resolve(sel: Selector | str, node: model.Node, host: str, *, allow_absent: bool = True) -> ResolvedGpu:
    """The GPU ``sel`` names on ``node`` (a fresh snapshot of ``host``).

    A selector that names no GPU the snapshot lists is the same usage error whatever its form
    (index, UUID, bus id), naming the host and listing the GPUs present: sending it would only
    have the agent say so, later and as a refusal. The one exception, with ``allow_absent``: a
    bus id the kernel logged Xid 79 for and the driver no longer lists. It goes to the agent
    (marked not enumerated), which says why it cannot be reset and what to do instead."""
    if isinstance(sel, str):
        sel = parse(sel)
    gpu = find(node, sel)
    if gpu is not None:
        procs = tuple(gpu.processes) if gpu.processes is not None else None
        return ResolvedGpu(sel, gpu.uuid, gpu.bus_id, gpu.index, gpu.name, not model.gpu_lost(gpu), procs)
    lost = fallen_off(node)
    if allow_absent and sel.form == BUS_ID and sel.bus_id in lost:
        return ResolvedGpu(sel, None, sel.bus_id, None, None, False, None)
    what = {INDEX: "index", UUID: "UUID", BUS_ID: "bus id"}[sel.form]
    text = f"{host} has no GPU with {what} {sel.text} (present: {present(node)})"
    if lost:
        text += f"; Xid 79 (fallen off the bus) was logged for {', '.join(lost)}: name it by that bus id"
    raise SelectorError(text)


def parse_identity(text: str, flag: str = "--gpu") -> Selector:
    """A selector that names a GPU by identity (UUID or bus id), as every node-side change
    takes it: an index is refused here, because on the node nothing shows the operator which
    GPU it resolved to before acting (the controller resolves indices and sends the UUID)."""
    try:
        sel = parse(text)
    except SelectorError as exc:
        raise SelectorError(f"{flag} {text!r}: {exc}") from None
    if sel.form == INDEX:
        raise SelectorError(
            f"{flag} {sel.text!r}: the agent takes a UUID or a PCI bus id, never an index (indices change "
            "when the driver loads without a GPU that fell off the bus); `fleetops reset NODE INDEX` resolves an index to its UUID first"
        )
    return sel
