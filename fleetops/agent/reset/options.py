"""What the operator asked of ``fleetops-agent reset``: the options, their parsing, and the flag
combinations refused before anything on the node is looked at (``flow`` runs them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fleetops.agent import lock as node_lock
from fleetops.agent.reset.backends import ResetError
from fleetops.catalog.actions import DEFAULT_CLIENTS, DEFAULT_GRACE_S, RESET_TIMEOUT_S

CLIENTS_ENV = "FLEETOPS_RESET_CLIENTS"


@dataclass
class Options:
    selector: str
    expected_bus: str | None = None
    dry_run: bool = False
    kill_processes: bool = False
    expect_pids: list[int] | None = None  # the processes the operator confirmed may be ended
    expect_jobs: list[str] | None = None  # the Slurm jobs the operator confirmed may lose the GPU
    grace_s: float = DEFAULT_GRACE_S
    reset_timeout_s: float = RESET_TIMEOUT_S
    clients: list[str] | None = None
    log_path: str | None = None
    lock_path: str | None = None
    use_syslog: bool = True
    # the node's maintenance lock when this process already holds it (``mig apply``, which runs
    # this flow for a MIG mode that waits for a reset): the flow works under it, moves its
    # deadline, and leaves it held for the caller to release
    held_lock: node_lock.Lock | None = None


def parse_selector(selector: str) -> tuple[str | None, str | None]:
    """(uuid, bus_id) from ``--gpu`` by the one selector rule; an index is a usage error."""
    from fleetops.common import selectors

    try:
        sel = selectors.parse_identity(selector)
    except selectors.SelectorError as exc:
        raise ResetError(exc.message, "usage", 2) from None
    return sel.uuid, sel.bus_id


def parse_clients(text: str | None) -> list[str]:
    if text is None:
        text = os.environ.get(CLIENTS_ENV)
    if text is None:
        return list(DEFAULT_CLIENTS)
    return [u.strip() for u in text.split(",") if u.strip()]


def parse_pids(text: str | None) -> list[int] | None:
    """``--expect-pids 4242,4243`` -> [4242, 4243]; ``''`` confirms that no process runs."""
    if text is None:
        return None
    pids = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) <= 0:
            raise ResetError(f"--expect-pids: {item!r} is not a process id", "usage", 2)
        pids.append(int(item))
    return sorted(set(pids))


def check_usage(opts: Options) -> None:
    """Flag combinations refused before anything is looked at."""
    if opts.kill_processes and opts.expect_pids is None:
        raise ResetError(
            "--kill-processes needs --expect-pids PID[,PID]: only processes the operator confirmed are ended "
            "(list them with `fleetops-agent reset --gpu GPU --dry-run`; --expect-pids '' confirms none)",
            "usage",
            2,
        )
    if opts.expect_pids is not None and not opts.kill_processes:
        raise ResetError("--expect-pids names the processes --kill-processes may end: give both", "usage", 2)
    if opts.expect_jobs is not None and not opts.kill_processes:
        raise ResetError("--expect-jobs names the jobs --kill-processes may reset under: give both", "usage", 2)
    if opts.grace_s < 0 or opts.reset_timeout_s <= 0:
        raise ResetError("--grace must be >= 0 and --reset-timeout > 0", "usage", 2)


def parse_jobs(text: str | None) -> list[str] | None:
    """``--expect-jobs 1234,1240`` -> ["1234", "1240"]; ``''`` confirms that no job holds the GPU."""
    from fleetops.jobs.record import JobRecordError, check_job_id

    if text is None:
        return None
    try:
        return sorted({check_job_id(p.strip()) for p in text.split(",") if p.strip()}, key=int)
    except JobRecordError as exc:
        raise ResetError(f"--expect-jobs: {exc}", "usage", 2) from None
