"""``fleetops-agent history``: the daemon's last hour of a GPU's samples, as one JSON object; with
``--job``, a job's (its cgroup's CPU time, ``cpu_usage_usec``, to compute the job's CPU share).

Stdlib only and one short unix-socket request per field: the TUI runs this over SSH every few
seconds while a node's charts are open, so it must cost next to nothing on the node.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from fleetops.agent.serve import client

DEFAULT_FIELDS = ("temp_gpu_c", "temp_memory_c", "power_draw_w", "clock_sm_mhz")
JOB_FIELDS = ("cpu_usage_usec",)  # a job's: its cgroup's CPU time (serve/jobs.py)
DEFAULT_SECONDS = 3600.0
REQUEST_TIMEOUT_S = 5.0


class HistoryError(Exception):
    """An answer the caller reports as the agent's one-line JSON error (``kind``, exit code)."""

    def __init__(self, kind: str, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


def _ask(path: str, request: str) -> dict[str, Any]:
    try:
        answer = client.ask(path, request.encode() + b"\n", REQUEST_TIMEOUT_S, client.CONNECT_TIMEOUT_S * 5)
    except client.NotAnswering as exc:
        raise HistoryError("no-daemon", f"no fleetops-agent daemon answers on {path} ({exc.strerror or exc})") from exc
    except OSError as exc:
        raise HistoryError("no-daemon", f"the daemon on {path} did not answer {request!r}: {exc}") from exc
    try:
        doc = json.loads(answer)
    except ValueError as exc:
        raise HistoryError("internal", f"the daemon on {path} sent no JSON for {request!r}") from exc
    if not isinstance(doc, dict):
        raise HistoryError("internal", f"the daemon on {path} sent {type(doc).__name__} for {request!r}")
    return doc


def _value(v: Any) -> float | None:
    """A sample's value as the daemon sent it: a counter's int stays an exact int (JSON keeps
    every digit of 8.7e12 KiB, or of a value past 2**53), a gauge a float, NaN None."""
    if v is None or isinstance(v, bool) or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, int):
        return v
    return float(v)


def history(path: str, uuid: str, fields: list[str], seconds: float) -> dict[str, list[list[float | None]]]:
    """{field: [[t, v], ...]} oldest first, v None where the GPU gave no value."""
    if not os.path.exists(path):
        raise HistoryError("no-daemon", f"no fleetops-agent daemon on this node ({path} does not exist)")
    out: dict[str, list[list[float | None]]] = {}
    for name in fields:
        doc = _ask(path, f"history {uuid} {name} {seconds:g}")
        if "error" in doc:
            kind = str(doc.get("kind") or "failed")
            raise HistoryError(kind, str(doc["error"]), 2 if kind == "usage" else 1)
        out[name] = [[float(t), _value(v)] for t, v in doc.get("samples", [])]
    return out


def run(args: Any) -> int:
    job = getattr(args, "job", None)
    if (args.gpu is None) == (job is None):
        return _fail("usage", "history: give one of --gpu UUID or --job JOBID", 2)
    if job is not None and not str(job).isdigit():
        return _fail("usage", f"--job: expected a Slurm job number, got {job!r}", 2)
    default = JOB_FIELDS if job is not None else DEFAULT_FIELDS
    fields = [f.strip() for f in (args.fields or ",".join(default)).split(",") if f.strip()]
    bad = [f for f in fields if not f.replace("_", "").isalnum()]
    if not fields or bad:
        return _fail("usage", f"--fields: expected names like {','.join(DEFAULT_FIELDS)}, got {args.fields!r}", 2)
    if not math.isfinite(args.seconds) or args.seconds <= 0:
        return _fail("usage", f"--seconds must be a positive number, got {args.seconds:g}", 2)
    path = client.socket_for(args.backend, args.state, args.socket)
    try:
        doc = history(path, args.gpu if job is None else f"job:{job}", fields, args.seconds)
    except HistoryError as exc:
        return _fail(exc.kind, str(exc), exc.code)
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), allow_nan=False) + "\n")
    return 0


def _fail(kind: str, message: str, code: int) -> int:
    sys.stderr.write(json.dumps({"error": message, "kind": kind}) + "\n")
    return code
