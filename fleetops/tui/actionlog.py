"""The TUI's action log: every action taken from this screen (reset, drain, resume, re-audit)
with its outcome, newest first, written through to the history store (``ops.action_log``) and
read back from it at start, so the actions of earlier sessions are there too. No Textual here:
the app adds and settles rows from its workers, ``screens/actions.py`` draws them."""

from __future__ import annotations

import io
import threading
import time

from fleetops.fleet.store.rows import ActionRow
from fleetops.ops import action_log

KEEP = 500  # rows held on screen (the store keeps every one, with the audits' retention)
COLUMNS = ("TIME", "NODE", "GPU", "ACTION", "OUTCOME", "WHY")


class ActionLog:
    """``db_path`` None: the rows live only as long as the app (nothing recorded)."""

    def __init__(self, db_path: str | None) -> None:
        self.db_path = db_path
        self._rows: list[ActionRow] = []
        self._lock = threading.Lock()
        self.version = 0  # bumped on every change: the pane redraws when it moves
        self.warning = ""  # the last store trouble, said in the pane (stderr lies under the screen)

    def _warned(self, buffer: io.StringIO) -> None:
        if buffer.getvalue():
            self.warning = buffer.getvalue().strip().splitlines()[-1].removeprefix("fleetops: warning: ")

    def load(self) -> None:
        """The store's latest actions (earlier sessions), newest first."""
        if self.db_path is None:
            return
        warned = io.StringIO()
        rows = action_log.recent(self.db_path, KEEP, warn=warned)
        self._warned(warned)
        with self._lock:
            self._rows = rows
            self.version += 1

    @property
    def rows(self) -> list[ActionRow]:
        with self._lock:
            return list(self._rows)

    def add(self, node: str, action: str, outcome: str, why: str, gpu: str | None = None) -> ActionRow:
        warned = io.StringIO()
        if self.db_path is not None:
            row, _ = action_log.record(self.db_path, node, action, outcome, why, gpu=gpu, warn=warned)
        else:
            row = ActionRow(at=time.time(), node=node, gpu=gpu, action=action, outcome=outcome, why=" ".join(why.split()))
        self._warned(warned)
        with self._lock:
            self._rows = [row, *self._rows][:KEEP]
            self.version += 1
        return row

    def settle(self, row: ActionRow, outcome: str, why: str) -> ActionRow:
        """What came of ``row`` (sent), now known: verified or unknown, and why."""
        warned = io.StringIO()
        new = action_log.update(self.db_path, row, outcome, why, warn=warned) if self.db_path else \
            ActionRow(**{**row.to_dict(), "outcome": outcome, "why": " ".join(why.split())})
        self._warned(warned)
        with self._lock:
            self._rows = [new if r is row else r for r in self._rows]
            self.version += 1
        return new


def cells(row: ActionRow) -> tuple[str, str, str, str, str, str]:
    """One row as the pane shows it: local time, node, GPU, action, outcome, why."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.at))
    return (stamp, row.node, row.gpu or "-", row.action, row.outcome, row.why)
