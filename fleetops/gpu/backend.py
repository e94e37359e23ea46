"""The one interface of GPU access, whichever kind answers: ``GpuAccess``.

Two kinds implement it: NVML on a real node (``gpu/nvml/access.py``: ``NvmlAccess``) and the
simulator's state file (``sim/access.py``: ``SimAccess``). Every command that reads or changes
the GPUs goes through one of them: the daemon samples through ``light``/``full``/``events``, the
reset flow, ``mig reset`` and the setters look up, reset and change GPUs through the rest, and
``mig apply`` reads and changes MIG through the ``mig_*`` methods (changes raise ``NodeChangeError``).

The node snapshot is an access method too (``snapshot``, the cold one that ``collect``, the
reset flow and ``mig reset`` read; ``full``, the daemon's, on what the object holds open): the
host facts around the GPUs (``gpu/hostinfo.py``), the kernel log's XIDs and the reset journal's
``last_reset_at`` (``gpu/node.py``) are read in this layer. What is not GPU access stays with
the command: the systemd units, signals to processes, the node lock, writing the reset journal
and the daemon's socket are the reset flow's host services (``agent/reset/host.py``), which its
``Backend`` (``agent/reset/backends.py``) composes with the GPU access.

Also here: the light sample's vocabulary (the field names a light read fills, which the
daemon's ring stores). The changing operations do not guard a dry run themselves: their
callers (the reset backends, ``mig apply``) refuse before they call one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleetops import model
    from fleetops.catalog.mig import GiProfile

# Scalar fields every GPU has; per-link NVLink fields are added as ``nvlink<N>_<name>``.
GPU_FIELDS = (  # model.Gpu's names, so a sample reads like the snapshot it came from
    "temp_gpu_c",
    "temp_memory_c",
    "power_draw_w",
    "clock_sm_mhz",
    "clocks_event_mask",
    "utilization_gpu_pct",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "pcie_replay_counter",
    "pcie_tx_kbps",  # NVML throughput counters, KB/s; the simulator gives them only for a GPU running a workload
    "pcie_rx_kbps",
)
# Cumulative counters, as model.NvLink names them (tx_kib / rx_kib: KiB since the driver loaded).
LINK_FIELDS = ("crc_errors", "replay_errors", "recovery_errors", "tx_kib", "rx_kib")
# The GPU fields kept as exact integers: cumulative counters, and a bitmask (its bits are names).
COUNTER_FIELDS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "pcie_replay_counter")
INTEGER_FIELDS = frozenset((*COUNTER_FIELDS, "clocks_event_mask"))

Value = float | int | None  # a sampled value: int from an integer field, None: not read

# (uuid -> field -> value, uuid -> why the GPU is lost)
LightSample = tuple[dict[str, dict[str, Value]], dict[str, str]]


class NodeChangeError(Exception):
    """The node refused a change (NVML said no); the message names the setting and the reason."""


class GpuAccess(Protocol):
    """One node's GPUs through one access kind (``name``: "nvml" or "sim")."""

    name: str
    # whether ``events`` reports XIDs (NVML's event sets); the simulator's come from its kernel log only
    xid_events: bool
    # MIG instances as of the last light read (``gpu/instances.py``), None when not sampled
    mig: dict[str, dict[str, Any]] | None

    # --- the daemon's sampling ----------------------------------------------------------

    def light(self) -> LightSample:
        """One light read: (uuid -> sampled values, uuid -> lost reason), no model.Node built."""
        ...

    def full(self) -> model.Node:
        """The daemon's full snapshot, on what this object holds open (its XIDs are the daemon's
        book's); raises RuntimeError where it cannot be built, as a failed sample does."""
        ...

    def fabric_ports(self) -> dict[str, tuple[bool | None, int | None]]:
        """The RDMA ports' (ACTIVE or not, link_downed) by ``"<dev>/<port>"``, from sysfs: the
        daemon samples them every tick for flaps and drops (``fabric.sysfs.read_ports``)."""
        ...

    def snapshot(self, release: bool = False) -> model.Node:
        """The cold snapshot (``fleetops-agent collect``, the reset flow, ``mig reset``, the
        setters): read afresh, kernel-log XIDs included. ``release``: hold no device file
        afterwards (a reset). Raises ``gpu.node.SnapshotError`` where none can be built."""
        ...

    def release(self) -> None:
        """Let go of every device file until the next ``light`` or ``full`` (before a reset)."""
        ...

    def boot_epoch(self) -> float | None:
        """When the node booted (wall clock), for the kernel log's uptime stamps."""
        ...

    def boot_id(self) -> str:
        """This boot's identity: the XID book starts afresh when it changes."""
        ...

    def events(self, on_xid: Callable[[str | None, int], None], stop: threading.Event) -> None:
        """XID events (bus id, code) until ``stop``; returns at once where there are none."""
        ...

    def events_status(self) -> dict[str, Any] | None:
        """The events path's state (None where there is none)."""
        ...

    # --- looking up GPUs (the reset flow, ``mig reset``, the setters) --------------------

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        """The GPU the selector names when it is known but not enumerated (fallen off the bus)."""
        ...

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        """A second, independent look-up that the UUID and the bus id name the same GPU."""
        ...

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        """The XIDs that count after a reset at ``reset_at``."""
        ...

    def device_prefix(self) -> str:
        """Where the node's device files start (``gpu.holders``)."""
        ...

    def holders(self) -> tuple[list[Any] | None, str | None]:
        """(every process holding a device file, None) or (None, why they cannot be listed)."""
        ...

    def release_own(self) -> int:
        """Let go of what this process holds of the GPUs; how many NVML initialisations ended."""
        ...

    # --- changing GPUs (callers guard them in a dry run) --------------------------------

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        ...

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        """Destroy the GPU's MIG instances and create ``profiles``."""
        ...

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        """Set power cap, persistence or MIG mode on the GPUs ``uuids``."""
        ...

    # --- MIG (``mig apply``: reads, and changes its callers guard in a dry run) ---------------

    def hostname(self) -> str:
        """The node's name as the snapshot gives it."""
        ...

    def mig_read(self) -> list[dict[str, Any]]:
        """Every GPU's MIG state (``gpu.nvml.MigControl.read``'s form: identity, ``mode_current``,
        ``mode_pending``, ``table``, ``instances`` with ``in_use`` and ``pids``, ``loose_pids``,
        ``why``, ``device_id``) and ``reset_needed`` (whether a mode change waits for a GPU reset;
        None: told only once it is set). Raises ``gpu.node.SnapshotError`` where NVML cannot read it."""
        ...

    def mig_set_mode(self, uuid: str, enabled: bool) -> bool:
        """Request MIG mode; True when current at once, False when it waits for a GPU reset."""
        ...

    def mig_destroy(self, uuid: str, gpu_instance_id: int) -> None:
        """Destroy the GPU instance and its compute instances."""
        ...

    def mig_create(self, uuid: str, profile: GiProfile, start: int) -> int:
        """A GPU instance of ``profile`` at ``start`` and its one compute instance; its id."""
        ...


def holders_under(prefix: str) -> tuple[list[Any] | None, str | None]:
    """``GpuAccess.holders`` for device files under ``prefix``: both kinds scan ``/proc`` alike."""
    from fleetops.gpu import holders

    if not holders.readable():
        return None, "not root: other processes' descriptors are not readable"
    return holders.scan(prefix), None
