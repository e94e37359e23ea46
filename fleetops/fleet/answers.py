"""Reading what ``fleetops-agent`` answered, by the JSON it prints and never by the wording of
its stderr.

The agent's contract: a command prints one JSON document on stdout (a snapshot, tagged
``"schema": "fleetops.snapshot/v1"``, or an action report tagged ``"kind": "fleetops.reset/v1"``,
``"fleetops.mig/v1"`` or ``"fleetops.set/v1"``), or a one-line JSON error ``{"error": ...,
"kind": ...}`` on stderr. Reports come on stdout also when the action is refused (exit 1).

Only an SSH command that exits 127 *without* such an error line means the agent is missing:
a simulator saying "state file not found" is the agent's own error, with its kind, and must
never be taken for a missing agent (which would send the operator to reinstall it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetops.schema import SCHEMA_ID

RESET_KIND = "fleetops.reset/v1"
MIG_KIND = "fleetops.mig/v1"
SET_KIND = "fleetops.set/v1"
REPORT_KINDS: dict[str, str] = {RESET_KIND: "reset", MIG_KIND: "mig", SET_KIND: "set"}

# what an answer is
SNAPSHOT = "snapshot"  # doc is the snapshot (a dict; model.node_from_dict builds the Node)
REPORT = "report"  # doc is an action report; ``action`` says which (reset, mig, set)
AGENT_ERROR = "agent-error"  # the agent ran and said why it could not: ``error``, ``kind``
MISSING = "missing"  # no agent at the command's path (exit 127, no agent error line)
TRANSPORT = "transport"  # the command did not run to an end: ``kind`` is the transport's error kind
UNREADABLE = "unreadable"  # it ran, but printed nothing this contract knows

EXIT_NOT_FOUND = 127  # what a POSIX shell exits with when the command is not there


@dataclass(frozen=True)
class Answer:
    """One agent answer. ``kind`` is the agent's error kind for AGENT_ERROR and the transport's
    error kind for TRANSPORT (``timeout``, ``unreachable``, ``outcome-unknown``, ...)."""

    what: str
    doc: dict[str, Any] | None = None
    action: str | None = None
    error: str | None = None
    kind: str | None = None
    exit_status: int | None = None

    @property
    def is_snapshot(self) -> bool:
        return self.what == SNAPSHOT

    @property
    def is_report(self) -> bool:
        return self.what == REPORT

    def describe(self) -> str:
        """One line for the operator: why there is no usable document."""
        if self.what in (SNAPSHOT, REPORT):
            return f"{self.action or self.what} answer"
        if self.what == AGENT_ERROR:
            return f"agent error ({self.kind or 'unknown kind'}): {self.error}"
        if self.what == MISSING:
            return f"fleetops-agent not found on the node ({self.error})"
        if self.what == TRANSPORT:
            return f"{self.kind}: {self.error}" if self.error else str(self.kind)
        return f"agent answer unusable: {self.error}"


def agent_error(stderr: str | None) -> tuple[str, str | None] | None:
    """(message, kind) of the agent's one-line JSON error: the last such line on stderr (a
    warning printed before it does not hide it)."""
    for line in reversed((stderr or "").strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and "error" in doc:
            kind = doc.get("kind")
            return str(doc["error"]), (str(kind) if kind is not None else None)
    return None


def _document(stdout: str | None) -> dict[str, Any] | None:
    text = (stdout or "").strip()
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _looks_like_reset(doc: dict[str, Any]) -> bool:
    """A reset report from an agent older than the ``kind`` tag."""
    return "result" in doc and "preconditions" in doc and isinstance(doc.get("gpu"), dict)


def classify_document(doc: dict[str, Any]) -> tuple[str, str | None] | None:
    """(SNAPSHOT|REPORT, action) for a document this contract knows; None otherwise."""
    if doc.get("schema") == SCHEMA_ID:
        return SNAPSHOT, None
    kind = doc.get("kind")
    if isinstance(kind, str) and kind in REPORT_KINDS:
        return REPORT, REPORT_KINDS[kind]
    if kind is None and _looks_like_reset(doc):
        return REPORT, "reset"
    return None


def read(result: Any) -> Answer:
    """The answer in one transport result (``fleet.transport.Result`` or anything with ``ok``,
    ``exit_status``, ``stdout``, ``stderr``, ``error_kind``, ``error``)."""
    error_kind = getattr(result, "error_kind", None)
    status = getattr(result, "exit_status", None)
    if not result.ok and error_kind not in (None, "command"):
        return Answer(TRANSPORT, error=(result.error or "").strip() or None, kind=error_kind, exit_status=status)
    doc = _document(result.stdout)
    if doc is not None:
        known = classify_document(doc)
        if known is not None:
            return Answer(known[0], doc=doc, action=known[1], exit_status=status)
    err = agent_error(result.stderr)
    if err is not None:
        return Answer(AGENT_ERROR, error=err[0], kind=err[1], exit_status=status)
    stderr = (result.stderr or "").strip()
    if status == EXIT_NOT_FOUND:
        return Answer(MISSING, error=stderr or (result.error or "exit 127"), exit_status=status)
    if doc is not None:
        why = f"a JSON document that is neither a snapshot nor a known report (schema {doc.get('schema')!r}, kind {doc.get('kind')!r})"
    elif (result.stdout or "").strip():
        why = "stdout is not a JSON document"
    else:
        why = "the agent printed nothing"
    if not result.ok:
        why += f"; exit {status}" + (f": {stderr.splitlines()[-1]}" if stderr else "")
    return Answer(UNREADABLE, error=why, exit_status=status)
