"""One served node: the sampler, health, XID book and the unix socket for one GPU access
(``gpu.backend.GpuAccess``: ``NvmlAccess`` on a real node, ``SimAccess`` on a simulated one).

Loops (``loops.py``, shared by the nodes one process serves): the sampler (``tick``: light read
every ``interval_s``, full snapshot every ``full_interval_s``), the kernel-log follower, the
socket server, and a watchdog that marks the node degraded when a backend call has not returned
within ``hang_s`` (the follower keeps recording XIDs meanwhile).
Readers get ``state()``: an immutable snapshot (a JSON-ready mapping built once per change).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from fleetops.agent.serve.jobs import JobBook
from fleetops.agent.serve.ring import GPU_FIELDS, Ring, Value
from fleetops.checks.thermal_power import ThrottleHold, held_throttle_findings
from fleetops.gpu import instances
from fleetops.xid import follower as kmsg

if TYPE_CHECKING:
    from fleetops.gpu.backend import GpuAccess

HISTORY_S = 3600.0
# The snapshot's counters that rate checks compare, as the ring names them.
RATE_GPU_COUNTERS = ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "pcie_replay_counter")
RATE_LINK_COUNTERS = ("crc_errors", "replay_errors", "recovery_errors", "tx_kib", "rx_kib")


def _count(value: Value) -> int | None:
    """A counter's ring value as the snapshot's int (the ring keeps counters as exact ints)."""
    if value is None or value != value:
        return None
    return value if isinstance(value, int) else int(value)


def _num(value: Any) -> Value:
    """A snapshot value for the ring: an int stays an int (a counter at 8.7e12 KiB, or past
    2**53, keeps every digit), a float stays a float, anything else is not a number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    return None


def _known(value: Any) -> Value:
    """A sample's value, NaN (not read) as None so that an unread field never reads as a change."""
    v = _num(value)
    return v if v is not None and v == v else None


class NodeService:
    def __init__(
        self,
        backend: GpuAccess,
        socket_path: str,
        state_dir: str,
        kmsg_path: str,
        interval_s: float = 2.0,
        full_interval_s: float = 10.0,
        hang_s: float = 10.0,
        baseline: Any = None,
        clear_after: int = 30,
        jobs_dir: str | None = None,
    ) -> None:
        self.backend = backend
        self.socket_path = socket_path
        self.state_dir = state_dir
        self.interval_s = interval_s
        self.full_interval_s = full_interval_s
        self.hang_s = hang_s
        self.baseline = baseline  # fleetops.baseline.Baseline or None; replaced whole on SIGHUP
        self.clear_after = clear_after  # clean light samples that clear a throttle hold
        self.started_at = time.time()
        # collected_at of the rate base the last full snapshot's findings were judged against
        # (None: no base yet, so the rate checks could only report totals)
        self.rate_since: float | None = None
        self.reloaded_at: float | None = None
        self.reload_error: str | None = None  # the last SIGHUP's refusal; the running config stayed
        self.stop = threading.Event()
        self.changed = threading.Condition()
        self.version = 0
        self.rings: dict[str, Ring] = {}
        self.lost: dict[str, str] = {}
        self.node: Any = None
        # Full snapshots over about one rate window: the previous snapshot's GPUs, links and XIDs
        # (its counters come from the ring, which holds the hour).
        self.full_history: deque[Any] = deque(maxlen=int(self.rate_window_s() / max(full_interval_s, 0.1)) + 2)
        self.findings: list[dict[str, Any]] = []  # the last full snapshot's, then the held ones
        self._checked: list[Any] = []  # the last full snapshot's findings (model.Finding)
        self.holds: dict[str, Any] = {}  # uuid -> checks.thermal_power.ThrottleHold, fed every sample
        # "<dev>/<port>" -> (time, ACTIVE or not, link_downed) of every tick that changed either,
        # over the hour (the first entry is the state at the hour's start): the RDMA ports' flaps
        # and drops (checks.fabric.history_findings). Kept as changes, a steady port costs one
        # entry and no judging.
        self.port_rings: dict[str, deque[tuple[float, bool | None, int | None]]] = {}
        # (fabric, baseline, compute ports, each port's reference): the checks' port rule, worked
        # out again only for a new fabric or a reloaded baseline
        self._port_refs: tuple[Any, Any, set[str], dict[str, dict[str, object]]] | None = None
        self._trigger_values: dict[str, tuple[Value, Value]] = {}
        self.degraded_reason: str | None = None
        self.in_call: tuple[str, float] | None = None
        # Held around every backend call (a tick, a resample, a release): a quiesce waits for the
        # call in flight instead of pulling NVML from under it.
        self.backend_lock = threading.Lock()
        # While set, the backend holds nothing and no tick calls it (a GPU reset or a driver
        # reload runs): who asked, since when, and until when at the latest (the lease).
        self.quiesced: dict[str, Any] | None = None
        self._next_full = 0.0  # time.monotonic() of the next full snapshot; 0: at the next tick
        self.last_resume: dict[str, Any] | None = None
        # _previous's last GPUs: (the retained snapshot's GPU list, GPUs with rings, base time, GPUs)
        self._prev_cache: tuple[list[Any], set[str], float, list[Any]] | None = None
        self._doc: dict[str, Any] | None = None
        self._node_doc: tuple[Any, dict[str, Any]] | None = None  # (node, to_dict(node)), shared by docs
        self._baseline_cache: tuple[Any, dict[str, Any]] | None = None
        # GPU UUID -> MIG instances and the PIDs in each (gpu/instances.py): from every light
        # read where the backend samples them (``backend.mig``), else from each full snapshot
        self.mig: dict[str, dict[str, Any]] = {}
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        os.chmod(state_dir, 0o700)
        self.book = kmsg.XidBook(os.path.join(state_dir, "xid-state.json"), self._boot_id())
        self.follower = kmsg.Follower(kmsg_path, self.book, backend.boot_epoch, self._on_xid, self.stop)
        # the node's job records (serve/jobs.py): read each tick, the snapshot tagged with them
        self.jobs: JobBook | None = JobBook(jobs_dir, HISTORY_S, interval_s) if jobs_dir else None

    def _boot_id(self) -> str:
        return self.backend.boot_id()

    # --- threads -------------------------------------------------------------------------

    def start(self) -> None:
        """This node's loops, alone in its process (``loops.start`` runs several nodes' together)."""
        from fleetops.agent.serve import loops

        loops.start([self])

    def start_events(self) -> None:
        if getattr(self.backend, "xid_events", False):  # NVML: critical XIDs as events, beside the kernel log
            threading.Thread(target=self.backend.events, args=(self._nvml_xid, self.stop), name="nvml-events",
                             daemon=True).start()

    def _nvml_xid(self, bus_id: str | None, code: int) -> None:
        event = {"seq": None, "source": "nvml", "bus_id": bus_id, "code": code, "uptime_s": None,
                 "time": round(time.time(), 3), "message": f"NVML critical XID event {code}"}
        with self.book.lock:
            added = self.book.add(event)
            self.book.save()
        if added:
            self._publish()

    def _call(self, name: str, fn: Any) -> Any:
        self.in_call = (name, time.monotonic())
        try:
            return fn()
        finally:
            self.in_call = None

    def tick(self) -> None:
        """One light sample, and the full snapshot when it is due or the sample shows a change;
        ``loops.Sampling`` calls it every ``interval_s``. A quiesced node is not sampled (its
        lease, when it runs out, ends the quiesce here)."""
        quiesced = self.quiesced
        if quiesced is not None:
            if time.time() < quiesced["until"]:
                return
            self.resume("the quiesce's lease ran out")
        if not self.backend_lock.acquire(timeout=self.hang_s):
            return  # a resample or a release holds the backend; the next tick samples
        try:
            self._tick()
        finally:
            self.backend_lock.release()

    # --- quiesce: the backend gives the GPUs back for a reset or a driver reload ----------

    def quiesce(self, by: str, lease_s: float) -> dict[str, Any]:
        """Stop sampling and release the backend (NVML shut down, its handles and event set
        dropped; the simulator's device file closed) until ``resume`` or ``lease_s`` seconds:
        what a reset or a driver unload needs from a monitoring client. The kernel-log follower
        keeps recording XIDs meanwhile. Raises ``RuntimeError`` when a backend call in flight
        does not return within the hang timeout (NVML wedged: nothing can be released)."""
        if self.quiesced is not None:
            raise RuntimeError(f"already quiesced by {self.quiesced['by']}")
        if not self.backend_lock.acquire(timeout=self.hang_s):
            call = self.in_call
            raise RuntimeError("a backend call has not returned within "
                               f"{self.hang_s:g} s ({call[0] if call else 'unknown'}): NVML cannot be released")
        try:
            now = time.time()
            self.quiesced = {"by": by, "since": now, "until": now + max(1.0, lease_s)}
            release = getattr(self.backend, "release", None)
            if release is not None:
                release()
        finally:
            self.backend_lock.release()
        self._publish()
        return dict(self.quiesced)

    def resume(self, why: str = "resumed") -> None:
        """Take the backend back: the next tick initialises it again and takes a full snapshot
        at once, so what is served after a reset was sampled after it."""
        if self.quiesced is None:
            return
        self.quiesced = None
        self.last_resume = {"at": time.time(), "why": why}
        self._next_full = 0.0
        self._publish()

    def resample(self) -> bool:
        """A light sample and a full snapshot now (``resample`` on the socket, after an
        action): False when quiesced or when the backend is busy past the hang timeout."""
        if self.quiesced is not None or not self.backend_lock.acquire(timeout=self.hang_s):
            return False
        try:
            self._next_full = 0.0
            self._tick()
        finally:
            self.backend_lock.release()
        return True

    def _tick(self) -> None:
        now = time.time()
        try:
            values, lost = self._call("sample", self.backend.light)
            if self._changed_state(values, lost):
                self._next_full = 0.0  # judge it now, not at the next full interval
            sampled = getattr(self.backend, "mig", None)
            if sampled is not None and sampled != self.mig:
                self.mig = sampled
                self._next_full = 0.0  # instances that changed are judged against the layout now
            for uuid, row in values.items():
                ring = self.rings.get(uuid)
                if ring is None:
                    ring = self.rings[uuid] = Ring(int(HISTORY_S / self.interval_s), GPU_FIELDS)
                if not ring.columns.keys() >= row.keys():
                    for name in row:
                        ring.add_field(name)
                ring.append(now, row)
                hold = self.holds.get(uuid)
                if hold is None:
                    hold = self.holds[uuid] = ThrottleHold()
                hold.observe(now, row.get("clocks_event_mask"), self.clear_after)
            self.lost.update(lost)
            if self._sample_ports(now):
                self._next_full = 0.0  # a port went down or came back: judged now, as a new DBE is
            if self.degraded_reason and self.degraded_reason.startswith("sample"):
                self.degraded_reason = None
        except Exception as exc:  # a failed tick is reported, the next one tries again  # noqa: BLE001
            self.degraded_reason = f"sample failed: {type(exc).__name__}: {exc}"
        if self.jobs is not None:
            if self.jobs.scan(now):
                self._next_full = 0.0  # a job started or ended: the snapshot's jobs change now
            self.jobs.sample_cpu(now)
        if time.monotonic() >= self._next_full:
            self._next_full = time.monotonic() + self.full_interval_s
            self._full()
        self._hold_findings()
        self._publish()

    def _sample_ports(self, now: float) -> bool:
        """The RDMA ports' state and link_downed into their rings (a backend without the call,
        a test's, samples none). True when a port seen before changed state (ACTIVE or not)."""
        read = getattr(self.backend, "fabric_ports", None)
        if read is None:
            return False
        start = now - HISTORY_S
        changed = False
        for key, (active, downed) in self._call("fabric ports", read).items():
            ring = self.port_rings.get(key)
            if ring is None:
                ring = self.port_rings[key] = deque(maxlen=int(HISTORY_S / self.interval_s) + 1)
            if ring and ring[-1][1] != active:
                changed = True
            if not ring or ring[-1][1] != active or ring[-1][2] != downed:
                ring.append((now, active, downed))
            while len(ring) > 1 and ring[1][0] <= start:
                ring.popleft()
        return changed

    def _changed_state(self, values: dict[str, dict[str, Value]], lost: dict[str, str]) -> bool:
        """Whether this tick shows what a check judges on its value, not on a rate: a new
        uncorrectable ECC error, other clocks-event reasons, a GPU gone. Such a tick takes the
        full snapshot at once, so the finding reaches watchers within a tick (counters that move
        all the time, SBE and replays, wait for the full interval: their checks are rates)."""
        changed = any(uuid not in self.lost for uuid in lost)
        for uuid, row in values.items():
            key = (_known(row.get("ecc_uncorrected_volatile")), _known(row.get("clocks_event_mask")))
            before = self._trigger_values.get(uuid)
            self._trigger_values[uuid] = key
            if before is not None and before != key:
                changed = True
        return changed

    def _full(self) -> None:
        from fleetops import checks

        try:
            node = self._call("full snapshot", self.backend.full)
        except Exception as exc:  # noqa: BLE001
            if self.degraded_reason is None:  # the per-tick read's reason, when it has one, says more
                self.degraded_reason = f"full snapshot failed: {type(exc).__name__}: {exc}"
            return
        if self.backend.name == "nvml":
            node.xids = self._xid_models(node)
        if self.jobs is not None:
            node = self.jobs.tag(node)
        previous = self._previous(node)
        self._checked = checks.run_node_checks(node, self.baseline, previous)
        self.rate_since = float(previous.collected_at) if previous is not None and previous.collected_at else None
        from fleetops.model import gpu_lost

        present = {g.uuid for g in node.gpus if not gpu_lost(g)}
        for g in node.gpus:
            if gpu_lost(g):  # listed at its index, answering GpuIsLost: lost, not gone
                self.lost.setdefault(g.uuid, "GpuIsLost")
        for uuid in [u for u in self.lost if u in present]:  # back (a reset, a reboot)
            del self.lost[uuid]
        for old in self.node.gpus if self.node is not None else []:
            if old.uuid not in present:
                self.lost.setdefault(old.uuid, "gone from the driver's enumeration")
        self.node = node
        self.full_history.append(node)
        if self.degraded_reason and self.degraded_reason.startswith("full"):
            self.degraded_reason = None

    def _hold_findings(self) -> None:
        """The last full snapshot's findings plus a throttle finding for each GPU whose hold is
        active: re-judged on every light sample, so a slowdown between two full snapshots is
        reported and a hold clears on the sample that completes it."""
        node = self.node
        if node is None:
            return
        held = held_throttle_findings(node, self.holds, self._checked, self.clear_after)
        self.findings = [f.to_dict() for f in [*self._checked, *held, *self._port_findings(node)]]

    def _port_findings(self, node: Any) -> list[Any]:
        """Flaps and drops of the RDMA ports, from their rings, judged on every tick."""
        if all(len(r) == 1 and r[0][1] is not False for r in self.port_rings.values()):
            return []  # every port up (or unread) all hour: nothing to judge
        from fleetops.baseline import DEFAULT_THRESHOLDS
        from fleetops.checks import fabric

        compute, refs = self._ports(node)
        th = self.baseline.thresholds if self.baseline is not None else DEFAULT_THRESHOLDS
        return fabric.history_findings(node.hostname, {k: list(r) for k, r in self.port_rings.items()},
                                       compute, refs, time.time(), th)

    def _ports(self, node: Any) -> tuple[set[str], dict[str, dict[str, object]]]:
        """(the compute ports, each port's reference) by ``"<dev>/<port>"``, by the checks' rule
        under this daemon's baseline (``fleetops.checks.fabric.port_labels``)."""
        cached = self._port_refs
        if cached is None or cached[0] is not node.fabric or cached[1] is not self.baseline:
            from fleetops.checks import fabric

            cached = self._port_refs = (node.fabric, self.baseline, *fabric.port_labels(node, self.baseline))
        return cached[2], cached[3]

    def _xid_models(self, node: Any) -> list[Any]:
        """The book's events as the snapshot's XIDs, attributed to GPUs by bus id."""
        from fleetops import model

        by_bus = {g.bus_id: g for g in node.gpus}
        out = []
        for ev in self.book.snapshot()["events"]:
            gpu = by_bus.get(ev.get("bus_id") or "")
            out.append(model.XidEvent(
                code=int(ev["code"]), bus_id=ev.get("bus_id"), gpu_uuid=gpu.uuid if gpu else None,
                gpu_index=gpu.index if gpu else None, message=str(ev.get("message", "")),
                timestamp=ev.get("time"), uptime_s=ev.get("uptime_s"), source=str(ev.get("source")),
            ))
        return out

    def rate_window_s(self) -> float:
        """How far back the rate base lies: long enough for every rate check under the baseline
        (``nvlink_idle_window_s`` may ask for more than a minute), and never over the ring."""
        from fleetops.baseline import DEFAULT_THRESHOLDS

        th = self.baseline.thresholds if self.baseline is not None else DEFAULT_THRESHOLDS
        window = max(float(th.nvlink_idle_window_s), float(th.rate_min_interval_s))
        return min(window, HISTORY_S - 2 * self.interval_s)

    def _previous(self, node: Any) -> Any:
        """The earlier snapshot for rate checks: the oldest retained full snapshot (GPUs, links,
        XIDs), its counters and its time both taken from one ring sample, the newest at least
        ``rate_window_s`` before ``node`` (the oldest sample while the daemon is younger). A GPU
        the ring has no sample of at that time gets no counters (no rate), never the full
        snapshot's counters beside the sample's time."""
        if not self.full_history:
            return None
        since = float(node.collected_at or 0) - self.rate_window_s()
        rings = [r for r in self.rings.values() if r.count]
        if not rings:
            return None
        t = max(r.base_time(since) for r in rings)  # one tick: every ring sampled then shares it
        base = self.full_history[0]
        prev = copy.copy(base)
        prev.collected_at = t
        cached = self._prev_cache
        if (
            cached is not None and cached[0] is base.gpus and cached[1] == self.rings.keys()
            and all(r.same_as_now(cached[2]) and r.same_as_now(t) for r in self.rings.values())
        ):  # the very same GPUs (the sim backend's unchanged state), no counter moved since
            prev.gpus = cached[3]
            return prev
        prev.gpus = self._previous_gpus(base, t)
        self._prev_cache = (base.gpus, set(self.rings), t, prev.gpus)
        return prev

    def _previous_gpus(self, base: Any, t: float) -> list[Any]:
        gpus = []
        for old in base.gpus:
            gpu = copy.copy(old)
            gpu.nvlinks = [copy.copy(link) for link in old.nvlinks] if old.nvlinks is not None else None
            ring = self.rings.get(gpu.uuid)
            values = ring.sample_at(t) if ring is not None else None
            for name in RATE_GPU_COUNTERS:
                setattr(gpu, name, _count(values.get(name)) if values is not None else None)
            for link in gpu.nvlinks or []:
                for name in RATE_LINK_COUNTERS:
                    setattr(link, name, _count(values.get(f"nvlink{link.link}_{name}")) if values is not None else None)
            gpus.append(gpu)
        return gpus

    def check_hang(self) -> bool:
        """The watchdog's look at this node (``loops`` calls it at least every second): a backend
        call running past ``hang_s`` marks the node degraded, its return clears that. True unless
        such a call is hung, which is all the systemd watchdog's ping stands for: a restart
        helps only a process stuck in a call. A degraded node (a failed sample, the driver
        unloaded, a cursor not saved) and a quiesced one (a reset has the GPUs) answer True: a
        restart would not mend them, and it would end the kernel-log follower that keeps
        recording XIDs meanwhile; the snapshot and the metrics report them."""
        call = self.in_call
        hung = call is not None and time.monotonic() - call[1] > self.hang_s
        if hung:
            assert call is not None
            reason = f"hung: backend call {call[0]!r} has not returned within {self.hang_s:g} s"
            if self.degraded_reason != reason:
                self.degraded_reason = reason
                self._publish()
        elif call is None and self.degraded_reason and self.degraded_reason.startswith("hung:"):
            self.degraded_reason = None
            self._publish()
        return not hung

    def _on_xid(self, event: dict[str, Any]) -> None:
        # the count is served at once; the snapshot's XIDs and the checks that judge them come
        # with a full snapshot, taken at the next tick rather than when the full interval ends
        # (an XID counted but not yet listed reads as a healthy node to every audit meanwhile)
        self._next_full = 0.0
        self._publish()

    # --- state ---------------------------------------------------------------------------

    def _publish(self) -> None:
        doc = self._build()
        with self.changed:
            self._doc = doc
            self.version += 1
            self.changed.notify_all()

    def _node_dict(self, node: Any) -> dict[str, Any]:
        """``to_dict(node)``, each field the previous snapshot held as the very same object (the
        sim backend's GPUs, topology and XIDs while its state is unchanged) taken from the
        previous conversion: snapshots are never mutated once taken, so the same object
        converts the same, and a thousand simulated nodes' full snapshots cost their few
        changed scalars rather than a conversion of every GPU."""
        import dataclasses

        from fleetops.model import to_dict

        if self._node_doc is None or type(self._node_doc[0]) is not type(node):
            doc: dict[str, Any] = to_dict(node)
            return doc
        old, old_doc = self._node_doc
        out: dict[str, Any] = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            out[f.name] = old_doc[f.name] if value is getattr(old, f.name) else to_dict(value)
        return out

    def _build(self) -> dict[str, Any]:
        node = self.node
        if node is not None and (self._node_doc is None or self._node_doc[0] is not node):
            self._node_doc = (node, self._node_dict(node))  # once per full snapshot, not on every publish
            if getattr(self.backend, "mig", None) is None:  # no per-tick sampling: the full snapshot's
                self.mig = instances.table(self._node_doc[1]["gpus"])
        doc: dict[str, Any] = (
            dict(self._node_doc[1]) if node is not None and self._node_doc is not None
            else {"schema": "fleetops.snapshot/v1", "gpus": []}
        )
        doc["mig"] = self.mig
        book = self.book.snapshot()
        status = getattr(self.backend, "events_status", None)
        events = status() if status is not None else None  # NVML's XID events path
        degraded = (self.degraded_reason or self.follower.error or (events or {}).get("error")
                    or book["write_error"])
        doc["daemon"] = {
            "collected_at": node.collected_at if node is not None else None,
            "interval_s": self.interval_s,
            "started_at": self.started_at,
            "rate_since": self.rate_since,
            "reloaded_at": self.reloaded_at,
            "reload_error": self.reload_error,
            # what the findings were judged by: the controller takes the daemon's rate findings
            # only when these thresholds are the ones it would use
            "baseline": self._baseline_doc(),
            "clear_after": self.clear_after,
            "degraded": degraded is not None,
            "reason": degraded,
            "pid": os.getpid(),
            "backend": self.backend.name,
            # a reset or a driver reload has the GPUs: nothing sampled meanwhile
            "quiesced": dict(self.quiesced) if self.quiesced is not None else None,
            "last_resume": self.last_resume,
            "lost": dict(self.lost),
            "findings": list(self.findings),
            # the RDMA ports the checks take for compute ports (the endpoint's role label)
            "compute_ports": sorted(self._ports(node)[0]) if node is not None and node.fabric is not None else None,
            "xid_counts": book["counts"],
            "xid_events": book["events"][-100:],
            "xid_cursor": book["seq"],
            # XIDs both sources reported, counted once, and the printk clock's measured offset
            # from wall time (NVML's stamp minus the kernel's; None until pairs measured it)
            "xid_paired": book["paired"],
            "printk_offset_s": book["printk_offset_s"],
            "nvml_events": events,
            # the job records' folder and the records in it that do not read (serve/jobs.py)
            "job_records": None if self.jobs is None else {
                "dir": self.jobs.directory, "errors": sorted(self.jobs.errors.values()),
                "list_error": self.jobs.list_error},
        }
        return doc

    def _baseline_doc(self) -> dict[str, Any] | None:
        b = self.baseline
        if b is None:
            return None
        cached = self._baseline_cache
        if cached is None or cached[0] is not b:
            import dataclasses

            cached = self._baseline_cache = (b, {"source": b.source, "thresholds": dataclasses.asdict(b.thresholds)})
        return cached[1]

    def state(self) -> tuple[int, dict[str, Any] | None]:
        """(version, document): the same object until the next change; never mutated."""
        with self.changed:
            return self.version, self._doc

    def snapshot_json(self) -> str:
        _, doc = self.state()
        if doc is None:
            return json.dumps({"error": "no snapshot yet", "kind": "starting"})
        out = dict(doc)
        daemon = dict(out["daemon"])
        at = daemon.pop("collected_at")
        daemon["age_s"] = round(time.time() - at, 3) if at else None
        out["daemon"] = daemon
        return json.dumps(out, separators=(",", ":"))

