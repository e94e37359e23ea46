"""``fleetops-agent slurm-healthcheck``: slurm.conf's ``HealthCheckProgram`` on a GPU node.

slurmd runs it every ``HealthCheckInterval`` as root. It takes the node's findings from the
resident daemon (``fleetops-agent serve``: one socket round trip, the daemon's rate windows)
or, when no daemon answers with a fresh snapshot, from a cold collect run in a child process
with a timeout (a wedged NVML must not wedge slurmd's health check), and says which it used.

What it does with them, for Slurm's name of this node (``--node-name``, else the short host
name):

- a crit finding and the node not drained: drain it, with a Reason that names the check and the
  GPU (UUID and bus id) and starts with ``[fleetops] healthcheck:``;
- no crit finding and the node drained by this health check (its Reason starts with that
  prefix): resume it;
- a drain anyone else set (an operator, another tool, or another part of fleetops such as a
  driver rollout, whose drain carries the marker but not this prefix) is never touched;
- a drain that is ours while the node is still faulty is left as it is.

The marker rule is ``fleetops.catalog.slurm``'s; the argv lists are ``fleetops.ops.slurm``'s.

Exit codes: 0 the node was looked at and the right thing was done (nothing, drain, resume, or
a foreign drain left alone; also ``--dry-run``); 1 this program failed: no snapshot (the daemon
did not answer and the cold collect failed or timed out), or scontrol failed or timed out;
2 usage. A failed look never drains and never resumes: slurmd logs the non-zero exit, and the
node stays as it was, since draining a healthy node on a broken monitor would take capacity out
silently and resuming on one would put a faulty GPU back.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

from fleetops.catalog import slurm as rule

KIND = "fleetops.slurm-healthcheck/v1"
# What this program writes after the marker; only drains whose Reason starts with the whole
# prefix are resumed by it.
REASON_PREFIX = "healthcheck:"
EXIT_OK, EXIT_FAIL = 0, 1
# slurmd runs the health check synchronously; one that waits on a dead slurmctld for minutes
# would hold it up, so scontrol and the cold collect get bounded times.
DEFAULT_SCONTROL_TIMEOUT_S = 20.0
DEFAULT_COLLECT_TIMEOUT_S = 30.0
# A daemon snapshot older than this is not current enough to act on (the daemon samples every
# few seconds; an older one means its sampler is stuck).
DEFAULT_MAX_AGE_S = 60.0
MAX_REASON = 200  # Slurm keeps long reasons, but sinfo -R and operators read this one


class HealthcheckError(Exception):
    """This program could not do its job; ``kind`` goes into the JSON error line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _ours_prefix() -> str:
    return rule.marked_reason(REASON_PREFIX)


def is_healthcheck_drain(reason: str | None) -> bool:
    """A drain this health check set: the fleetops marker (``catalog.slurm.is_ours``) and then
    this program's own prefix, so a rollout's or an operator's drain is never resumed here."""
    return rule.is_ours(reason) and (reason or "").strip().startswith(_ours_prefix())


def _gpu_label(gpu: Any) -> str:
    if not isinstance(gpu, dict):
        return "node"
    parts = [str(gpu[k]) for k in ("uuid", "bus_id") if gpu.get(k)]
    return " ".join(parts) if parts else f"index {gpu.get('index')}"


def drain_reason(crit: list[dict[str, Any]]) -> str:
    """The Reason for a drain: the first crit finding's check and GPU, and how many more."""
    first = crit[0]
    text = f"{REASON_PREFIX} {first.get('check')} on GPU {_gpu_label(first.get('gpu'))}"
    if first.get("gpu") is None:
        text = f"{REASON_PREFIX} {first.get('check')} on the node"
    if len(crit) > 1:
        text += f" (+{len(crit) - 1} more crit)"
    # "Key=" inside a Reason would read as a later field of scontrol's one-line output
    text = text.replace("=", ":")
    return rule.marked_reason(text)[:MAX_REASON]


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
        raise HealthcheckError("collect", f"no daemon answered and the cold collect did not finish in {timeout_s:g} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise HealthcheckError("collect", f"no daemon answered and the cold collect failed (exit {done.returncode}): {last}")
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
        raise HealthcheckError("failed", f"{' '.join(argv[:3])} did not answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise HealthcheckError("failed", f"cannot run {argv[0]}: {exc}") from exc


def show_node(scontrol: str, name: str, timeout_s: float) -> tuple[str | None, str | None]:
    from fleetops.ops import slurm as ops_slurm

    done = _scontrol(ops_slurm.show_argv(name, scontrol), timeout_s)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        raise HealthcheckError("failed", f"scontrol show node {name} failed (exit {done.returncode}): {text}")
    return rule.parse_node(done.stdout)


def decide(crit: list[dict[str, Any]], state: str | None, reason: str | None) -> tuple[str, str]:
    """(action, why): action is drain, resume or none."""
    drained = rule.is_drained(state)
    if crit:
        if not drained:
            return "drain", "a crit finding and the node is not drained"
        if is_healthcheck_drain(reason):
            return "none", "still faulty; our drain stays"
        return "none", f"already drained by someone else ({reason or 'no reason given'}); left alone"
    if drained and is_healthcheck_drain(reason):
        return "resume", "clean again; lifting the drain this health check set"
    if drained:
        return "none", f"clean, but drained by someone else ({reason or 'no reason given'}); left alone"
    return "none", "clean"


def run(args: Any) -> tuple[dict[str, Any], int]:
    from fleetops.agent.serve import client
    from fleetops.ops import slurm as ops_slurm

    name = (args.node_name or socket.gethostname().split(".", 1)[0]).strip()
    if not name:
        raise HealthcheckError("usage", "no node name: give --node-name")
    sock = client.socket_for(args.backend, args.state, args.socket)
    look = None if args.fresh else from_daemon(sock, args.max_age)
    fallback_note = None
    if look is None:
        fallback_note = f"no fresh daemon snapshot on {sock}" if not args.fresh else "--fresh"
        look = cold_collect(args.backend, args.state, args.collect_timeout)
    crit = [f for f in look["findings"] if f.get("severity") == "crit"]
    state, reason = show_node(args.scontrol, name, args.scontrol_timeout)
    action, why = decide(crit, state, reason)
    argv: list[str] | None = None
    if action == "drain":
        argv = ops_slurm.drain_argv(name, drain_reason(crit), args.scontrol)
        # drain_argv marks the Reason; ours is already marked and marked_reason keeps it so
    elif action == "resume":
        argv = ops_slurm.resume_argv(name, args.scontrol)
    doc: dict[str, Any] = {
        "kind": KIND,
        "node": name,
        "source": look["source"],
        "age_s": look["age_s"],
        "why_cold": fallback_note,
        "degraded": look["degraded"],
        "crit": [
            {"check": f.get("check"), "gpu": f.get("gpu"), "message": f.get("message")} for f in crit
        ],
        "slurm": {"state": state, "reason": reason},
        "action": action,
        "why": why,
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
    p = sub.add_parser(
        "slurm-healthcheck",
        help="slurm.conf HealthCheckProgram: drain this node on a crit finding, resume only its own drains",
    )
    common(p)
    p.add_argument("--node-name", help="Slurm's name for this node (default: the short host name)")
    p.add_argument("--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)")
    p.add_argument(
        "--max-age", type=float, default=DEFAULT_MAX_AGE_S,
        help=f"oldest daemon snapshot used, seconds (default {DEFAULT_MAX_AGE_S:g}); older: a cold collect",
    )  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="always a cold collect; never ask the daemon")
    p.add_argument("--scontrol", default="scontrol", help="the scontrol to run (default: scontrol on PATH)")
    p.add_argument(
        "--scontrol-timeout", type=float, default=DEFAULT_SCONTROL_TIMEOUT_S,
        help=f"seconds for each scontrol call (default {DEFAULT_SCONTROL_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument(
        "--collect-timeout", type=float, default=DEFAULT_COLLECT_TIMEOUT_S,
        help=f"seconds for the cold collect (default {DEFAULT_COLLECT_TIMEOUT_S:g})",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print what it would do; run no scontrol update")


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    """Entry from ``fleetops-agent``: the report and the exit code, or HealthcheckError."""
    for flag in ("max_age", "scontrol_timeout", "collect_timeout"):
        if getattr(args, flag) <= 0:
            raise HealthcheckError("usage", f"--{flag.replace('_', '-')} must be a positive number of seconds")
    if os.environ.get("SLURMD_NODENAME") and not args.node_name:
        # slurmd sets it for its health check: Slurm's own name beats the host name
        args.node_name = os.environ["SLURMD_NODENAME"]
    return run(args)
