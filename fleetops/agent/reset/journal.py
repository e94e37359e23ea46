"""The reset's record: one JSON line per attempt in the audit log, and one line to syslog.

Every attempt that is not a dry run is recorded, refused, failed and interrupted ones included,
so an operator can tell afterwards who reset which GPU, when, and what the agent did to the node.
Writing the record never fails the reset: a log that cannot be written is reported in the
document (``log.error``) instead.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

SYSLOG_IDENT = "fleetops-reset"


def send_syslog(message: str, failed: bool) -> str:
    """Send one line to syslog/journal; says where it went (tests replace this function)."""
    import syslog

    try:
        syslog.openlog(SYSLOG_IDENT, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING if failed else syslog.LOG_NOTICE, message)
        syslog.closelog()
    except OSError as exc:
        return f"failed: {exc}"
    return "sent" if os.path.exists("/dev/log") else "sent (no /dev/log on this host: dropped)"


def entry(doc: dict[str, Any], started: float) -> dict[str, Any]:
    """The audit-log line of one attempt (``doc`` is the reset's report)."""
    return {
        "time": started,
        "host": socket.gethostname(),
        "node": doc.get("node"),
        "user": os.environ.get("SUDO_USER") or os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid()),
        "pid": os.getpid(),
        "gpu": doc.get("gpu"),
        "backend": doc.get("backend"),
        "dry_run": doc.get("dry_run"),
        "kill_processes": doc.get("kill_processes"),
        "expect_pids": doc.get("expect_pids"),
        "result": doc.get("result"),
        "refused": doc.get("refused"),
        "remedy": doc.get("remedy"),
        "verified": doc.get("verified"),
        "interrupted_by": doc.get("interrupted_by"),
        "within": doc.get("within"),  # the action that ran this reset under its lock (mig apply), else None
        "preconditions": [{k: c.get(k) for k in ("name", "status", "detail")} for c in doc.get("preconditions", [])],
        "actions": doc.get("actions"),
        "elapsed_s": doc.get("elapsed_s"),
    }


def syslog_line(doc: dict[str, Any]) -> str:
    gpu = doc.get("gpu") or {}
    return f"gpu reset {doc.get('result')}: {gpu.get('uuid')} ({gpu.get('bus_id')}) on {doc.get('node')}" + (
        f"; remedy: {doc['remedy']}" if doc.get("remedy") else ""
    )


def record(doc: dict[str, Any], path: str, use_syslog: bool, started: float) -> dict[str, Any]:
    """Append the attempt to the audit log (JSON line) and syslog; never fails the reset."""
    out: dict[str, Any] = {"file": path}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry(doc, started), separators=(",", ":"), default=str) + "\n")
    except OSError as exc:
        out["error"] = f"{path}: {exc.strerror}"
    out["syslog"] = send_syslog(syslog_line(doc), doc.get("result") != "reset") if use_syslog else "off"
    return out
