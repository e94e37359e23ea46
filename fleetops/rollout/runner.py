"""Run one of the repository's playbooks through ansible-runner, with live per-host progress.

ansible-runner is imported inside ``run_playbook`` only: the rest of fleetops (and its CLI's
``--help``) does not pay for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetops.rollout.progress import Tracker

ANSIBLE_DIR_ENV = "FLEETOPS_ANSIBLE_DIR"
ARTIFACTS_ENV = "FLEETOPS_ROLLOUT_DIR"
KEEP_ARTIFACTS = 20


class RolloutError(Exception):
    """The run cannot start (missing playbook, inventory, ansible-runner); the message says why."""


def ansible_dir() -> Path:
    """The folder holding ansible.cfg, playbooks/ and roles/ (the repository root by default)."""
    override = os.environ.get(ANSIBLE_DIR_ENV)
    root = Path(override) if override else Path(__file__).resolve().parents[2]
    if not (root / "playbooks").is_dir() or not (root / "roles").is_dir():
        raise RolloutError(
            f"no playbooks/ and roles/ under {root}: set {ANSIBLE_DIR_ENV} to the fleetops checkout "
            "that holds them"
        )
    return root


def artifacts_dir() -> Path:
    override = os.environ.get(ARTIFACTS_ENV)
    if override:
        return Path(override)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "fleetops" / "rollout"


@dataclass
class RunResult:
    playbook: str
    status: str  # ansible-runner's: successful | failed | timeout | canceled
    rc: int | None
    rows: list[dict[str, Any]]
    failed_hosts: list[str]
    not_reached: list[str]
    elapsed_s: float
    artifacts: str
    stats: dict[str, dict[str, int]] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failed_hosts and self.status == "successful"

    def changed_hosts(self) -> list[str]:
        return sorted(r["host"] for r in self.rows if r["changed"] > 0)


def run_playbook(
    playbook: str,
    inventories: list[str],
    *,
    extravars: dict[str, Any] | None = None,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    forks: int | None = None,
    verbose: bool = False,
    emit: Callable[[str, str], None] | None = None,
    private_data_dir: str | None = None,
    ident_prefix: str = "run",
    keep: int = KEEP_ARTIFACTS,
    timeout: int | None = None,
) -> RunResult:
    """Run ``playbooks/<playbook>`` and return per-host results. ``emit(kind, line)`` gets each
    progress line as it happens."""
    try:
        import ansible_runner
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise RolloutError("ansible-runner is not installed: pip install ansible-runner") from exc

    root = ansible_dir()
    book = root / "playbooks" / playbook
    if not book.is_file():
        raise RolloutError(f"no playbook {book}")
    sources = []
    for inv in inventories:
        path = Path(inv).expanduser()
        if not path.exists():
            raise RolloutError(f"inventory {inv} does not exist")
        sources.append(str(path.resolve()))
    if not sources:
        raise RolloutError("no inventory given (-i INVENTORY)")

    data_dir = Path(private_data_dir) if private_data_dir else artifacts_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    cmdline = []
    if check:
        cmdline.append("--check")
    if diff or check:
        cmdline.append("--diff")
    envvars = {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(root / "roles"),
        "ANSIBLE_LIBRARY": str(root / "playbooks" / "library"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # The controller-side audit gate runs `fleetops audit` from this environment.
        "PATH": os.pathsep.join(
            dict.fromkeys([os.path.dirname(sys.executable)] + os.environ.get("PATH", "").split(os.pathsep))
        ),
    }
    tracker = Tracker(emit=emit, verbose=verbose)
    ident = f"{ident_prefix}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    started = time.monotonic()
    kwargs: dict[str, Any] = {
        "private_data_dir": str(data_dir),
        "project_dir": str(root / "playbooks"),
        "playbook": str(book),
        "inventory": sources,
        "extravars": dict(extravars or {}),
        "limit": limit,
        "cmdline": " ".join(cmdline) or None,
        "envvars": envvars,
        "event_handler": tracker.handle,
        "quiet": True,
        "suppress_env_files": True,
        "rotate_artifacts": keep,
        "ident": ident,
    }
    if forks:
        kwargs["forks"] = forks
    if timeout:
        kwargs["timeout"] = timeout
    runner = ansible_runner.run(**kwargs)
    elapsed = time.monotonic() - started
    errors: list[str] = []
    if runner.rc not in (0, None) and tracker.stats is None:
        # ansible-playbook stopped before running anything (syntax, inventory, missing role).
        try:
            tail = runner.stdout.read().strip().splitlines()[-12:]
        except (OSError, ValueError, AttributeError):  # stdout file gone (artifacts rotated)
            tail = []
        joined = "\n".join(tail)
        errors.append(f"ansible-playbook exited {runner.rc} before running any host:\n{joined}")
    return RunResult(
        playbook=playbook,
        status=runner.status,
        rc=runner.rc,
        rows=tracker.summary_rows(),
        failed_hosts=tracker.failed_hosts(),
        not_reached=tracker.not_reached(),
        elapsed_s=round(elapsed, 2),
        artifacts=str(data_dir / "artifacts" / ident),
        stats=tracker.stats,
        errors=errors,
    )
