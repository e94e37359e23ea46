"""Where the TUI's data comes from, and where its actions go: the fleet over SSH.

``SshSource.run`` is the refresh loop. It runs in a background thread and keeps every host on
its own schedule: a host is collected again ``interval`` seconds after its previous answer
arrived, on one persistent SSH session per host (``transport.SessionPool``). A dead or hung
host therefore delays nobody but itself, and until its command times out it keeps its last
good entry (with a growing age); then it is marked unreachable or hung, still with that state.

No Textual here: entries are handed to a callback, which the app turns into messages.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from fleetops import model
from fleetops.checks import verdict
from fleetops.fleet import audit, sshopts
from fleetops.ops import results as ops_results
from fleetops.tui import data, liveness

# Rate and growth checks compare with an earlier snapshot; one a few seconds old makes rates
# noisy (and below the checks' minimum interval, none at all), so the base is kept this long.
RATE_BASE_MIN_AGE_S = 60.0


# the owner kind of the TUI's drains (fleetops.catalog.slurm): an operator at this screen
OPERATOR = "operator"


@dataclass(frozen=True)
class ActionResult:
    """What drain/resume did (the reset answers with ``fleetops.ops.results.ActionResult``; both
    have ``ok`` and ``message``, which is all the app reads)."""

    ok: bool
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


def failure_status(result: Any, node_result: verdict.NodeResult) -> str:
    if getattr(result, "error_kind", None) == "timeout":
        return "timeout"
    return "unreachable" if not node_result.reachable else "error"


class SshSource:
    """The fleet of an inventory, collected with ``fleetops-agent collect`` over SSH."""

    def __init__(
        self,
        hosts: list[Any],
        baselines: dict[str, Any] | None = None,
        *,
        interval: float = 2.0,
        connect_timeout: float = 5.0,
        command_timeout: float = 15.0,
        forks: int = sshopts.FORKS,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        previous: dict[str, model.Node] | None = None,
        clock: Callable[[], float] = time.time,
        drain_db: str | None = None,
    ) -> None:
        from fleetops.fleet import transport

        self.hosts = {h.name: h for h in hosts}
        self.baselines = baselines or {}
        # where drains and resumes from this screen are recorded (None: not recorded)
        self.drain_db = drain_db
        self.interval = float(interval)
        self.clock = clock
        self._connect_timeout = float(connect_timeout)
        self._known_hosts = known_hosts
        self._accept_new_hostkeys = accept_new_hostkeys
        self.pool = transport.SessionPool(
            hosts,
            forks=forks,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            known_hosts=known_hosts,
            accept_new_hostkeys=accept_new_hostkeys,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, min(forks, len(hosts) or 1)), thread_name_prefix="tui-poll"
        )
        self._entries: dict[str, data.NodeEntry] = {}
        self._rate_base: dict[str, model.Node] = dict(previous or {})
        # one collect per host at a time: a re-audit waits for the poll in flight
        self._host_locks = {name: threading.Lock() for name in self.hosts}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    def agent(self, name: str) -> str:
        return str(self.hosts[name].vars.get(audit.AGENT_COMMAND_VAR, audit.DEFAULT_AGENT))

    # --- collecting --------------------------------------------------------------------

    def collect(self, name: str, after_action: bool = False) -> data.NodeEntry:
        """Collect one host now and return its new entry (never raises for host trouble).
        ``after_action``: the snapshot is taken now (the daemon samples on request, else a cold
        collect), never one the daemon took before the action."""
        command = [self.agent(name), "collect"] + (["--resample"] if after_action else [])
        with self._host_locks[name]:
            result = self.pool.run_one(name, command, idempotent=True)
            return self._ingest(name, result)

    def gpu_history(self, name: str, uuid: str) -> dict[str, list[tuple[float, float | None]]]:
        """The daemon's last hour of one GPU's charted fields (``charts.FIELDS``: temperatures,
        power, utilisation, SM clock and the clocks-event bits), from one ``fleetops-agent
        history`` over the host's session. Raises ``HistoryError`` (its kind
        ``no-daemon`` when the node runs no daemon) instead of returning empty series."""
        import json as _json

        from fleetops.agent.serve.history_cli import HistoryError
        from fleetops.tui.widgets.charts import FIELDS

        command = [self.agent(name), "history", "--gpu", uuid, "--fields", ",".join(FIELDS)]
        deadline = time.monotonic() + 2 * self._connect_timeout
        # under the host's lock, as every command on its session is: the pool runs one command
        # per host, and a history read in flight there made a reset sent meanwhile come back
        # "busy: the previous command has not finished" (not sent, so not done)
        lock = self._host_locks[name]
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise HistoryError("busy", f"{name}: the host's session stayed busy (a poll or an action in flight)")
        try:
            while True:  # the pool's own one-at-a-time guard, for a caller outside these locks
                result = self.pool.run_one(name, command, idempotent=True)
                if result.ok or result.exit_status is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            lock.release()
        if result.exit_status is None:
            raise HistoryError(result.error_kind or "unreachable", f"{name}: {result.error or 'no answer'}")
        if result.exit_status != 0:
            try:
                err = _json.loads(result.stderr.strip().splitlines()[-1])
                raise HistoryError(str(err.get("kind") or "failed"), f"{name}: {err['error']}")
            except (ValueError, IndexError, KeyError, TypeError, AttributeError):
                raise HistoryError("failed", f"{name}: history exited {result.exit_status}: {result.stderr.strip()[:200]}") from None
        try:
            doc = _json.loads(result.stdout)
            return {f: [(float(t), None if v is None else float(v)) for t, v in doc.get(f, [])] for f in FIELDS}
        except (ValueError, TypeError, AttributeError) as exc:
            raise HistoryError("failed", f"{name}: history printed no JSON object: {exc}") from exc

    def _ingest(self, name: str, result: Any) -> data.NodeEntry:
        node_result, problem = audit.node_from_result(name, result)
        with self._lock:
            previous = self._entries.get(name)
        snap = node_result.snapshot
        if snap is None:
            assert problem is not None
            status = failure_status(result, node_result)
            if status == "timeout":
                # a command that never answered on a session: a hung host, or one that went
                # away under the session (no keepalive ends it sooner); the SSH port tells
                probed = self.probe_host(name)
                if probed is not None and probed[0] == liveness.UNREACHABLE:
                    status = "unreachable"
                    problem = replace(problem, message=f"{problem.message}; {probed[1]}")
            entry = data.mark_failed(name, status, problem, previous)
        else:
            snap.hostname = name  # the inventory name is the node's identity, as in audits
            findings = self.judge(name, snap)
            seen = self.clock()
            age = snap.daemon.get("age_s") if isinstance(snap.daemon, dict) else None
            if isinstance(age, (int, float)) and age > 0:  # a daemon's snapshot is as old as it says
                seen -= float(age)
            entry = data.summarize(name, snap, findings, seen, previous, self.baselines.get(name))
            with self._lock:
                base = self._rate_base.get(name)
                if base is None or snap.collected_at - base.collected_at >= RATE_BASE_MIN_AGE_S:
                    self._rate_base[name] = snap
        with self._lock:
            self._entries[name] = entry
        return entry

    def probe_host(self, name: str) -> tuple[str, str] | None:
        """``liveness.probe`` of the host's SSH port, or None where it cannot be probed from
        here (a local connection, a host behind a jump host, an unusable SSH config)."""
        from fleetops.fleet import transport

        host = self.hosts[name]
        if getattr(host, "connection", "ssh") == "local":
            return None
        try:
            target = self.pool.target(host)
        except transport.Failure:
            return None
        if target.jumps:
            return None
        return liveness.probe(target.hostname, target.port, min(liveness.PROBE_TIMEOUT_S, self._connect_timeout))

    def judge(self, name: str, snap: model.Node) -> list[model.Finding]:
        """The node's findings as ``fleetops audit`` gives them (``verdict.node_findings``: with a
        daemon's snapshot, the daemon's rate and held findings). The TUI's own run of the rate
        checks against its older rate base measured another window: after a reset it called
        CRIT a node the daemon and a fresh audit called clean."""
        with self._lock:
            base = self._rate_base.get(name)
        result = verdict.NodeResult(name, True, None, snap)
        try:
            return list(verdict.node_findings(result, self.baselines.get(name), base if base is not snap else None))
        except Exception:  # noqa: BLE001 - run_checks says a check bug in its own words
            return self.run_checks(name, snap)

    def run_checks(self, name: str, snap: model.Node) -> list[model.Finding]:
        from fleetops import checks

        with self._lock:
            base = self._rate_base.get(name)
        previous = base if base is not None and base is not snap else None
        try:
            return list(checks.run_node_checks(snap, self.baselines.get(name), previous))
        except Exception as exc:  # noqa: BLE001 - a check bug must not blank the screen: say it, keep the data
            return [
                model.Finding(
                    check="tui.checks_failed",
                    severity="unknown",
                    node=name,
                    message=f"checks raised {type(exc).__name__}: {exc}",
                    action="Report this as a fleetops bug, with the node's snapshot (fleetops-agent collect).",
                )
            ]

    def run(self, should_stop: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        """Keep every host refreshed until ``should_stop()``; ``deliver`` gets each new entry
        from a pool thread as soon as it is there."""
        due = {name: 0.0 for name in self.hosts}
        running: set[str] = set()
        done_lock = threading.Lock()
        changed = threading.Event()

        def one(name: str) -> None:
            try:
                entry = self.collect(name)
                if not should_stop():
                    deliver(entry)
            finally:
                with done_lock:
                    running.discard(name)
                    due[name] = time.monotonic() + self.interval
                changed.set()

        while not should_stop():
            now = time.monotonic()
            with done_lock:
                ready = [n for n, t in due.items() if t <= now and n not in running]
                running.update(ready)
                pending = [t for n, t in due.items() if n not in running]
            for name in ready:
                self._executor.submit(one, name)
            wait = max(0.05, min(pending) - now) if pending else 0.25
            changed.wait(min(wait, 0.25))  # short, so a quit is noticed at once
            changed.clear()

    # --- actions -----------------------------------------------------------------------

    def _entry(self, name: str) -> data.NodeEntry | None:
        with self._lock:
            return self._entries.get(name)

    def run_action(self, name: str, command: list[str], timeout_s: float) -> Any:
        """Run an action's command on the host's session with the action's own timeout (a reset
        outlasts the collect timeout by far), after the poll in flight there; sent at most once."""
        with self._host_locks[name]:
            return self.pool.run_one(name, command, timeout=timeout_s)

    def reset_gpu(
        self, name: str, uuid: str, bus_id: str | None = None, pids: Sequence[int] | None = None,
        jobs: Sequence[str] | None = None,
    ) -> ops_results.ActionResult:
        """Reset one GPU through ``fleetops.ops.reset``, as ``fleetops reset`` does: the agent
        checks every precondition, ends exactly ``pids`` (the processes the dialog showed; none
        shown: none ended, and a busy GPU is refused), resets, verifies. ``bus_id`` makes it
        refuse if the UUID has moved since the screen saw it. ``jobs``: the Slurm jobs the dialog
        named on the GPU; with processes to end, a job not among them refuses the reset."""
        from fleetops.common import selectors
        from fleetops.ops import reset as ops_reset

        host = self.hosts[name]
        gpu = selectors.ResolvedGpu(selectors.parse(uuid), uuid, bus_id)
        entry = self._entry(name)  # the snapshot the dialog was planned on names its backend
        planned = entry.snapshot.backend if entry is not None and entry.snapshot is not None else None
        result = ops_reset.run(
            host,
            gpu,
            lambda argv, timeout: self.run_action(name, argv, timeout),
            kill_pids=list(pids or ()),
            timeout_s=ops_reset.command_timeout_s(),
            planned_backend=planned,
            expect_jobs=jobs,
        )
        report = result.detail.get("report")
        if report is not None:
            result.detail["text"] = ops_reset.render(name, report)
        if result.check:
            return ops_results.ActionResult(
                result.node, result.action, result.outcome, f"{result.message}; check: {result.check}",
                result.check, result.detail,
            )
        return result

    def drain(self, name: str, purpose: str) -> ActionResult:
        """Drain as an operator (``operator/USER@HOST``) for ``purpose`` (the worst finding's
        check): another owner's drain is left as it is and named; the capacity guard applies."""
        return self._scontrol(name, "DRAIN", purpose)

    def resume(self, name: str) -> ActionResult:
        """Lift an operator's drain; another owner's is refused and named (no force here:
        ``fleetops resume --force`` is the deliberate way)."""
        return self._scontrol(name, "RESUME", None)

    @functools.cached_property
    def operator_run(self) -> str:
        """This TUI's run id as the owner of its drains: ``USER@HOST`` (ops.slurm.operator_run)."""
        from fleetops.ops import slurm

        return slurm.operator_run()

    def slurm_refusal(self, name: str, verb: str) -> str | None:
        """Why drain/resume cannot apply to this node, known before asking anything (no
        network: this runs before the dialog). Slurm itself answers the rest after it."""
        refusal = self._slurm_control.precheck(self.hosts[name])
        if refusal is None:
            return None
        entry = self._entry(name)
        if entry is not None and entry.snapshot is not None and entry.snapshot.backend == "sim":
            return f"{name} is a simulated node, not a Slurm node: nothing to {verb} (scontrol not run; {refusal})"
        return f"{name}: cannot {verb}: {refusal}"

    def resume_refusal(self, name: str) -> str | None:
        """Why a resume from here would be refused, asked before the dialog (reads the node's
        State and Reason: network): another owner's drain, named (catalog.slurm.resume_decision
        through ops.slurm's dry run), or a node that is not drained. None: the dialog may ask."""
        from fleetops.ops import results

        if self.slurm_refusal(name, "resume"):
            return None  # said by slurm_refusal already
        done = self._slurm_control.resume(self.hosts[name], kind=OPERATOR, run=self.operator_run, dry_run=True)
        if done.outcome == results.REFUSED:
            return f"resume refused: {done.message}"
        return None

    def drain_plan(self, names: Sequence[str], purpose: str) -> list[ops_results.ActionResult]:
        """What draining ``names`` one at a time would do, before anything is sent (the filtered
        drain's dialog shows it): ``ops.slurm.SlurmControl.plan_drains``, the capacity guard of
        ``fleetops drain``, over the Slurm nodes; a node that is no Slurm node here
        (``slurm_refusal``) is refused as such (``detail["slurm"]`` False) without asking Slurm."""
        planned: dict[str, ops_results.ActionResult] = {}
        asked = []
        for name in names:
            refusal = self.slurm_refusal(name, "drain")
            if refusal:
                planned[name] = ops_results.ActionResult(name, "drain", ops_results.REFUSED, refusal, detail={"slurm": False})
            else:
                asked.append(self.hosts[name])
        if asked:
            for done in self._slurm_control.plan_drains(asked, purpose, kind=OPERATOR, run=self.operator_run):
                planned[done.node] = done
        return [planned[name] for name in names]

    def slurm_node(self, name: str) -> Any:
        """The node as Slurm shows it now (``ops.slurm.SlurmControl.read``: State, Reason, the
        drain's owner): for the node screen's header, read in a worker (network). A simulated
        node that Slurm cannot be asked about is no Slurm node, as ``slurm_refusal`` says."""
        from fleetops.ops import slurm

        host = self.hosts[name]
        entry = self._entry(name)
        simulated = entry is not None and entry.snapshot is not None and entry.snapshot.backend == "sim"
        refusal = self._slurm_control.precheck(host) if slurm.slurm_managed(host) and simulated else None
        if refusal:
            return slurm.NodeReading(name, managed=False, problem=f"a simulated node; {refusal}")
        return self._slurm_control.read(host)

    def _scontrol(self, name: str, state: str, purpose: str | None) -> ActionResult:
        """Drain or resume through ``fleetops.ops.slurm``: scontrol on the controller or the
        inventory's Slurm host, never on the node (a hung node can be drained)."""
        verb = "drain" if state == "DRAIN" else "resume"
        refusal = self.slurm_refusal(name, verb)
        if refusal:
            return ActionResult(False, refusal, {"slurm": False, "outcome": "refused"})
        control = self._slurm_control
        host = self.hosts[name]
        run = self.operator_run
        if state == "DRAIN":
            done = control.drain(host, purpose, kind=OPERATOR, run=run)
        else:
            done = control.resume(host, kind=OPERATOR, run=run)
        message = done.message
        if self.drain_db is not None:
            import io

            from fleetops.ops import drain_log

            # stderr lies under the screen: a store that cannot be written is said in the
            # action's message instead (the action itself stands)
            warned = io.StringIO()
            drain_log.record(self.drain_db, done, kind=OPERATOR, run=run, purpose=purpose, source="tui", warn=warned)
            if warned.getvalue():
                message += " (" + warned.getvalue().strip().removeprefix("fleetops: warning: ") + ")"
        return ActionResult(done.ok, message, {"outcome": done.outcome, "check": done.check, **done.detail})

    @functools.cached_property
    def _slurm_control(self) -> Any:
        """Drain/resume through ops.slurm, reaching a Slurm host the way the pool reaches nodes."""
        from fleetops.ops import slurm

        return slurm.SlurmControl(self.hosts, **self.pool.ssh_settings())

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.pool.close()


def resolve_hosts(
    inventory: str, baseline: str | None, limit: str | None = None
) -> tuple[list[Any], dict[str, Any]]:
    """Hosts and per-host baselines, as ``fleetops audit`` resolves them."""
    from fleetops.fleet import inventory as inv
    from fleetops.ops.baseline import resolve_baselines

    hosts = inv.load(inventory, limit)
    return hosts, resolve_baselines(hosts, baseline, inventory)


def previous_snapshots(store: Any, names: Iterable[str]) -> dict[str, model.Node]:
    if store is None:
        return {}
    try:
        found: dict[str, model.Node] = store.previous_snapshots(list(names))
        return found
    except sqlite3.Error:  # no rate base rather than no TUI
        return {}
