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


def _skip_gpu_tests_without_a_gpu(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


# Which tests may run at the same time, when the suite runs on several workers (pytest-xdist,
# ``-n N --dist loadgroup``: the README's test command). A tier that starts machines of its own
# stays on one worker, in the order it has when run alone: the nspawn hosts and their slurmctld
# (tests/ansible), the shared simulated fleet of tests/integration and the fleets the modules
# there start beside it, and the TUI's live fleets (tests/tui). Every other module is a group of
# its own, so its module-scoped fixtures are made once. Tiers use address blocks of their own
# (127.0.2x/3x integration, 127.0.3x tui, 127.0.4x ansible) and take free ports.
_SERIAL_TIERS = ("ansible", "integration", "tui")


def _group_for_workers(items: list[pytest.Item]) -> None:
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        rel = os.path.relpath(str(item.path), tests_dir).split(os.sep)
        group = rel[0] if rel[0] in _SERIAL_TIERS else "/".join(rel)
        item.add_marker(pytest.mark.xdist_group(group))


# tryfirst: pytest-xdist reads the groups in its own hook of this name, after this one
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _group_for_workers(items)
    _skip_gpu_tests_without_a_gpu(items)
