"""A Slurm job's cgroup and its CPU time: where slurmd's cgroup plugin puts a job, under cgroup
v2 (``system.slice/slurmstepd.scope/job_<id>``) or v1 (``cpu,cpuacct/slurm/uid_<uid>/job_<id>``),
and the CPU time the job's tasks used, in microseconds, read exactly (integers)."""

from __future__ import annotations

import glob
import os

DEFAULT_ROOT = "/sys/fs/cgroup"


def candidates(root: str, job_id: str, uid: int | None) -> list[str]:
    out = [
        os.path.join(root, "system.slice", "slurmstepd.scope", f"job_{job_id}"),
        *sorted(glob.glob(os.path.join(glob.escape(root), "system.slice", "*_slurmstepd.scope", f"job_{job_id}"))),
        os.path.join(root, f"job_{job_id}"),  # a cgroup root of its own (a simulated node's)
    ]
    if uid is not None:
        for controller in ("cpu,cpuacct", "cpuacct"):
            out.append(os.path.join(root, controller, "slurm", f"uid_{uid}", f"job_{job_id}"))
    return out


def find(root: str, job_id: str, uid: int | None) -> str | None:
    """The job's cgroup folder, or None when there is none (no cgroup plugin, or the job's not made yet)."""
    return next((p for p in candidates(root, job_id, uid) if os.path.isdir(p)), None)


def cpu_usage_usec(path: str) -> int | None:
    """CPU time of the cgroup in µs: v2 ``cpu.stat``'s ``usage_usec``; v1 ``cpuacct.usage`` (ns).
    None when neither reads (the cgroup is gone: the job ended)."""
    try:
        with open(os.path.join(path, "cpu.stat"), encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(path, "cpuacct.usage"), encoding="ascii") as fh:
            return int(fh.read().strip()) // 1000
    except (OSError, ValueError):
        return None


def cpu_count(path: str) -> int | None:
    """CPUs in the cgroup's effective cpuset (v2 ``cpuset.cpus.effective``, list form), or None."""
    try:
        with open(os.path.join(path, "cpuset.cpus.effective"), encoding="ascii") as fh:
            text = fh.read().strip()
    except OSError:
        return None
    total = 0
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            total += int(hi or lo) - int(lo) + 1
    except ValueError:
        return None
    return total or None
