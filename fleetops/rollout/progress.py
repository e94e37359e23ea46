"""ansible-runner events -> live per-host progress lines and a per-host summary.

Pure: no ansible, no rich, no I/O except through the ``emit`` callable, so it is tested with
recorded event dicts. ``Tracker.handle`` is the runner's ``event_handler`` and returns True
(ansible-runner drops events, and the final stats with them, when the handler returns False).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OK_EVENTS = ("runner_on_ok", "runner_item_on_ok", "runner_on_async_ok")
FAILED_EVENTS = ("runner_on_failed", "runner_item_on_failed", "runner_on_async_failed")
SKIPPED_EVENTS = ("runner_on_skipped", "runner_item_on_skipped")
MAX_MSG = 300
TALKATIVE = ("fleetops.gpu.", "fleetops_", "ansible.builtin.debug", "debug", "ansible.builtin.reboot")
DEBUG_ACTIONS = ("ansible.builtin.debug", "debug")
# The slurm_drain role's lines for a node left in another owner's drain, and for a host whose
# Slurm is skipped on purpose (fleetops_slurm_managed: false): shown even when not verbose.
HELD_PREFIX = "held: "
SLURM_MODULE = "fleetops_slurm_node"
UNMANAGED_MARK = "fleetops_slurm_managed is false"


@dataclass
class HostRecord:
    name: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    plays: list[str] = field(default_factory=list)
    changed_tasks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # failures, rescued ones included, in order
    held: str | None = None  # another owner's drain left in place: the role's "held: ..." line
    last_task: str | None = None
    finished: bool = False

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        if self.held:
            return "held"
        if self.changed:
            return "changed"
        return "ok"

    @property
    def note(self) -> str:
        if self.status in ("failed", "unreachable") and self.errors:
            return self.errors[-1]
        if self.status == "held" and self.held:
            return self.held
        if self.changed_tasks:
            shown = ", ".join(dict.fromkeys(self.changed_tasks))
            return f"changed: {shown}"
        return ""


def _task_label(data: dict[str, Any]) -> str:
    task = str(data.get("task") or "").strip()
    role = str(data.get("role") or "").strip()
    if role and not task.startswith(f"{role} :"):
        return f"{role} : {task}"
    return task


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg")
    if not msg and res.get("results"):
        msg = "; ".join(str(r.get("msg")) for r in res["results"] if isinstance(r, dict) and r.get("msg"))
    if not msg:
        msg = res.get("stderr") or res.get("reason") or res.get("module_stderr") or ""
    text = " ".join(str(msg).split())
    return text if len(text) <= MAX_MSG else text[: MAX_MSG - 3] + "..."


class Tracker:
    """Follows one playbook run. ``emit(kind, line)`` receives each progress line; ``kind`` is
    one of play, changed, failed, unreachable, rescued, held, note, ok (ok lines only when verbose)."""

    def __init__(
        self, emit: Callable[[str, str], None] | None = None, verbose: bool = False, check: bool = False
    ) -> None:
        self.emit = emit or (lambda kind, line: None)
        self.verbose = verbose
        # check mode: nothing changed; a task that reports "changed" would change (said so)
        self.check = check
        self.hosts: dict[str, HostRecord] = {}
        self.plays: list[str] = []
        self.stats: dict[str, dict[str, int]] | None = None
        self.started = time.monotonic()
        self.events = 0
        # what the drain module did on each node, for the history store (slurm_events)
        self.slurm: list[dict[str, Any]] = []

    def host(self, name: str) -> HostRecord:
        record = self.hosts.get(name)
        if record is None:
            record = self.hosts[name] = HostRecord(name)
        return record

    def _line(self, kind: str, host: str, text: str) -> None:
        elapsed = time.monotonic() - self.started
        shown = "WOULD CHANGE" if self.check and kind == "changed" else kind.upper()
        self.emit(kind, f"[{elapsed:6.1f}s] {host:<14} {shown:<11} {text}")

    def handle(self, event: dict[str, Any]) -> bool:
        self.events += 1
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            name = str(data.get("play") or data.get("name") or "play")
            self.plays.append(name)
            self.emit("play", f"PLAY {name}")
        elif kind in OK_EVENTS + FAILED_EVENTS + SKIPPED_EVENTS or kind == "runner_on_unreachable":
            self._host_event(kind, data)
        elif kind == "playbook_on_stats":
            self._stats(data)
        return True  # always: False makes ansible-runner drop the event and the stats

    def _host_event(self, kind: str, data: dict[str, Any]) -> None:
        name = data.get("host") or data.get("remote_addr")
        if not name:
            return
        record = self.host(str(name))
        label = _task_label(data)
        record.last_task = label
        if self.plays and (not record.plays or record.plays[-1] != self.plays[-1]):
            record.plays.append(self.plays[-1])
        res = data.get("res") or {}
        if kind == "runner_on_ok" and str(data.get("task_action", "")).endswith(SLURM_MODULE):
            self._slurm(record.name, res)
        if kind in OK_EVENTS:
            said_by_debug = str(data.get("task_action", "")) in DEBUG_ACTIONS and kind == "runner_on_ok"
            msg = str(res.get("msg") or "") if said_by_debug else ""
            if msg.startswith(HELD_PREFIX):
                record.held = " ".join(msg.split())
                self._line("held", record.name, record.held)
                return
            if UNMANAGED_MARK in msg:
                self._line("note", record.name, " ".join(msg.split()))
                return
            if kind == "runner_on_ok" and res.get("changed"):
                record.changed_tasks.append(label)
                # Our modules say what changed (per GPU, per node); others' messages are noise
                # ("debconf: delaying package configuration ...").
                said = _message(res) if str(data.get("task_action", "")).startswith(TALKATIVE) else ""
                self._line("changed", record.name, f"{label}: {said}" if said else label)
            elif self.verbose and kind == "runner_on_ok":
                self._line("ok", record.name, label)
        elif kind in FAILED_EVENTS:
            if kind != "runner_on_failed":
                return  # the task's own failed event follows and carries the summary
            message = f"{label}: {_message(res)}"
            if data.get("ignore_errors"):
                if self.verbose:
                    self._line("ok", record.name, f"{label}: failed, ignored")
                return
            record.errors.append(message)
            # Inside a block with rescue the failure may yet be rescued; stats decide.
            self._line("failed", record.name, message)
        elif kind == "runner_on_unreachable":
            message = f"{label}: {_message(res)}"
            record.errors.append(message)
            self._line("unreachable", record.name, message)

    def _slurm(self, host: str, res: dict[str, Any]) -> None:
        """Keep a drain or resume the module made, took over or was held from (not its queries,
        its capacity checks, or a drain that was already this run's)."""
        args = (res.get("invocation") or {}).get("module_args") or {}
        state, action = args.get("state"), res.get("action")
        if state not in ("drained", "resumed") or action not in ("drain", "adopt", "held", "resume", "leave"):
            return
        self.slurm.append(
            {
                "at": time.time(),
                "host": host,
                "slurm_name": res.get("node") or args.get("name"),
                "action": "drain" if state == "drained" else "resume",
                "outcome": "refused" if action in ("held", "leave") else "done",
                "kind": args.get("owner"),
                "run": args.get("run"),
                "purpose": args.get("reason"),
                "previous_owner": res.get("held_by") or res.get("adopted_from"),
                "message": " ".join(str(res.get("msg") or "").split()),
            }
        )

    def _stats(self, data: dict[str, Any]) -> None:
        keys = ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
        self.stats = {k: dict(data.get(k) or {}) for k in keys}
        names: set[str] = set()
        for key in keys:
            names.update(self.stats[key])
        for name in sorted(names):
            record = self.host(name)
            record.ok = int(self.stats["ok"].get(name, 0))
            record.changed = int(self.stats["changed"].get(name, 0))
            record.failed = int(self.stats["failures"].get(name, 0))
            record.unreachable = int(self.stats["dark"].get(name, 0))
            record.skipped = int(self.stats["skipped"].get(name, 0))
            record.rescued = int(self.stats["rescued"].get(name, 0))
            record.ignored = int(self.stats["ignored"].get(name, 0))
            record.finished = True

    # --- results ---------------------------------------------------------------------------

    def held(self) -> dict[str, str]:
        """Hosts left in another owner's drain (not changed, not failed) and the role's line."""
        return {h.name: h.held for h in self.hosts.values() if h.held and h.status == "held"}

    def failed_hosts(self) -> list[str]:
        return sorted(h.name for h in self.hosts.values() if h.status in ("failed", "unreachable"))

    def not_reached(self) -> list[str]:
        """Hosts that took part in the first play only: a later play stopped before them
        (a failed canary or max_fail_percentage ends the run early)."""
        if len(self.plays) < 2:
            return []
        first = self.plays[0]
        return sorted(
            h.name
            for h in self.hosts.values()
            if h.plays == [first] and h.status not in ("failed", "unreachable")
        )

    def summary_rows(self) -> list[dict[str, Any]]:
        stopped = set(self.not_reached())
        rows = []
        for record in sorted(self.hosts.values(), key=lambda h: h.name):
            status = "not reached" if record.name in stopped else record.status
            note = "the run stopped before this host" if record.name in stopped else record.note
            if self.check and status == "changed":
                status, note = "would change", "would change" + note.removeprefix("changed")
            rows.append(
                {
                    "host": record.name,
                    "status": status,
                    "ok": record.ok,
                    "changed": record.changed,
                    "failed": record.failed,
                    "unreachable": record.unreachable,
                    "skipped": record.skipped,
                    "rescued": record.rescued,
                    "note": note,
                }
            )
        return rows


def summary_text(rows: list[dict[str, Any]], width: int = 120) -> str:
    """The per-host summary as plain text (one line per host, then a totals line)."""
    if not rows:
        return "no host took part in the run"
    name_w = max(4, max(len(r["host"]) for r in rows))
    head = f"{'HOST':<{name_w}}  {'STATUS':<12} {'OK':>3} {'CHG':>3} {'FAIL':>4} {'UNR':>3} {'SKIP':>4}  NOTE"
    lines = [head]
    for r in rows:
        line = (
            f"{r['host']:<{name_w}}  {r['status']:<12} {r['ok']:>3} {r['changed']:>3} "
            f"{r['failed']:>4} {r['unreachable']:>3} {r['skipped']:>4}  {r['note']}"
        )
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f" ({len(rows)} hosts)")
    return "\n".join(lines)
