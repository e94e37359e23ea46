"""MIG instances as the daemon serves them: per GPU in MIG mode, its instances and the
processes in each, in one small mapping.

It is its own key of the served document (``mig``) rather than only the snapshot's GPUs: a
``watch`` line carries the top-level keys that changed, and the GPUs change with every sample,
while instances change when someone creates or destroys one, or a job starts in one. A watcher
(the TUI, an operator's script) sees an instance change in one short line, and none otherwise.

Stdlib only: the daemon imports this on its cold path. In the GPU access layer because both
access kinds' light reads build it (``NvmlAccess``, ``SimAccess``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _in(proc: Mapping[str, Any], inst: Mapping[str, Any]) -> bool:
    gi, ci = proc.get("gpu_instance_id"), proc.get("compute_instance_id")
    if gi is None or gi != inst.get("gpu_instance_id"):
        return False
    want = inst.get("compute_instance_id")
    return ci is None or want is None or ci == want


def gpu_table(gpu: Mapping[str, Any]) -> dict[str, Any] | None:
    """One GPU's entry, from its snapshot form (``model.to_dict`` of a ``Gpu``, or the simulator's
    snapshot, which share one shape); None for a GPU that is not in MIG mode and has no instance
    (a GPU whose mode is only pending has none yet: it shows up once the mode is current)."""
    instances = gpu.get("mig_instances") or []
    if not gpu.get("mig_mode_current") and not instances:
        return None
    procs = [p for p in gpu.get("processes") or [] if isinstance(p, Mapping)]
    placed: set[int] = set()
    rows = []
    for inst in instances:
        pids = []
        for i, p in enumerate(procs):
            if i not in placed and _in(p, inst):
                placed.add(i)
                pids.append(int(p["pid"]))
        rows.append({
            "gi": inst.get("gpu_instance_id"),
            "ci": inst.get("compute_instance_id"),
            "profile": inst.get("profile"),
            "uuid": inst.get("uuid"),
            # NVML's per-instance process list (in_use) can see a process the parent GPU's list
            # does not attribute to an instance (no permission for other users' processes)
            "in_use": bool(inst.get("in_use")) or bool(pids),
            "pids": pids,
        })
    return {
        "mode": gpu.get("mig_mode_current"),
        "pending": gpu.get("mig_mode_pending"),
        "instances": rows,
        # processes the driver did not place in any instance listed (none, on a healthy GPU)
        "other_pids": [int(p["pid"]) for i, p in enumerate(procs) if i not in placed],
    }


def table(gpus: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """GPU UUID -> its entry (``gpu_table``), for the GPUs in MIG mode only."""
    out: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        entry = gpu_table(gpu)
        if entry is not None:
            out[str(gpu["uuid"])] = entry
    return out
