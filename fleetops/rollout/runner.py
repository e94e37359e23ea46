"""Run one of the fleetops.gpu collection's playbooks through ansible-runner, with live per-host
progress: the collection of a checkout, or the one the installed wheel carries.

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

from fleetops.ops.baseline import PLAYBOOK_VAR
from fleetops.rollout.progress import Tracker

ANSIBLE_DIR_ENV = "FLEETOPS_ANSIBLE_DIR"
ARTIFACTS_ENV = "FLEETOPS_ROLLOUT_DIR"
KEEP_ARTIFACTS = 20

COLLECTION = ("fleetops", "gpu")
# Where the wheel carries the collection, installed (setup.py builds it with ansible-galaxy): inside
# the package, so that `pip install` of fleetops alone brings its playbooks, roles and modules.
PACKAGED_COLLECTIONS = Path(__file__).resolve().parents[1] / "collections"
# Ansible's own places after ours, for any other collection a site's inventory plugins need.
DEFAULT_COLLECTIONS = ("~/.ansible/collections", "/usr/share/ansible/collections")


class RolloutError(Exception):
    """The run cannot start (missing playbook, inventory, ansible-runner); the message says why."""


def _collection_root(collections: Path) -> Path:
    return collections.joinpath("ansible_collections", *COLLECTION)


def _is_ansible_dir(root: Path) -> bool:
    return (root / "playbooks").is_dir() and (root / "roles").is_dir()


def ansible_dir() -> Path:
    """The folder holding ansible.cfg, playbooks/ and roles/: the one FLEETOPS_ANSIBLE_DIR names,
    else the collection the installed package carries, else the checkout this file lies in (an
    editable install, where the repository root is the collection)."""
    override = os.environ.get(ANSIBLE_DIR_ENV)
    if override:
        root = Path(override).expanduser()
        if not _is_ansible_dir(root):
            raise RolloutError(
                f"no playbooks/ and roles/ under {root} ({ANSIBLE_DIR_ENV}): name a fleetops checkout "
                "or an installed fleetops.gpu collection"
            )
        return root
    candidates = [_collection_root(PACKAGED_COLLECTIONS), Path(__file__).resolve().parents[2]]
    for root in candidates:
        if _is_ansible_dir(root):
            return root
    raise RolloutError(
        f"no playbooks/ and roles/ in {' or '.join(map(str, candidates))}: reinstall the fleetops wheel "
        f"(it carries them) or set {ANSIBLE_DIR_ENV} to the fleetops checkout"
    )


def collections_dir(root: Path) -> Path:
    """The folder to put on Ansible's collections path so that ``fleetops.gpu.*`` resolves to the
    modules beside ``root``'s roles: the checkout's .collections link, or, for an installed
    collection (root is .../ansible_collections/fleetops/gpu), the folder above ansible_collections."""
    real = root.resolve()
    candidates = [root / ".collections"]
    if len(real.parts) > 3:
        candidates.append(real.parents[2])
    for base in candidates:
        if _collection_root(base).resolve() == real and (real / "plugins" / "modules").is_dir():
            return base
    raise RolloutError(
        f"{root} is neither a fleetops checkout with .collections/ansible_collections/fleetops/gpu nor an "
        "installed fleetops.gpu collection: the roles' fleetops.gpu.* modules would not resolve"
    )


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
    # host -> why: left drained by another owner's drain, not changed, not failed
    held: dict[str, str] = field(default_factory=dict)
    # the drain module's drains and resumes (Progress.slurm), for the history store
    slurm: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.failed_hosts and self.status == "successful"

    def changed_hosts(self) -> list[str]:
        return sorted(r["host"] for r in self.rows if r["changed"] > 0)


def _layered_baselines(inventories: list[str], limit: str | None) -> dict[str, Any] | None:
    """Every host's layered ``fleetops_baseline`` for the run (``ops.baseline.playbook_vars``):
    Ansible replaces a child group's mapping for its parent's, so the roles get fleetops' layering
    through ``fleetops_effective_baseline`` (``playbooks/group_vars/all.yml``) instead. A bad
    inventory or baseline stops the run before it starts, naming the file."""
    from fleetops import baseline as bl
    from fleetops.fleet import inventory
    from fleetops.ops.baseline import playbook_vars

    merged: dict[str, Any] = {"hosts": {}, "baselines": []}
    for source in inventories:
        try:
            hosts = inventory.load(source, limit)
            part = playbook_vars(hosts, source)
        except (inventory.InventoryError, bl.BaselineError) as exc:
            raise RolloutError(str(exc)) from None
        if part is None:
            continue
        offset = len(merged["baselines"])
        merged["baselines"].extend(part["baselines"])
        for name, i in part["hosts"].items():
            merged["hosts"].setdefault(name, i + offset)
    return merged if merged["hosts"] else None


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
    layered_baselines: bool = True,
) -> RunResult:
    """Run ``playbooks/<playbook>`` and return per-host results. ``emit(kind, line)`` gets each
    progress line as it happens."""
    try:
        import ansible_runner
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise RolloutError("ansible-runner is not installed: pip install ansible-runner") from exc

    root = ansible_dir()
    collections = collections_dir(root)
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

    from fleetops.fleet.inventory import BASELINE_VAR

    extravars = dict(extravars or {})
    # an extra variable fleetops_baseline is the caller's baseline for every host, and wins over
    # the inventory's in Ansible too: layering the inventory's levels would override it
    if layered_baselines and PLAYBOOK_VAR not in extravars and BASELINE_VAR not in extravars:
        layered = _layered_baselines(sources, limit)
        if layered is not None:
            extravars[PLAYBOOK_VAR] = layered

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
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(collections), *DEFAULT_COLLECTIONS]),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # The controller-side audit gate runs `fleetops audit` from this environment.
        "PATH": os.pathsep.join(
            dict.fromkeys([os.path.dirname(sys.executable)] + os.environ.get("PATH", "").split(os.pathsep))
        ),
    }
    tracker = Tracker(emit=emit, verbose=verbose, check=check)
    ident = f"{ident_prefix}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    started = time.monotonic()
    kwargs: dict[str, Any] = {
        "private_data_dir": str(data_dir),
        "project_dir": str(root / "playbooks"),
        "playbook": str(book),
        "inventory": sources,
        "extravars": extravars,
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
        held=tracker.held(),
        slurm=list(tracker.slurm),
    )
