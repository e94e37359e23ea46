"""Degradations for ``fleetops-agent validate --backend sim``: faults that slow a GPU's measured
figures, and the run-to-run noise of the simulated measurements."""

from __future__ import annotations

from typing import Any

from fleetops.sim.gpu.base import (
    VALIDATION_FAULTS,
    SimError,
)


def inject_validation_fault(state: dict[str, Any], name: str, gpu_index: int, peer: int | None = None) -> bool:
    """Mark one GPU degraded for the simulated validation backend (idempotent: False when it
    was already). ``peer`` (only for slow-nvlink) narrows it to the one link between
    ``gpu_index`` and ``peer``."""
    if name not in VALIDATION_FAULTS:
        raise SimError(f"unknown validation fault {name!r}; known: {', '.join(VALIDATION_FAULTS)}")
    for index in (gpu_index,) if peer is None else (gpu_index, peer):
        if not 0 <= index < len(state["gpus"]):
            raise SimError(f"GPU index {index} out of range (0-{len(state['gpus']) - 1})")
    if peer is not None and (name != "slow-nvlink" or peer == gpu_index):
        raise SimError(f"a peer GPU narrows slow-nvlink to one link between two GPUs, not {name} on {gpu_index}-{peer}")
    entries = state.setdefault("validation_faults", [])
    entry: dict[str, Any] = {"fault": name, "gpu": gpu_index}
    if peer is not None:
        entry["peer"] = peer
    if entry in entries:
        return False
    entries.append(entry)
    return True


def clear_validation(state: dict[str, Any], name: str, gpu: int | None) -> int:
    """Remove validation degradations named ``name`` (or all) on ``gpu`` (either end of a
    narrowed link) or on every GPU; how many."""
    entries = state.get("validation_faults") or []
    kept = [
        e for e in entries
        if not ((name == "all" or e["fault"] == name) and (gpu is None or gpu in (e.get("gpu"), e.get("peer"))))
    ]  # fmt: skip
    if entries:
        state["validation_faults"] = kept
    return len(entries) - len(kept)


def set_validation_noise(state: dict[str, Any], noise: float | None = None, seed: int | None = None) -> None:
    """The noise level and seed of this node's simulated validation runs, for an agent whose
    command line names neither: ``fleetops validate`` passes no simulator options, so a fleet's
    runs reach a noise level and a seed (a reproducible run) only through each node's state.
    ``None`` for both removes the setting (the backend's default noise, fresh draws each run)."""
    if noise is not None and not 0.0 <= noise < 1.0:
        raise SimError(f"validation noise {noise!r}: expected a fraction from 0 to below 1")
    if noise is None and seed is None:
        state.pop("validation_noise", None)
        return
    setting: dict[str, Any] = {}
    if noise is not None:
        setting["noise"] = float(noise)
    if seed is not None:
        setting["seed"] = int(seed)
    state["validation_noise"] = setting


def validation_faults(state: dict[str, Any], gpu_index: int) -> list[str]:
    return [str(e["fault"]) for e in state.get("validation_faults") or [] if e.get("gpu") == gpu_index]
