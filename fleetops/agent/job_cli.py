"""``fleetops-agent job start|end|list``: the node's job records (``fleetops.jobs.record``).

``start`` is what the Slurm prolog runs (the collection's ``fleetops-prolog.sh``): it reads the
job from slurmd's environment (SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_USER, SLURM_JOB_GPUS;
CUDA_VISIBLE_DEVICES only when SLURM_JOB_GPUS is unset, and ``source`` says so; SLURMD_NODENAME,
the node's Slurm name, for gres.conf's NodeName= lines; SLURM_JOB_CPUS_PER_NODE for its CPUs),
flags overriding each, resolves the GPUs by device minor (``fleetops.jobs.resolve``), finds the job's
cgroup, and writes the record atomically. Anything that cannot be resolved is exit 1 with one
JSON error line naming the id and why, and nothing is written. Whether that fails the prolog is
the prolog script's decision (it does not, by default: a failed prolog drains the node).

``end`` (the epilog) sets ``ended_at``; both prune records ended more than 24 h ago. ``list``
prints every record, and in ``cgroup_gone`` the open ones whose cgroup slurmd has removed (jobs
that may have ended without their epilog); a record that does not read is named on stderr and
makes the exit 1.

``show JOBID`` is what ``fleetops job`` asks every node (``job_show.py``): one JSON document
(``fleetops.job-show/v1``) with the record and, from the resident daemon, the job's GPUs' samples
over its life, their static facts, the XIDs on them during the job and the cgroup's CPU time.
A job this node never ran is a quiet answer, not an error: ``fleetops.job-absent/v1`` on stdout,
exit 3 (EXIT_ABSENT), nothing on stderr.

Paths: records in ``--jobs-dir``, else $FLEETOPS_JOBS_DIR, else ``/run/fleetops/jobs``; gres.conf
in ``--gres-conf``, else $FLEETOPS_GRES_CONF, else ``/etc/slurm/gres.conf``; the MIG minors in
``--mig-minors``, else ``/proc/driver/nvidia-caps/mig-minors``; cgroups under ``--cgroup-root``,
else ``/sys/fs/cgroup``. On a simulated node (``--backend sim`` or auto with its state) each
default is the node's own, in its run folder ``<state>.agent/`` (the simulated ``/run/fleetops``,
where its daemon keeps its socket): ``jobs/``, ``gres.conf``, ``mig-minors``, ``cgroup/``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_ABSENT = 3  # show: no record of the job on this node (a quiet answer: the job ran elsewhere)
SNAPSHOT_MAX_AGE_S = 30.0


class JobCliError(Exception):
    def __init__(self, kind: str, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code


def add_parser(sub: Any, common: Any) -> None:
    about = "job records for attribution: start (the Slurm prolog), end (the epilog), list"
    p = sub.add_parser("job", help=about, description=about)
    jsub = p.add_subparsers(dest="job_command", required=True, parser_class=type(p))

    def paths(q: Any) -> None:
        common(q)
        q.add_argument("--jobs-dir", help="the job records' folder (default $FLEETOPS_JOBS_DIR, else "
                       "/run/fleetops/jobs; sim: <state>.agent/jobs)")

    q = jsub.add_parser("start", help="record a job's GPUs and cgroup (the prolog)")
    paths(q)
    q.add_argument("--job-id", help="default $SLURM_JOB_ID (a plain job number; steps and ARRAY_TASK refused)")
    q.add_argument("--uid", help="default $SLURM_JOB_UID")
    q.add_argument("--user", help="default $SLURM_JOB_USER")
    q.add_argument("--gpus", help="gres ids (0,3) or UUIDs; default $SLURM_JOB_GPUS, else $CUDA_VISIBLE_DEVICES")
    q.add_argument("--cpus", type=int, help="CPUs of the job on this node (default $SLURM_CPUS_ON_NODE, else "
                   "$SLURM_JOB_CPUS_PER_NODE when every node's count is the same, else the cgroup's cpuset)")
    q.add_argument("--gres-conf", help="Slurm's gres.conf (default $FLEETOPS_GRES_CONF, else /etc/slurm/gres.conf)")
    q.add_argument("--slurm-conf", help="slurm.conf, whose node Gres= type order slurmd numbers typed gres.conf "
                   "devices by (default $SLURM_CONF, which slurmd sets, else /etc/slurm/slurm.conf)")
    q.add_argument("--mig-minors", help="the driver's MIG minors (default /proc/driver/nvidia-caps/mig-minors)")
    q.add_argument("--cgroup-root", help="where to find the job's cgroup (default /sys/fs/cgroup)")
    q.add_argument("--node-name", help="this node's name for gres.conf NodeName= lines (default $SLURMD_NODENAME, "
                   "else the hostname)")
    q.add_argument("--socket", help="the daemon's socket, asked for the snapshot first (default: by the backend)")

    q = jsub.add_parser("end", help="mark a job ended (the epilog)")
    paths(q)
    q.add_argument("--job-id", help="default $SLURM_JOB_ID")

    q = jsub.add_parser("list", help="print the job records as JSON")
    paths(q)

    q = jsub.add_parser("show", help="one job's record, its GPUs' samples, facts and XIDs and its CPU, from the "
                        "daemon (what fleetops job asks); exit 3 when the node has no record of it")
    paths(q)
    q.add_argument("job_id", metavar="JOBID", help="the Slurm job number")
    q.add_argument("--socket", help="the daemon's socket (default: by the backend)")


def _sim_run_dir(args: Any) -> str | None:
    from fleetops.agent.serve import client

    state = args.state or os.environ.get("FLEETOPS_SIM_STATE")
    if not state or not client.simulated(args.backend, state):
        return None
    # the simulated node's run folder holds its daemon's socket (sim.run_dir; not imported here: the
    # simulator's package costs more than this whole command)
    return os.path.dirname(client.socket_for(args.backend, state, None))


def _jobs_dir(args: Any, sim_dir: str | None) -> str:
    from fleetops.jobs import record

    return str(args.jobs_dir) if args.jobs_dir else record.default_dir(sim_dir)


def _env(flag: Any, name: str) -> str | None:
    if flag is not None:
        return str(flag)
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def _job_id(args: Any) -> str:
    from fleetops.jobs.record import JobRecordError, check_job_id

    text = _env(args.job_id, "SLURM_JOB_ID")
    if text is None:
        raise JobCliError("usage", "no job id: pass --job-id or set SLURM_JOB_ID", EXIT_USAGE)
    try:
        return check_job_id(text)
    except JobRecordError as exc:
        raise JobCliError("usage", str(exc), EXIT_USAGE) from None


def _snapshot(args: Any, fresh: bool) -> Any:
    """The node's snapshot: the daemon's when it answers with one at most 30 s old (cheap),
    else a cold collect; ``fresh`` always collects (the daemon's may predate a MIG change)."""
    from fleetops import model
    from fleetops.agent.collect import collect
    from fleetops.agent.serve import client

    if not fresh:
        served = client.fetch_snapshot(client.socket_for(args.backend, args.state, args.socket), SNAPSHOT_MAX_AGE_S)
        if served is not None:
            return model.node_from_json(served)
    return collect(args.backend, args.state)


def _resolve(args: Any, ids_text: str, from_env: str, sim_dir: str | None, fresh: bool) -> tuple[list[Any], str]:
    from fleetops.jobs import gres, resolve

    ids = resolve.parse_ids(ids_text, from_env)
    node = _snapshot(args, fresh)
    if not all(i.isdigit() for i in ids):
        return resolve.resolve_uuids(ids, node.gpus), f"UUIDs from {from_env}"
    conf_path = (args.gres_conf or os.environ.get(gres.GRES_CONF_ENV)
                 or (os.path.join(sim_dir, "gres.conf") if sim_dir else gres.DEFAULT_GRES_CONF))
    minors_path = args.mig_minors or (os.path.join(sim_dir, "mig-minors") if sim_dir else gres.DEFAULT_MIG_MINORS)
    name = args.node_name or os.environ.get("SLURMD_NODENAME") or node.hostname
    conf = gres.parse(conf_path, name)
    slurm_conf = (args.slurm_conf or os.environ.get("SLURM_CONF")
                  or (os.path.join(sim_dir, "slurm.conf") if sim_dir else gres.DEFAULT_SLURM_CONF))
    types = gres.node_gpu_types(slurm_conf, name)
    ordered = gres.in_slurmd_order(conf, types)
    gpus, how = resolve.resolve_gres(ids, ordered, node.gpus, lambda: gres.parse_mig_minors(minors_path))
    if ordered is not conf:
        how += f"; grouped by type in {slurm_conf}'s Gres= order ({', '.join(t or 'untyped' for t in types or [])})"
    return gpus, f"{from_env}={ids_text}: {how}"


def env_cpus(environ: Any) -> int | None:
    """The job's CPUs on this node from slurmd's environment: SLURM_CPUS_ON_NODE where it is set
    (a job step's; a real slurmd 22.05 does not give it to the prolog), else
    SLURM_JOB_CPUS_PER_NODE (what the prolog gets: the job's counts per node, ``8``, ``8(x2)`` or
    ``8(x2),4``) when every node has the same count; None when that does not say (this node's
    count among different ones: the cgroup's cpuset tells then)."""
    text = (environ.get("SLURM_CPUS_ON_NODE") or "").strip()
    if text.isdigit():
        return int(text)
    counts = set()
    for part in filter(None, (environ.get("SLURM_JOB_CPUS_PER_NODE") or "").split(",")):
        count, _, repeat = part.strip().partition("(")
        if not count.isdigit() or (repeat and not re.fullmatch(r"x[0-9]+\)", repeat)):
            return None
        counts.add(int(count))
    return counts.pop() if len(counts) == 1 else None


def start(args: Any) -> dict[str, Any]:
    from fleetops.jobs import cgroup, record, resolve

    job_id = _job_id(args)
    uid_text = _env(args.uid, "SLURM_JOB_UID")
    try:
        uid = int(uid_text) if uid_text is not None else None
    except ValueError:
        raise JobCliError("usage", f"uid {uid_text!r} (--uid or SLURM_JOB_UID): expected a number", EXIT_USAGE) from None
    user = _env(args.user, "SLURM_JOB_USER")
    sim_dir = _sim_run_dir(args)
    if args.gpus is not None:
        ids_text, from_env = str(args.gpus), "--gpus"
    elif os.environ.get("SLURM_JOB_GPUS"):
        ids_text, from_env = os.environ["SLURM_JOB_GPUS"], "SLURM_JOB_GPUS"
    elif os.environ.get("CUDA_VISIBLE_DEVICES"):
        ids_text, from_env = os.environ["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES (fallback: SLURM_JOB_GPUS unset)"
    else:
        ids_text, from_env = "", ""
    gpus: list[Any] = []
    source = "no GPUs: SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES unset"
    if ids_text.strip():
        try:
            try:
                gpus, source = _resolve(args, ids_text, from_env, sim_dir, fresh=False)
            except resolve.ResolveError:  # the daemon's snapshot may predate a change: once more, cold
                gpus, source = _resolve(args, ids_text, from_env, sim_dir, fresh=True)
        except resolve.ResolveError as exc:
            raise JobCliError("unresolved", f"job {job_id}: {exc}") from None
    root = args.cgroup_root or (os.path.join(sim_dir, "cgroup") if sim_dir else cgroup.DEFAULT_ROOT)
    found = cgroup.find(root, job_id, uid)
    cpus = args.cpus if args.cpus is not None else env_cpus(os.environ)
    if cpus is None and found is not None:
        cpus = cgroup.cpu_count(found)
    rec = record.JobRecord(job_id=job_id, uid=uid, user=user, started_at=time.time(), ended_at=None, cgroup=found,
                           cpus=cpus, gpus=tuple(gpus), source=source)
    directory = _jobs_dir(args, sim_dir)
    record.prune(directory)
    path = record.write(directory, rec)
    return {"kind": "fleetops.job/v1", "path": path, "job": rec.to_dict()}


def end(args: Any) -> dict[str, Any]:
    from fleetops.jobs import record

    job_id = _job_id(args)
    directory = _jobs_dir(args, _sim_run_dir(args))
    done = record.end(directory, job_id)
    record.prune(directory)
    return {"kind": "fleetops.job/v1", "path": record.path_for(directory, job_id), "job": done.to_dict()}


def run(args: Any) -> int:
    from fleetops.jobs import gres, record

    try:
        if args.job_command == "start":
            doc = start(args)
        elif args.job_command == "end":
            doc = end(args)
        elif args.job_command == "show":
            from fleetops.agent import job_show

            doc = job_show.show(args, _jobs_dir(args, _sim_run_dir(args)), _job_id(args))
            _emit(doc, args.pretty)
            return EXIT_OK if doc["kind"] == job_show.KIND else EXIT_ABSENT
        else:
            directory = _jobs_dir(args, _sim_run_dir(args))
            records, errors = record.read_all(directory)
            # open records whose cgroup slurmd has removed: jobs that may have ended without their
            # epilog (ask Slurm, then `job end --job-id N`); a reset of their GPUs still refuses
            gone = [r.job_id for r in records if r.ended_at is None and r.cgroup and not os.path.isdir(r.cgroup)]
            doc = {"kind": "fleetops.jobs/v1", "dir": directory, "jobs": [r.to_dict() for r in records],
                   "errors": errors, "cgroup_gone": gone}
            _emit(doc, args.pretty)
            if errors:
                return _fail("job-record", "; ".join(errors), EXIT_FAIL)
            return EXIT_OK
    except JobCliError as exc:
        return _fail(exc.kind, str(exc), exc.code)
    except (record.JobRecordError, gres.GresError) as exc:
        return _fail("job-record" if isinstance(exc, record.JobRecordError) else "gres", str(exc), EXIT_FAIL)
    _emit(doc, args.pretty)
    return EXIT_OK


def _emit(doc: dict[str, Any], pretty: bool) -> None:
    sys.stdout.write(json.dumps(doc, indent=2 if pretty else None) + "\n")


def _fail(kind: str, message: str, code: int) -> int:
    sys.stderr.write(json.dumps({"error": message, "kind": kind}) + "\n")
    return code
