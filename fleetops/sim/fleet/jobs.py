"""``fleetops sim job start|stop``: a Slurm job on a simulated node, started and ended the way
slurmd does it: the job's cgroup made first (as with ``PrologFlags=Contain``), then the SAME
prolog and epilog scripts the collection ships (``roles/fleetops_jobs/files``) run on the node
over SSH, with the environment a real slurmd 22.05 gives them (``slurm_env``: SLURM_JOB_ID,
SLURM_JOB_UID, SLURM_JOB_USER, SLURMD_NODENAME, SLURM_SCRIPT_CONTEXT, and to the epilog as to the
prolog the job's SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES; checked against a real slurmd by
tests/ansible/test_jobs_slurmd_realistic.py), and the cgroup removed after the epilog. The node's ``gres.conf`` and ``mig-minors`` are written from its state first
(``sim.write_slurm_files``), as a site keeps gres.conf in step with its MIG layout.

The prolog exits 0 whatever the agent answered (a failed attribution must not drain a node), so
success is judged here as an operator would: the job's record exists (start) or is ended (stop);
otherwise the prolog's stderr says why, and the command fails with it.

``--profile`` also runs a simulated workload (``sim.set_job_workload``: steady, input-bound,
straggler, nvlink-unused, cpu-starved) on the job's GPUs once its record exists, with the record's
cgroup and CPUs, so the fleet's daemon samples the pathology (its GPUs' rings, the cgroup's
``cpu.stat``) as it would a real job's; ``stop`` ends the workload before the epilog runs (the
job's processes are gone when slurmd runs it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fleetops.jobs import record
from fleetops.sim import gpu as sim
from fleetops.sim.fleet.base import SimFleetError
from fleetops.sim.fleet.record import read_fleet, resolve_node

SCRIPTS = ("roles", "fleetops_jobs", "files")
ANSIBLE_DIR_ENV = "FLEETOPS_ANSIBLE_DIR"
SSH_TIMEOUT_S = 30.0


def script(name: str) -> str:
    """The shipped script ``name``: in $FLEETOPS_ANSIBLE_DIR, the collection the wheel carries, or
    this checkout (the repository root is the collection)."""
    package = Path(__file__).resolve().parents[2]
    roots = [Path(os.environ[ANSIBLE_DIR_ENV])] if os.environ.get(ANSIBLE_DIR_ENV) else []
    roots += [package / "collections" / "ansible_collections" / "fleetops" / "gpu", package.parent]
    for root in roots:
        path = root.joinpath(*SCRIPTS, name)
        if path.is_file():
            return str(path)
    raise SimFleetError(f"{name}: not found under {', '.join(str(r.joinpath(*SCRIPTS)) for r in roots)}")


def _host(fleet: dict[str, Any], name: str) -> Any:
    from fleetops.fleet.inventory import Host

    node = fleet["nodes"][name]
    return Host(name=name, address=node["address"], port=int(node["port"]), user="root",
                key_file=fleet["client_key"])


def _run(fleet: dict[str, Any], name: str, path: str, env: dict[str, str]) -> Any:
    from fleetops.fleet.transport.oneshot import run_all

    host = _host(fleet, name)
    result = run_all([host], ["/bin/sh", path], known_hosts=fleet["known_hosts"], env=env,
                     command_timeout=SSH_TIMEOUT_S, global_known_hosts="")[name]
    if result.exit_status is None:
        raise SimFleetError(f"{name}: {os.path.basename(path)} did not run: {result.error or result.error_kind}")
    return result


# The lists of the job's GPU ids slurmd 22.05 sets for its prolog and epilog, alike (seen from a
# real slurmd: each the gres ids, CUDA_VISIBLE_DEVICES too, where no device cgroup renumbers them).
GPU_LISTS = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES",
             "ZE_AFFINITY_MASK")


def slurm_env(job_id: str, uid: int, user: str, gpus: str, context: str, state: str, node: str,
              cpus: int | None = None) -> dict[str, str]:
    """The environment slurmd gives a job's prolog (``context`` prolog_slurmd) or epilog
    (epilog_slurmd), as a real slurmd 22.05 gives it: the job's ids and user, this node's Slurm
    name (SLURMD_NODENAME), its CPUs (SLURM_JOB_CPUS_PER_NODE, when known), and in BOTH scripts
    the job's gres ids (``gpus``) in SLURM_JOB_GPUS and the visible-devices lists. slurmd's own
    environment is not passed on (not even PATH): this is all a script gets from it, plus the
    simulator's two settings below. The user's group is taken to be its uid, as for the
    simulator's users."""
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_UID": str(uid), "SLURM_UID": str(uid),
           "SLURM_JOB_GID": str(uid), "SLURM_JOB_USER": user, "SLURM_SCRIPT_CONTEXT": context,
           "SLURM_JOB_PARTITION": "gpu", "SLURMD_NODENAME": node, "SLURM_NODELIST": node,
           "SLURM_JOB_NUM_NODES": "1", "SLURM_CONF": os.path.join(sim.run_dir(state), "slurm.conf"),
           # the node's own settings file, none by default (a real node's is /etc/fleetops/jobs.env)
           "FLEETOPS_JOBS_ENV": os.path.join(sim.run_dir(state), "jobs.env"),
           # the simulated node has no syslog of its own: a failure is on the prolog's stderr only
           "FLEETOPS_JOBS_SYSLOG": "0"}
    if cpus:
        env["SLURM_JOB_CPUS_PER_NODE"] = str(cpus)
    if gpus:
        env.update(dict.fromkeys(GPU_LISTS, gpus))
    if context == "epilog_slurmd":  # the job ended well (the simulator's jobs do)
        env.update({"SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_DERIVED_EC": "0"})
    return env


def _spool(state: str, job_id: str) -> str:
    """What slurmd keeps of a running job for its epilog (the job's credential, in its spool):
    here the gres ids and CPUs the prolog was given, so the epilog gets the same lists."""
    return os.path.join(sim.run_dir(state), "slurmd", f"job_{job_id}.json")


def _keep(state: str, job_id: str, gpus: str, cpus: int | None) -> None:
    path = _spool(state, job_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"gpus": gpus, "cpus": cpus}, fh)


def _kept(state: str, job_id: str) -> tuple[str, int | None]:
    """(gres ids, CPUs) the job's prolog was given; ("", None) for a job started before the
    simulator kept them."""
    try:
        with open(_spool(state, job_id), encoding="utf-8") as fh:
            doc = json.load(fh)
        return str(doc.get("gpus") or ""), doc.get("cpus")
    except (OSError, ValueError):
        return "", None


def _forget(state: str, job_id: str) -> None:
    try:
        os.unlink(_spool(state, job_id))
    except FileNotFoundError:
        pass


def _mig_ids(devices: list[dict[str, Any]], specs: list[str]) -> list[int]:
    """``INDEX:GI`` (the GPU's NVML index, its GPU instance id) -> that MIG device's gres id."""
    out = []
    for spec in specs:
        index, sep, gi = spec.partition(":")
        if not sep or not index.isdigit() or not gi.isdigit():
            raise SimFleetError(f"--mig {spec!r}: expected INDEX:GI (a GPU's index and a GPU instance id)")
        found = [d for d in devices if d["index"] == int(index) and d["gi"] == int(gi)]
        if not found:
            have = ", ".join(f"{d['index']}:{d['gi']}" for d in devices if d["gi"] is not None) or "none"
            raise SimFleetError(f"--mig {spec}: no MIG device in GPU instance {gi} of GPU {index} (MIG devices: {have})")
        out.append(int(found[0]["gres_id"]))
    return out


DEFAULT_PROFILE_CPUS = 16  # a profiled job's CPUs when --cpus is not given (the workload's default)


def start(directory: str, node: str | int, job_id: str, gpus: str | None = None, user: str = "alice",
          uid: int = 1000, mig: list[str] | None = None, cpus: int | None = None,
          profile: str | None = None, seed: int | None = None, straggler_elsewhere: bool = False) -> dict[str, Any]:
    """Start job ``job_id`` on ``node`` with gres ids ``gpus`` (``0,3``: SLURM_JOB_GPUS, which
    index the node's gres.conf) and/or MIG devices ``mig`` (``INDEX:GI``); returns its record.
    ``profile`` (with ``seed``, default fixed by the job id) runs that simulated workload on the
    job's GPUs; without ``cpus`` the job then gets DEFAULT_PROFILE_CPUS, in its cgroup's cpuset
    and its record, so the record's CPUs and the workload's are the same number.
    ``straggler_elsewhere`` (a ``straggler`` job on several nodes): the slow GPU is on another
    node, and every GPU of the job here waits for it; the node that has it is started without."""
    if profile is not None and profile not in sim.PROFILES:
        raise SimFleetError(f"--profile {profile!r}: known profiles: {', '.join(sim.PROFILES)}")
    if straggler_elsewhere and profile != "straggler":
        raise SimFleetError("--straggler-elsewhere places a straggler job's slow GPU on another node: give "
                            "--profile straggler")
    if seed is not None and profile is None:
        raise SimFleetError("--seed seeds a workload: give --profile too")
    if profile is not None and cpus is None:
        cpus = DEFAULT_PROFILE_CPUS
    fleet, name, state, job_id = _node_and_job(directory, node, job_id)
    devices = sim.write_slurm_files(state)
    ids = [p.strip() for p in (gpus or "").split(",") if p.strip()]
    ids += [str(i) for i in _mig_ids(devices, mig or [])]
    sim.make_job_cgroup(state, job_id, cpus)
    _keep(state, job_id, ",".join(ids), cpus)
    env = slurm_env(job_id, uid, user, ",".join(ids), "prolog_slurmd", state, name, cpus)
    result = _run(fleet, name, script("fleetops-prolog.sh"), env)
    path = record.path_for(os.path.join(sim.run_dir(state), "jobs"), job_id)
    try:
        rec = record.read(path)
    except record.JobRecordError as exc:
        sim.remove_job_cgroup(state, job_id)
        _forget(state, job_id)
        raise SimFleetError(f"{name}: job {job_id}: the prolog recorded nothing (exit {result.exit_status}): "
                            f"{result.stderr.strip() or exc}") from None
    if rec.ended_at is not None:  # an old record of this number, not overwritten: the start failed
        raise SimFleetError(f"{name}: job {job_id}: the prolog left the ended record in place: {result.stderr.strip()}")
    if profile is not None:
        with sim.locked_state(state) as st:
            sim.set_job_workload(st, [g.uuid for g in rec.gpus], profile, job_id, time.time(), seed=seed,
                                 cpus=rec.cpus or cpus, cgroup=rec.cgroup,
                                 straggler="elsewhere" if straggler_elsewhere else None)
    return {"node": name, "path": path, "job": rec.to_dict(), "prolog_stderr": result.stderr, "profile": profile}


def _node_and_job(directory: str, node: str | int, job_id: str) -> tuple[dict[str, Any], str, str, str]:
    """(the fleet record, the node's name, its state file, the job id as recorded), or
    SimFleetError naming what is refused."""
    fleet = read_fleet(directory)
    assert fleet is not None
    name = resolve_node(fleet, node)
    try:
        return fleet, name, fleet["nodes"][name]["state"], record.check_job_id(job_id)
    except record.JobRecordError as exc:
        raise SimFleetError(str(exc)) from None


def stop(directory: str, node: str | int, job_id: str, user: str = "alice", uid: int = 1000) -> dict[str, Any]:
    """End job ``job_id`` on ``node``: the epilog over SSH, then its cgroup removed."""
    fleet, name, state, job_id = _node_and_job(directory, node, job_id)
    with sim.locked_state(state) as st:  # the job's processes end before slurmd runs the epilog
        now = time.time()
        for g in sim.job_gpus(st, job_id):
            sim.set_workload(st, g["uuid"], None, None, now)
    gpus, cpus = _kept(state, job_id)
    env = slurm_env(job_id, uid, user, gpus, "epilog_slurmd", state, name, cpus)
    result = _run(fleet, name, script("fleetops-epilog.sh"), env)
    sim.remove_job_cgroup(state, job_id)
    _forget(state, job_id)
    path = record.path_for(os.path.join(sim.run_dir(state), "jobs"), job_id)
    try:
        rec = record.read(path)
    except record.JobRecordError as exc:
        raise SimFleetError(f"{name}: job {job_id}: {exc} ({result.stderr.strip()})") from None
    if rec.ended_at is None:
        raise SimFleetError(f"{name}: job {job_id}: the epilog did not end the record: {result.stderr.strip()}")
    return {"node": name, "path": path, "job": rec.to_dict(), "epilog_stderr": result.stderr}


def main(args: Any) -> int:
    """``fleetops sim job``'s front end (its options are cli.py's)."""
    if args.job_command == "start":
        doc = start(args.dir, args.node, args.job_id, args.gpus, args.user, args.uid, args.mig, args.cpus,
                    args.profile, args.seed, args.straggler_elsewhere)
    else:
        doc = stop(args.dir, args.node, args.job_id, args.user, args.uid)
    print(json.dumps(doc["job"], indent=2))
    return 0

