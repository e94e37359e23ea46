"""The simulated node as Slurm and the driver describe its GPUs to a job's prolog, in its run
folder (``<state>.agent/``, the node's ``/run/fleetops``; ``statefile.run_dir``):

- ``gres.conf``: slurmd's GPU devices in order, as a site writes it: one ``Name=gpu
  File=<dev>/nvidia<minor>`` per whole GPU, by device minor (``/dev/nvidia[0-7]``), and for a GPU
  in MIG mode one ``MultipleFiles=`` line per MIG device (its GPU's device file and its GPU and
  compute instance's nvidia-caps files), as Slurm lists MIG devices. A job's gres ids (its
  SLURM_JOB_GPUS) index these lines as slurmd orders them (by type: ``slurm.conf`` below).
- ``slurm.conf``: the node's ``Gres=`` (its GPU types in gres.conf's order of first appearance),
  the order slurmd numbers typed devices by: grouped by type, so a job's gres id indexes gres.conf's
  lines in that grouping, not in line order (``gres_devices``' ``gres_id``).
- ``mig-minors``: the driver's ``/proc/driver/nvidia-caps/mig-minors`` table, every GPU minor's
  possible GPU and compute instances with their nvidia-caps minors, in the driver's numbering
  (``gpu0/gi1/access 12``).
- ``cgroup/job_<id>/``: a job's cgroup, with the ``cpu.stat`` (``usage_usec N``) the simulated
  workloads advance, made before the prolog runs, as slurmd does with ``PrologFlags=Contain``.

The device files gres.conf names are the simulated node's (``<state>.dev/nvidia<minor>``, plain
files, no character devices): the agent reads their minors from their names.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from fleetops.sim.gpu.base import SimError
from fleetops.sim.gpu.statefile import device_prefix, read_state, run_dir

GI_SLOTS, CI_SLOTS = 15, 8  # the driver's table: 15 GPU instances a GPU, 8 compute instances each


def gi_access_minor(gpu_minor: int, gi: int) -> int:
    return 3 + (gpu_minor * GI_SLOTS + gi) * (CI_SLOTS + 1)


def ci_access_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_access_minor(gpu_minor, gi) + 1 + ci


def mig_minors_text(gpu_minors: list[int]) -> str:
    lines = ["config 1", "monitor 2"]
    for g in sorted(gpu_minors):
        for gi in range(GI_SLOTS):
            lines.append(f"gpu{g}/gi{gi}/access {gi_access_minor(g, gi)}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {ci_access_minor(g, gi, ci)}" for ci in range(CI_SLOTS)]
    return "\n".join(lines) + "\n"


def gres_devices(state_path: str, state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The node's gres devices in gres.conf order: ``{"gres_id", "index", "minor", "gi", "ci",
    "profile", "files"}`` (gi/ci/profile None for a whole GPU)."""
    state = read_state(state_path) if state is None else state
    prefix = device_prefix(state_path)
    caps = os.path.join(run_dir(state_path), "nvidia-caps", "nvidia-cap")
    out: list[dict[str, Any]] = []
    gpus = sorted(state["gpus"], key=lambda g: int(g.get("minor_number", g["index"])))
    for gpu in gpus:
        minor = int(gpu.get("minor_number", gpu["index"]))
        instances = gpu.get("mig_instances") or [] if gpu.get("mig_mode_current") else []
        if not gpu.get("mig_mode_current"):
            out.append({"gres_id": len(out), "index": gpu["index"], "minor": minor, "gi": None, "ci": None,
                        "profile": None, "files": [f"{prefix}{minor}"]})
            continue
        for inst in sorted(instances, key=lambda m: int(m["gpu_instance_id"])):
            gi, ci = int(inst["gpu_instance_id"]), inst.get("compute_instance_id")
            files = [f"{prefix}{minor}", f"{caps}{gi_access_minor(minor, gi)}"]
            if ci is not None:
                files.append(f"{caps}{ci_access_minor(minor, gi, int(ci))}")
            out.append({"gres_id": len(out), "index": gpu["index"], "minor": minor, "gi": gi, "ci": ci,
                        "profile": inst.get("profile"), "files": files})
    # slurmd numbers the devices grouped by type, in the order of slurm.conf's Gres= (slurm_conf_text:
    # each type where it first appears here), gres.conf's order kept within a type (seen from a real
    # slurmd 22.05): MIG devices of two profiles on one GPU are not numbered in line order
    types = gpu_types(out)
    for gres_id, dev in enumerate(sorted(out, key=lambda d: types.index(d["profile"] or ""))):
        dev["gres_id"] = gres_id
    return out


def gpu_types(devices: list[dict[str, Any]]) -> list[str]:
    """The devices' types (MIG profiles; "" for a whole GPU) in the order they first appear."""
    return list(dict.fromkeys(d["profile"] or "" for d in devices))


def slurm_conf_text(hostname: str, devices: list[dict[str, Any]]) -> str:
    """The node's line of slurm.conf: its GPUs by type, in gres.conf's order of first appearance."""
    counts = [(t, sum(1 for d in devices if (d["profile"] or "") == t)) for t in gpu_types(devices)]
    gres = ",".join(f"gpu:{t}:{n}" if t else f"gpu:{n}" for t, n in counts)
    return ("# the simulated node's slurm.conf (fleetops.sim.gpu.slurm): its line only\nGresTypes=gpu\n"
            f"NodeName={hostname} Gres={gres}\n")


def gres_conf_text(devices: list[dict[str, Any]]) -> str:
    lines = ["# the simulated node's gres.conf (fleetops.sim.gpu.slurm): device files by minor", "AutoDetect=off"]
    for dev in devices:
        if dev["gi"] is None:
            lines.append(f"Name=gpu File={dev['files'][0]}")
        else:
            lines.append(f"Name=gpu Type={dev['profile']} MultipleFiles={','.join(dev['files'])}")
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_slurm_files(state_path: str) -> list[dict[str, Any]]:
    """Write the node's ``gres.conf`` and ``mig-minors`` from its state now (a MIG layout change
    changes gres.conf, as a site regenerates it); returns the gres devices."""
    state = read_state(state_path)
    devices = gres_devices(state_path, state)
    folder = run_dir(state_path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    _write(os.path.join(folder, "gres.conf"), gres_conf_text(devices))
    _write(os.path.join(folder, "slurm.conf"), slurm_conf_text(str(state["hostname"]), devices))
    minors = [int(g.get("minor_number", g["index"])) for g in state["gpus"]]
    _write(os.path.join(folder, "mig-minors"), mig_minors_text(minors))
    return devices


def job_cgroup(state_path: str, job_id: str) -> str:
    """``<state>.agent/cgroup/job_<id>``: the simulated job's cgroup folder."""
    if not str(job_id).isdigit():
        raise SimError(f"job id {job_id!r}: a Slurm job number (digits only)")
    return os.path.join(run_dir(state_path), "cgroup", f"job_{job_id}")


def make_job_cgroup(state_path: str, job_id: str, cpus: int | None = None) -> str:
    """The job's cgroup with ``cpu.stat`` at zero (and its cpuset when ``cpus`` is given)."""
    path = job_cgroup(state_path, job_id)
    os.makedirs(path, exist_ok=True)
    _write(os.path.join(path, "cpu.stat"), "usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
    if cpus:
        _write(os.path.join(path, "cpuset.cpus.effective"), f"0-{cpus - 1}\n" if cpus > 1 else "0\n")
    return path


def remove_job_cgroup(state_path: str, job_id: str) -> None:
    """The job's cgroup goes when its last task ends, as slurmd removes it after the epilog."""
    shutil.rmtree(job_cgroup(state_path, job_id), ignore_errors=True)
