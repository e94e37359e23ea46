"""The cold snapshot of ``fleetops-agent collect`` (and ``check``): the backend this node
answers with (``choose_backend``), and its ``GpuAccess.snapshot``, which builds the node around its
GPUs (host facts, kernel-log XIDs, the reset journal) alike for NVML and the simulator.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from fleetops.gpu.node import SnapshotError

if TYPE_CHECKING:
    from fleetops import model
    from fleetops.gpu.backend import GpuAccess

BACKENDS = ("auto", "nvml", "sim")
SIM_STATE_ENV = "FLEETOPS_SIM_STATE"  # = gpu.sim.STATE_ENV, kept here so the NVML path never imports sim


# One class with the GPU layer's: a snapshot that cannot be built (``GpuAccess.snapshot``) is the
# same failure to every agent command as a backend this node refuses.
CollectError = SnapshotError


def choose_backend(requested: str) -> str:
    """``nvml`` or ``sim``, decided by ``backend_choice.choose`` (``auto`` is never the simulator
    on a node with an NVIDIA driver; ``sim`` there needs ``--sim-on-gpu-node``)."""
    from fleetops.gpu import backend_choice

    try:
        return backend_choice.choose(requested)
    except (ValueError, backend_choice.BackendRefused) as exc:
        raise CollectError(str(exc)) from exc


def sim_state_path(state_path: str | None) -> str:
    """The simulator's state file: ``--state``, else ``$FLEETOPS_SIM_STATE``."""
    path = state_path or os.environ.get(SIM_STATE_ENV)
    if not path:
        raise CollectError(f"the sim backend needs a state file: set {SIM_STATE_ENV} or pass --state")
    return path


def collect_dict(backend: str = "auto", state_path: str | None = None) -> dict[str, Any]:
    """The snapshot as the JSON-ready mapping the agent prints. The simulator's path builds the
    mapping directly (the controller validates it on receipt); NVML's goes through ``collect``."""
    start = time.perf_counter()
    if choose_backend(backend) != "sim":
        from fleetops.model import to_dict

        doc: dict[str, Any] = to_dict(collect(backend, state_path))
        return doc
    from fleetops.sim.access import snapshot_dict

    data = snapshot_dict(sim_state_path(state_path), time.time())
    data["collect_ms"] = round((time.perf_counter() - start) * 1000.0, 2)
    return data


def collect(backend: str = "auto", state_path: str | None = None, *, release: bool = False) -> model.Node:
    """A cold snapshot through the chosen backend's ``GpuAccess.snapshot``. ``release``: NVML is
    shut down before returning (the reset's)."""
    start = time.perf_counter()
    access: GpuAccess
    if choose_backend(backend) == "sim":
        from fleetops.sim.access import SimAccess

        access = SimAccess(sim_state_path(state_path))
    else:
        from fleetops.gpu.nvml.access import NvmlAccess

        access = NvmlAccess()
    node = access.snapshot(release=release)
    node.collect_ms = round((time.perf_counter() - start) * 1000.0, 2)
    return node
