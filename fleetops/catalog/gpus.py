"""The GPU models fleetops knows, by the product name NVML reports (``nvmlDeviceGetName``), and
the power limit each can be set to.

A baseline's ``gpu_models`` keys must be one of these names: a key NVML never reports (``NVIDIA
H200 SXM`` for ``NVIDIA H200``) would match no GPU, and the firmware and power-limit checks it
asks for would silently check nothing. The names are those the checks' per-model knowledge
covers (MIG profile tables and validation floors: H100 and H200), their PCIe/NVL siblings (the
inventory's ``h100_pcie`` group), the Ampere parts the pre-Hopper checks (retired pages) are for,
and the simulator's model. Plain data: the agent imports it on its cold path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    """``max_power_w``: the board's maximum power limit (its TDP, NVIDIA's datasheet): a baseline
    power limit above it is refused at load (NVML refuses it on the node, and the check would
    then report every GPU forever)."""

    name: str
    max_power_w: float


# NVML product name -> model. Maximum power from NVIDIA's datasheets.
KNOWN: dict[str, GpuModel] = {m.name: m for m in (
    GpuModel("NVIDIA H200", 700),  # H200 SXM 141GB (the captured reference GPU; the simulator's)
    GpuModel("NVIDIA H200 NVL", 600),
    GpuModel("NVIDIA H100 80GB HBM3", 700),  # H100 SXM5 80GB
    GpuModel("NVIDIA H100 PCIe", 350),
    GpuModel("NVIDIA H100 NVL", 400),
    GpuModel("NVIDIA A100-SXM4-80GB", 400),
    GpuModel("NVIDIA A100-SXM4-40GB", 400),
    GpuModel("NVIDIA A100 80GB PCIe", 300),
    GpuModel("NVIDIA A100-PCIE-40GB", 250),
)}

# The physical range of a power limit on any of them, in W: what the baseline's schema states
# (and editors check). Datacenter boards' minimum limits sit between 100 and 200 W, the largest
# TDP above is 700 W; 1000 W leaves room for parts newer than this list without accepting a
# typo (7000).
POWER_LIMIT_MIN_W = 100.0
POWER_LIMIT_MAX_W = 1000.0


def known(name: str) -> GpuModel | None:
    return KNOWN.get(name)


def names() -> list[str]:
    return list(KNOWN)
