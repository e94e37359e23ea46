"""The GPU reset action, the same from every front end.

Two steps. ``preview`` resolves the operator's selector against a fresh snapshot and returns
the GPU (UUID, bus id) and the processes on it, for the front end to show and ask about. ``run``
then sends ``fleetops-agent reset`` once, through the runner the front end passes (the TUI's
session, the CLI's one-shot SSH), and maps the agent's report to an ``ActionResult``.

Safety rules kept here rather than in each front end:

- the agent gets the UUID *and* the bus id, so a GPU renumbered in between is refused;
- ``--kill-processes`` is passed only with ``--expect-pids`` and exactly the PIDs the operator
  was shown; with none shown it is not passed, so a process that appeared meanwhile makes the
  agent refuse instead of being killed unseen;
- the command timeout is the reset's own budget (``catalog.actions``), never the collect's;
- a command that was sent but not answered is ``unknown``, with the command that tells what
  happened, never "failed" (which invites a second reset);
- the reset is planned on a snapshot, which names the backend that took it (``nvml``, ``sim``):
  the command pins that backend, and an answer from another backend is not taken for the
  planned GPU's (``backend_mismatch``): refused when the simulator answered a plan made on
  NVML (no GPU was touched), unknown when NVML answered a plan made on anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.catalog import actions as catalog_actions
from fleetops.common import selectors
from fleetops.common.errors import Refused
from fleetops.fleet import answers
from fleetops.ops import results

AGENT_VAR = "fleetops_agent_path"
DEFAULT_AGENT = "fleetops-agent"
SIM_STATE_VAR = "fleetops_sim_state"
DEFAULT_JOURNAL = "/var/log/fleetops/reset.jsonl"
DEFAULT_COLLECT_TIMEOUT_S = 60.0

# runner(argv, timeout_s) -> a transport result (fleet.transport.Result or alike)
Runner = Callable[[list[str], float], Any]

RESULT_OUTCOME = {
    "reset": results.DONE,
    "would-reset": results.DRY_RUN,
    "refused": results.REFUSED,
    "error": results.REFUSED,  # no such GPU: nothing was touched
    "failed": results.FAILED,
    # a signal stopped the agent: it restarted what it had stopped, but whether the GPU was reset
    # before the signal is for its report and journal to say, not for a retry to guess
    "interrupted": results.UNKNOWN,
}
# transport error kinds after which the command may have run on the node
SENT_UNANSWERED = ("outcome-unknown", "timeout")


def agent_argv(host: Any, *args: str) -> list[str]:
    """The agent command for ``host``: its path from the inventory, and on a simulated node the
    backend and state file named on the command line (not left to the session's environment)."""
    argv = [str(host.vars.get(AGENT_VAR, DEFAULT_AGENT)), *args]
    state = host.vars.get(SIM_STATE_VAR)
    if state:
        argv += ["--backend", "sim", "--state", str(state)]
    return argv


def journal_path(host: Any) -> str:
    """Where the agent on ``host`` appends its reset journal (the simulator keeps it by the state)."""
    state = host.vars.get(SIM_STATE_VAR)
    if state:
        return os.path.splitext(os.path.abspath(str(state)))[0] + ".reset.jsonl"
    return DEFAULT_JOURNAL


def command_timeout_s(clients: Sequence[str] | int = catalog_actions.DEFAULT_CLIENTS) -> float:
    """How long to wait for the agent's answer to a reset: its own phases plus SSH."""
    return catalog_actions.reset_command_timeout_s(clients=clients)


@dataclass(frozen=True)
class Preview:
    """What a front end shows before it asks: the GPU as a fresh snapshot has it, and its
    processes (``None`` when the node could not list them)."""

    node: str
    gpu: selectors.ResolvedGpu
    collected_at: float
    backend: str | None = None  # the snapshot's backend: the one the reset must be answered by
    # the jobs running on the GPU (or its MIG instances) as the snapshot's job records have them:
    # the daemon's snapshot tags them; None when it has none (a cold collect: no daemon)
    jobs: tuple[model.NodeJob, ...] | None = None

    @property
    def processes(self) -> tuple[model.GpuProcess, ...] | None:
        return self.gpu.processes

    @property
    def pids(self) -> tuple[int, ...]:
        return self.gpu.pids

    def job_lines(self) -> list[str]:
        """The Slurm jobs a reset of the GPU hits, as the daemon's job records name them."""
        if self.jobs is None:
            return ["jobs: unknown (no daemon's job records; the agent reads them before the reset)"] \
                if self.gpu.enumerated else []
        if not self.jobs:
            return ["jobs: none running"]
        return [f"jobs ({len(self.jobs)}): {model.job_text(self.jobs)}"]

    def process_lines(self) -> list[str]:
        if self.gpu.processes is None:
            return ["processes: unknown (the node did not list them)"] if self.gpu.enumerated else []
        if not self.gpu.processes:
            return ["processes: none"]
        out = [f"processes ({len(self.gpu.processes)}):"]
        for p in self.gpu.processes:
            mem = f"{p.used_memory_mib} MiB" if p.used_memory_mib is not None else "? MiB"
            out.append(f"  pid {p.pid:<8} {p.name or '?':<24} {mem}")
        return out


def snapshot(host: Any, runner: Runner, timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S) -> model.Node:
    """A fresh snapshot of ``host``, or a FleetopsError saying why there is none."""
    answer = answers.read(runner(agent_argv(host, "collect"), timeout_s))
    if not answer.is_snapshot or answer.doc is None:
        raise Refused(f"{host.name}: cannot take a fresh snapshot: {answer.describe()}")
    try:
        return model.node_from_dict(answer.doc)
    except model.SchemaError as exc:
        raise Refused(f"{host.name}: the agent's snapshot is unusable: {exc}") from exc


def preview(
    host: Any, selector: str, runner: Runner, collect_timeout_s: float = DEFAULT_COLLECT_TIMEOUT_S
) -> Preview:
    """Resolve ``selector`` on a fresh snapshot of ``host`` (an index to its UUID and bus id)."""
    sel = selectors.parse(selector)
    node = snapshot(host, runner, collect_timeout_s)
    gpu = selectors.resolve(sel, node, host.name)
    on = model.gpu_jobs(node, gpu.uuid) if gpu.uuid else None
    return Preview(host.name, gpu, node.collected_at, node.backend, None if on is None else tuple(on))


def command(
    host: Any,
    gpu: selectors.ResolvedGpu,
    *,
    dry_run: bool = False,
    kill_pids: Sequence[int] | None = None,
    backend: str | None = None,
    under_jobs: bool = False,
    expect_jobs: Sequence[str] | None = None,
) -> list[str]:
    """The agent's argv. ``kill_pids``: the processes the operator agreed to end; empty or None
    means none, and then ``--kill-processes`` is not passed, unless ``under_jobs``: the operator
    agreed to reset under the GPU's Slurm jobs (``--kill-processes``) where no process runs
    (between job steps): ``--expect-pids ''`` then confirms none, so a process that appeared
    meanwhile still refuses the reset. ``backend``: the planning
    snapshot's, passed as ``--backend`` unless the host's argv names one already (a simulated
    node's), so the agent cannot pick another one for the action. ``expect_jobs``: the Slurm jobs
    the operator was shown on the GPU (None: not known here), passed with ``--kill-processes`` as
    ``--expect-jobs`` so a job that started since then refuses the reset instead of losing its GPU."""
    target = gpu.uuid or gpu.bus_id or gpu.selector.text
    argv = ["reset", "--gpu", target]
    if gpu.uuid and gpu.bus_id:
        argv += ["--bus-id", gpu.bus_id]
    argv.append("--json")
    if dry_run:
        argv.append("--dry-run")
    pids = sorted({int(p) for p in kill_pids or ()})
    if pids or under_jobs:
        argv += ["--kill-processes", "--expect-pids", ",".join(str(p) for p in pids)]
        if expect_jobs is not None:
            argv += ["--expect-jobs", ",".join(sorted(set(expect_jobs), key=int))]
    full = agent_argv(host, *argv)
    if backend in PINNED_BACKENDS and "--backend" not in full:
        full += ["--backend", str(backend)]
    return full


PINNED_BACKENDS = ("nvml", "sim")


def backend_mismatch(planned: str | None, doc: dict[str, Any]) -> str | None:
    """Why an agent's answer ``doc`` cannot be taken for an action planned on a snapshot from
    the ``planned`` backend, or None when it can (or no plan's backend is known)."""
    if planned is None:
        return None
    answered = doc.get("backend")
    if answered == planned:
        return None
    named = f"the {answered} backend" if answered else "no backend (an agent that does not name it)"
    return (f"the answer came from {named}, but the action was planned on a snapshot from the {planned} "
            f"backend: it is not about the GPU that was planned")


def check_command(host: Any, gpu: selectors.ResolvedGpu, inventory: str | None = None) -> str:
    """What tells the operator what a reset without an answer did, pasteable: with ``-i`` and
    the inventory the reset came from (``INVENTORY`` where the caller does not know it)."""
    import shlex

    target = gpu.uuid or gpu.bus_id or gpu.selector.text
    where = shlex.quote(inventory) if inventory else "INVENTORY"
    return (f"fleetops reset {host.name} {target} -i {where} --dry-run; then read the agent's journal "
            f"{journal_path(host)} on {host.name}")


def run(
    host: Any,
    gpu: selectors.ResolvedGpu,
    runner: Runner,
    *,
    dry_run: bool = False,
    kill_pids: Sequence[int] | None = None,
    timeout_s: float | None = None,
    planned_backend: str | None = None,
    inventory: str | None = None,
    under_jobs: bool = False,
    expect_jobs: Sequence[str] | None = None,
) -> results.ActionResult:
    """Send the reset once and say what came of it. ``under_jobs``, ``expect_jobs``: see ``command``. ``planned_backend``: the backend of the
    snapshot the reset was planned on (``Preview.backend``, the TUI's snapshot): pinned in the
    command, and an answer from another backend is not taken (see the module's docstring).
    ``inventory``: the one the host came from, for the pasteable ``check`` command."""
    argv = command(host, gpu, dry_run=dry_run, kill_pids=kill_pids, backend=planned_backend, under_jobs=under_jobs,
                   expect_jobs=expect_jobs)
    wait = float(timeout_s) if timeout_s is not None else command_timeout_s()
    result = runner(argv, wait)
    return outcome(host, gpu, argv, result, wait, planned_backend, inventory)


def outcome(
    host: Any,
    gpu: selectors.ResolvedGpu,
    argv: list[str],
    result: Any,
    timeout_s: float,
    planned_backend: str | None = None,
    inventory: str | None = None,
) -> results.ActionResult:
    answer = answers.read(result)
    name = str(host.name)
    detail: dict[str, Any] = {"argv": argv, "timeout_s": timeout_s, "answer": answer.what}
    label = gpu.label()
    if answer.is_report and answer.action == "reset" and answer.doc is not None:
        doc = answer.doc
        detail["report"] = doc
        mismatch = backend_mismatch(planned_backend, doc)
        if mismatch is not None:
            detail["backend_mismatch"] = {"planned": planned_backend, "answered": doc.get("backend")}
            real = doc.get("backend") == "nvml"  # NVML answered a plan made elsewhere: a GPU may have changed
            return results.ActionResult(
                name, "reset", results.UNKNOWN if real else results.REFUSED,
                f"{name}: reset of {label} not taken: {mismatch}"
                + ("; a real GPU may have been reset: check the node" if real
                   else "; no GPU was touched: check which backend fleetops-agent picks on the node "
                        "($FLEETOPS_SIM_STATE, --backend) and plan again"),
                check_command(host, gpu, inventory) if real else None, detail,
            )
        verdict = str(doc.get("result"))
        out = RESULT_OUTCOME.get(verdict, results.FAILED)
        if out == results.DONE and not result.ok:  # said reset but exited non-zero: not a success
            out = results.FAILED
        message = f"{name}: {doc.get('message') or verdict}"
        if doc.get("remedy"):
            message += f" (remedy: {doc['remedy']})"
        check = check_command(host, gpu, inventory) if out == results.UNKNOWN else None
        return results.ActionResult(name, "reset", out, message, check, detail)
    sent_unanswered = answer.what == answers.TRANSPORT and answer.kind in SENT_UNANSWERED
    # an answer that is not a reset report (a traceback, garbage) also leaves the outcome open
    if sent_unanswered or answer.what in (answers.UNREADABLE, answers.SNAPSHOT, answers.REPORT):
        why = answer.describe()
        return results.ActionResult(
            name,
            "reset",
            results.UNKNOWN,
            f"{name}: the reset of {label} was sent but its outcome is unknown ({why})",
            check_command(host, gpu, inventory),
            detail,
        )
    if answer.what == answers.AGENT_ERROR:
        detail["agent_error_kind"] = answer.kind
        return results.ActionResult(name, "reset", results.FAILED, f"{name}: reset of {label}: {answer.describe()}", None, detail)
    # not sent, or nothing ran: unreachable, auth, hostkey, local, agent missing
    return results.ActionResult(
        name, "reset", results.FAILED, f"{name}: reset of {label} not done: {answer.describe()}", None, detail
    )


MARK = {"ok": "ok", "failed": "FAILED", "skipped": "-"}


def render(node: str, doc: dict[str, Any]) -> str:
    """The agent's reset report as text, for a terminal or the TUI's notification detail."""
    gpu = doc.get("gpu") or {}
    head = f"{node} {gpu.get('uuid') or gpu.get('selector')} ({gpu.get('bus_id') or '?'}"
    head += f", GPU {gpu['index']})" if gpu.get("index") is not None else ")"
    lines = [f"{head}: {doc.get('result')}" + (" [dry run]" if doc.get("dry_run") else "")]
    for c in doc.get("preconditions") or []:
        lines.append(f"  {MARK.get(c.get('status'), c.get('status')):7} {c.get('name'):20} {c.get('detail')}")
    for a in doc.get("actions") or []:
        if a.get("action") == "end_processes":
            for p in a.get("processes") or []:
                sig = " -> ".join(p.get("signals") or []) or "no signal"
                lines.append(
                    f"  action  end pid {p['pid']} ({p.get('name') or '?'}): {sig}: "
                    + ("ended" if p.get("ended") else f"NOT ended ({p.get('detail', '')})")
                )
        elif a.get("action") in ("stop_service", "start_service"):
            lines.append(f"  action  {a['action'].split('_')[0]} {a.get('unit')}: {'ok' if a.get('ok') else 'FAILED'}")
        else:
            detail = a.get("detail")
            lines.append(
                f"  action  {a.get('action')}: {'ok' if a.get('ok') else 'FAILED'}" + (f": {detail}" if detail else "")
            )
    if doc.get("verification"):
        lines.append(f"  verify  {'ok' if doc.get('verified') else 'FAILED'}: {doc['verification'].get('detail')}")
    if doc.get("remedy"):
        lines.append(f"  remedy: {doc['remedy']}")
    return "\n".join(lines) + "\n"
