"""``fleetops-agent validate --probe``: which validation backends work on this node, measured
nothing.

The rollout's validation gate runs after a node was drained, upgraded and rebooted; a node
whose agent cannot measure (the role's virtualenv holds only nvidia-ml-py) would fail the gate
every time, with the node already out of service. The probe is the cheap question asked before
the drain: it tries each backend the way ``validate`` would pick it (importing torch or CuPy
and asking for a CUDA device, looking for ``dcgmi``) and says what to install where none works.
"""

from __future__ import annotations

import sys
from typing import Any

from fleetops.validation.node.run import ValidateError, pick_backend

# What makes each backend work, in the terms of the fleetops_agent role's
# fleetops_agent_validate_backend, so the refusal names the inventory setting to change.
INSTALL: dict[str, str] = {
    "torch": "PyTorch with CUDA in the agent's Python (fleetops_agent_validate_backend: system-torch, "
             "with PyTorch installed for the system's python3)",
    "cupy": "CuPy for the node's CUDA (fleetops_agent_validate_backend: cupy, with the wheel in "
            "fleetops_agent_validate_cupy_wheelhouse)",
    "dcgm": "DCGM, so that dcgmi is on PATH and nv-hostengine runs (fleetops_agent_validate_backend: dcgm)",
}
ORDER = ("torch", "cupy", "dcgm")


def _why_not(name: str) -> str | None:
    """None when ``name`` works here, else why not. Any failure of the check itself (a broken
    install that raises on import) is a reason too, never a traceback."""
    try:
        if name == "torch":
            from fleetops.validation.node import torchbackend

            return torchbackend.available()
        if name == "cupy":
            from fleetops.validation.node import cupybackend

            return cupybackend.available()
        from fleetops.validation.node import dcgmbackend

        return dcgmbackend.available()
    except Exception as exc:  # noqa: BLE001 - a backend that cannot even be asked does not work
        return f"{name} failed to load ({type(exc).__name__}: {exc})"


def install_hint(names: tuple[str, ...] = ORDER) -> str:
    return "install one of: " + "; ".join(f"{n}: {INSTALL[n]}" for n in names)


def probe(backend: str, state_path: str | None) -> dict[str, Any]:
    """The probe's report: every backend's verdict and the one ``validate --backend BACKEND``
    would run with (``picked``; None where it would refuse, with ``error`` and ``install``)."""
    backends: dict[str, dict[str, Any]] = {}
    for name in ORDER:
        why = _why_not(name)
        backends[name] = {"usable": why is None, "why_not": why}
    picked: str | None
    error: str | None = None
    try:
        picked = pick_backend(backend, state_path)
    except ValidateError as exc:
        picked, error = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - validate itself would stop here: no backend to offer
        picked, error = None, f"choosing a backend failed ({type(exc).__name__}: {exc})"
    if picked == "sim":
        backends["sim"] = {"usable": True, "why_not": None}
    wanted = ORDER if backend in ("auto", "sim") or backend not in INSTALL else (backend,)
    return {
        "kind": "validate-probe",
        "asked": backend,
        "picked": picked,
        "backends": backends,
        "python": sys.executable,
        "error": error,
        "install": None if picked else install_hint(wanted),
    }
