"""The ``Baseline`` type and its parts (``Thresholds``, MIG, GPU models, driver, PCIe,
validation), as ``load`` builds them from a validated mapping."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetops.baseline.schema import SCHEMA, SERVICE_PERSISTENCED, T_INT
from fleetops.catalog import mig as _mig_catalog
from fleetops.catalog import migparted as _migparted
from fleetops.xid import policy as _xpolicy

# --- the baseline ----------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """Check thresholds. Defaults and meanings live in SCHEMA (``thresholds.*``); an import-time
    check keeps the two identical."""

    ecc_dbe_volatile_crit: int = 1
    ecc_sbe_volatile_warn: int = 10_000
    ecc_sbe_volatile_crit: int = 50_000_000
    ecc_sbe_growth_per_hour_warn: float = 1000.0
    remapped_rows_uncorrectable_warn: int = 512
    retired_pages_total_crit: int = 63
    retired_pages_dbe_crit: int = 16
    pcie_replays_per_min: float = 31.0
    nvlink_crc_per_min_warn: float = 100.0
    nvlink_crc_per_min_crit: float = 6000.0
    nvlink_replays_per_min_warn: float = 0.0
    nvlink_recoveries_per_min_warn: float = 0.0
    nvlink_idle_window_s: float = 60.0
    nvlink_idle_max_kib: float = 1024.0
    nvlink_idle_peer_min_kib: float = 1048576.0
    temp_slowdown_margin_c: float = 5.0
    temp_memory_warn_c: float = 85.0
    power_limit_tolerance_w: float = 1.0
    xid_window_hours: float = 24.0
    xid_storm_count: int = 10
    xid_hold_hours: float = 168.0
    rate_min_interval_s: float = 10.0
    fabric_link_downed_crit: int = 1
    fabric_symbol_errors_per_s_warn: float = 10.0
    fabric_symbol_errors_per_hour_crit: float = 120.0
    fabric_link_recoveries_per_min_warn: float = 5.0
    fabric_flap_down_s: float = 25.0
    fabric_flap_count: int = 3
    fabric_drop_down_s: float = 240.0
    fabric_drop_hold_s: float = 600.0


def _check_thresholds_match_schema() -> None:
    in_schema = {k.name: k for k in SCHEMA if k.parent == "thresholds"}
    fields = {f.name: f for f in dataclasses.fields(Thresholds)}
    if set(in_schema) != set(fields):
        raise AssertionError(f"Thresholds and SCHEMA differ: {sorted(set(in_schema) ^ set(fields))}")
    for name, key in in_schema.items():
        if fields[name].default != key.default:
            raise AssertionError(f"thresholds.{name}: default {fields[name].default!r} != SCHEMA {key.default!r}")
        if (fields[name].type in ("int", int)) != (key.type == T_INT):
            raise AssertionError(f"thresholds.{name}: type differs from SCHEMA")


_check_thresholds_match_schema()
DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class MigBaseline:
    mode: bool | None = None
    profile: str | None = None
    layout: tuple[str, ...] | None = None
    config_file: str | None = None
    config: str | None = None
    # the selected config of config_file, read when the baseline is built
    parted: tuple[_migparted.Entry, ...] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GpuModelBaseline:
    vbios_version: str | None = None
    inforom_image: str | None = None
    power_limit_w: float | None = None
    mig: MigBaseline | None = None
    # gpu_models.*.fabric: the RDMA ports of a node of this model; its keys over the group's fabric
    fabric: FabricBaseline | None = None


@dataclass(frozen=True)
class MigWant:
    """The MIG state a baseline wants for one GPU, and the key that says so (for findings)."""

    mode: bool
    layout: tuple[str, ...]
    key: str


@dataclass(frozen=True)
class DriverBaseline:
    branches: tuple[int, ...] | None = None
    flavour: str | None = None  # "datacenter" | "any"


@dataclass(frozen=True)
class PcieBaseline:
    gen: int | None = None
    width: int | None = None


@dataclass(frozen=True)
class ValidationBaseline:
    """``validation:``: ``floors`` maps a shipped floor model ('H200 SXM') to metric -> floor,
    the shape ``fleetops.validation.judge`` takes as overrides."""

    require: str | None = None
    max_age_days: float | None = None
    floors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)



@dataclass(frozen=True)
class FabricBaseline:
    """``fabric:``: the RDMA ports every node must have (see SCHEMA's ``fabric.*``)."""

    compute_ports: int | None = None
    link_layer: str | None = None
    rate_gbps: float | None = None
    width: str | None = None
    firmware: str | None = None
    exclude_devices: tuple[str, ...] | None = None
    exclude_link_layers: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Baseline:
    """Desired state. ``None`` means "not checked". Build with ``from_mapping``/``load_file``."""

    driver_version: str | None = None
    cuda_driver_version: str | None = None
    fabric_manager_version: str | None = None
    gpu_models: Mapping[str, GpuModelBaseline] = field(default_factory=dict)
    power_limit_w: float | None = None
    persistence_mode: bool | None = None
    ecc_mode: bool | None = None
    compute_mode: str | None = None
    mig: MigBaseline = field(default_factory=MigBaseline)
    gpu_count: int | None = None
    pcie: PcieBaseline = field(default_factory=PcieBaseline)
    nvlinks_per_gpu: int | None = None
    expected_topology: str | None = None
    stray_process_allowlist: tuple[str, ...] | None = None
    services: tuple[str, ...] = (SERVICE_PERSISTENCED,)
    driver: DriverBaseline = field(default_factory=DriverBaseline)
    packages: Mapping[str, str] = field(default_factory=dict)  # name -> pinned version
    thresholds: Thresholds = field(default_factory=Thresholds)
    xid_policy: Mapping[int, _xpolicy.XidPolicy] = field(default_factory=dict)
    validation: ValidationBaseline = field(default_factory=ValidationBaseline)
    fabric: FabricBaseline = field(default_factory=FabricBaseline)
    source: str = "<defaults>"
    # The validated mapping as written (explicit keys only) and where each key came from:
    # what merge() layers. Not part of equality.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    origins: Mapping[str, tuple[str, int | None]] = field(default_factory=dict, compare=False, repr=False)
    # Key path -> the inventory level that set it ("group gpu_h200"), for layered baselines.
    levels: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def level_of(self, path: str) -> str | None:
        return self.levels.get(path)

    def model(self, name: str | None) -> GpuModelBaseline | None:
        if name is None:
            return None
        return self.gpu_models.get(name)

    def fabric_for(self, model_name: str | None) -> FabricBaseline:
        """The RDMA ports a node whose GPUs are of this model must have: each key its
        ``gpu_models.*.fabric`` sets, else the group's ``fabric`` key (as ``power_limit_for``
        takes the model's power limit over the group's)."""
        m = self.model(model_name)
        own = m.fabric if m is not None else None
        if own is None:
            return self.fabric
        return FabricBaseline(**{
            f.name: getattr(own, f.name) if getattr(own, f.name) is not None else getattr(self.fabric, f.name)
            for f in dataclasses.fields(FabricBaseline)
        })

    def power_limit_for(self, model_name: str | None) -> float | None:
        """Desired power limit for a GPU of this model: the model's own, else the group's."""
        m = self.model(model_name)
        if m is not None and m.power_limit_w is not None:
            return m.power_limit_w
        return self.power_limit_w

    def mig_want(self, model_name: str | None, index: int | None) -> MigWant | None:
        """The layout for a GPU of this model at this NVML index: the model's own
        ``gpu_models.*.mig.layout``, else ``mig.layout``, else the selected mig-parted config's
        entry that covers the index; None when the baseline gives no layout for it."""
        m = self.model(model_name)
        own = m.mig if m is not None else None
        if own is not None and own.layout is not None:
            mode = own.mode if own.mode is not None else True
            return MigWant(mode, own.layout if mode else (), f'gpu_models["{model_name}"].mig.layout')
        if own is not None and own.mode is False:
            return MigWant(False, (), f'gpu_models["{model_name}"].mig.mode')
        if self.mig.layout is not None:
            return MigWant(True, self.mig.layout, "mig.layout")
        if self.mig.parted is not None and index is not None:
            got = _migparted.want_for(self.mig.parted, index, _mig_catalog.device_id_for(model_name))
            if got is not None:
                return MigWant(got[0], tuple(_mig_catalog.normalize(p) for p in got[1]),
                               f"mig.config {self.mig.config} of {self.mig.config_file}")
        return None

    def has_mig_layout(self) -> bool:
        return (self.mig.layout is not None or self.mig.parted is not None
                or any(g.mig is not None and (g.mig.layout is not None or g.mig.mode is not None)
                       for g in self.gpu_models.values()))

    def expected_fabric_manager(self) -> str | None:
        return self.fabric_manager_version or self.driver_version

    def origin(self, path: str) -> tuple[str, int | None] | None:
        return self.origins.get(path)
