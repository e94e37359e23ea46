"""``SessionPool``: one persistent connection per host, a command re-run on demand (a TUI
refreshing every few seconds)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import paramiko

from fleetops.fleet import sshconfig
from fleetops.fleet.transport.common import (
    BUSY,
    OUTCOME_UNKNOWN,
    Failure,
    Result,
    as_read,
    become_refused,
    callback,
    command_line,
    failed,
    finish,
    since,
)
from fleetops.fleet.transport.runner import Runner


class SessionPool:
    """One persistent SSH connection per host; ``run`` re-runs a command on all (or some) of them.

    A connection that broke is reopened on the next run. A reused one found dead before the
    command went out is reopened within the same run and the command sent on the new one; a
    connection lost after the command went out gives ``outcome-unknown`` and the command is not
    sent again, unless the caller passed ``idempotent=True`` (reads such as collect: sent again
    once). A host whose previous command is still running answers ``timeout`` at once instead of
    queueing. Use as a context manager, or call ``close``."""

    def __init__(
        self,
        hosts: Iterable[Any],
        forks: int = 50,
        connect_timeout: float = 5.0,
        command_timeout: float = 20.0,
        known_hosts: str | None = None,
        accept_new_hostkeys: bool = False,
        keepalive_s: float = 15.0,
        ssh_config: str | None = None,
        global_known_hosts: str | None = None,
    ) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.keepalive_s = keepalive_s
        self._runner = Runner(
            connect_timeout, command_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
        )
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._locks = {name: threading.Lock() for name in self.hosts}
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(int(forks), len(self.hosts) or 1)), thread_name_prefix="fleetops-pool"
        )
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def target(self, host: Any) -> sshconfig.Target:
        """Where ``host`` is reached (inventory, then ssh_config); a ``Failure`` ``local`` if unusable."""
        return self._runner.target(host)

    def ssh_settings(self) -> dict[str, Any]:
        """How this pool reaches hosts, for a one-off connection elsewhere that should be made
        the same way (a Slurm host): connect_timeout, known_hosts, accept_new_hostkeys."""
        return {
            "connect_timeout": self._runner.connect_timeout,
            "known_hosts": self._runner.known_hosts,
            "accept_new_hostkeys": self._runner.accept_new,
        }

    def connected(self) -> list[str]:
        """Hosts with an open connection now."""
        out = []
        for name, client in list(self._clients.items()):
            transport = client.get_transport()
            if transport is not None and transport.is_active():
                out.append(name)
        return sorted(out)

    def drop(self, name: str) -> None:
        client = self._clients.pop(name, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        for name in list(self._clients):
            self.drop(name)

    def run_one(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> Result:
        """Run ``command`` on ``name``'s session. ``timeout`` (seconds) replaces the pool's
        command timeout for this call: an action brings its own budget. ``idempotent`` only for
        commands that change nothing: they may be sent a second time."""
        if self._closed:
            raise RuntimeError("SessionPool is closed")
        host = self.hosts[name]
        if getattr(host, "connection", "ssh") == "local":
            return self._runner.run_local(host, command, env, timeout)
        started = time.monotonic()
        lock = self._locks[name]
        if not lock.acquire(blocking=False):
            return Result(
                name,
                False,
                None,
                "",
                "",
                BUSY,  # not "timeout": nothing was sent, so an action is not done rather than unknown
                "the previous command on this host has not finished: not sent",
                0.0,
            )
        try:
            target = self._runner.target(host)
            line = command_line(command, env, target.become)
            for attempt in (1, 2):
                client = self._clients.get(name)
                transport = client.get_transport() if client is not None else None
                reused = transport is not None and transport.is_active()
                try:
                    if not reused:
                        self.drop(name)
                        client = self._runner.connect_target(target)
                        client.get_transport().set_keepalive(int(self.keepalive_s))  # type: ignore[union-attr]
                        for jump in getattr(client, "jumps", ()):  # a bastion idle behind a NAT drops too
                            jump_transport = jump.get_transport()
                            if jump_transport is not None:
                                jump_transport.set_keepalive(int(self.keepalive_s))
                        self._clients[name] = client
                    assert client is not None
                    status, stdout, stderr = self._runner.execute(client, line, name, timeout)
                    refused = become_refused(target.become, status, stderr)
                    if refused:
                        raise Failure("auth", refused, stdout, stderr, status, sent=True)
                except Failure as f:
                    if f.kind in ("timeout", "unreachable", OUTCOME_UNKNOWN):
                        self.drop(name)
                    stale = reused and f.kind == "unreachable" and not f.sent
                    lost_read = reused and idempotent and f.kind == OUTCOME_UNKNOWN
                    if attempt == 1 and (stale or lost_read):
                        continue  # nothing ran (or it only read): once more on a new connection
                    return failed(name, as_read(f) if idempotent else f, started)
                return finish(name, status, stdout, stderr, started)
            raise AssertionError("unreachable")
        except Exception as exc:  # as in run_once: a Result, never an exception  # noqa: BLE001
            self.drop(name)
            return Result(name, False, None, "", "", "local", f"{type(exc).__name__}: {exc}", since(started))
        finally:
            lock.release()

    def run(
        self,
        command: Sequence[str],
        hosts: Iterable[str] | None = None,
        env: dict[str, str] | None = None,
        on_result: Callable[[Result], None] | None = None,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
    ) -> dict[str, Result]:
        """Run ``command`` on ``hosts`` (names; default all) in parallel; name -> Result.
        ``timeout`` and ``idempotent`` as in ``run_one``."""
        command_line(command, env)
        names = list(self.hosts) if hosts is None else list(hosts)
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            raise KeyError(f"not in this pool: {', '.join(unknown[:5])}")
        errors: list[BaseException] = []
        deliver = callback(on_result, errors)

        def one(name: str) -> Result:
            return deliver(self.run_one(name, command, env, timeout=timeout, idempotent=idempotent))

        futures = [self._pool.submit(one, n) for n in names]
        results = {n: fut.result() for n, fut in zip(names, futures, strict=True)}
        if errors:
            raise errors[0]
        return results
