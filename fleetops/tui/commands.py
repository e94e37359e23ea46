"""The command line an operator pastes into a ticket, or runs, for what the screen shows: the
``fleetops reset`` of a GPU, the ``fleetops drain`` of a node, in those commands' own grammar
(``reset_cli``, ``drain_cli``), with the inventory the TUI was started with, every word
shell-quoted. No Textual here; the screens ask and the app copies (``FleetApp.copy_command``)."""

from __future__ import annotations

import shlex

from fleetops.tui import data
from fleetops.tui.refusals import reset_refusal

PROGRAM = "fleetops"
# the purpose the TUI's own drain writes when the node has no fault to name (FleetApp.request_drain)
NO_FAULT_PURPOSE = "drained from the TUI"


def _inventory(inventory: str | None) -> list[str]:
    """``-i PATH``; nothing where the TUI knows no inventory (the command then reads
    $FLEETOPS_INVENTORY or $ANSIBLE_INVENTORY, as every fleetops command does)."""
    return ["-i", inventory] if inventory else []


def reset_command(inventory: str | None, node: str, uuid: str) -> str:
    """``fleetops reset -i INVENTORY NODE UUID``: the GPU by its UUID, never by an index."""
    return shlex.join([PROGRAM, "reset", *_inventory(inventory), node, uuid])


def drain_command(inventory: str | None, node: str, reason: str) -> str:
    """``fleetops drain -i INVENTORY NODE --reason REASON`` (Slurm's Reason then names the
    operator who runs it: ``[fleetops] operator/USER@HOST: REASON``)."""
    return shlex.join([PROGRAM, "drain", *_inventory(inventory), node, "--reason", reason])


def drain_purpose(entry: data.NodeEntry) -> str:
    """What the TUI's drain (``d``) gives as the Reason's purpose: the worst finding's check."""
    return entry.worst.check if entry.worst is not None else NO_FAULT_PURPOSE


def for_selection(entry: data.NodeEntry, uuid: str | None, inventory: str | None) -> tuple[str, str]:
    """(command, what it is, for the toast) for a GPU (its reset) or a node (its drain). A GPU
    that a reset cannot reach (lost) gets the node's drain, and the toast says why."""
    why = ""
    gv = entry.gpu(uuid) if uuid else None
    if gv is not None:
        refusal = reset_refusal(entry, gv.uuid)
        if refusal is None:
            return reset_command(inventory, entry.name, gv.uuid), f"reset of GPU {gv.index} on {entry.name}"
        why = f" ({refusal})"
    return drain_command(inventory, entry.name, drain_purpose(entry)), f"drain of {entry.name}{why}"
