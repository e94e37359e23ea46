"""NVML access (``NvmlAccess``, the ``gpu.backend.GpuAccess`` of a real node): the one class
through which the daemon samples and the reset flow, ``mig reset`` and the setters look up,
reset and change GPUs.

Sampling: NVML initialised once, a light per-tick read, a full ``model.Node`` at the slower
cadence, and critical-XID events (``nvmlEventSetWait_v2``).

Light read per GPU: temperature, power, SM clock, clocks-event reasons, utilisation, PCIe
throughput, and one ``nvmlDeviceGetFieldValues`` call for memory temperature, volatile ECC
totals, the PCIe replay counter and, per NVLink (``scopeId`` = link id), the CRC / replay /
recovery error counters and the TX / RX data counters (KiB, cumulative): 18 links add fields
to that call, not calls. The link count is read once per GPU when NVML is initialised.
On the GPUs the last full snapshot found in MIG mode, and only on those, the light read also
lists the GPU and compute instances and their processes (``access.mig``, through
``fleetops.gpu.nvml.mig_sample``; the profile table is read once per GPU), so the daemon serves
an instance created, destroyed or taken by a job within a sample; a GPU with MIG off costs no
MIG call, and one whose MIG mode is turned on is picked up at the next full snapshot.
``GpuIsLost`` marks that GPU lost and the others go on.
``Uninitialized``/``DriverNotLoaded`` (the driver unloaded) drops the handles and re-runs
``nvmlInit`` on the next tick, so a reloaded driver is picked up without a restart.

The events loop (``events``) holds one event set registered for every GPU's XIDs while NVML is
initialised and holds none otherwise (quiesced, re-initialising). Any error in it, NVML's or
not, ends that set; the loop registers again after a backoff, also on the GPUs a partial
registration missed, and on a new set of handles after a re-init. Failing repeatedly is reported
(``events_status``), never silent. Each event's GPU is the bus id its handle was registered
with, so a GPU that fell off the bus (every query answers ``GpuIsLost``) keeps its bus id.

GPU operations: the look-ups of a GPU that fell off the bus and the second look-up by UUID and
bus id, ``nvidia-smi -r`` and ``nvidia-smi mig`` (``nvidia_smi_reset``, ``nvidia_smi_mig``:
module-level functions looked up at call time, which tests replace with fakes that record each
call) and the NVML setters. They do not guard a dry run: their callers do.

Snapshots: ``snapshot`` (the cold one: its own ``nvmlInit``, kernel-log XIDs) and ``full`` (the
daemon's, on the NVML held initialised) are one builder's, ``gpu.nvml.node.build`` (host facts,
the reset journal's ``last_reset_at``).

Test hook: ``$FLEETOPS_AGENT_NVML_MODULE`` names a module used in place of ``pynvml``
(``fleetops.gpu.nvml.load_module``: the GPU layer owns the NVML module).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetops.gpu.backend import (
    INTEGER_FIELDS,
    LightSample,
    NodeChangeError,
    Value,
    holders_under,
)
from fleetops.gpu.node import SnapshotError
from fleetops.gpu.nvml.core import as_text

if TYPE_CHECKING:
    from fleetops import model
    from fleetops.catalog.mig import GiProfile

REINIT_REASONS = ("Uninitialized", "DriverNotLoaded", "LibraryNotFound")
EVENTS_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # before each new registration after a failure
EVENTS_REPORT_AFTER = 3  # failed registrations in a row before the events path is reported down
EVENTS_WAIT_MS = 500  # one event wait: how soon a re-init or a release is noticed
LIGHT_FIELDS = (
    ("temp_memory_c", "NVML_FI_DEV_MEMORY_TEMP"),
    ("ecc_corrected_volatile", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("ecc_uncorrected_volatile", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ("pcie_replay_counter", "NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
)
# ring.LINK_FIELDS name -> the per-link field id (scopeId = link): NVML's data-link error
# counters (CRC, replay, recovery) and the THROUGHPUT_DATA counters in KiB. The full snapshot
# reads the same fields (gpu/nvml/topology.py), so a rate from a ring sample to a snapshot compares alike.
LINK_LIGHT_FIELDS = (
    ("crc_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"),
    ("replay_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY"),
    ("tx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    ("rx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
)


def _reason(N: Any, exc: BaseException) -> str:
    from fleetops.gpu.nvml import reason_of

    return reason_of(exc)


class NvmlAccess:
    name = "nvml"
    xid_events = True

    def __init__(self, module: Any = None) -> None:
        self._module: Any = module  # the NVML module (tests hand the fake); None: loaded at first use
        self._mig_control: Any = None  # ``mig apply``'s MigControl, made at its first call
        self.initialised = False
        self.handles: list[tuple[str, str, Any]] = []  # (uuid, bus id, handle)
        self.link_counts: dict[str, int] = {}  # uuid -> NVLinks to sample (0: none or unknown)
        self.lost: dict[str, str] = {}
        self.reinits = 0
        self._hostname = socket.gethostname()
        self._packages: tuple[dict[str, str], dict[str, str], str | None] | None = None
        # MIG instances as of the last light read (gpu/instances.py), sampled only on the GPUs
        # the last full snapshot found in MIG mode (None until the first full snapshot)
        self.mig: dict[str, dict[str, Any]] | None = None
        self._mig_gpus: dict[str, dict[str, Any]] | None = None  # uuid -> its entry in the full snapshot
        self._mig_tables: dict[str, Any] = {}  # uuid -> its MIG profile table (None: unreadable), read once
        self.events_quiet = threading.Event()  # set while the events loop holds no event set
        self.events_quiet.set()
        # the events loop's state (``events_status``): GPUs registered, failures in a row, the
        # error reported once they are repeated, sets made since the start
        self._events: dict[str, Any] = {"registered": 0, "gpus": 0, "failures": 0, "error": None, "sets": 0,
                                        "last_failure": None}

    @property
    def N(self) -> Any:  # the NVML module, named as every reader in this layer names it
        """The NVML module, loaded on first use: the GPU operations below do not need it (they
        import ``pynvml`` themselves), so a reset or a setter on a node without nvidia-ml-py
        builds this object as before; the daemon loads it at its start (``agent.serve``)."""
        if self._module is None:
            from fleetops.gpu.nvml import load_module

            self._module = load_module()
        return self._module

    # NVML lifecycle ----------------------------------------------------------------------

    def _init(self) -> None:
        if self.initialised:
            return
        self.N.nvmlInit()
        self.initialised = True
        self.handles = []
        handles = []  # published whole: the events loop registers on a complete list, never half of one
        count = self.N.nvmlDeviceGetCount()
        for index in range(count):
            try:
                h = self.N.nvmlDeviceGetHandleByIndex(index)
                uuid = as_text(self.N.nvmlDeviceGetUUID(h))
                bus = as_text(self.N.nvmlDeviceGetPciInfo(h).busId)
            except self.N.NVMLError:
                continue
            handles.append((uuid, _norm_bus(bus), h))
            self.link_counts[uuid] = self._link_count(h)
        self.handles = handles

    def _link_count(self, h: Any) -> int:
        """NVML_FI_DEV_NVLINK_LINK_COUNT, once per GPU at init: 0 where NVLink is not
        supported (a passthrough VM) or the count cannot be read, so no link is asked for."""
        fid = getattr(self.N, "NVML_FI_DEV_NVLINK_LINK_COUNT", None)
        if fid is None or not hasattr(self.N, "nvmlDeviceGetFieldValues"):
            return 0
        try:
            (fv,) = self.N.nvmlDeviceGetFieldValues(h, [fid])
        except (self.N.NVMLError, ValueError, TypeError):
            return 0
        from fleetops.gpu.nvml import field_value

        value = _num(field_value(fv)) if getattr(fv, "nvmlReturn", 1) == 0 else None
        return max(0, int(value)) if value is not None else 0

    def _drop(self) -> None:
        self.initialised = False
        self.handles = []
        self.link_counts = {}
        self.reinits += 1

    def light(self) -> LightSample:
        try:
            self._init()
        except self.N.NVMLError as exc:
            self._drop()
            raise RuntimeError(f"nvmlInit: {_reason(self.N, exc)}") from exc
        values: dict[str, dict[str, Value]] = {}
        for uuid, _bus, h in self.handles:
            if uuid in self.lost:
                continue
            row: dict[str, Value] = {}
            try:
                self._read(h, row, self.link_counts.get(uuid, 0))
            except self.N.NVMLError as exc:
                reason = _reason(self.N, exc)
                if reason in REINIT_REASONS:
                    self._drop()
                    raise RuntimeError(f"NVML: {reason} (driver unloaded?); re-initialising") from exc
                if reason == "GpuIsLost":
                    self.lost[uuid] = reason
                    continue
            values[uuid] = row
        if self._mig_gpus is not None:
            self.mig = self._sample_mig()
        return values, dict(self.lost)

    def _sample_mig(self) -> dict[str, dict[str, Any]]:
        """The instances of the GPUs in MIG mode (``gpu.nvml.mig_sample``); a GPU NVML does not
        answer for keeps its last entry; one whose mode went off has none and is not asked again
        until a full snapshot finds it in MIG mode. GPUs with MIG off cost nothing here."""
        from fleetops.gpu import instances, nvml

        assert self._mig_gpus is not None
        out: dict[str, dict[str, Any]] = {}
        for uuid, _bus, h in self.handles:
            known = self._mig_gpus.get(uuid)
            if known is None or uuid in self.lost:
                continue
            table = self._mig_table(uuid, h)
            got = nvml.mig_sample(self.N, h, table) if table is not None else None
            if got is None:
                last = (self.mig or {}).get(uuid) or known
                out[uuid] = last
                continue
            entry = instances.gpu_table({"uuid": uuid, **got})
            if entry is None:
                del self._mig_gpus[uuid]  # MIG mode off now
                continue
            out[uuid] = entry
        return out

    def _mig_table(self, uuid: str, h: Any) -> Any:
        if uuid not in self._mig_tables:
            from fleetops.gpu import nvml

            name = None
            try:
                name = as_text(self.N.nvmlDeviceGetName(h))
            except self.N.NVMLError:
                pass
            self._mig_tables[uuid], _why = nvml.MigControl(self.N).profiles(h, name or "")
        return self._mig_tables[uuid]

    def _read(self, h: Any, row: dict[str, Value], links: int = 0) -> None:
        N = self.N

        def one(name: str, fn: Callable[[], Any]) -> None:
            try:
                row[name] = _num(fn()) if name in INTEGER_FIELDS else float(fn())
            except N.NVMLError as exc:
                if _reason(N, exc) in (*REINIT_REASONS, "GpuIsLost"):
                    raise
                row[name] = None
            except (AttributeError, TypeError, ValueError):  # not in this nvidia-ml-py, or no number
                row[name] = None

        one("temp_gpu_c", lambda: N.nvmlDeviceGetTemperature(h, getattr(N, "NVML_TEMPERATURE_GPU", 0)))
        one("power_draw_w", lambda: N.nvmlDeviceGetPowerUsage(h) / 1000.0)
        one("clock_sm_mhz", lambda: N.nvmlDeviceGetClockInfo(h, getattr(N, "NVML_CLOCK_SM", 1)))
        one("clocks_event_mask", lambda: N.nvmlDeviceGetCurrentClocksEventReasons(h))
        one("utilization_gpu_pct", lambda: N.nvmlDeviceGetUtilizationRates(h).gpu)
        one("pcie_tx_kbps", lambda: N.nvmlDeviceGetPcieThroughput(h, getattr(N, "NVML_PCIE_UTIL_TX_BYTES", 0)))
        one("pcie_rx_kbps", lambda: N.nvmlDeviceGetPcieThroughput(h, getattr(N, "NVML_PCIE_UTIL_RX_BYTES", 1)))
        if not hasattr(N, "nvmlDeviceGetFieldValues"):
            return
        # (ring field, field id or (field id, link)) for every value of this one call
        wanted: list[tuple[str, Any]] = []
        for name, const in LIGHT_FIELDS:
            fid = getattr(N, const, None)
            if fid is not None:
                wanted.append((name, fid))
        for name, const in LINK_LIGHT_FIELDS if links else ():
            fid = getattr(N, const, None)
            if fid is not None:
                wanted.extend((f"nvlink{link}_{name}", (fid, link)) for link in range(links))
        if not wanted:
            return
        try:
            fvs = N.nvmlDeviceGetFieldValues(h, [fid for _, fid in wanted])
        except N.NVMLError as exc:
            if _reason(N, exc) in (*REINIT_REASONS, "GpuIsLost"):
                raise
            fvs = []
        from fleetops.gpu.nvml import field_value

        for (name, _), fv in zip(wanted, fvs, strict=False):
            if getattr(fv, "nvmlReturn", 1) == 0:
                row[name] = _num(field_value(fv))

    def full(self) -> model.Node:
        """The node's full snapshot through the cold snapshot's builder (``gpu.nvml.node.build``:
        services, packages, the reset journal's ``last_reset_at`` included), on the NVML this
        object holds initialised; the XIDs are the daemon's book's (``NodeService._full``).
        The package list is read with the first snapshot and handed back afterwards: it changes
        only with a reboot or a rollout that restarts the daemon."""
        from fleetops import model
        from fleetops.gpu import instances
        from fleetops.gpu.nvml import node as node_builder

        try:
            self._init()
        except self.N.NVMLError as exc:
            self._drop()
            raise RuntimeError(f"nvmlInit: {_reason(self.N, exc)}") from exc
        try:
            node = node_builder.build(held=True, packages=self._packages, kernel_log=False)
        except SnapshotError as exc:  # the daemon's failed call, as a failed ``nvmlInit`` is
            raise RuntimeError(str(exc)) from exc
        if self._packages is None:
            self._packages = (dict(node.packages), dict(node.package_origins), node.unavailable.get("packages"))
        node.hostname = self._hostname
        for g in node.gpus:
            self.lost.pop(g.uuid, None)  # enumerated again (a reset, a driver reload)
        # the GPUs whose instances the light reads sample until the next full snapshot
        self._mig_gpus = instances.table(model.to_dict(g) for g in node.gpus if g.mig_mode_current or g.mig_instances)
        return node

    def fabric_ports(self) -> dict[str, tuple[bool | None, int | None]]:
        """The RDMA ports' state and link_downed, for the daemon's every tick (sysfs only)."""
        from fleetops.fabric import sysfs

        return sysfs.read_ports()

    def snapshot(self, release: bool = False) -> model.Node:
        """The cold snapshot (``gpu.nvml.node.build``): its own ``nvmlInit``, whatever this
        object holds; ``release``: NVML shut down before returning."""
        from fleetops.gpu.nvml import node as node_builder

        return node_builder.build(release=release)

    def release(self) -> None:
        """Let go of the GPUs for a reset or a driver reload (``NodeService.quiesce``): the
        handles dropped (the events loop frees its set when ``reinits`` moves) and NVML shut
        down as often as this process initialised it, so no device file stays open. The next
        ``light`` or ``full`` initialises it again."""
        from fleetops.gpu import nvml

        self._drop()
        self.events_quiet.wait(2.5)  # NVML must not be shut down under an event wait in progress
        nvml.release_process(self.N)

    def boot_epoch(self) -> float | None:
        try:
            with open("/proc/uptime", encoding="ascii") as fh:
                return time.time() - float(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def boot_id(self) -> str:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
                return fh.read().strip()
        except OSError:
            return "unknown"

    # events ------------------------------------------------------------------------------

    def events(self, on_xid: Callable[[str | None, int], None], stop: threading.Event) -> None:
        """XID events until ``stop``: one event set while NVML is initialised, none while it is
        not (``release`` waits on ``events_quiet`` for that). Never ends on an error: whatever
        raises (NVML, or ``on_xid``) ends the set, and a new one is registered after a backoff."""
        while not stop.is_set():
            generation = self.reinits
            self.events_quiet.clear()  # before looking: a release from here on waits for the set's end
            handles = self.handles
            if not self.initialised or generation != self.reinits or not handles:
                self.events_quiet.set()
                # quiesced or re-initialising: nothing to hold and no fault; the next NVML starts afresh
                self._events.update(registered=0, gpus=0, error=None, failures=0)
                stop.wait(0.5)
                continue
            failed = False
            try:
                self._event_set(handles, generation, on_xid, stop)
            except Exception as exc:  # noqa: BLE001 - any error ends this set, never the loop
                # NVML released or dropped under the set is not the events path's fault
                if self.initialised and generation == self.reinits:
                    self._event_failure(_reason(self.N, exc))
                    failed = True
            finally:
                self.events_quiet.set()  # the set is freed: a release need not wait out the backoff
            if failed:
                stop.wait(self._backoff())

    def _event_set(self, handles: list[tuple[str, str, Any]], generation: int,
                   on_xid: Callable[[str | None, int], None], stop: threading.Event) -> None:
        """One event set for ``handles`` until NVML is released or re-initialised (the handles
        replaced); the GPUs a registration missed are tried again on the same set after a
        backoff. Raises what NVML (or ``on_xid``) raised; frees the set in every case."""
        N = self.N
        kind = getattr(N, "nvmlEventTypeXidCriticalError", 8)
        wait = getattr(N, "nvmlEventSetWait_v2", None) or N.nvmlEventSetWait
        es = N.nvmlEventSetCreate()
        self._events["sets"] += 1
        try:
            # the bus id of every handle as registered: an event's device is looked up here, so
            # a GPU that fell off the bus (its PCI query answers GpuIsLost) keeps its bus id
            bus_of = {_handle_key(h): bus for _uuid, bus, h in handles}
            missing = [(uuid, bus, h) for uuid, bus, h in handles if uuid not in self.lost]
            retry_at = 0.0
            while not stop.is_set() and generation == self.reinits and self.handles is handles:
                if missing and time.monotonic() >= retry_at:
                    missing = self._register(es, kind, missing, len(handles))
                    retry_at = time.monotonic() + self._backoff()
                try:
                    data = wait(es, EVENTS_WAIT_MS)
                except N.NVMLError as exc:
                    if _reason(N, exc) == "Timeout":
                        continue
                    raise
                if not int(getattr(data, "eventType", kind)) & kind:
                    continue
                bus = bus_of.get(_handle_key(data.device))
                if bus is None:  # a device registered by no handle of this list: ask NVML
                    try:
                        bus = _norm_bus(as_text(N.nvmlDeviceGetPciInfo(data.device).busId))
                    except N.NVMLError:
                        bus = None
                on_xid(bus, int(data.eventData))
        finally:
            self._events["registered"] = 0
            try:
                N.nvmlEventSetFree(es)
            except Exception:  # noqa: BLE001 - NVML shut down or the driver gone: the set went with it
                pass

    def _register(self, es: Any, kind: int, todo: list[tuple[str, str, Any]], total: int) -> list[tuple[str, str, Any]]:
        """Register ``todo``'s GPUs on ``es``; returns those that failed for a reason worth
        another try (a GPU that is lost is not tried again until it is enumerated again)."""
        N = self.N
        failed: list[tuple[str, str, Any]] = []
        why: list[str] = []
        for uuid, bus, h in todo:
            try:
                N.nvmlDeviceRegisterEvents(h, kind, es)
            except N.NVMLError as exc:
                reason = _reason(N, exc)
                if reason in REINIT_REASONS:
                    raise
                if reason == "GpuIsLost":
                    self.lost.setdefault(uuid, reason)
                    continue
                failed.append((uuid, bus, h))
                why.append(f"{bus}: {reason}")
                continue
            self._events["registered"] += 1
        self._events["gpus"] = total
        if failed:
            self._event_failure("XID events not registered on " + ", ".join(why))
        else:
            self._events.update(failures=0, error=None)
        return failed

    def _event_failure(self, why: str) -> None:
        ev = self._events
        ev["failures"] += 1
        ev["last_failure"] = why
        if ev["failures"] >= EVENTS_REPORT_AFTER:
            ev["error"] = (f"NVML XID events down ({ev['failures']} failures in a row, retrying; the kernel log "
                           f"still reports XIDs): {why}")

    def _backoff(self) -> float:
        failures = int(self._events["failures"])
        return EVENTS_BACKOFF_S[min(max(failures - 1, 0), len(EVENTS_BACKOFF_S) - 1)]

    def events_status(self) -> dict[str, Any]:
        """The events path as the daemon's snapshot shows it: GPUs registered of those NVML
        enumerated, failures in a row, and ``error`` once they repeat (None while quiesced)."""
        return dict(self._events)

    # GPU operations (the reset flow, ``mig reset``, the setters) ----------------------------

    def lost_gpu(self, node: model.Node, uuid: str | None, bus_id: str | None) -> dict[str, Any] | None:
        lost_buses = {x.bus_id for x in node.xids if x.code == 79 and x.bus_id and x.gpu_uuid is None}
        enumerated = {g.bus_id for g in node.gpus}
        if bus_id:
            on_pci = _pci_vendor(bus_id) == "0x10de"
            if bus_id in lost_buses:
                return {"uuid": uuid, "bus_id": bus_id, "reason": "Xid 79: the GPU has fallen off the bus"}
            if on_pci and bus_id not in enumerated:
                return {"uuid": uuid, "bus_id": bus_id, "reason": "on the PCI bus but not enumerated by the driver"}
            return None
        unclaimed = sorted(b for b in lost_buses - enumerated if b)
        if unclaimed:
            return {
                "uuid": uuid,
                "bus_id": None,
                "reason": f"not enumerated; Xid 79 (fallen off the bus) was logged for {', '.join(unclaimed)}",
            }
        return None

    def cross_check(self, gpu: model.Gpu) -> tuple[str, str]:
        from fleetops import model

        try:
            import pynvml as nv
        except ImportError:
            return "ok", "UUID and bus id from one snapshot (pynvml not importable for a second look-up)"
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return "failed", f"NVML does not start for the second look-up: {exc}"
        try:
            by_uuid = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            bus_of_uuid = as_text(nv.nvmlDeviceGetPciInfo(by_uuid).busId)
            by_bus = nv.nvmlDeviceGetHandleByPciBusId(_nvml_bus(gpu.bus_id))
            uuid_of_bus = as_text(nv.nvmlDeviceGetUUID(by_bus))
        except nv.NVMLError as exc:
            return "failed", f"NVML look-up of {gpu.uuid} / {gpu.bus_id} failed: {exc}"
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
        if model.normalize_bus_id(bus_of_uuid) != gpu.bus_id or uuid_of_bus != gpu.uuid:
            return "failed", (
                f"NVML by UUID {gpu.uuid} -> bus {bus_of_uuid}; by bus {gpu.bus_id} -> UUID {uuid_of_bus}: they disagree"
            )
        return "ok", f"NVML by UUID -> {model.normalize_bus_id(bus_of_uuid)}, by bus id -> {uuid_of_bus}: the same GPU"

    def xids_since_reset(self, node: model.Node, reset_at: float) -> list[model.XidEvent]:
        # a kernel log keeps the XIDs that led to the reset: only later ones count
        return [x for x in node.xids if x.timestamp is None or x.timestamp >= reset_at]

    def device_prefix(self) -> str:
        from fleetops.gpu import holders

        return holders.DEVICE_PREFIX

    def holders(self) -> tuple[list[Any] | None, str | None]:
        return holders_under(self.device_prefix())

    def release_own(self) -> int:
        from fleetops.gpu import nvml

        return nvml.release_process()

    def reset(self, gpu: model.Gpu, timeout: float) -> tuple[bool, str, dict[str, Any]]:
        rc, out = nvidia_smi_reset(gpu.bus_id, timeout)
        return rc == 0, out or f"exit {rc}", {"command": ["nvidia-smi", "-r", "-i", gpu.bus_id], "exit_status": rc}

    def recreate_mig(self, uuid: str, profiles: list[str]) -> tuple[bool, str]:
        steps = [["-i", uuid, "-dci"], ["-i", uuid, "-dgi"], ["-i", uuid, "-cgi", ",".join(profiles), "-C"]]
        said = []
        for step in steps:
            rc, out = nvidia_smi_mig(step)
            said.append(f"nvidia-smi mig {' '.join(step)}: exit {rc}")
            # destroying when there is nothing to destroy is not an error worth stopping for
            if rc != 0 and step[-1] not in ("-dci", "-dgi"):
                return False, "; ".join(said) + (f": {out}" if out else "")
        return True, "; ".join(said)

    # MIG (``mig apply``), through ``gpu.nvml.MigControl`` on this object's NVML module ------------

    def hostname(self) -> str:
        return self._hostname

    def _mig(self) -> Any:
        if self._mig_control is None:
            from fleetops.gpu import nvml

            self._mig_control = nvml.MigControl(self.N)
        return self._mig_control

    def mig_read(self) -> list[dict[str, Any]]:
        from fleetops.gpu import nvml

        try:
            gpus: list[dict[str, Any]] = self._mig().read()
        except (nvml.MigControlError, nvml.NvmlUnavailable) as exc:
            raise SnapshotError(f"cannot read the node's MIG state through NVML: {exc}") from exc
        for g in gpus:
            for m in g["instances"] or []:
                m["in_use"] = bool(m["pids"])
            g.setdefault("reset_needed", None)  # told only once the mode is set: pending, or current at once
        return gpus

    def _mig_call(self, name: str, *args: Any) -> Any:
        from fleetops.gpu import nvml

        try:
            return getattr(self._mig(), name)(*args)
        except nvml.MigControlError as exc:
            raise NodeChangeError(str(exc)) from exc

    def mig_set_mode(self, uuid: str, enabled: bool) -> bool:
        return bool(self._mig_call("set_mode", uuid, enabled))

    def mig_destroy(self, uuid: str, gpu_instance_id: int) -> None:
        self._mig_call("destroy", uuid, gpu_instance_id)

    def mig_create(self, uuid: str, profile: GiProfile, start: int) -> int:
        return int(self._mig_call("create", uuid, profile.id, start, profile.placements[0][1], profile.slices))

    def apply_setting(self, setting: str, field_name: str, value: Any, uuids: list[str]) -> None:
        import pynvml as nv

        nv.nvmlInit()
        try:
            for uuid in uuids:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                if setting == "power":
                    nv.nvmlDeviceSetPowerManagementLimit(handle, int(value * 1000))
                elif setting == "persistence":
                    nv.nvmlDeviceSetPersistenceMode(handle, 1 if value else 0)
                elif setting == "mig":
                    nv.nvmlDeviceSetMigMode(handle, 1 if value else 0)
        except nv.NVMLError as exc:
            raise NodeChangeError(f"{setting}: NVML refused the change: {exc}") from exc
        finally:
            nv.nvmlShutdown()


# --- the commands that change a real node's GPUs (tests replace them) -------------------------


def nvidia_smi_reset(bus_id: str, timeout: float) -> tuple[int, str]:
    """``nvidia-smi -r -i BUS_ID`` (argument list, no shell); (exit status, output)."""
    cmd = ["nvidia-smi", "-r", "-i", bus_id]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 124, f"nvidia-smi -r timed out after {timeout:.0f}s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def nvidia_smi_mig(args: list[str], timeout: float | None = None) -> tuple[int, str]:
    """``nvidia-smi mig ARGS`` (argument list, no shell); (exit status, output)."""
    from fleetops.catalog.actions import MIG_COMMAND_TIMEOUT_S

    limit = MIG_COMMAND_TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.run(["nvidia-smi", "mig", *args], capture_output=True, text=True, timeout=limit, check=False)
    except FileNotFoundError:
        return 127, "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return 124, "nvidia-smi mig timed out"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _nvml_bus(bus_id: str) -> str:
    return "0000" + bus_id if len(bus_id) == 12 else bus_id  # NVML's 8-digit domain form


def _pci_vendor(bus_id: str) -> str | None:
    try:
        with open(f"/sys/bus/pci/devices/{bus_id}/vendor", encoding="ascii") as fh:
            return fh.read().strip().lower()
    except OSError:
        return None


def _handle_key(h: Any) -> Any:
    """A device handle as a dict key: the fake's handles are ints; nvidia-ml-py's are ctypes
    pointers, a new object for each event, so their address is the key."""
    if isinstance(h, int):
        return h
    import ctypes

    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(h)




def _norm_bus(bus: str) -> str:
    from fleetops.model import normalize_bus_id

    return normalize_bus_id(bus)


def _num(value: Any) -> Value:
    """A number NVML gave, as it gave it: an unsigned 64-bit counter stays an exact int."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None
