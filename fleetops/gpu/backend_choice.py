"""Which backend answers on this node: the one decision every agent command takes.

``auto`` is NVML on a node with an NVIDIA driver, whatever ``$FLEETOPS_SIM_STATE`` or a state
file says: a stray simulator variable on a real node must never turn a reset, a power cap or a
MIG change into an edit of a JSON file that "succeeds". A node has a driver when its control
device ``/dev/nvidiactl`` exists (``nvmlInit`` opens it) or the driver's ``/proc`` entry does
(NVML starts only with the module loaded). Elsewhere (the simulated fleet's machine) ``auto``
is the simulator when the caller has a simulator state, else NVML.

An explicit ``--backend sim`` on a node with a driver is refused unless the operator says so
with ``--sim-on-gpu-node`` (which sets ``$FLEETOPS_SIM_ON_GPU_NODE`` for the processes the
command starts). Even then ``auto`` stays NVML.

Only ``os`` is imported: ``collect``'s answered path and the daemon's client ask this too.
"""

from __future__ import annotations

import os

GPU_MARKERS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")
# Tests only: os.pathsep-separated paths that stand for GPU_MARKERS (a temporary file for "this
# node has a driver", a path that does not exist for "it has none").
MARKERS_ENV = "FLEETOPS_AGENT_GPU_MARKERS"
CONSENT_ENV = "FLEETOPS_SIM_ON_GPU_NODE"
CONSENT_FLAG = "--sim-on-gpu-node"
SIM_STATE_ENV = "FLEETOPS_SIM_STATE"
BACKENDS = ("auto", "nvml", "sim")


class BackendRefused(Exception):
    """The requested backend is not allowed here (``sim`` on a node with a driver, no consent)."""


def markers() -> tuple[str, ...]:
    override = os.environ.get(MARKERS_ENV)
    if override is not None:
        return tuple(p for p in override.split(os.pathsep) if p)
    return GPU_MARKERS


def gpu_driver_marker() -> str | None:
    """The first marker of an NVIDIA driver present on this node, None when there is none."""
    for path in markers():
        if os.path.exists(path):
            return path
    return None


def sim_consented() -> bool:
    return os.environ.get(CONSENT_ENV, "") not in ("", "0")


def consent() -> None:
    """``--sim-on-gpu-node`` given: this process and the ones it starts may use the simulator
    on a node with a driver when ``--backend sim`` asks for it."""
    os.environ[CONSENT_ENV] = "1"


def choose(requested: str, sim_state: bool | None = None) -> str:
    """``nvml`` or ``sim`` for ``requested`` (auto, nvml, sim). ``sim_state``: whether the
    caller has a simulator state for ``auto`` to use (default: ``$FLEETOPS_SIM_STATE`` set).
    Raises ``ValueError`` for an unknown name and ``BackendRefused`` for ``sim`` on a node with a
    driver without consent."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "nvml":
        return "nvml"
    marker = gpu_driver_marker()
    if requested == "auto":
        has_state = bool(os.environ.get(SIM_STATE_ENV)) if sim_state is None else sim_state
        return "sim" if has_state and marker is None else "nvml"
    if marker is not None and not sim_consented():
        raise BackendRefused(
            f"--backend sim refused: this node has an NVIDIA driver ({marker} exists), so a simulated reset, "
            f"setting or MIG change would act on a state file while the GPUs stay as they are; pass "
            f"{CONSENT_FLAG} to simulate on this node anyway"
        )
    return "sim"
