"""``fleetops-agent slurm-healthcheck``: slurm.conf's ``HealthCheckProgram`` on a GPU node.

slurmd runs it every ``HealthCheckInterval`` as root. It takes the node's findings from the
resident daemon (``fleetops-agent serve``: one socket round trip, the daemon's rate windows)
or, when no daemon answers with a fresh snapshot, from a cold collect run in a child process
with a timeout (a wedged NVML must not wedge slurmd's health check), and says which it used.

Every drain it makes names its owner, as every fleetops drain does (``fleetops.catalog.slurm``)::

    [fleetops] health/20261206T031207Z-7c1e-node017: memory.ecc_dbe_volatile on GPU GPU-5d3e... 0000:18:00.0

The run is a fresh ``new_run_id()`` and the node's name: when it started (the circuit breaker
reads the age of a drain from it) and where. For Slurm's name of this node (``--node-name``,
else ``$SLURMD_NODENAME``, else the short host name):

- a crit finding and the node not drained: drain it (``drain_decision(..., "health", run)``),
  unless the maintenance lock or the circuit breaker holds it (below);
- no crit finding and the node drained by the health program (any pass of it, and the
  ``[fleetops] healthcheck: ...`` drains written before owners were): resume it
  (``resume_decision(..., "health", run)``), unless the maintenance lock holds it;
- any other owner's drain (a rollout, a MIG, firmware or power run, remediate's reset drain, an
  operator, someone outside fleetops) is never touched, faulty or clean; the report names it
  (``owner``, ``why``);
- the health program's own drain while the node is still faulty stays as it is.

The maintenance lock (``fleetops.agent.lock``, read with ``peek``: never taken, never changed):
while a live planned action holds it (a GPU reset, a MIG apply), what the program sees may be
that action's doing (a GPU missing while it is reset, clocks down while MIG changes), so it
neither drains nor resumes: action ``held-by-lock``, naming the holder's action and pid. A lock
whose holder is dead is stale and holds nothing.

The circuit breaker (``catalog.slurm.breaker``, read from ``scontrol show nodes -o`` just before
a drain): when one more drain would make the health program's standing drains more than
``--breaker-share`` (default 20 %, never fewer than one node) of the nodes it watches (the nodes
of this node's partitions), it does not drain: action ``held-by-breaker``, with the counts. Many
nodes turning crit at once is more likely one common cause (a driver or firmware push, a
baseline typo, a broken monitor, a cooling or power event) than that many independent GPU
faults, and draining them would take the partition's capacity out for a cause no drain fixes.
Every standing health drain counts, however old: with a window of recent drains only (NVSentinel
counts cordons within 5 minutes, 50 % of the nodes), a false positive that lasts would drain
another share every window until the partition is empty. Ours is tighter in share because a
drained Slurm node takes no jobs for as long as the drain stays; it closes when drains are
lifted (by the program itself once nodes are clean, or by an operator).

Each run (not ``--dry-run``) writes its report atomically as JSON to ``--report-file`` (default
``/run/fleetops/slurm-healthcheck.json``, or ``$FLEETOPS_SLURM_HEALTHCHECK_REPORT``; with the
simulator, beside the state file), also after a failed look; the resident daemon exports it on
``/metrics`` (``fleetops_slurm_healthcheck_breaker_open``, ``..._last_run_timestamp_seconds``,
``..._action_info{action}``) for the ``FleetopsHealthDrainBreakerOpen`` alert.

The argv lists are built here: the node side imports nothing of the controller's ``ops``.

Exit codes: 0 the node was looked at and the right thing was done (nothing, drain, resume,
another owner's drain left alone, held by the lock or by the breaker; also ``--dry-run``); 1 this
program failed: no snapshot (the daemon did not answer and the cold collect failed or timed
out), scontrol failed or timed out, or the lock could not be read; 2 usage. A failed look never
drains and never resumes: slurmd logs the non-zero exit, and the node stays as it was, since
draining a healthy node on a broken monitor would take capacity out silently and resuming on one
would put a faulty GPU back.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

from fleetops.catalog import slurm as rule

KIND = "fleetops.slurm-healthcheck/v1"
OWNER = "health"  # the owner kind of every drain this program makes
EXIT_OK, EXIT_FAIL = 0, 1
# slurmd runs the health check synchronously; one that waits on a dead slurmctld for minutes
# would hold it up, so scontrol and the cold collect get bounded times.
DEFAULT_SCONTROL_TIMEOUT_S = 20.0
DEFAULT_COLLECT_TIMEOUT_S = 30.0
# A daemon snapshot older than this is not current enough to act on (the daemon samples every
# few seconds; an older one means its sampler is stuck).
DEFAULT_MAX_AGE_S = 60.0
# The circuit breaker (see the module's docstring for why this and not NVSentinel's 50 % / 5 min).
DEFAULT_BREAKER_SHARE = 0.20
DEFAULT_REPORT = "/run/fleetops/slurm-healthcheck.json"
REPORT_ENV = "FLEETOPS_SLURM_HEALTHCHECK_REPORT"
LOCK_ENV = "FLEETOPS_LOCK"  # the reset's and MIG's override of the lock's path (agent.reset.host)
# What the report's ``action`` can be; the daemon exports it as a label, so the set is closed.
ACTIONS = ("none", "drain", "resume", "held-by-lock", "held-by-breaker", "failed")
_RUN_CHARS = re.compile(r"[^A-Za-z0-9._:@-]")


class HealthcheckError(Exception):
    """This program could not do its job; ``kind`` goes into the JSON error line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# --- whose drain, and what it says -----------------------------------------------------------


def health_run(node: str, now: float | None = None) -> str:
    """This pass's run id: ``new_run_id()`` and the node's name (cut to fit ``RUN_RE``)."""
    base = rule.new_run_id(now)
    tail = _RUN_CHARS.sub("_", node)[: 63 - len(base)]
    return f"{base}-{tail}" if tail else base


def _gpu_label(gpu: Any) -> str:
    if not isinstance(gpu, dict):
        return "node"
    parts = [str(gpu[k]) for k in ("uuid", "bus_id") if gpu.get(k)]
    return " ".join(parts) if parts else f"index {gpu.get('index')}"


def purpose(crit: list[dict[str, Any]]) -> str:
    """What the drain is for: the first crit finding's check and GPU, and how many more."""
    first = crit[0]
    text = f"{first.get('check')} on GPU {_gpu_label(first.get('gpu'))}"
    if first.get("gpu") is None:
        # an HCA port's finding names the port, for the technician the drain sends
        text = f"{first.get('check')} on {'port ' + str(first['port']) if first.get('port') else 'the node'}"
    if len(crit) > 1:
        text += f" (+{len(crit) - 1} more crit)"
    return text


def drain_reason(crit: list[dict[str, Any]], run: str) -> str:
    """The Reason of this program's drain: ``[fleetops] health/RUN: PURPOSE``."""
    return rule.drain_reason(OWNER, run, purpose(crit))


def _owner_doc(owner: rule.Owner | None) -> dict[str, Any] | None:
    if owner is None:
        return None
    return {"kind": owner.kind, "run": owner.run, "purpose": owner.purpose, "legacy": owner.legacy,
            "describe": owner.describe()}  # fmt: skip


def decide(
    crit: list[dict[str, Any]], state: str | None, reason: str | None, run: str
) -> tuple[str, rule.Decision]:
    """(action, the rule's decision): action is drain, resume or none; the decision says why and
    whose drain the node carries."""
    if crit:
        found = rule.drain_decision(state, reason, OWNER, run)
        if found.action == "drain":
            return "drain", found
        if found.action == "ours":
            return "none", rule.Decision("ours", found.owner, f"still faulty; the drain stays ({found.why})")
        return "none", found  # another owner's: held, whatever it is
    found = rule.resume_decision(state, reason, OWNER, run)
    if found.action == "resume":
        return "resume", rule.Decision("resume", found.owner, f"clean again; lifting the drain: {found.why}")
    if found.action == "not_drained":
        return "none", rule.Decision("not_drained", None, "clean")
    return "none", found


# --- the node's findings ------------------------------------------------------------------


def from_daemon(socket_path: str, max_age_s: float) -> dict[str, Any] | None:
    from fleetops.agent.serve import client

    text = client.fetch_snapshot(socket_path, max_age_s)
    if text is None:
        return None
    doc = json.loads(text)
    daemon = doc["daemon"]
    return {
        "source": "daemon",
        "socket": socket_path,
        "age_s": daemon.get("age_s"),
        "degraded": daemon.get("reason") if daemon.get("degraded") else None,
        "findings": list(daemon.get("findings") or []),
    }


def cold_collect(backend: str, state: str | None, timeout_s: float) -> dict[str, Any]:
    """A fresh collect in a child process (bounded by ``timeout_s``), checked here with the same
    ``fleetops.checks`` the daemon and the audit use."""
    argv = [sys.executable, "-m", "fleetops.agent.main", "collect", "--fresh", "--backend", backend]
    if state:
        argv += ["--state", state]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise HealthcheckError(
            "collect", f"no daemon answered and the cold collect did not finish in {timeout_s:g} s"
        ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise HealthcheckError(
            "collect", f"no daemon answered and the cold collect failed (exit {done.returncode}): {last}"
        )
    from fleetops import checks
    from fleetops.model import SchemaError, node_from_json

    try:
        node = node_from_json(done.stdout)
    except (SchemaError, ValueError) as exc:
        raise HealthcheckError("collect", f"the cold collect printed no valid snapshot: {exc}") from exc
    return {
        "source": "cold",
        "age_s": 0.0,
        "degraded": None,
        "findings": [f.to_dict() for f in checks.run_node_checks(node, None, None)],
    }


# --- Slurm ----------------------------------------------------------------------------------


def _scontrol(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise HealthcheckError(
            "failed", f"{' '.join(argv[:3])} did not answer within {timeout_s:g} s"
        ) from exc
    except OSError as exc:
        raise HealthcheckError("failed", f"cannot run {argv[0]}: {exc}") from exc


def show_node(scontrol: str, name: str, timeout_s: float) -> tuple[str | None, str | None]:
    done = _scontrol(rule.show_argv(name, scontrol), timeout_s)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        raise HealthcheckError("failed", f"scontrol show node {name} failed (exit {done.returncode}): {text}")
    return rule.parse_node(done.stdout)


def show_nodes(scontrol: str, timeout_s: float) -> list[rule.SlurmNode]:
    """Every node (state, reason, partitions): what the circuit breaker counts."""
    done = _scontrol(rule.show_all_argv(scontrol), timeout_s)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        raise HealthcheckError("failed", f"scontrol show nodes failed (exit {done.returncode}): {text}")
    return rule.parse_nodes(done.stdout)


# --- where things are -----------------------------------------------------------------------


def sim_state(backend: str, state: str | None) -> str | None:
    """The simulator's state file when the simulator is this run's backend, else None."""
    state = state or os.environ.get("FLEETOPS_SIM_STATE")
    if not state:
        return None
    from fleetops.gpu import backend_choice

    try:
        return state if backend_choice.choose(backend, True) == "sim" else None
    except (ValueError, backend_choice.BackendRefused):
        return None


def lock_path(explicit: str | None, sim: str | None) -> str:
    """``--lock-file``, else the simulator's beside its state (as reset and MIG take it), else
    ``$FLEETOPS_LOCK``, else ``/run/fleetops/maintenance.lock``."""
    if explicit:
        return explicit
    if sim:
        return os.path.abspath(sim) + ".maintenance.lock"
    from fleetops.agent import lock as node_lock

    return os.environ.get(LOCK_ENV) or node_lock.DEFAULT_PATH


def report_path(explicit: str | None, sim: str | None) -> str:
    """``--report-file``, else the simulator's beside its state (``<state>.slurm-healthcheck.json``),
    else ``$FLEETOPS_SLURM_HEALTHCHECK_REPORT``, else ``/run/fleetops/slurm-healthcheck.json``.
    The daemon reads the same path (``exposition``)."""
    if explicit:
        return explicit
    if sim:
        base = sim[:-5] if sim.endswith(".json") else sim
        return os.path.abspath(base) + ".slurm-healthcheck.json"
    return os.environ.get(REPORT_ENV) or DEFAULT_REPORT


def write_report(path: str, doc: dict[str, Any]) -> None:
    """The report, whole or not at all (a scrape never reads half of it): a temporary file in the
    same folder, then renamed over the old one."""
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".slurm-healthcheck.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _lock_look(path: str) -> dict[str, Any]:
    from fleetops.agent import lock as node_lock

    try:
        found = node_lock.peek(path)
    except node_lock.LockError as exc:
        raise HealthcheckError(
            "failed", f"cannot tell whether a maintenance action holds the node: {exc}"
        ) from exc
    record = found.record or {}
    return {
        "path": path,
        "state": found.state,
        "action": record.get("action"),
        "pid": record.get("pid"),
        "gpu": record.get("gpu"),
        "phase": record.get("phase"),
        "detail": found.detail(),
    }


# --- the daemon's view of the last pass ----------------------------------------------------

_METRICS = (
    ("fleetops_slurm_healthcheck_breaker_open",
     "1 when the health program's last pass held a drain at its circuit breaker"),
    ("fleetops_slurm_healthcheck_last_run_timestamp_seconds",
     "When the health program's last pass ran (Unix time, from its report file)"),
    ("fleetops_slurm_healthcheck_action_info",
     "The health program's last action (none, drain, resume, held_by_lock, held_by_breaker, failed, other)"),
)  # fmt: skip


def metrics_text(path: str) -> str:
    """The health program's last report (``path``) as exposition-format families, read when the
    daemon's endpoint is scraped; empty while there is no report (the program has not run, or
    its report is not one). Label values come from ``ACTIONS`` only."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return ""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        return ""
    action = doc.get("action")
    label = str(action).replace("-", "_") if action in ACTIONS else "other"
    breaker = doc.get("breaker")
    is_open = isinstance(breaker, dict) and breaker.get("open") is True
    at = doc.get("at")
    values: list[tuple[str, str]] = [("", "1" if is_open else "0")]
    stamp = [("", repr(float(at)))] if isinstance(at, (int, float)) and not isinstance(at, bool) else []
    samples = (values, stamp, [(f'{{action="{label}"}}', "1")])
    out: list[str] = []
    for (name, help_text), rows in zip(_METRICS, samples, strict=True):
        if not rows:
            continue
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        out += [f"{name}{labels} {value}" for labels, value in rows]
    return "\n".join(out) + "\n"


# --- one pass -------------------------------------------------------------------------------


def run(args: Any) -> tuple[dict[str, Any], int]:
    from fleetops.agent.serve import client

    name = (args.node_name or socket.gethostname().split(".", 1)[0]).strip()
    if not name:
        raise HealthcheckError("usage", "no node name: give --node-name")
    args.resolved_node = name
    sim = sim_state(args.backend, args.state)
    sock = client.socket_for(args.backend, args.state, args.socket)
    look = None if args.fresh else from_daemon(sock, args.max_age)
    fallback_note = None
    if look is None:
        fallback_note = f"no fresh daemon snapshot on {sock}" if not args.fresh else "--fresh"
        look = cold_collect(args.backend, args.state, args.collect_timeout)
    crit = [f for f in look["findings"] if f.get("severity") == "crit"]
    state, reason = show_node(args.scontrol, name, args.scontrol_timeout)
    run_id = health_run(name)
    action, decision = decide(crit, state, reason, run_id)
    why = decision.why
    held_lock: dict[str, Any] | None = None
    breaker: dict[str, Any] | None = None
    if action in ("drain", "resume"):
        held_lock = _lock_look(lock_path(args.lock_file, sim))
        if held_lock["state"] == "held":
            why = (f"would {action} ({why}), but a maintenance action holds the node: {held_lock['action']} "
                   f"by pid {held_lock['pid']}; what it sees may be that action's doing")  # fmt: skip
            action = "held-by-lock"
    if action == "drain":
        is_open, breaker_why = rule.breaker(
            show_nodes(args.scontrol, args.scontrol_timeout), name, args.breaker_share
        )
        breaker = {"open": is_open, "why": breaker_why, "share": args.breaker_share}
        if is_open:
            action = "held-by-breaker"
            why = f"would drain ({why}), but the health program's circuit breaker is open: {breaker_why}"
    argv: list[str] | None = None
    if action == "drain":
        argv = rule.drain_argv(name, drain_reason(crit, run_id), args.scontrol)
    elif action == "resume":
        argv = rule.resume_argv(name, args.scontrol)
    doc: dict[str, Any] = {
        "kind": KIND,
        "node": name,
        "run": run_id,
        "source": look["source"],
        "age_s": look["age_s"],
        "why_cold": fallback_note,
        "degraded": look["degraded"],
        "crit": [{"check": f.get("check"), "gpu": f.get("gpu"), "port": f.get("port"), "message": f.get("message")}
                 for f in crit],
        "slurm": {"state": state, "reason": reason},
        "decision": decision.action,
        "owner": _owner_doc(decision.owner),
        "action": action,
        "why": why,
        "lock": held_lock,
        "breaker": breaker,
        "argv": argv,
        "dry_run": bool(args.dry_run),
        "outcome": "dry-run" if args.dry_run and argv else ("done" if argv else "none"),
        "at": round(time.time(), 3),
    }
    if argv is None or args.dry_run:
        return doc, EXIT_OK
    done = _scontrol(argv, args.scontrol_timeout)
    if done.returncode != 0:
        doc["outcome"] = "failed"
        doc["message"] = (done.stderr or done.stdout).strip()
        return doc, EXIT_FAIL
    return doc, EXIT_OK


def add_parser(sub: Any, common: Any) -> None:
    from fleetops.catalog.durations import GRAMMAR, duration_arg

    p = sub.add_parser(
        "slurm-healthcheck",
        help="slurm.conf HealthCheckProgram: drain this node on a crit finding (owner health), resume only "
        "the health program's drains; held by the maintenance lock and by its circuit breaker",
    )
    common(p)
    p.add_argument(
        "--node-name", help="Slurm's name for this node (default: $SLURMD_NODENAME, else the short host name)"
    )
    p.add_argument(
        "--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)"
    )
    p.add_argument(
        "--max-age", type=duration_arg("--max-age", allow_zero=True), default=DEFAULT_MAX_AGE_S,
        help=f"oldest daemon snapshot used ({GRAMMAR}; default {DEFAULT_MAX_AGE_S:g}); older: a cold collect",
    )  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="always a cold collect; never ask the daemon")
    p.add_argument("--scontrol", default="scontrol", help="the scontrol to run (default: scontrol on PATH)")
    p.add_argument(
        "--scontrol-timeout", type=duration_arg("--scontrol-timeout"), default=DEFAULT_SCONTROL_TIMEOUT_S,
        help=f"how long each scontrol call may take ({GRAMMAR}; default {DEFAULT_SCONTROL_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--collect-timeout", type=duration_arg("--collect-timeout"), default=DEFAULT_COLLECT_TIMEOUT_S,
        help=f"how long the cold collect may take ({GRAMMAR}; default {DEFAULT_COLLECT_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--breaker-share", type=float, default=DEFAULT_BREAKER_SHARE,
        help="circuit breaker: no drain that would make the health program's standing drains "
        f"more than this share of the nodes it watches, never fewer than one (default {DEFAULT_BREAKER_SHARE:g})",
    )  # fmt: skip
    p.add_argument("--lock-file", help="maintenance lock, read only (default /run/fleetops/maintenance.lock; "
                   "sim: by the state)")  # fmt: skip
    p.add_argument("--report-file", help=f"the last report, JSON, for the daemon's /metrics (default {DEFAULT_REPORT}; "
                   "sim: by the state)")  # fmt: skip
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what it would do; run no scontrol update, write no report",
    )


def _failed_report(args: Any, exc: HealthcheckError) -> dict[str, Any]:
    return {
        "kind": KIND,
        "node": getattr(args, "resolved_node", None) or args.node_name,
        "action": "failed",
        "error_kind": exc.kind,
        "error": str(exc),
        "breaker": None,
        "at": round(time.time(), 3),
    }


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    """Entry from ``fleetops-agent``: the report and the exit code, or HealthcheckError."""
    for flag in ("max_age", "scontrol_timeout", "collect_timeout"):
        if getattr(args, flag) <= 0:
            raise HealthcheckError(
                "usage", f"--{flag.replace('_', '-')} must be a positive number of seconds"
            )
    if not 0 < args.breaker_share <= 1:
        raise HealthcheckError(
            "usage", f"--breaker-share {args.breaker_share:g}: a fraction above 0 and at most 1"
        )
    if os.environ.get("SLURMD_NODENAME") and not args.node_name:
        # slurmd sets it for its health check: Slurm's own name beats the host name
        args.node_name = os.environ["SLURMD_NODENAME"]
    report = report_path(args.report_file, sim_state(args.backend, args.state))
    try:
        doc, code = run(args)
    except HealthcheckError as exc:
        if exc.kind != "usage" and not args.dry_run:
            try:
                write_report(report, _failed_report(args, exc))
            except OSError:
                pass  # the error line says what failed; a report it cannot write adds nothing
        raise
    if not args.dry_run:
        doc["report_file"] = report
        try:
            write_report(report, doc)
        except OSError as exc:
            doc["report_file_error"] = f"{report}: {exc.strerror or exc}"
    return doc, code
