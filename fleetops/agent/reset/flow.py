"""``fleetops-agent reset``: reset one GPU safely, or say exactly why not.

The order never changes:

1. *Identify.* The GPU is named by UUID or PCI bus id, never by index (indices shift when a GPU
   falls off the bus). It must exist, be enumerated, and its UUID and bus id must agree (checked
   by two independent look-ups; against ``--bus-id`` when the controller passes it). An unknown
   GPU is an error before anything is touched.
2. *Preconditions* (``preconditions.py``), evaluated on the snapshot taken under the node's
   maintenance lock (``agent.lock``): row-remap failure, MIG instances in use, NVLink peers that
   must be reset together, the fabric manager on NVSwitch systems, compute processes, the Slurm
   jobs the node's job records put on the GPU, and the GPU clients that hold the device. A busy GPU
   is refused unless ``--kill-processes`` comes with ``--expect-pids``, the processes the operator
   was shown, and the GPU runs exactly those; a running job, with no process between two steps, too.
3. *Act*, only when every precondition is ok and this is not a dry run: end the confirmed
   processes (SIGTERM, SIGKILL after ``--grace``), stop the clients, reset (``nvidia-smi -r``; the
   simulator models it), restart the clients (always, also after a failure or a signal).
4. *Verify*: the GPU is back with the same UUID at the same bus id and a fresh snapshot passes
   the health checks with no critical finding on it.

A caller that holds the lock already (``mig apply``, whose MIG mode change waits for this
reset) hands it in (``Options.held_lock``): the flow checks that this process holds it, works
under it (the preconditions are judged on a snapshot taken under it, as always), moves its
deadline at each phase, and leaves it held; the caller moves the deadline back to its own work
and releases it. A second ``acquire`` by the same process would find its own live pid in the
record and refuse, so the hand-over is the only way to run the flow inside another action.

The lock's deadline is the reset's own worst case (``catalog.actions.reset_budget_s``) and is
moved at each phase to the worst case of what is left. SIGTERM, SIGHUP and SIGINT during a real
run end it cleanly: the clients this run stopped are started again, the lock is released, the
attempt is journalled with result ``interrupted`` and the agent exits 128 + the signal number.
A signal that arrives while ``nvidia-smi -r`` runs is acted on when it returns: a reset cut off
half-way leaves the GPU in a state nobody can describe.

Every attempt that is not a dry run is journalled (``journal.py``). A dry run evaluates every
precondition and changes nothing: it takes no lock (it only looks), writes no log, sends no
signal, stops no service and never reaches ``nvidia-smi -r``: ``_act`` is the only caller of
the backend's changing methods, it is not called in a dry run, and a backend built for a dry run
refuses every change.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from fleetops import model
from fleetops.agent import lock as node_lock
from fleetops.agent.reset import journal
from fleetops.agent.reset.backends import Backend, DryRunViolation, ResetError, make_backend
from fleetops.agent.reset.options import (
    Options,
    check_usage,
    parse_clients,
    parse_jobs,
    parse_pids,
    parse_selector,
)
from fleetops.agent.reset.preconditions import (
    PRECONDITIONS,
    REMEDY_INSPECT,
    REMEDY_REBOOT,
    Check,
    check_clients,
    check_fabric_manager,
    check_holders,
    check_identity,
    check_jobs,
    check_mig,
    check_nvlink_peers,
    check_processes,
    check_row_remap,
    lock_check,
    pick_remedy,
    tolerated,
)
from fleetops.catalog.actions import (
    DEFAULT_CLIENTS,
    DEFAULT_GRACE_S,
    reset_budget_s,
    reset_remaining_s,
)

REPORT_KIND = "fleetops.reset/v1"
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


# --- signals -------------------------------------------------------------------------------------


class Interrupted(BaseException):
    """SIGTERM/SIGHUP/SIGINT arrived; a BaseException so no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """Turns the handled signals into ``Interrupted`` for the duration of a real run.

    The first signal raises (unless deferred); any later one is only recorded, so the cleanup
    it started (restart the clients, release the lock, journal) is not cut short in its turn.
    The previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.received: list[int] = []
        self.pending: int | None = None
        self._defer = 0
        self._raised = False

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._raised:
            return
        if self._defer:
            if self.pending is None:
                self.pending = signum
            return
        self._raised = True
        raise Interrupted(signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal until the block ends, then raise it (a reset is not cut off half-way)."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
        if not self._defer and self.pending is not None and not self._raised:
            signum, self.pending = self.pending, None
            self._raised = True
            raise Interrupted(signum)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Record signals and never raise (the cleanup itself)."""
        raised, self._raised = self._raised, True
        try:
            yield
        finally:
            self._raised = raised


class _NoGuard:
    """A dry run installs no handler: there is nothing to clean up."""

    @contextmanager
    def deferred(self) -> Iterator[None]:
        yield

    @contextmanager
    def shielded(self) -> Iterator[None]:
        yield


# --- the whole flow --------------------------------------------------------------------------------


def run(opts: Options, backend: Backend, guard: SignalGuard | None = None) -> tuple[dict[str, Any], int]:
    """Evaluate, and unless a dry run or refused, reset and verify. (document, exit code).

    ``guard``: the caller's SignalGuard, already entered (``mig apply``): a signal during the
    reset ends it as it would end the reset command (result ``interrupted``, 128 + the signal
    number), and the guard, having raised once, only records the signals after it, so the
    caller's own cleanup runs to the end."""
    check_usage(opts)
    if opts.dry_run:
        return _Attempt(opts, backend, _NoGuard()).run()
    if guard is not None:
        return _Attempt(opts, backend, guard).run()
    with SignalGuard() as own:
        return _Attempt(opts, backend, own).run()


class _Attempt:
    """One run of the flow: the report being built, the checks so far, the lock while held."""

    def __init__(self, opts: Options, backend: Backend, guard: SignalGuard | _NoGuard) -> None:
        self.opts = opts
        self.backend = backend
        self.guard = guard
        self.clients = list(opts.clients) if opts.clients is not None else list(DEFAULT_CLIENTS)
        self.budget_s = reset_budget_s(opts.grace_s, opts.reset_timeout_s, self.clients)
        self.lock_path = opts.held_lock.path if opts.held_lock is not None else opts.lock_path or backend.default_lock()
        self.log_path = opts.log_path or backend.default_log()
        self.checks: list[Check] = []
        self.held: node_lock.Lock | None = None
        self.daemon_socket: str | None = None
        self.daemon_pid: int | None = None
        self.doc: dict[str, Any] = {
            "kind": REPORT_KIND,
            "gpu": {"selector": opts.selector, "uuid": None, "bus_id": None, "index": None, "name": None},
            "node": None,
            "backend": backend.name,
            "dry_run": opts.dry_run,
            "kill_processes": opts.kill_processes,
            "expect_pids": opts.expect_pids,
            "grace_s": opts.grace_s,
            "reset_timeout_s": opts.reset_timeout_s,
            "budget_s": self.budget_s,
            "preconditions": [],
            "refused": False,
            "remedy": None,
            "actions": [],
            "verified": False,
            "verification": None,
            "result": None,
            "message": "",
            "lock": self.lock_path,
        }

    def beat(self, phase: str) -> None:
        """Tell the lock which phase runs and move its deadline to the worst case of the rest."""
        if self.held is not None:
            self.held.heartbeat(phase, reset_remaining_s(phase, self.opts.grace_s, self.opts.reset_timeout_s, self.clients))

    def run(self) -> tuple[dict[str, Any], int]:
        started = time.time()
        doc = self.doc
        code = 1
        try:
            code = self._evaluate_and_act()
        except Interrupted as exc:
            code = 128 + exc.signum
            doc["result"] = "interrupted"
            doc["interrupted_by"] = signal.Signals(exc.signum).name
            doc["remedy"] = (
                f"the reset was interrupted by {doc['interrupted_by']}: look at the GPU "
                "(fleetops-agent reset --dry-run) before trying again"
            )
        finally:
            with self.guard.shielded():
                if self.held is not None and self.held is not self.opts.held_lock:
                    self.held.release()  # a lock handed in is the caller's to release
        with self.guard.shielded():
            doc["preconditions"] = [c.to_dict() for c in self.checks]
            if doc["result"] in ("refused", "error"):
                doc["refused"] = True
                doc["remedy"] = pick_remedy(self.checks)
            doc["message"] = _message(doc, self.checks)
            doc["elapsed_s"] = round(time.time() - started, 3)
            if not self.opts.dry_run:
                doc["log"] = journal.record(doc, self.log_path, self.opts.use_syslog, started)
        if not self.opts.dry_run and doc["result"] in ("reset", "failed") and any(
                a["action"] == "reset" for a in doc.get("actions") or []):
            # after the journal line, which is the evidence that clears a reset's XIDs: the
            # daemon's snapshot served from now on was taken after the reset and knows of it
            doc["daemon"] = self._fresh_daemon()
        return doc, code

    def _evaluate_and_act(self) -> int:
        opts, backend, doc, checks = self.opts, self.backend, self.doc, self.checks
        uuid, bus_id = parse_selector(opts.selector)
        doc["gpu"].update(uuid=uuid, bus_id=bus_id)
        expected_bus = None
        if opts.expected_bus:
            try:
                expected_bus = model.normalize_bus_id(opts.expected_bus)
            except ValueError:
                raise ResetError(f"--bus-id {opts.expected_bus!r} is not a PCI bus id", "usage", 2) from None

        node = backend.snapshot()
        doc["node"] = node.hostname
        lost = None
        found = node.gpu_by_uuid(uuid) if uuid else node.gpu_by_bus_id(bus_id or "")
        if found is None:
            lost = backend.lost_gpu(node, uuid, bus_id)
        gpu, first = check_identity(node, uuid, bus_id, expected_bus, lost)
        checks += first
        if gpu is not None and checks[1].status == "ok":
            status, detail = backend.cross_check(gpu)
            if status != "ok":
                checks[1] = Check("uuid_matches_bus_id", status, detail, "collect the node again and name the GPU by its current UUID")
            else:
                checks[1].detail = f"{gpu.uuid} is at {gpu.bus_id}: {detail}"
        doc["gpu"].update(
            uuid=gpu.uuid if gpu else (lost or {}).get("uuid") or uuid,
            bus_id=gpu.bus_id if gpu else (lost or {}).get("bus_id") or bus_id,
            index=gpu.index if gpu else None,
            name=gpu.name if gpu else None,
        )
        if gpu is None or any(c.status == "failed" for c in checks):
            done = {c.name for c in checks}
            if gpu is None:
                why = "not evaluated: the GPU is not enumerated" if lost else "not evaluated: the GPU was not found"
            else:
                why = "not evaluated: the GPU cannot be reset (see above)"
            checks += [Check(name, "skipped", why) for name in PRECONDITIONS if name not in done]
            doc["result"] = "error" if gpu is None and lost is None else "refused"
            return 1

        # the lock: a dry run only looks; a real run takes it and then looks again at the GPU
        stale_record: dict[str, Any] | None = None
        if opts.dry_run:
            peeked = node_lock.peek(self.lock_path)
            checks.append(lock_check(peeked))
            stale_record = peeked.record if peeked.state == "stale" else None
        else:
            handed = opts.held_lock
            try:
                if handed is not None:
                    self.held = _take_over(handed)
                    self.beat("preconditions")
                else:
                    self.held = node_lock.acquire(self.lock_path, "gpu reset", gpu.uuid, self.budget_s,
                                                  phase="preconditions")
            except node_lock.LockHeld as exc:
                checks.append(lock_check(node_lock.Status("held", exc.holder, path=self.lock_path)))
            except node_lock.LockError as exc:
                checks.append(Check("maintenance_lock", "failed", str(exc), "fix the lock folder's permissions"))
            else:
                if handed is not None:
                    action = handed.record.get("action") or "maintenance"
                    doc["within"] = action  # the journal says which action the reset was part of
                    checks.append(Check("maintenance_lock", "ok", f"held by this process ({action}, {self.lock_path})"))
                    if handed.recovered:
                        stale_record = handed.recovered
                elif self.held.recovered:
                    rec = stale_record = self.held.recovered
                    checks.append(
                        Check(
                            "maintenance_lock",
                            "ok",
                            f"taken over a stale lock ({node_lock.describe(rec)}): {rec.get('stale_because')}",
                            data={"recovered": rec},
                        )
                    )
                else:
                    checks.append(Check("maintenance_lock", "ok", f"taken ({self.lock_path})"))
                node = backend.snapshot()  # under the lock: nobody else changes the node now
                again = node.gpu_by_uuid(gpu.uuid)
                if again is None or again.bus_id != gpu.bus_id:
                    checks.append(
                        Check("gpu_exists", "failed", f"{gpu.uuid} changed or vanished while taking the lock", REMEDY_REBOOT)
                    )
                else:
                    gpu = again
        # services a crashed run stopped and never started again: start them after this reset
        left_stopped = [str(u) for u in (stale_record or {}).get("stopped") or []]
        states, reason = backend.services(sorted(set(self.clients) | set(left_stopped)))
        checks += [
            check_row_remap(gpu),
            check_mig(gpu),
            check_nvlink_peers(node, gpu),
            check_fabric_manager(node, gpu),
            check_processes(gpu, opts.kill_processes, opts.grace_s, opts.expect_pids),
            check_jobs(gpu, *backend.job_records(), opts.kill_processes, opts.expect_jobs),
            check_clients(states, reason, self.clients, left_stopped),
        ]
        checks.append(self._holders_check(checks[-1], opts.expect_pids if opts.kill_processes else []))
        if any(c.status == "failed" for c in checks):
            doc["result"] = "refused"
            return 1
        if opts.dry_run:
            doc["result"] = "would-reset"
            return 0
        return self._act(gpu)

    def _holders_check(self, clients: Check, end: list[int] | None) -> Check:
        """``device_holders``: who holds the device files now, each with what the flow does about
        it; the daemon is found by its socket (the kernel names the pid that answers)."""
        from fleetops.agent.serve import client

        held, reason = self.backend.holders()
        self.daemon_socket = self.backend.daemon_socket()
        self.daemon_pid = client.daemon_pid(self.daemon_socket)
        stop = list((clients.data or {}).get("stop", []))
        return check_holders(held, reason, own_pid=os.getpid(), daemon_pid=self.daemon_pid,
                             client_pids=self.backend.service_pids(stop) if stop else {}, end_pids=list(end or []))

    def _fresh_daemon(self) -> dict[str, Any] | None:
        return _daemon_after(self.daemon_socket) if self.daemon_pid is not None else None

    def _reset_alone(self, gpu: model.Gpu, actions: list[dict[str, Any]]) -> tuple[bool, str, dict[str, Any]]:
        """The reset with the daemon paused and the holders checked again right before it: any
        process still holding the device files (a job started since, a collect in flight, this
        process) fails the attempt before ``nvidia-smi -r``, which would fail on it anyway."""
        from fleetops.agent.serve import client

        lease = reset_remaining_s("reset", self.opts.grace_s, self.opts.reset_timeout_s, self.clients) + 30.0
        try:
            socket_path = self.daemon_socket or self.backend.daemon_socket()
            pause = client.Quiesce(socket_path, lease, f"reset pid {os.getpid()} {gpu.uuid}").__enter__()
        except client.QuiesceError as exc:
            actions.append({"action": "quiesce_daemon", "ok": False, "socket": self.daemon_socket, "detail": str(exc)})
            return False, f"the resident agent did not let go of the GPU: {exc}", {}
        try:
            if pause.answer is not None:
                actions.append({"action": "quiesce_daemon", "ok": True, "socket": self.daemon_socket,
                                "pid": pause.answer.get("pid")})
            released = self.backend.release_own()  # this process's own NVML (a MIG apply, the snapshots)
            if released:
                actions.append({"action": "release_nvml", "ok": True, "shutdowns": released})
            held, reason = self.backend.holders()
            if held is None:
                return False, f"cannot check who holds the GPU right before the reset ({reason})", {}
            left = [h for h in held if not tolerated(h)]
            actions.append({"action": "check_holders", "ok": not left, "holders": [h.to_dict() for h in held]})
            if left:
                return False, ("not reset: the GPU's device files are still held right before the reset: "
                               + "; ".join(h.describe() for h in left)), {"holders": [h.to_dict() for h in left]}
            t0 = time.time()
            ok, detail, extra = self.backend.reset(gpu, self.opts.reset_timeout_s)
            extra = {**extra, "elapsed_s": round(time.time() - t0, 3)}
            return ok, detail, extra
        finally:
            with self.guard.shielded():  # signals are deferred here already; the resume runs whatever comes
                pause.resume()
                if pause.answer is not None:
                    actions.append({"action": "resume_daemon", "ok": True, "detail": (pause.resumed or {}).get("why")
                                    or "connection closed: the daemon resumes"})

    def _act(self, gpu: model.Gpu) -> int:
        """End the confirmed processes, stop clients, reset, restart clients, verify. Never in a dry run."""
        opts, backend, doc = self.opts, self.backend, self.doc
        if opts.dry_run or backend.dry_run:
            raise DryRunViolation("dry run: _act must not be reached")
        actions: list[dict[str, Any]] = doc["actions"]
        listed = next((c.data or {}).get("processes", []) for c in self.checks if c.name == "compute_processes")
        confirmed = set(opts.expect_pids or [])
        procs = [p for p in listed if int(p["pid"]) in confirmed]  # never a process nobody confirmed
        if procs:
            self.beat("end_processes")
            reports = backend.end_processes(gpu, procs, opts.grace_s)
            ok = all(r["ended"] for r in reports)
            actions.append({"action": "end_processes", "ok": ok, "processes": reports})
            if not ok:
                doc["result"] = "failed"
                doc["remedy"] = "end the processes by hand (or drain and reboot the node), then retry"
                return 1
            left = backend.listed_pids(gpu)
            if left:
                actions[-1]["ok"] = False
                actions[-1]["still_listed"] = left
                doc["result"] = "failed"
                doc["remedy"] = "processes are still listed on the GPU (a job started after the confirmation?): drain it and retry"
                return 1
        client_data = next((c.data or {}) for c in self.checks if c.name == "gpu_clients")
        to_stop = list(client_data.get("stop", []))
        # left stopped by a crashed run: started again at the end, like the ones this run stops
        stopped: list[str] = [u for u in client_data.get("restart", []) if u not in to_stop]
        reset_ok = False
        t0 = time.time()
        try:
            self.beat("stop_clients")
            for unit in to_stop:
                # a signal is held until the stop is on record: a unit stopped but not noted down
                # would never be started again
                with self.guard.deferred():
                    ok, detail = backend.stop_service(unit)
                    actions.append({"action": "stop_service", "unit": unit, "ok": ok, "detail": detail})
                    if ok:
                        stopped.append(unit)
                        if self.held is not None:
                            self.held.update(stopped=list(stopped))
                if not ok:
                    doc["result"] = "failed"
                    doc["remedy"] = f"{unit} did not stop: stop it by hand and retry"
                    return 1
            self.beat("reset")
            t0 = time.time()
            # the pause, the last look and nvidia-smi -r are one step: a signal is acted on after it
            with self.guard.deferred():
                ok, detail, extra = self._reset_alone(gpu, actions)
                actions.append({"action": "reset", "bus_id": gpu.bus_id, "ok": ok, "detail": detail, **extra})
            reset_ok = ok
        finally:
            with self.guard.deferred():
                self.beat("start_clients")
                for unit in reversed(stopped):
                    ok, detail = backend.start_service(unit)
                    actions.append({"action": "start_service", "unit": unit, "ok": ok, "detail": detail})
                if self.held is not None:
                    self.held.update(stopped=[])
        if not reset_ok:
            doc["result"] = "failed"
            doc["remedy"] = f"the reset failed; {REMEDY_REBOOT}"
            return 1
        self.beat("verify")
        verification = _verify(opts, backend, gpu, t0)
        doc["verification"] = verification
        doc["verified"] = verification["ok"]
        restarted = all(a["ok"] for a in actions if a["action"] == "start_service")
        if verification["ok"] and restarted:
            doc["result"] = "reset"
            return 0
        doc["result"] = "failed"
        if not restarted:
            doc["remedy"] = "a GPU client did not start again: start it by hand (systemctl start UNIT)"
        else:
            doc["remedy"] = verification.get("remedy") or f"the GPU is not healthy after the reset; {REMEDY_INSPECT}"
        return 1


def _daemon_after(socket_path: str | None) -> dict[str, Any] | None:
    """The daemon's snapshot taken after the reset (``client.after_action``): what audits and
    the TUI are served from now on, so they never read a verdict from before the reset."""
    from fleetops.agent.serve import client

    return client.after_action(socket_path)


def _take_over(held: node_lock.Lock) -> node_lock.Lock:
    """The lock handed in by the caller, after making sure it is held, and by this process."""
    if held.released:
        raise node_lock.LockError(f"{held.path}: the maintenance lock handed to the reset was already released")
    if held.record.get("pid") != os.getpid():
        raise node_lock.LockError(f"{held.path}: the maintenance lock handed to the reset is held by pid "
                                  f"{held.record.get('pid')}, not by this process")
    return held


def _verify(opts: Options, backend: Backend, gpu: model.Gpu, reset_at: float) -> dict[str, Any]:
    """The GPU is back with the same UUID at the same bus id, and has no critical finding."""
    deadline = time.monotonic() + opts.reset_timeout_s
    node = backend.snapshot()
    back = node.gpu_by_uuid(gpu.uuid)
    while back is None and time.monotonic() < deadline:
        time.sleep(1.0)
        node = backend.snapshot()
        back = node.gpu_by_uuid(gpu.uuid)
    out: dict[str, Any] = {"ok": False, "same_uuid": back is not None, "same_bus_id": bool(back and back.bus_id == gpu.bus_id)}
    if back is None:
        at_bus = node.gpu_by_bus_id(gpu.bus_id)
        out["detail"] = f"{gpu.uuid} did not come back" + (f"; {gpu.bus_id} now shows {at_bus.uuid}" if at_bus else "")
        out["remedy"] = REMEDY_REBOOT
        return out
    if back.bus_id != gpu.bus_id:
        out["detail"] = f"{gpu.uuid} came back at {back.bus_id}, not {gpu.bus_id}"
        out["remedy"] = REMEDY_REBOOT
        return out
    node.xids = backend.xids_since_reset(node, reset_at)
    from fleetops import checks as health

    findings = [f for f in health.run_node_checks(node, None, None) if (f.gpu or {}).get("uuid") == gpu.uuid]
    crit = [f for f in findings if f.severity == "crit"]
    out["findings"] = [
        {"check": f.check, "severity": f.severity, "message": f.message, "action": f.action}
        for f in findings
        if f.severity in ("warn", "crit", "unknown")
    ]
    if crit:
        out["detail"] = "critical after the reset: " + "; ".join(f"{f.check}: {f.message}" for f in crit)
        out["remedy"] = crit[0].action or f"{REMEDY_INSPECT}"
        return out
    out["ok"] = True
    out["detail"] = f"{gpu.uuid} is back at {gpu.bus_id} with no critical finding" + (
        f" ({len(out['findings'])} warning(s) left)" if out["findings"] else ""
    )
    return out


def _message(doc: dict[str, Any], checks: list[Check]) -> str:
    gpu = doc["gpu"]
    name = f"{gpu.get('uuid') or gpu.get('selector')} ({gpu.get('bus_id') or '?'})"
    result = doc["result"]
    failed = [c for c in checks if c.status == "failed"]
    if result == "error":
        return failed[0].detail if failed else f"no such GPU: {name}"
    if result == "refused":
        why = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        return f"refused to reset {name}: {why}"
    if result == "would-reset":
        holders = next(((c.data or {}).get("holders") or [] for c in checks if c.name == "device_holders"), [])
        then = "; ".join(f"pid {h['pid']} ({h['command']}): {h['then']}" for h in holders)
        return f"dry run: every precondition holds; {name} would be reset" + (f" ({then})" if then else "")
    if result == "reset":
        return f"reset {name} and verified it"
    if result == "interrupted":
        restarted = [a["unit"] for a in doc["actions"] if a["action"] == "start_service"]
        return f"reset of {name} interrupted by {doc.get('interrupted_by')}" + (
            f"; started again: {', '.join(restarted)}" if restarted else ""
        ) + "; lock released"
    return f"reset of {name} failed" + (f": {doc['verification']['detail']}" if doc.get("verification") else "")


def main_args(args: Any, warn: Callable[[str], None] | None = None) -> tuple[dict[str, Any], int]:
    """Entry from ``fleetops-agent reset`` (argparse namespace). ``warn`` gets plain-text notes
    for stderr (the deprecated ``--timeout``)."""
    grace = args.grace
    if args.timeout is not None:
        if warn is not None:
            warn("fleetops-agent reset: --timeout is deprecated, use --grace (seconds between SIGTERM and SIGKILL)")
        if grace is None:
            grace = args.timeout
    opts = Options(
        selector=args.gpu,
        expected_bus=args.bus_id,
        dry_run=bool(args.dry_run),
        kill_processes=bool(args.kill_processes),
        expect_pids=parse_pids(args.expect_pids),
        expect_jobs=parse_jobs(args.expect_jobs),
        grace_s=float(DEFAULT_GRACE_S if grace is None else grace),
        reset_timeout_s=float(args.reset_timeout),
        clients=parse_clients(args.clients),
        log_path=args.log,
        lock_path=args.lock_file,
        use_syslog=not args.no_syslog,
    )
    check_usage(opts)
    parse_selector(opts.selector)  # usage errors before any backend is touched
    backend = make_backend(args.backend, args.state, opts.dry_run)
    return run(opts, backend)
