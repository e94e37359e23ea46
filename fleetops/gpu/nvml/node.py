"""The node's snapshot through NVML (``build``): the one builder of the cold collect
(``NvmlAccess.snapshot``) and the daemon's full snapshot (``NvmlAccess.full``), so a field one of
them has, the other has too. NVML's GPU fields (``snapshot.collect_into``) plus the host facts
(``gpu.hostinfo``), the RDMA devices from sysfs (``fabric.sysfs``), the kernel log's XIDs and the
reset journal's ``last_reset_at`` (``gpu.node``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetops import model


def build(
    now: float | None = None,
    *,
    held: bool = False,
    release: bool = False,
    packages: tuple[dict[str, str], dict[str, str], str | None] | None = None,
    kernel_log: bool = True,
) -> model.Node:
    """``held``: the caller has NVML initialised already (the daemon) and no second ``nvmlInit``
    is counted. ``release``: NVML is shut down before returning (the reset, which must hold no
    device file when it resets). ``packages``: the package list already read (the daemon reads
    it once; the packages change only with a reboot or a rollout that restarts it).
    ``kernel_log``: False where the caller keeps the XIDs itself (the daemon's book follows the
    kernel log); the snapshot's ``xids`` are then empty for the caller to fill.
    Raises ``gpu.node.SnapshotError`` when NVML cannot start."""
    import socket

    from fleetops import model
    from fleetops.fabric import sysfs as fabric
    from fleetops.gpu import hostinfo, nvml
    from fleetops.gpu.node import SnapshotError, reset_times, xid_events
    from fleetops.xid import kernlog as xid

    now = time.time() if now is None else now
    node = model.Node(hostname=socket.gethostname(), backend="nvml", collected_at=now)
    node.kernel = hostinfo.kernel()
    node.os = hostinfo.os_name()
    node.uptime_s = hostinfo.uptime_s()
    try:
        nvml.collect_into(node, initialised=held, shutdown=release)
    except nvml.NvmlUnavailable as exc:
        raise SnapshotError(str(exc)) from exc
    node.services, reason = hostinfo.service_states()
    if reason:
        node.unavailable["services"] = reason
    node.packages, node.package_origins, reason = packages or hostinfo.nvidia_packages_with_origins()
    node.packages, node.package_origins = dict(node.packages), dict(node.package_origins)
    if reason:
        node.unavailable["packages"] = reason
    if kernel_log:
        lines, reason = xid.read_kernel_log()
        if reason:
            node.unavailable["xids"] = reason
        gpus = {g.bus_id: (g.uuid, g.index) for g in node.gpus}
        node.xids = xid_events(lines, "kernel", gpus, now, node.uptime_s)
    node.fabric = fabric.read(gpu_bus_ids=[g.bus_id for g in node.gpus], now=time.time())
    resets = reset_times()
    for gpu in node.gpus:
        gpu.last_reset_at = resets.get(gpu.uuid)
        if gpu.last_reset_at is not None:
            gpu.unavailable.pop("last_reset_at", None)
        elif gpu.unavailable.get("last_reset_at", "").startswith("not from NVML"):
            gpu.unavailable["last_reset_at"] = "no reset recorded in the agent's reset journal"
    return node
