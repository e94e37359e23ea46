"""Skip tests marked ``gpu`` where NVML cannot start or sees no GPU (markers: pyproject.toml)."""

from __future__ import annotations

import functools
import os

import pytest

# The simulator's tests simulate nodes without a GPU driver, also when they run on a GPU machine:
# there ``--backend auto`` would be NVML and ``--backend sim`` refused (gpu/backend_choice.py).
# An empty marker list says "no driver here"; tests of the guard set their own markers, and the
# GPU tier looks at the real device files (tests/gpu/test_backend_choice_real.py).
os.environ.setdefault("FLEETOPS_AGENT_GPU_MARKERS", "")


@functools.lru_cache(maxsize=1)
def _no_gpu_reason() -> str | None:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start here: {exc}"
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    except pynvml.NVMLError as exc:
        return f"NVML cannot count GPUs: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
