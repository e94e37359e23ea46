"""``run_all``: one command on many hosts, a fresh connection per host, ``forks`` at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetops.fleet.transport.common import Result, callback, command_line
from fleetops.fleet.transport.runner import Runner


def run_all(
    hosts: Iterable[Any],
    command: Sequence[str],
    forks: int = 50,
    connect_timeout: float = 5.0,
    command_timeout: float = 20.0,
    known_hosts: str | None = None,
    accept_new_hostkeys: bool = False,
    env: dict[str, str] | None = None,
    on_result: Callable[[Result], None] | None = None,
    idempotent: bool = False,
    ssh_config: str | None = None,
    global_known_hosts: str | None = None,
) -> dict[str, Result]:
    """Run ``command`` on every host, ``forks`` at a time; host name -> Result, in the hosts' order.

    ``hosts`` are ``fleetops.fleet.inventory.Host`` (or anything with name, address, port, user,
    key_file, connection, vars). ``on_result`` is called from the worker thread as each host
    finishes. Each host gets the command at most once; ``idempotent=True`` (a command that only
    reads) reports a connection lost mid-command as ``unreachable`` instead of ``outcome-unknown``.
    ``ssh_config``: the file ``-F`` names (``None``: the process default, else ``~/.ssh/config``);
    ``global_known_hosts``: replaces ``/etc/ssh/ssh_known_hosts`` and GlobalKnownHostsFile (``""``: none)."""
    hosts = list(hosts)
    command_line(command, env)  # bad command or env: fail now, not once per host
    if not hosts:
        return {}
    runner = Runner(
        connect_timeout, command_timeout, known_hosts, accept_new_hostkeys, ssh_config, global_known_hosts
    )
    errors: list[BaseException] = []
    deliver = callback(on_result, errors)
    workers = max(1, min(int(forks), len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetops-ssh") as pool:

        def one(host: Any) -> Result:
            return deliver(runner.run_once(host, command, env, idempotent=idempotent))

        futures = [pool.submit(one, h) for h in hosts]
        results = {h.name: fut.result() for h, fut in zip(hosts, futures, strict=True)}
    if errors:
        raise errors[0]
    return results
