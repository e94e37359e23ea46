"""Fixtures for the baseline and checks tests: simulator nodes as ``model.Node``, a baseline
that matches the simulator's default node, and a node shaped like the real H200 passthrough VM
(``tests/fixtures/h200``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fleetops import baseline, model
from fleetops.sim import gpu as sim

# The simulator's default node, as desired state.
SIM_BASELINE: dict[str, Any] = {
    "driver_version": "580.159.04",
    "cuda_driver_version": "13.0",
    "gpu_models": {
        "NVIDIA H200": {"vbios_version": "96.00.A5.00.1A", "inforom_image": "G520.0282.02.02", "power_limit_w": 700}
    },
    "persistence_mode": True,
    "ecc_mode": True,
    "compute_mode": "Default",
    "mig": {"mode": False},
    "gpu_count": 8,
    "pcie": {"gen": 5, "width": 16},
    "nvlinks_per_gpu": 18,
    "expected_topology": "NV18",
    "stray_process_allowlist": [],
    "fabric": {"compute_ports": 8, "link_layer": "InfiniBand", "rate_gbps": 400, "width": "4X",
               "firmware": "28.39.1002", "exclude_devices": ["mlx5_8"]},
}


def node_from_state(state: dict[str, Any], now: float | None = None) -> model.Node:
    """A simulator snapshot as the agent would deliver it: ``collected_at`` set, the kernel
    log's XID lines parsed into ``xids`` and mapped to GPUs by bus id."""
    now = time.time() if now is None else now
    data = sim.snapshot(state, now=now)
    lines = data.pop("_kernel_log", [])
    data["collected_at"] = now
    node = model.node_from_dict(data)
    from fleetops.xid import kernlog as xid

    node.xids = xid.parse_lines(lines, source="sim")
    for event in node.xids:
        gpu = node.gpu_by_bus_id(event.bus_id) if event.bus_id else None
        if gpu is not None:
            event.gpu_uuid, event.gpu_index = gpu.uuid, gpu.index
    return node


@pytest.fixture
def sim_node() -> Callable[..., model.Node]:
    """``sim_node(host="n1", faults=(), now=None)`` -> Node; ``sim_node(state=..., now=...)``
    snapshots an existing state."""

    def make(host: str = "n1", faults: tuple[str, ...] | list[str] = (), now: float | None = None,
             state: dict[str, Any] | None = None) -> model.Node:
        if state is None:
            state = sim.build_state(host, {"faults": list(faults)})
        return node_from_state(state, now)

    return make


@pytest.fixture
def sim_baseline() -> baseline.Baseline:
    return baseline.from_mapping(SIM_BASELINE, "sim-baseline")


def passthrough_h200(reason: str = "NotSupported") -> model.Node:
    """One H200 passed through to a VM, with the real capture's values: NVLink, NUMA, retired
    pages and fabric state unreadable (``reason``). Remapped rows are unreadable too, which the
    capture's GPU did report (2 corrected): the stricter case, a VM that hides them as well."""
    unsupported = [
        "nvlinks", "numa_node", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
        "remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending", "remapped_rows_failure",
        "fabric_state", "fabric_status",
    ]
    gpu = model.Gpu(
        index=0, uuid="GPU-ed2c431b-4811-46fb-82e0-deeead4dc641", bus_id="0000:00:06.0", name="NVIDIA H200",
        serial="1654024197156", vbios_version="96.00.A5.00.1A", inforom_image="G520.0282.02.02",
        gsp_firmware="580.159.04", persistence_mode=True, compute_mode="Default", power_draw_w=77.7,
        power_limit_w=700.0, power_default_limit_w=700.0, power_min_limit_w=200.0, power_max_limit_w=700.0,
        power_enforced_limit_w=700.0, temp_gpu_c=36.0, temp_memory_c=36.0, temp_slowdown_c=89.0,
        temp_shutdown_c=95.0, temp_memory_max_c=95.0, clock_sm_mhz=345, clock_sm_max_mhz=1980,
        clocks_event_mask=0x1, clocks_event_reasons=["gpu_idle"], ecc_mode_current=True, ecc_mode_pending=True,
        ecc_corrected_volatile=0, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=289,
        ecc_uncorrected_aggregate=0, pcie_gen_current=5, pcie_gen_max=5, pcie_width_current=16,
        pcie_width_max=16, pcie_replay_counter=0, mig_mode_current=False, mig_mode_pending=False,
        processes=[], recovery_action="none",
        unavailable={name: reason for name in unsupported} | {"mig_instances": "MIG disabled"},
    )
    return model.Node(
        hostname="h200-vm", backend="nvml", collected_at=time.time(), driver_version="580.159.04",
        cuda_driver_version="13.0", gpu_count=1, gpus=[gpu],
        topology=model.Topology(gpus=[gpu.bus_id], links=[["X"]], nvlink_counts=[[0]], numa={gpu.bus_id: None},
                                unavailable={"numa": reason}),
    )


@pytest.fixture
def passthrough_node() -> Callable[..., model.Node]:
    return passthrough_h200
