"""The app's action handlers: re-audit, GPU reset, drain (one node, or the nodes a filter shows,
through the capacity guard), resume. Each asks first where it must (a dialog that defaults to
Cancel), runs in a thread worker, reports with ``notify``, writes its outcome to the action log,
and settles it with what came after: a snapshot taken after the action, or Slurm's State read
after a drain or resume.

A mixin of ``FleetApp`` (``tui/app.py``), on ``ActionGates`` (``tui/gating.py``): read-only mode
refuses every one of them, and a drain or resume asks the node's Slurm side again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual import work
from textual.notifications import SeverityLevel

from fleetops.ops import results as ops_results
from fleetops.tui import data
from fleetops.tui.gating import ActionGates


def snapshot_time(collected_at: float) -> str:
    """A snapshot's time as the toast and the header name it (the node's clock, local time)."""
    return time.strftime("%H:%M:%S", time.localtime(collected_at))



class ActionHandlers(ActionGates):
    """The actions an operator takes from the screens, as part of ``FleetApp``."""

    # FleetApp's state (set in its __init__) and methods, which the handlers use
    action_log: Any
    action_note: str
    last_action: Any

    if TYPE_CHECKING:

        def deliver(self, entry: data.NodeEntry) -> None: ...

        def refresh_screens(self, changed: list[str] | None = None) -> None: ...

    def request_reaudit(self, name: str) -> None:
        if self.refuse_readonly("re-audit"):
            return
        if self.source is None:
            self.notify(f"{name}: no live source to re-audit from", severity="warning")
            return
        self.notify(f"re-auditing {name} ...", timeout=2)
        self._reaudit(name)

    @work(thread=True, group="actions", exit_on_error=False)
    def _reaudit(self, name: str, after: str = "re-audited") -> None:
        entry = self.source.collect(name, after_action=True)  # the node now, not the daemon's last sample
        self.deliver(entry)
        self.from_worker(self._report_entry, entry, after)

    def _report_entry(self, entry: data.NodeEntry, what: str, logged: Any = None) -> None:
        """Toast the verdict of ``entry`` (collected after the action), naming its snapshot's
        time; the header keeps the same words until the next action."""
        shown = self.state.entries.get(entry.name)
        if (
            entry.status == data.STATUS_OK and shown is not None and shown.status == data.STATUS_OK
            and shown.snapshot is not None and entry.snapshot is not None
            and shown.snapshot.collected_at > entry.snapshot.collected_at
        ):
            entry = shown  # a newer snapshot reached the screen first: the toast says what it shows
        if entry.status != data.STATUS_OK:
            why = entry.problem.message if entry.problem else entry.status
            self.action_note = f"{entry.name} {what}: {entry.mark}, no snapshot after it"
            self._log_verdict(entry.name, what, "unknown", f"{self.action_note} ({why})", logged)
            self.notify(f"{entry.name} {what}: {entry.mark} ({why})", severity="error", timeout=8)
            self.refresh_screens(None)
            return
        counts: dict[str, int] = {}
        for f in entry.findings:
            if f.severity in ("warn", "crit", "unknown"):
                counts[f.severity] = counts.get(f.severity, 0) + 1
        detail = ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items())) or "no faults"
        sev: SeverityLevel = (
            "error" if entry.health == "crit" else "warning" if entry.health == "warn" else "information"
        )
        snap = entry.snapshot
        source = "daemon, sampled now" if snap is not None and isinstance(snap.daemon, dict) else "cold collect"
        taken = snapshot_time(snap.collected_at) if snap is not None else "?"
        self.action_note = f"{entry.name} {what}: {entry.health.upper()} from the snapshot of {taken}"
        self._log_verdict(entry.name, what, "verified", f"{self.action_note} ({detail})", logged)
        self.notify(
            f"{entry.name} {what}: {entry.health.upper()} ({detail}; {source}; snapshot {taken})", severity=sev, timeout=6
        )
        self.refresh_screens(None)

    def _log_verdict(self, name: str, what: str, outcome: str, why: str, logged: Any) -> None:
        """The action log: a sent action settles with the verdict after it; a re-audit is logged."""
        if logged is not None:
            self.action_log.settle(logged, outcome, why)
        elif what == "re-audited":
            self.action_log.add(name, "re-audit", outcome, why)

    def request_reset(self, name: str, uuid: str) -> None:
        """Ask first (the dialog names node, GPU and the processes a reset ends), then reset,
        passing exactly the PIDs the dialog showed: none shown, none ended."""
        if self.refuse_readonly("GPU reset"):
            return
        from fleetops.tui.screens.confirm import ConfirmScreen, reset_question

        entry = self.state.entries.get(name)
        if entry is None or entry.gpu(uuid) is None:
            self.notify(f"{name}: no GPU {uuid} to reset", severity="error")
            return
        from fleetops.tui.refusals import reset_refusal

        refusal = reset_refusal(entry, uuid)
        if refusal:  # disabled: said at once, no dialog
            self.notify(f"{name}: reset refused: {refusal}", severity="warning", timeout=8)
            self.action_log.add(name, "reset", "refused", refusal, gpu=uuid)
            return
        question = reset_question(entry, uuid, self.state.clock(), fleet_jobs=self.state.jobs_known)
        bus_id = entry.gpu(uuid).bus_id  # type: ignore[union-attr]
        shown = question.pids or ()

        def answered(yes: bool | None) -> None:
            if yes:
                self.notify(f"resetting {uuid} on {name} ...", timeout=3)
                self._action(name, "reset", lambda: self.source.reset_gpu(name, uuid, bus_id, shown, question.jobs),
                             gpu=uuid)
            else:
                self.notify(f"reset of {uuid} on {name} cancelled", timeout=3)

        self.push_screen(ConfirmScreen(question, confirm_label="Reset GPU"), answered)

    def _slurm_refused(self, name: str, verb: str) -> bool:
        if self.source is None:
            self.notify(f"{name}: no live source to {verb} through", severity="warning")
            return True
        refusal = self.source.slurm_refusal(name, verb)
        if refusal:
            self.notify(refusal, severity="warning", timeout=8)
            self.action_log.add(name, verb, "refused", refusal)
        return bool(refusal)

    def request_drain(self, name: str) -> None:
        if self.refuse_readonly("drain") or self._slurm_refused(name, "drain"):
            return
        lines = [
            f"Node:    {name}",
            "",
            "Slurm stops scheduling jobs on it; running jobs finish.",
            "A drain someone else set stays as it is (theirs, named).",
            *self.drain_job_lines([name]),
        ]

        def answered(purpose: str | None) -> None:
            if purpose:
                self._action(name, "drain", lambda: self.source.drain(name, purpose))
            else:
                self._drain_cancelled([name])

        self.push_screen(self._drain_screen(f"Drain {name}?", lines, self.drain_purpose([name])), answered)

    # --- the drain's reason prompt and the drain of a filtered set ------------------------

    def drain_job_lines(self, names: list[str], listed: int = 12) -> list[str]:
        """The running jobs a drain of ``names`` would hit (they finish; nothing new starts), by
        the nodes' last snapshots; nothing where no node of the fleet reports jobs (the dialog
        reads as it did)."""
        if not self.state.jobs_known:
            return []
        now = self.state.clock()
        if len(names) == 1:
            entry = self.state.entries.get(names[0])
            return ["", *data.jobs.running_lines(entry.snapshot if entry else None, now)]
        hit: list[str] = []
        unknown: list[str] = []
        for name in names:
            entry = self.state.entries.get(name)
            jobs = entry.running_jobs if entry is not None else None
            if jobs is None:
                unknown.append(name)
            elif jobs:
                hit.append(f"  {name}: " + ", ".join(f"{j.job_id} ({j.user or j.uid or '?'})" for j in jobs))
        count = len({j.job_id for n in names for j in (getattr(self.state.entries.get(n), "running_jobs", None) or [])})
        out = ["", f"Running jobs on these nodes: {count}" + (", which a drain lets finish:" if count else "")]
        out += hit[:listed] + ([f"  and {len(hit) - listed} more nodes with jobs"] if len(hit) > listed else [])
        if unknown:
            shown = ", ".join(unknown[:listed]) + (f" and {len(unknown) - listed} more" if len(unknown) > listed else "")
            out.append(f"Jobs unknown (no job records in the snapshot): {shown}")
        return out

    def drain_purpose(self, names: list[str]) -> str:
        """The reason the prompt starts with: the check of the nodes' worst finding (the one most
        of them share), or a plain one where none has a finding."""
        checks: dict[str, int] = {}
        for name in names:
            entry = self.state.entries.get(name)
            worst = entry.worst if entry else None
            if worst is not None and worst.check:
                checks[worst.check] = checks.get(worst.check, 0) + 1
        return max(checks, key=lambda c: (checks[c], c)) if checks else "drained from the TUI"

    def drain_purpose_refusal(self, purpose: str) -> str | None:
        """Why the prompt's reason cannot be sent (empty, too long for Slurm's Reason)."""
        from fleetops.ops import slurm

        run = getattr(self.source, "operator_run", None)
        if not isinstance(run, str):  # no source that names its run: the rule's limit with a short one
            run = "operator"
        return slurm.purpose_refusal("operator", run, purpose)

    def _drain_screen(self, title: str, lines: list[str], purpose: str, waiting: str | None = None) -> Any:
        from fleetops.tui.screens.drain import DrainScreen

        return DrainScreen(title, lines, purpose, self.drain_purpose_refusal, self._drain_reason, waiting=waiting)

    def _drain_cancelled(self, names: list[str]) -> None:
        from fleetops.ops import action_log

        self.notify("drain cancelled: nothing sent", timeout=3)
        for name in names:
            self.action_log.add(name, "drain", action_log.CANCELLED, "cancelled at the reason prompt: nothing sent")

    def request_drain_set(self, names: list[str], filter_text: str, job: str | None = None) -> None:
        """Drain the nodes the filter shows, through the capacity guard: one dialog with the
        count, the reason prompt and the guard's answer (asked before anything is sent); the
        allowed nodes are then drained once each, the others are not sent, and every node's
        outcome goes to the action log. Without a filter (``/``, or the job filter ``j``) nothing
        is offered."""
        if self.refuse_readonly("drain"):
            return
        if not filter_text and not job:
            self.notify("filter first (/): a drain of every node the screen shows is not offered", severity="warning")
            return
        described = " ".join(([f"/{filter_text}/"] if filter_text else []) + ([f"job {job}"] if job else []))
        if not names:
            self.notify(f"the filter {described} shows no node: nothing to drain", severity="warning")
            return
        if self.source is None or not hasattr(self.source, "drain_plan"):
            self.notify("no live source to drain through", severity="warning")
            return
        from fleetops.tui.screens.drain import plan_placeholder

        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        lines = [
            f"Filter {described}: {len(names)} node{'s' if len(names) != 1 else ''} ({shown})",
            "Each allowed node is drained once, in turn; refused nodes are not sent.",
            "Slurm stops scheduling jobs on them; running jobs finish. A drain someone else set stays as it is.",
            *self.drain_job_lines(list(names)),
        ]
        purpose = self.drain_purpose(names)
        screen = self._drain_screen(
            f"Drain {len(names)} node{'s' if len(names) != 1 else ''}?", lines, purpose, plan_placeholder(len(names))
        )

        def answered(chosen: str | None) -> None:
            plan = screen.plan
            if chosen and plan is not None:
                self._drain_set(plan, chosen)
            else:
                self._drain_cancelled(list(names))

        self.push_screen(screen, answered)
        self._plan_drain_set(screen, list(names), purpose)

    @work(thread=True, group="actions", exit_on_error=False)
    def _plan_drain_set(self, screen: Any, names: list[str], purpose: str) -> None:
        from fleetops.tui.screens.drain import Plan

        try:
            planned = self.source.drain_plan(names, purpose)
        except Exception as exc:  # noqa: BLE001 - said in the dialog, which then cannot confirm
            why = f"the capacity guard could not be asked: {type(exc).__name__}: {exc}"
            self.from_worker(lambda: screen.show_error(why) if screen.is_running else None)
            return

        def show() -> None:
            if screen.is_running:  # not dismissed while Slurm was asked
                screen.show_plan(Plan.of(planned))

        self.from_worker(show)

    @work(thread=True, group="actions", exit_on_error=False)
    def _drain_set(self, plan: Any, purpose: str) -> None:
        """The set's drain, as the dialog showed it: the refused are logged, the allowed are sent
        once each, in turn (each drain passes the guard again; nothing is retried)."""
        from fleetops.ops import action_log

        for node, why in (*plan.refused, *plan.not_slurm, *plan.already):
            self.action_log.add(node, "drain", ops_results.REFUSED, why)
        sent = 0
        for node in plan.allowed:
            if self.exiting:
                return
            try:
                result = self.source.drain(node, purpose)
            except Exception as exc:  # noqa: BLE001 - one node's failure is logged; the next is its own drain
                result = ops_results.ActionResult(node, "drain", ops_results.FAILED, f"{node}: drain failed: {exc}")
            self.action_log.add(node, "drain", action_log.outcome_of(result), action_log.why_of(result))
            sent += bool(result.ok)
            self.last_action = result
            self.from_worker(self.forget_slurm_state, node)
        refused = len(plan.refused) + len(plan.not_slurm) + len(plan.already)
        self.from_worker(
            self.notify,
            f"drained {sent} of {len(plan.allowed)} allowed node(s); {refused} not sent (action log: l)",
            severity="information" if sent == len(plan.allowed) else "warning",
            timeout=10,
        )

    def _drain_reason(self, purpose: str) -> str:
        """The Reason the drain writes, as Slurm will show it (the source's operator run)."""
        from fleetops.catalog import slurm as rule

        run = getattr(self.source, "operator_run", None)
        try:
            return rule.drain_reason("operator", run, purpose) if isinstance(run, str) else purpose
        except ValueError:
            return purpose

    # --- resume, and what every action does once sent ---------------------------------------

    def request_resume(self, name: str) -> None:
        if self.refuse_readonly("resume") or self._slurm_refused(name, "resume"):
            return
        if hasattr(self.source, "resume_refusal"):  # another owner's drain: refused before the dialog
            self._resume_precheck(name)
            return
        self._ask_resume(name, None)

    @work(thread=True, group="actions", exit_on_error=False)
    def _resume_precheck(self, name: str) -> None:
        try:
            refusal = self.source.resume_refusal(name)
        except Exception:  # noqa: BLE001 - the check is advisory: the resume itself decides again
            refusal = None
        self.from_worker(self._ask_resume, name, refusal)

    def _ask_resume(self, name: str, refusal: str | None) -> None:
        self.resume_refusals[name] = (time.monotonic(), refusal)
        self.update_gates()
        if refusal:
            self.notify(refusal, severity="warning", timeout=10)
            self.action_log.add(name, "resume", "refused", refusal)
            return
        from fleetops.tui.screens.confirm import ConfirmScreen, Question

        question = Question(
            title=f"Resume {name}?",
            lines=[
                f"Node:    {name}",
                "",
                "Slurm may schedule jobs on it again.",
                "Only an operator's drain is lifted; another owner's is refused and named",
                "(fleetops resume --force lifts it, after reading why it was drained).",
            ],
        )

        def answered(yes: bool | None) -> None:
            if yes:
                self._action(name, "resume", lambda: self.source.resume(name))

        self.push_screen(ConfirmScreen(question, confirm_label="Resume"), answered)

    @work(thread=True, group="actions", exit_on_error=False)
    def _action(self, name: str, what: str, call: Callable[[], Any], gpu: str | None = None) -> None:
        if self.source is None:
            self.from_worker(self.notify, f"{name}: no live source for {what}", severity="warning")
            return
        try:
            result = call()
        except Exception as exc:  # a failed action is reported, never kills the screen  # noqa: BLE001
            result = ops_results.ActionResult(
                name, what, ops_results.FAILED, f"{name}: {what} failed: {type(exc).__name__}: {exc}"
            )
        self.from_worker(
            self.notify, result.message, severity="information" if result.ok else "error", timeout=10
        )
        from fleetops.ops import action_log

        logged: Any = self.action_log.add(name, what, action_log.outcome_of(result), action_log.why_of(result), gpu)
        self.last_action = result
        if what in ("drain", "resume"):
            self.from_worker(self.forget_slurm_state, name)
            reading = None
            if result.ok and logged is not None and hasattr(self.source, "slurm_node"):
                # a drain's outcome is Slurm's State read after it, not the node's GPUs (a node
                # with no agent, or one whose GPUs are sick, was drained all the same)
                reading = self._settle_slurm(name, what, logged)
                logged = None
            self.from_worker(self.slurm_changed, name, reading)
        if result.ok and not self.exiting:
            # what the action left behind, from a snapshot taken after it (the daemon samples on
            # request, else a cold collect), now rather than at the next round
            entry = self.source.collect(name, after_action=True)
            self.deliver(entry)
            self.from_worker(self._report_entry, entry, f"after {what}", logged)

    def _settle_slurm(self, name: str, what: str, logged: Any) -> Any:
        """Settle a sent drain or resume with the node as Slurm shows it right after (worker
        thread): verified when the drain is there (or gone, after a resume), failed when not,
        unknown when Slurm could not be read. Returns the reading (None: not read), which the
        node screens show rather than asking Slurm again."""
        try:
            reading = self.source.slurm_node(name)
        except Exception as exc:  # noqa: BLE001 - the log says it, the action stays sent
            reading, problem = None, f"{type(exc).__name__}: {exc}"
        else:
            problem = reading.problem
        if reading is None or problem or reading.state is None:
            self.action_log.settle(logged, "unknown", f"{name} after {what}: Slurm not read ({problem})")
            return None
        wanted = reading.drained if what == "drain" else not reading.drained
        shown = f"Slurm State {reading.state}" + (f", Reason {reading.reason}" if reading.reason else "")
        if wanted:
            self.action_log.settle(logged, "verified", f"{name} after {what}: {shown}")
        else:
            self.action_log.settle(logged, "failed", f"{name} after {what}: still {shown}")
        return reading

    def slurm_changed(self, name: str, reading: Any = None) -> None:
        """A drain or resume from this TUI is done: node screens of ``name`` show ``reading``
        (Slurm read after it), or read Slurm again where there is none."""
        for screen in self.screen_stack:
            if getattr(screen, "node", None) != name or not hasattr(screen, "load_slurm"):
                continue
            if reading is not None:
                screen.show_slurm(reading)  # type: ignore[attr-defined]  # NodeScreen's
            else:
                screen.load_slurm()
