"""The on-node job record: one JSON file per job, ``<dir>/<job_id>.json``.

Written by the Slurm prolog (``fleetops-agent job start``), closed by the epilog (``job end``:
``ended_at``), read by the daemon each tick (``fleetops.agent.serve.jobs``) and by ``job list``.
Pure read and write: a write goes to a temporary file in the same folder and is renamed over
the record, so a reader never sees half a record; every error names the file and the field.

Ended records are kept (the daemon attributes XIDs and samples over its one-hour window) and
pruned once ended more than ``KEEP_ENDED_S`` ago, by ``job start`` and ``job end``.

Job ids: only a plain job number is taken (``1234``). ``1234_7`` is how Slurm *displays* an
array task, whose own SLURM_JOB_ID (what the prolog gets) is a plain number; ``1234.0`` is a
step of job 1234, and the prolog and epilog run once per job, never per step. Either one here
means the caller passed something other than SLURM_JOB_ID: refused, rather than normalised to a
number that may be another job's (the array's first task, or the step's parent while it is
recorded separately). The id is also the file name, so the rule keeps paths inside the folder.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
DEFAULT_DIR = "/run/fleetops/jobs"
DIR_ENV = "FLEETOPS_JOBS_DIR"
KEEP_ENDED_S = 24 * 3600.0
SUFFIX = ".json"
_JOB_ID = re.compile(r"[0-9]{1,20}")


class JobRecordError(Exception):
    """A record that cannot be read or written, or a job id refused; the message names the file
    (or the id) and the field."""


def check_job_id(job_id: str) -> str:
    """The job id as recorded, or ``JobRecordError`` saying why it is refused (module docstring)."""
    text = str(job_id).strip()
    if _JOB_ID.fullmatch(text):
        return text
    if re.fullmatch(r"[0-9]+_[0-9]+", text):
        why = ("an array task's display name (ARRAYJOB_TASK); the prolog's SLURM_JOB_ID of that task is its own "
               "plain job number")
    elif re.fullmatch(r"[0-9]+\.([0-9]+|batch|extern|interactive)", text):
        why = "a job step (JOB.STEP); records are per job: pass the job's number"
    else:
        why = "not a Slurm job number (digits only)"
    raise JobRecordError(f"job id {job_id!r}: {why}")


@dataclass(frozen=True)
class JobGpu:
    """One device of the job: the GPU (``uuid``), and for a MIG instance its MIG device
    (``mig_uuid``); ``index`` (NVML's, informational) and ``minor`` (``/dev/nvidia<minor>``)."""

    uuid: str
    mig_uuid: str | None = None
    index: int | None = None
    minor: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "mig_uuid": self.mig_uuid, "index": self.index, "minor": self.minor}


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    uid: int | None
    user: str | None
    started_at: float
    ended_at: float | None = None
    cgroup: str | None = None
    cpus: int | None = None
    gpus: tuple[JobGpu, ...] = field(default_factory=tuple)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "job_id": self.job_id,
            "uid": self.uid,
            "user": self.user,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "cgroup": self.cgroup,
            "cpus": self.cpus,
            "gpus": [g.to_dict() for g in self.gpus],
            "source": self.source,
        }

    @property
    def devices(self) -> list[str]:
        """The job's devices by UUID: the MIG device's where it has one, else the GPU's."""
        return [g.mig_uuid or g.uuid for g in self.gpus]

    @property
    def owner(self) -> str:
        """``user alice``, else ``uid 1000``, else ``user unknown``: who a refusal names."""
        if self.user:
            return f"user {self.user}"
        return f"uid {self.uid}" if self.uid is not None else "user unknown"


def running_on(records: list[JobRecord], gpu_uuid: str) -> list[JobRecord]:
    """The records of jobs still running on the GPU ``gpu_uuid``, whole or one of its MIG
    instances (a record names the GPU of each MIG device it holds)."""
    return [r for r in records if r.ended_at is None and any(g.uuid == gpu_uuid for g in r.gpus)]


def default_dir(sim_run_dir: str | None = None) -> str:
    """Where the node's job records are: $FLEETOPS_JOBS_DIR, else a simulated node's run folder's
    ``jobs/`` (``sim_run_dir``), else ``/run/fleetops/jobs``."""
    if os.environ.get(DIR_ENV):
        return os.environ[DIR_ENV]
    return os.path.join(sim_run_dir, "jobs") if sim_run_dir else DEFAULT_DIR


def path_for(directory: str, job_id: str) -> str:
    return os.path.join(directory, check_job_id(job_id) + SUFFIX)


# --- reading ------------------------------------------------------------------------------


def _want(path: str, data: dict[str, Any], name: str, kinds: tuple[type, ...], nullable: bool) -> Any:
    if name not in data:
        raise JobRecordError(f"{path}: {name}: missing")
    value = data[name]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        want = " or ".join(k.__name__ for k in kinds) + (" or null" if nullable else "")
        raise JobRecordError(f"{path}: {name}: expected {want}, got {value!r}")
    return value


def from_dict(data: Any, path: str) -> JobRecord:
    """A record from its JSON document; ``path`` names it in errors. Keys beyond the format's are
    ignored (a newer writer's additions); a version other than ours is refused."""
    if not isinstance(data, dict):
        raise JobRecordError(f"{path}: expected a JSON object, got {type(data).__name__}")
    version = _want(path, data, "version", (int,), False)
    if version != VERSION:
        raise JobRecordError(f"{path}: version: expected {VERSION}, got {version!r}")
    job_id = _want(path, data, "job_id", (str,), False)
    try:
        check_job_id(job_id)
    except JobRecordError as exc:
        raise JobRecordError(f"{path}: job_id: {exc}") from None
    uid = _want(path, data, "uid", (int,), True)
    if uid is not None and uid < 0:
        raise JobRecordError(f"{path}: uid: expected a non-negative integer, got {uid!r}")
    cpus = _want(path, data, "cpus", (int,), True)
    if cpus is not None and cpus < 0:
        raise JobRecordError(f"{path}: cpus: expected a non-negative integer, got {cpus!r}")
    started = _want(path, data, "started_at", (int, float), False)
    ended = _want(path, data, "ended_at", (int, float), True)
    raw_gpus = _want(path, data, "gpus", (list,), False)
    gpus = []
    for i, item in enumerate(raw_gpus):
        where = f"{path}: gpus[{i}]"
        if not isinstance(item, dict):
            raise JobRecordError(f"{where}: expected an object, got {item!r}")
        gpus.append(JobGpu(
            uuid=_want(where, item, "uuid", (str,), False),
            mig_uuid=_want(where, item, "mig_uuid", (str,), True),
            index=_want(where, item, "index", (int,), True),
            minor=_want(where, item, "minor", (int,), True),
        ))
    return JobRecord(
        job_id=job_id,
        uid=uid,
        user=_want(path, data, "user", (str,), True),
        started_at=float(started),
        ended_at=None if ended is None else float(ended),
        cgroup=_want(path, data, "cgroup", (str,), True),
        cpus=cpus,
        gpus=tuple(gpus),
        source=_want(path, data, "source", (str,), False),
    )


def read(path: str) -> JobRecord:
    """The record in ``path``; ``JobRecordError`` naming the file (and field) when it cannot be
    read, is not JSON, or is not a record of the job its name says."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise JobRecordError(f"{path}: no such job record") from None
    except OSError as exc:
        raise JobRecordError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise JobRecordError(f"{path}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise JobRecordError(f"{path}: not JSON ({exc})") from None
    record = from_dict(data, path)
    name = os.path.basename(path)
    if name != record.job_id + SUFFIX:
        raise JobRecordError(f"{path}: job_id: {record.job_id!r} does not match the file's name {name!r}")
    return record


def record_files(directory: str) -> list[str]:
    """The record files' names in ``directory`` (``<job_id>.json``), sorted; none when it does
    not exist (no job started since boot). Temporary files of a write in progress are skipped."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise JobRecordError(f"{directory}: cannot list job records: {exc.strerror or exc}") from None
    return sorted(n for n in names if n.endswith(SUFFIX) and _JOB_ID.fullmatch(n[: -len(SUFFIX)]))


def read_all(directory: str) -> tuple[list[JobRecord], list[str]]:
    """(every record that reads, the errors of those that do not), by job id."""
    records, errors = [], []
    for name in record_files(directory):
        try:
            records.append(read(os.path.join(directory, name)))
        except JobRecordError as exc:
            if "no such job record" not in str(exc):  # pruned between the listing and the read
                errors.append(str(exc))
    records.sort(key=lambda r: int(r.job_id))
    return records, errors


# --- writing ------------------------------------------------------------------------------


def write(directory: str, record: JobRecord) -> str:
    """Write ``record`` atomically (temporary file in the folder, fsync, rename); returns its path.
    The folder is made (0755) when missing."""
    path = path_for(directory, record.job_id)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise JobRecordError(f"{directory}: cannot make the job record folder: {exc.strerror or exc}") from None
    text = json.dumps(record.to_dict(), indent=1) + "\n"
    fd, tmp = -1, ""
    try:
        import tempfile  # writers only (the prolog): the daemon reads records, and tempfile brings random

        fd, tmp = tempfile.mkstemp(prefix=f".{record.job_id}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fd = -1
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = ""
    except OSError as exc:
        raise JobRecordError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def end(directory: str, job_id: str, at: float | None = None) -> JobRecord:
    """Set the record's ``ended_at`` (kept when already set: an epilog run twice does not move
    it); returns the record as written."""
    path = path_for(directory, job_id)
    record = read(path)
    if record.ended_at is not None:
        return record
    import dataclasses

    done = dataclasses.replace(record, ended_at=time.time() if at is None else float(at))
    write(directory, done)
    return done


def prune(directory: str, now: float | None = None, keep_s: float = KEEP_ENDED_S) -> list[str]:
    """Remove the records of jobs that ended more than ``keep_s`` ago; returns their ids. A
    record that does not read is left for an operator to look at (``job list`` names it)."""
    now = time.time() if now is None else now
    removed = []
    for name in record_files(directory):
        path = os.path.join(directory, name)
        try:
            # a record is rewritten when it ends: one changed within keep_s cannot have ended
            # before that, so only old files are read (a prolog's prune stays a listing and stats)
            if now - os.stat(path).st_mtime <= keep_s:
                continue
            record = read(path)
        except (OSError, JobRecordError):
            continue
        if record.ended_at is not None and now - record.ended_at > keep_s:
            try:
                os.unlink(path)
                removed.append(record.job_id)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise JobRecordError(f"{path}: cannot remove: {exc.strerror or exc}") from None
    return removed
