"""Why an action cannot do what it is for, known before any confirmation: such an action is
shown disabled, with this reason, and its key says the reason at once instead of opening a
dialog. No Textual here; the screens and the app ask."""

from __future__ import annotations

from fleetops.tui import data

XID_FALLEN_OFF_BUS = 79


def reset_refusal(entry: data.NodeEntry, uuid: str) -> str | None:
    """A lost GPU (NVML answers GpuIsLost, or it is gone since an earlier snapshot): no reset
    reaches it; the node needs a reboot. The XID that took it is named where the node logged one."""
    gv = entry.gpu(uuid)
    if gv is None or not gv.lost:
        return None
    codes = sorted(
        {x.code for x in entry.xids if not x.sxid and (x.gpu_index == gv.index or (x.bus_id and x.bus_id == gv.bus_id))}
    )
    code = XID_FALLEN_OFF_BUS if XID_FALLEN_OFF_BUS in codes else (codes[-1] if codes else None)
    cause = f" (XID {code})" if code is not None else ""
    return f"GPU {gv.index} is lost{cause}: a reset cannot bring it back; reboot the node"
