"""Simulator access (``SimAccess``, the ``gpu.backend.GpuAccess`` of a simulated node): the one
class through which ``fleetops-agent --backend sim`` samples (the daemon) and looks up, resets
and changes GPUs (the reset flow, ``mig reset``, the setters), on the node's state file
(``sim/gpu.py``), which refuses what real hardware refuses.

Snapshots: ``snapshot_dict`` is the cold snapshot of a state file as the JSON-ready mapping
(``fleetops-agent collect`` prints it without building a ``model.Node``); ``snapshot`` is that as
a node, and ``full``, the daemon's, is ``snapshot`` kept while the state is steady. The changing
operations do not guard a dry run: their callers do.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetops.gpu import instances
from fleetops.gpu.backend import (
    GPU_FIELDS,
    LINK_FIELDS,
    LightSample,
    NodeChangeError,
    Value,
    holders_under,
)
from fleetops.gpu.node import SnapshotError

if TYPE_CHECKING:
    from fleetops import model
    from fleetops.catalog.mig import GiProfile

RACY_S = 1.0  # a state file changed this recently before it was read is read again next time


class SimAccess:
    """The simulator: its state file is read on every tick (it changes under the daemon).

    The file's text is kept and parsed again only when it changed; a state that ``sim.steady``
    finds time-independent (an idle node without a growing storm: a simulated fleet's usual
    node) answers its light samples and full snapshots from what the last change produced, the
    snapshot's time and uptime renewed. One process serves every node of ``sim up --daemon``, a
    thousand of them on a two-core machine, and rebuilding a thousand identical snapshots cost
    that process more than a core (the simulator's cost, not the daemon's). Callers must not
    mutate what ``light`` and ``full`` return (the daemon never does): both share what they
    hold between calls."""

    name = "sim"
    xid_events = False  # the simulated kernel log is the only XID source

    def __init__(self, state_path: str, clock: Callable[[], float] | None = None) -> None:
        self.state_path = state_path
        # the simulated time of a read (a test or a benchmark drives a workload through minutes
        # of it without sleeping); None: the wall clock, ``time.time`` looked up at each read
        self._clock = clock
        base = state_path[:-5] if state_path.endswith(".json") else state_path
        self.run_dir = base + ".agent"
        self.kmsg_path = base + ".kmsg"
        self.boot: float | None = None
        # MIG instances as of the last light read (gpu/instances.py): the simulator's state
        # holds them, so every tick sees them at no extra cost
        self.mig: dict[str, dict[str, Any]] | None = None
        self._text: str | None = None
        self._key: tuple[int, ...] | None = None  # the file's stat when ``_text`` may be trusted by it
        self._state: dict[str, Any] = {}
        self._steady = False
        self._light: LightSample | None = None
        self._node: Any = None  # the full snapshot of a steady state, kept until the file changes
        self._ports: dict[str, tuple[bool | None, int | None]] | None = None  # a steady state's port sample
        # the simulated node's control device, held open while "NVML is initialised", as a real
        # daemon holds /dev/nvidiactl: a simulated reset or driver unload sees this process
        # holding the GPU (gpu/holders.py) until ``release``
        self._device: int | None = None

    # --- the daemon's sampling ----------------------------------------------------------

    def now(self) -> float:
        return self._clock() if self._clock is not None else time.time()

    def _hold(self) -> None:
        if self._device is None:
            from fleetops.sim import gpu as sim

            self._device = sim.open_device(self.state_path)

    def release(self) -> None:
        """Give the node's device files back (the quiesce before a reset): nothing held until
        the next ``light`` or ``full``, which takes them again."""
        fd, self._device = self._device, None
        if fd is not None:
            os.close(fd)

    def _current(self) -> dict[str, Any]:
        """The state as the file holds it now. An unchanged ``stat`` is trusted only when the
        text was read more than ``RACY_S`` after the file's last change (git's racy-clean rule):
        a write in the same clock tick as that read, or one that got a freed inode back with
        the same size, is then caught by reading the text again."""
        from fleetops.sim import gpu as sim

        try:
            st = os.stat(self.state_path)
            key: tuple[int, ...] | None = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None  # the read below says why
        if key is None or key != self._key:
            self._key = None
            read_at = time.time()
            text = sim.read_state_text(self.state_path)
            if text != self._text:
                state = sim.parse_state(self.state_path, text)
                self._text, self._state, self._steady = text, state, sim.steady(state)
                self._light = self._node = self._ports = None
            if key is not None and read_at - max(key[3], key[4]) / 1e9 > RACY_S:
                self._key = key
        self.boot = float(self._state["node"].get("boot_time", 0.0)) or None
        return self._state

    def light(self) -> LightSample:
        """(uuid -> ring values, uuid -> lost reason) without building a model.Node."""
        from fleetops.sim import gpu as sim

        self._hold()
        state = self._current()
        if self._light is not None:
            return self._light
        now = self.now()
        data = sim.snapshot(state, now)
        if state.get(sim.JOBS_KEY):  # the running jobs' cgroups: cpu.stat as of this read
            sim.advance_cgroups(self.state_path, state, now)
        self.mig = instances.table(data["gpus"])
        values: dict[str, dict[str, Value]] = {}
        lost: dict[str, str] = {}
        for g in data["gpus"]:
            if sim.GPU_IS_LOST in (g.get("unavailable") or {}).values():
                lost[g["uuid"]] = sim.GPU_IS_LOST  # at its index, sampled no more: as the NVML access
                continue
            row: dict[str, Value] = {n: _num(g.get(n)) for n in GPU_FIELDS}
            extra = g.get(sim.SAMPLE_KEY)  # what a workload adds: PCIe throughput (KB/s)
            if extra:
                row.update({n: _num(v) for n, v in extra.items() if n in GPU_FIELDS})
            for link in g.get("nvlinks") or []:
                for n in LINK_FIELDS:
                    row[f"nvlink{link['link']}_{n}"] = _num(link.get(n))
            values[g["uuid"]] = row
        result: LightSample = (values, lost)
        if self._steady:
            self._light = result
        return result

    def full(self) -> Any:
        from fleetops.sim import gpu as sim

        start = time.perf_counter()
        self._hold()
        state = self._current()
        if self._node is None:
            node = self.snapshot()
            if not self._steady:
                return node
            self._node = node
        now = time.time()
        # its GPUs, topology, XIDs and fabric are the kept snapshot's (the fabric's read_at stays the
        # time its ports were read: a steady state's ports do not move, so no rate moves either)
        node = copy.copy(self._node)
        node.collected_at = now
        node.uptime_s = sim.uptime_s(state, now)
        node.collect_ms = round((time.perf_counter() - start) * 1000.0, 2)
        return node

    def fabric_ports(self) -> dict[str, tuple[bool | None, int | None]]:
        """The RDMA ports' state and link_downed from the node's sysfs tree, for the daemon's
        every tick; a steady state's answer is kept until the file changes, as its light sample."""
        from fleetops.fabric import sysfs
        from fleetops.sim.gpu import fabric as simfabric

        state = self._current()
        if self._steady and self._ports is not None:
            return self._ports
        if any(f["name"] in simfabric.TIME_FAULTS for f in state["faults"]):
            simfabric.sync_tree(self.state_path, state, time.time(), only_timed=True)
        ports = sysfs.read_ports(simfabric.sys_root(self.state_path))
        self._ports = ports if self._steady else None
        return ports

    def snapshot(self, release: bool = False) -> model.Node:
        """The cold snapshot of the state file (``snapshot_dict``) as a node; nothing is held
        afterwards whatever ``release`` says."""
        from fleetops import model

        start = time.perf_counter()
        node = model.node_from_dict(snapshot_dict(self.state_path, self.now()))
        node.collect_ms = round((time.perf_counter() - start) * 1000.0, 2)
        return node

    def boot_epoch(self) -> float | None:
        return self.boot

    def boot_id(self) -> str:
        from fleetops.sim import gpu as sim

        try:
            return "sim:" + str(sim.read_state(self.state_path)["node"].get("boot_time"))
        except sim.SimError:
            return "sim:unknown"

    def events(self, on_xid: Callable[[str | None, int], None], stop: threading.Event) -> None:
        """No event source beside the simulated kernel log: returns at once."""
        return None

    def events_status(self) -> dict[str, Any] | None:
        return None

    # --- GPU operations (the reset flow, ``mig reset``, the setters) ----------------------

    def _read_state(self) -> dict[str, Any]:
        from fleetops.sim import gpu as sim

        return sim.read_state(self.state_path)

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        from fleetops.sim import gpu as sim

        state = self._read_state()
        pos, why = sim.find_gpu(state, uuid or bus_id or "")
        if pos is None or why is None:
            return None
        raw = state["gpus"][pos]
        text = "Xid 79: the GPU has fallen off the bus" if why == "xid:79" else "the driver does not enumerate it"
        return {"uuid": raw["uuid"], "bus_id": raw["bus_id"], "reason": text}

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        from fleetops.sim import gpu as sim

        state = self._read_state()
        by_uuid, _ = sim.find_gpu(state, gpu.uuid)
        by_bus, _ = sim.find_gpu(state, gpu.bus_id)
        if by_uuid is None or by_uuid != by_bus:
            other = state["gpus"][by_bus]["uuid"] if by_bus is not None else "nothing"
            return "failed", f"bus id {gpu.bus_id} holds {other}, not {gpu.uuid}"
        return "ok", "looked up by UUID and by bus id: the same GPU"

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        # the simulated reset removes the XIDs it cleared from the simulated kernel log and keeps
        # those of the faults it cannot clear: every XID left counts
        return list(node.xids)

    def device_prefix(self) -> str:
        from fleetops.sim import gpu as sim

        return sim.device_prefix(os.path.abspath(self.state_path))

    def holders(self) -> tuple[list[Any] | None, str | None]:
        return holders_under(self.device_prefix())

    def release_own(self) -> int:
        return 0  # no NVML in this process: the device file is held only while sampling

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        from fleetops.sim import gpu as sim

        held, why = self.holders()
        if held:  # the driver refuses a GPU any client holds, a monitoring one too
            return False, f"simulated nvidia-smi -r -i {gpu.bus_id}: {sim.in_use_message(gpu.bus_id, held)}", {
                "holders": [h.to_dict() for h in held]}
        if held is None:
            return False, f"simulated nvidia-smi -r -i {gpu.bus_id}: cannot tell who holds the GPU ({why})", {}
        duration = sim.reset_duration_s(self._read_state())
        if duration > 0:
            # the GPU is away while it resets; the state says which one, as long as it is away
            with sim.locked_state(self.state_path) as st:
                st["node"][sim.RESETTING_FIELD] = gpu.uuid
            time.sleep(min(duration, timeout))
        try:
            with sim.locked_state(self.state_path) as st:
                st["node"].pop(sim.RESETTING_FIELD, None)
                pos, _ = sim.find_gpu(st, gpu.uuid)
                if pos is None:
                    raise sim.SimError(f"{gpu.uuid} is no longer on this node")
                done = sim.reset_gpu(st, pos)
        except sim.SimError as exc:
            return False, f"simulated reset failed: {exc}", {}
        cleared = ", ".join(done["cleared"]) or "nothing (no volatile fault pending)"
        kept = f"; still present: {', '.join(done['kept'])}" if done["kept"] else ""
        return True, f"simulated nvidia-smi -r -i {gpu.bus_id}: cleared {cleared}{kept}", {
            "cleared": done["cleared"],
            "kept": done["kept"],
            "xids_cleared": done["xids_cleared"],
        }

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        from fleetops.sim import gpu as sim

        try:
            with sim.locked_state(self.state_path) as st:
                pos, _ = sim.find_gpu(st, uuid)
                if pos is None:
                    raise sim.SimError(f"{uuid} is no longer on this node")
                sim.mig_reset(st, pos, profiles)
        except sim.SimError as exc:
            return False, str(exc)
        return True, "simulated: destroyed and recreated"

    # --- MIG (``mig apply``) ---------------------------------------------------------------

    def hostname(self) -> str:
        from fleetops.sim import gpu as sim

        return str(sim.read_state(self.state_path)["hostname"])

    def mig_read(self) -> list[dict[str, Any]]:
        from fleetops.catalog import mig as catalog
        from fleetops.sim import gpu as sim

        state = sim.read_state(self.state_path)
        needs_reset = bool(state["node"].get(sim.MIG_NEEDS_RESET_FIELD))
        out = []
        for g in sim.snapshot(state)["gpus"]:
            pos = next(i for i, raw in enumerate(state["gpus"]) if raw["uuid"] == g["uuid"])
            raw = state["gpus"][pos]
            try:
                table: catalog.ProfileTable | None = sim.mig_table(state, pos)
            except sim.SimError:
                table = None
            current = bool(raw.get("mig_mode_current"))
            instances = None
            if current:
                instances = [
                    {"gpu_instance_id": int(m["gpu_instance_id"]), "profile": m.get("profile"),
                     "start": m.get("placement_start"), "size": m.get("placement_size"),
                     "compute_instance_id": m.get("compute_instance_id"), "uuid": m.get("uuid"),
                     "in_use": bool(m.get("in_use") or m.get("pids")), "pids": [int(p) for p in m.get("pids") or []]}
                    for m in raw.get("mig_instances") or []  # the state's records: with their placements
                ]
            out.append({"uuid": g["uuid"], "bus_id": g["bus_id"], "index": int(g["index"]), "name": g.get("name"),
                        "device_id": catalog.device_id_for(g.get("name")), "mode_current": current,
                        "mode_pending": bool(raw.get("mig_mode_pending", current)), "instances": instances,
                        "table": table, "why": None,
                        "loose_pids": [int(p["pid"]) for p in g.get("processes") or []],
                        "reset_needed": needs_reset})
        return out

    def _mig_change(self, uuid: str, fn: Callable[[dict[str, Any], int], Any]) -> Any:
        from fleetops.sim import gpu as sim

        try:
            with sim.locked_state(self.state_path) as st:
                pos, _ = sim.find_gpu(st, uuid)
                if pos is None:
                    raise sim.SimError(f"{uuid} is no longer on this node")
                return fn(st, pos)
        except sim.SimError as exc:
            raise NodeChangeError(str(exc)) from exc

    def mig_set_mode(self, uuid: str, enabled: bool) -> bool:
        from fleetops.sim import gpu as sim

        return bool(self._mig_change(uuid, lambda st, pos: sim.set_mig_mode(st, pos, enabled)))

    def mig_destroy(self, uuid: str, gpu_instance_id: int) -> None:
        from fleetops.sim import gpu as sim

        self._mig_change(uuid, lambda st, pos: sim.destroy_gpu_instance(st, pos, gpu_instance_id))

    def mig_create(self, uuid: str, profile: GiProfile, start: int) -> int:
        from fleetops.sim import gpu as sim

        def make(st: dict[str, Any], pos: int) -> int:
            gi = sim.create_gpu_instance(st, pos, profile.name, start)
            sim.create_compute_instance(st, pos, int(gi["gpu_instance_id"]))
            return int(gi["gpu_instance_id"])

        return int(self._mig_change(uuid, make))

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        from fleetops.sim import gpu as sim

        with sim.locked_state(self.state_path) as state:
            for uuid in uuids:
                pos = next(i for i, g in enumerate(state["gpus"]) if g["uuid"] == uuid)
                try:
                    sim.require_present(state, pos, f"set {setting}")
                except sim.SimError as exc:  # nothing is written: the state lock's body raised
                    raise NodeChangeError(str(exc)) from exc
                state["gpus"][pos][field_name] = value
                if field_name == "mig_mode_current":
                    state["gpus"][pos]["mig_mode_pending"] = value
                sim.retire_setting_fault(state, field_name, pos)


def snapshot_dict(path: str, now: float) -> dict[str, Any]:
    """The cold snapshot of the state file ``path`` as the JSON-ready mapping the agent prints
    (the controller validates it on receipt), its kernel-log XIDs attributed to GPUs as NVML's
    are (``gpu.node.xid_events``). Raises ``SnapshotError`` where the state cannot be read."""
    from fleetops.sim import gpu as sim

    try:
        device = sim.open_device(path)  # a collect in flight holds the GPUs, as nvmlInit does
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot open the simulated node's device files: {exc.strerror or exc}") from exc
    try:
        state = sim.read_state(path)
    except sim.SimError as exc:
        raise SnapshotError(str(exc)) from exc
    finally:
        os.close(device)
    data: dict[str, Any] = sim.snapshot(state, now=now)
    lines = data.pop("_kernel_log")
    for g in data["gpus"]:
        g.pop(sim.SAMPLE_KEY, None)  # light-sample values: the snapshot has no field for them
    data["fabric"] = _fabric(path, state, now, [g["bus_id"] for g in data["gpus"]])
    data["collected_at"] = now
    gpus = {g["bus_id"]: (g["uuid"], g["index"]) for g in data["gpus"]}
    data["xids"] = []
    if lines:  # most nodes have no XIDs: then neither the parser nor the model is imported
        from fleetops.gpu.node import xid_events
        from fleetops.model import to_dict

        data["xids"] = [to_dict(e) for e in xid_events(lines, "sim", gpus, now, data.get("uptime_s"))]
    return data


def _fabric(path: str, state: dict[str, Any], now: float, gpu_bus_ids: list[str]) -> dict[str, Any]:
    """The node's HCAs as the agent reads a node's: from its sysfs tree (``<state>.sys``), the
    ports a time fault moves written first (the tree is a file like any other: nobody else
    moves them)."""
    from fleetops.fabric import sysfs
    from fleetops.model import to_dict
    from fleetops.sim.gpu import fabric as simfabric

    if any(f["name"] in simfabric.TIME_FAULTS for f in state["faults"]):
        try:
            simfabric.sync_tree(path, state, now, only_timed=True)
        except OSError:
            pass  # a read-only state folder: the tree read below says what it shows
    doc: dict[str, Any] = to_dict(sysfs.read(simfabric.sys_root(path), gpu_bus_ids, now))
    return doc


def _num(value: Any) -> Value:
    """A snapshot value for the ring: an int stays an int (a counter at 8.7e12 KiB, or past
    2**53, keeps every digit), a float stays a float, anything else is not a number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    return None
