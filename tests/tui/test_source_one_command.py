"""One command at a time on a host's session, whoever sends it: the charts' history read, the
poll and an action (a reset) all go through the host's lock, so an action sent while a history
read is in flight waits for it instead of coming back "the previous command on this host has not
finished", a reset not done.

The session pool is a stand-in with the real pool's rule (one command per host; a second one at
the same time is refused at once), so this needs no SSH."""

from __future__ import annotations

import threading
from typing import Any

from fleetops.fleet import inventory
from fleetops.fleet.transport.common import Result
from fleetops.tui.source import SshSource


class OnePerHost:
    """A session pool that refuses a second command on a host, as SessionPool does."""

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.lock = threading.Lock()
        self.history_in = threading.Event()
        self.release_history = threading.Event()
        self.action_tried = threading.Event()
        self.sent: list[str] = []
        self.overlaps: list[str] = []

    def run_one(self, name: str, command: list[str], env: Any = None, *, timeout: float | None = None,
                idempotent: bool = False) -> Result:
        verb = command[1]
        with self.lock:
            if name in self.busy:
                self.overlaps.append(verb)
                if verb == "reset":
                    self.action_tried.set()
                return Result(name, False, None, "", "", "busy", "the previous command on this host has not finished: not sent",
                              0.0)
            self.busy.add(name)
        try:
            self.sent.append(verb)
            if verb == "history":
                self.history_in.set()
                self.release_history.wait(30)
                return Result(name, True, 0, "{}", "", None, None, 0.1)
            return Result(name, True, 0, '{"result": "ok"}', "", None, None, 0.1)
        finally:
            with self.lock:
                self.busy.discard(name)

    def close(self) -> None:
        pass


def test_an_action_sent_while_a_history_read_is_in_flight_waits_for_it_and_is_sent_once() -> None:
    host = inventory.Host(name="node001", address="127.0.0.1")
    source = SshSource([host], connect_timeout=10.0)
    source.pool.close()
    fake = OnePerHost()
    source.pool = fake  # type: ignore[assignment]
    history: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: history.update(source.gpu_history("node001", "GPU-1")))
    reader.start()
    assert fake.history_in.wait(30), "the history read never started"
    answers: list[Result] = []
    action = threading.Thread(target=lambda: answers.append(source.run_action("node001", ["fleetops-agent", "reset"], 60)))
    action.start()
    # with no lock shared by the two, the reset reaches the pool at once and is refused there; give
    # it up to 3 s to do so before the history read is let go
    fake.action_tried.wait(3)
    fake.release_history.set()
    reader.join(30)
    action.join(30)
    assert fake.overlaps == []
    assert fake.sent == ["history", "reset"]
    assert [(a.ok, a.stdout) for a in answers] == [(True, '{"result": "ok"}')]
    assert set(history) != set() and all(v == [] for v in history.values())


def test_a_history_read_gives_up_with_busy_when_the_session_stays_taken() -> None:
    from fleetops.agent.serve.history_cli import HistoryError

    host = inventory.Host(name="node001", address="127.0.0.1")
    source = SshSource([host], connect_timeout=0.5)
    source.pool.close()
    source.pool = OnePerHost()  # type: ignore[assignment]
    with source._host_locks["node001"]:  # an action holds the session
        try:
            source.gpu_history("node001", "GPU-1")
        except HistoryError as exc:
            assert (exc.kind, str(exc)) == ("busy", "node001: the host's session stayed busy (a poll or an action in flight)")
        else:
            raise AssertionError("a history read ran beside an action")
    assert source.pool.sent == []  # type: ignore[attr-defined]
