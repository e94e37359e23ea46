"""``SCHEMA``: every key a baseline may set (path, type, default, description, example, range),
which the validator is driven by and the docs generator reads; and the JSON Schema made from it."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fleetops.catalog import gpus as _gpus
from fleetops.validation import floors as _floors  # plain data, cheap for the agent's cold path
from fleetops.xid import catalog as _xid

SERVICE_PERSISTENCED = "nvidia-persistenced"
SERVICE_FABRICMANAGER = "nvidia-fabricmanager"


# --- schema ----------------------------------------------------------------------------

# Types, as the docs print them.
T_STR = "string"
T_INT = "integer"
T_NUM = "number"
T_BOOL = "boolean"
T_STR_LIST = "list of strings"
T_INT_LIST = "list of integers"
T_MAP = "mapping"
T_MAP_OF = "mapping of GPU model name to mapping"  # gpu_models: free keys, fixed sub-keys
T_MAP_OF_XID = "mapping of XID code to mapping"  # xid_policy: codes as keys, fixed sub-keys
T_MAP_OF_VERSION = "mapping of package name to version"  # packages: free keys, string values


@dataclass(frozen=True)
class SchemaKey:
    """One baseline key. ``path`` is dotted; ``*`` stands for a free key (a GPU model name)."""

    path: str
    type: str
    default: Any
    description: str
    example: Any
    nullable: bool = True  # null = "not checked" (in the override given to merge(), it unsets the key)
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # minimum itself is refused (durations: > 0)
    choices: tuple[Any, ...] | None = None
    pattern: str | None = None
    unit: str | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rsplit(".", 1)[0] if "." in self.path else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "type": self.type,
            "default": list(self.default) if isinstance(self.default, tuple) else self.default,
            "description": self.description,
            "example": self.example,
            "nullable": self.nullable,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "exclusive_minimum": self.exclusive_minimum,
            "choices": list(self.choices) if self.choices else None,
            "pattern": self.pattern,
            "unit": self.unit,
        }


def _threshold(name: str, type_: str, default: Any, description: str, unit: str | None = None,
               minimum: float = 0, maximum: float | None = None, exclusive_minimum: bool = False) -> SchemaKey:
    return SchemaKey(
        f"thresholds.{name}", type_, default, description, example=default, nullable=False, minimum=minimum,
        maximum=maximum, exclusive_minimum=exclusive_minimum, unit=unit,
    )


# Ranges (see _threshold's callers and the keys below): counts of errors or events that raise a
# finding start at 1 (0 would flag every GPU: "at or above 0"); durations and windows are above 0
# (0 would judge nothing or hold nothing); temperatures are degrees C within a GPU's operating
# range (slowdown near 90 C, HBM maximum near 95-105 C: a warning at 150 C never fires); power
# limits within the physical range of data center boards (catalog.gpus).


# Floor metrics a baseline may override: the ones floors.floors_for applies per model.

VALIDATION_FLOOR_METRICS: tuple[str, ...] = (*_floors.PER_GPU_METRICS, "p2p_gbps", _floors.IB_WRITE_BW)
_FLOOR_UNITS = {"gbps": "GB/s", "tflops": "TFLOP/s"}
_FLOOR_ABOUT = {
    _floors.IB_WRITE_BW: "Floor of the node-pair RDMA write bandwidth (ib_write_bw, GPUDirect where possible) "
    "of a 400 Gb/s rail, in Gb/s, for the nodes of this model (replaces the shipped 360, AzNHC's check_ib_bw_gdr); "
    "a rail of another rate is held to this x rate / 400. At most 400: a floor over the rate fails every rail.",
}
_VALIDATION_FLOOR_KEYS = tuple(
    SchemaKey(f"validation.floors.*.{m}", T_NUM, None,
              _FLOOR_ABOUT.get(m, f"Floor for {m} (replaces the shipped one for this model)."),
              _floors.SHIPPED["H200 SXM"].metric(m), minimum=0,
              maximum=_floors.IB_REFERENCE_RATE_GBPS if m == _floors.IB_WRITE_BW else None,
              unit="Gb/s" if m == _floors.IB_WRITE_BW else _FLOOR_UNITS.get(m.rsplit("_", 1)[-1]))
    for m in VALIDATION_FLOOR_METRICS
)

_VERSION_HINT = "Quote it so YAML keeps it as text."

# The RDMA fabric beside the GPUs (checks' fabric family): the group's keys, and each GPU
# model's under gpu_models.*.fabric, which override them for the nodes of that model.
_FABRIC_KEYS: tuple[SchemaKey, ...] = (
    SchemaKey("fabric", T_MAP, None,
              "The InfiniBand / RoCE HCAs every node of the group must have: the compute ports "
              "(every RDMA port not excluded), their link layer, rate and width, and the HCAs' "
              "firmware. Absent keys are decided by the fleet majority in an audit. A GPU model's "
              "gpu_models.*.fabric overrides these keys for the nodes of that model.",
              {"compute_ports": 8, "link_layer": "InfiniBand", "rate_gbps": 400, "width": "4X",
               "firmware": "28.39.1002", "exclude_devices": ["mlx5_8"]}),
    SchemaKey("fabric.compute_ports", T_INT, None,
              "Compute ports each node must have (one per GPU on HGX H100/H200: 8). 0: none expected.",
              8, minimum=0, maximum=64, unit="ports"),
    SchemaKey("fabric.link_layer", T_STR, None,
              "Link layer of every compute port: InfiniBand, or Ethernet for RoCE.", "InfiniBand",
              choices=("InfiniBand", "Ethernet")),
    SchemaKey("fabric.rate_gbps", T_NUM, None,
              "Lowest rate a compute port may run at (sysfs 'rate': 400 for NDR 4X, 200 for HDR 4X "
              "or NDR 2X).", 400, minimum=1, maximum=3200, unit="Gb/s"),
    SchemaKey("fabric.width", T_STR, None,
              "Narrowest link width a compute port may train to (4X on NDR HCAs).", "4X",
              choices=("1X", "2X", "4X", "8X", "12X")),
    SchemaKey("fabric.firmware", T_STR, None,
              "Firmware version (sysfs fw_ver) of every HCA with a compute port. " + _VERSION_HINT,
              "28.39.1002", pattern=r"[0-9]+(\.[0-9]+)+"),
    SchemaKey("fabric.exclude_devices", T_STR_LIST, None,
              "RDMA devices whose ports are not compute ports (management, storage): device names "
              "or shell-style patterns ('mlx5_8', 'mlx5_bond*'). Their ports are never expected and "
              "never drain a node (at most warn). Absent, with exclude_link_layers absent too: a port "
              "is a compute port when its HCA shares a PCIe switch with a GPU (or, where no HCA does, "
              "when it is InfiniBand).", ["mlx5_8"]),
    SchemaKey("fabric.exclude_link_layers", T_STR_LIST, None,
              "Link layers whose ports are not compute ports (Ethernet: the management and storage "
              "ports of an InfiniBand cluster).", ["Ethernet"]),
)

def _model_fabric_key(key: SchemaKey) -> SchemaKey:
    """``fabric.X`` as ``gpu_models.*.fabric.X``: the same type, range and choices."""
    if key.path == "fabric":
        return dataclasses.replace(
            key, path="gpu_models.*.fabric",
            description="The RDMA ports a node whose GPUs are of this model must have: the keys of "
            "fabric, each overriding the group's fabric key for these nodes (a key left out is the "
            "group's). A node with GPUs of several models takes the group's fabric alone.",
            example={"compute_ports": 8, "rate_gbps": 400, "firmware": "28.39.1002"})
    return dataclasses.replace(
        key, path="gpu_models.*." + key.path, example=copy.deepcopy(key.example),  # no YAML anchors
        description=key.description + " For the nodes of this model; overrides " + key.path + ".")


_MODEL_FABRIC_KEYS = tuple(_model_fabric_key(k) for k in _FABRIC_KEYS)

SCHEMA: tuple[SchemaKey, ...] = (
    SchemaKey("driver_version", T_STR, None,
              "NVIDIA driver version every node must run (as NVML reports it). " + _VERSION_HINT,
              "580.159.04"),
    SchemaKey("cuda_driver_version", T_STR, None,
              "CUDA version the driver supports (nvidia-smi's 'CUDA Version'). " + _VERSION_HINT,
              "13.0"),
    SchemaKey("fabric_manager_version", T_STR, None,
              "Version of the installed nvidia-fabricmanager package (upstream part, without the "
              "package revision). When absent it must equal driver_version (or, without that, the "
              "running driver): Fabric Manager refuses to start against a different driver.",
              "580.159.04"),
    SchemaKey("gpu_models", T_MAP_OF, None,
              "Per GPU model (the name NVML reports, e.g. 'NVIDIA H200'): firmware versions, "
              "power limit, MIG state and the RDMA fabric of its nodes. GPUs of a model not listed "
              "here are not checked for these (the group's keys apply to them).",
              {"NVIDIA H200": {"vbios_version": "96.00.A5.00.1A", "inforom_image": "G520.0282.02.02",
                               "power_limit_w": 700}}),
    SchemaKey("gpu_models.*", T_MAP, None,
              "One GPU model, keyed by the name NVML reports ('NVIDIA H200', 'NVIDIA H100 80GB HBM3').",
              {"vbios_version": "96.00.A5.00.1A", "power_limit_w": 700}),
    SchemaKey("gpu_models.*.vbios_version", T_STR, None, "VBIOS version of this model's GPUs.",
              "96.00.A5.00.1A"),
    SchemaKey("gpu_models.*.inforom_image", T_STR, None, "InfoROM image version of this model's GPUs.",
              "G520.0282.02.02"),
    SchemaKey("gpu_models.*.power_limit_w", T_NUM, None,
              "Power limit (W) this model's GPUs must be set to; overrides power_limit_w. At most "
              "the model's own maximum (its TDP: 700 W for H100/H200 SXM, 350 W for H100 PCIe).", 700,
              unit="W", minimum=_gpus.POWER_LIMIT_MIN_W, maximum=_gpus.POWER_LIMIT_MAX_W),
    SchemaKey("gpu_models.*.mig", T_MAP, None,
              "MIG state of this model's GPUs; its keys override the group's mig keys for them.",
              {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}),
    SchemaKey("gpu_models.*.mig.mode", T_BOOL, None, "MIG mode of this model's GPUs.", False),
    SchemaKey("gpu_models.*.mig.layout", T_STR_LIST, None,
              "GPU instances of this model's GPUs (profile names of this model's table; did-you-mean "
              "on a typo). fleetops-agent mig apply creates them; config.mig_layout reports a GPU "
              "whose instances differ.", ["3g.71gb", "3g.71gb"]),
    *_MODEL_FABRIC_KEYS,
    SchemaKey("power_limit_w", T_NUM, None,
              "Power limit (W) for every GPU whose model has no power_limit_w of its own.", 700,
              unit="W", minimum=_gpus.POWER_LIMIT_MIN_W, maximum=_gpus.POWER_LIMIT_MAX_W),
    SchemaKey("persistence_mode", T_BOOL, None, "Persistence mode must be on (true) or off (false).", True),
    SchemaKey("ecc_mode", T_BOOL, None, "ECC must be enabled (true) or disabled (false).", True),
    SchemaKey("compute_mode", T_STR, None, "Compute mode every GPU must be in.", "Default",
              choices=("Default", "Exclusive_Process", "Prohibited")),
    SchemaKey("mig", T_MAP, None, "MIG (Multi-Instance GPU) state.", {"mode": True, "layout": ["3g.71gb", "3g.71gb"]}),
    SchemaKey("mig.mode", T_BOOL, None, "MIG mode must be enabled (true) or disabled (false).", False),
    SchemaKey("mig.profile", T_STR, None,
              "GPU instance profile every MIG instance must use (only checked with mig.mode true).",
              "1g.18gb"),
    SchemaKey("mig.layout", T_STR_LIST, None,
              "GPU instances every MIG GPU must have, as profile names (one instance each, any "
              "order); implies mig.mode true. A model's gpu_models.*.mig.layout overrides it. Names "
              "must exist in an H100 or H200 profile table.", ["3g.71gb", "3g.71gb"]),
    SchemaKey("mig.config_file", T_STR, None,
              "An nvidia-mig-parted config file (version: v1) giving the layout instead of "
              "mig.layout: a path, relative to this baseline's file. Needs mig.config.",
              "mig-parted.yaml"),
    SchemaKey("mig.config", T_STR, None, "The config of mig.config_file to use (a key of its mig-configs).",
              "all-3g.71gb"),
    SchemaKey("gpu_count", T_INT, None, "Number of GPUs the driver must enumerate on each node.", 8,
              minimum=1, maximum=16),
    SchemaKey("pcie", T_MAP, None, "Minimum PCIe link each GPU must train to.", {"gen": 5, "width": 16}),
    SchemaKey("pcie.gen", T_INT, None, "Minimum PCIe generation.", 5, choices=(1, 2, 3, 4, 5, 6)),
    SchemaKey("pcie.width", T_INT, None, "Minimum PCIe link width (lanes).", 16,
              choices=(1, 2, 4, 8, 16, 32)),
    SchemaKey("nvlinks_per_gpu", T_INT, None,
              "NVLinks each GPU must have up (18 on HGX H100/H200). 0 means no NVLink is expected. "
              "When above 0, nvidia-fabricmanager joins the default services.", 18, minimum=0, maximum=18),
    SchemaKey("expected_topology", T_STR, None,
              "Link type every GPU pair must show in 'nvidia-smi topo -m' (NV<n>, SYS, NODE, PHB, "
              "PXB, PIX).", "NV18", pattern=r"^(NV[1-9][0-9]*|SYS|NODE|PHB|PXB|PIX)$"),
    SchemaKey("stray_process_allowlist", T_STR_LIST, None,
              "Names of processes allowed to hold a GPU; any other process on a GPU is reported. "
              "Entries match the process name, the basename of its first word, or a shell-style "
              "pattern ('dcgm*'). An empty list allows none; absent = not checked.",
              ["nvidia-cuda-mps-server", "dcgm*"]),
    SchemaKey("services", T_STR_LIST, (SERVICE_PERSISTENCED,),
              "systemd units that must be active. Default: nvidia-persistenced, plus "
              "nvidia-fabricmanager when nvlinks_per_gpu is above 0.",
              [SERVICE_PERSISTENCED, SERVICE_FABRICMANAGER]),
    SchemaKey("xid_policy", T_MAP_OF_XID, None,
              "Per XID code: the severity and action its finding gets, and an escalation by count "
              "within a time span on one GPU. Each key given overrides the XID catalog and the "
              "shipped policy for that code (the XID runbook lists both); an escalate given here "
              "replaces the shipped one.",
              {31: {"escalate": {"count": 3, "within_s": 600, "severity": "crit",
                                 "action": "drain_and_inspect"}},
               63: {"severity": "warn"}}),
    SchemaKey("xid_policy.*", T_MAP, None, "One XID code (a positive number; SXid codes are not covered).",
              {"severity": "crit", "action": "reset_gpu"}),
    SchemaKey("xid_policy.*.severity", T_STR, None, "Severity of the code's finding.", "crit",
              choices=_xid.SEVERITIES),
    SchemaKey("xid_policy.*.action", T_STR, None,
              "What the finding tells the operator to do (an XID catalog action). reboot_node "
              "findings hold until the node reboots, reset_gpu ones until the GPU is reset.",
              "reset_gpu", choices=_xid.ACTIONS),
    SchemaKey("xid_policy.*.escalate", T_MAP, None,
              "count events of this code on one GPU within within_s seconds raise the finding to "
              "severity/action.", {"count": 3, "within_s": 600, "severity": "crit"}),
    SchemaKey("xid_policy.*.escalate.count", T_INT, None, "Events that escalate (required).", 3,
              minimum=2, unit="events"),
    SchemaKey("xid_policy.*.escalate.within_s", T_NUM, None, "The span they must fall within (required).",
              600, minimum=1, maximum=7 * 86400, unit="s"),
    SchemaKey("xid_policy.*.escalate.severity", T_STR, None, "Severity once escalated (default crit).",
              "crit", choices=_xid.SEVERITIES),
    SchemaKey("xid_policy.*.escalate.action", T_STR, None,
              "Action once escalated (default: the code's action).", "drain_and_inspect",
              choices=_xid.ACTIONS),
    # --- the driver's branch and flavour (versions.driver_branch, versions.driver_flavour) ---
    SchemaKey("driver", T_MAP, None,
              "Which NVIDIA drivers the nodes may run: the allowed branches and the package flavour.",
              {"branches": [535, 550, 570, 580], "flavour": "datacenter"}),
    SchemaKey("driver.branches", T_INT_LIST, None,
              "Driver branches allowed, by the loaded driver's major number (580.159.04 is branch "
              "580; the build branch NVML names, r582_49 for that driver, is shown in a finding but "
              "not compared). Use the data center branches NVIDIA supports for the GPUs (production "
              "and long-term support branches).", [535, 550, 570, 580]),
    SchemaKey("driver.flavour", T_STR, None,
              "datacenter: the installed driver packages must be a data center flavour (Ubuntu's "
              "-server packages, or packages from NVIDIA's repository such as cuda-drivers and "
              "nvidia-open); a consumer package (Ubuntu's nvidia-driver-<branch> without -server, "
              "RPM Fusion's akmod-nvidia) is reported. any: not checked.", "datacenter",
              choices=("datacenter", "any")),
    SchemaKey("packages", T_MAP_OF_VERSION, None,
              "Packages every node must have installed, each at its pinned version (versions.packages): "
              "the version as the package manager lists it, or its upstream part, which matches any "
              "package revision (580.159.04 matches 580.159.04-0ubuntu1 and 580.159.04-1, not "
              "580.159.041; 580.159 matches no 580.159.04). An epoch is part of the pin "
              "(3:580.159.04 for 3:580.159.04-1.el9). The agent lists NVIDIA's packages only (names "
              "starting nvidia-, cuda-, libnvidia-, kmod-nvidia, ...): a pin on another package is "
              "reported as not installed.",
              {"nvidia-driver-580-server": "580.159.04", "nvidia-fabricmanager-580": "580.159.04"}),
    SchemaKey("packages.*", T_STR, None,
              "One package, keyed by its name as dpkg or rpm lists it: its pinned version. " + _VERSION_HINT,
              "580.159.04", pattern=r"\S+"),
    # --- validation (fleetops validate): floors overrides and what the audit requires ---
    SchemaKey("validation", T_MAP, None,
              "Performance validation (fleetops validate): floor overrides per GPU model, and "
              "whether the audit requires a current validation of every GPU.",
              {"require": "quick", "max_age_days": 7, "floors": {"NVIDIA H200": {"hbm_triad_gbps": 3500}}}),
    SchemaKey("validation.require", T_STR, None,
              "Level of validation every GPU must have passed and not outlived: 'quick' (a full "
              "one counts too) or 'full'. Absent: the audit does not ask for one.", "quick",
              choices=("quick", "full")),
    SchemaKey("validation.max_age_days", T_NUM, None,
              "Age (days) after which a validation no longer counts. Absent: the result's own "
              "expiry (7 days for quick, 30 for full).", 7, minimum=0.001, maximum=366, unit="d"),
    SchemaKey("validation.floors", T_MAP_OF, None,
              "Per GPU model (the name NVML reports, or a shipped floor model such as 'H200 SXM'): "
              "figures below which a GPU fails, replacing the shipped floors metric by metric. "
              "Models without shipped floors and unknown metrics are errors.",
              {"NVIDIA H200": {"hbm_triad_gbps": 3500}}),
    SchemaKey("validation.floors.*", T_MAP, None,
              "One GPU model's floors, keyed by metric name.", {"hbm_triad_gbps": 3500}),
    *_VALIDATION_FLOOR_KEYS,
    # --- the RDMA fabric beside the GPUs (checks' fabric family) ---
    *_FABRIC_KEYS,
    SchemaKey("thresholds", T_MAP, None, "Check thresholds; every one has a default.",
              {"pcie_replays_per_min": 31}, nullable=False),
    _threshold("ecc_dbe_volatile_crit", T_INT, 1,
               "Volatile uncorrectable (double-bit) ECC errors at or above which a GPU is critical.", minimum=1),
    _threshold("ecc_sbe_volatile_warn", T_INT, 10_000,
               "Volatile corrected (single-bit) ECC errors at or above which a GPU is warned about.", minimum=1),
    _threshold("ecc_sbe_volatile_crit", T_INT, 50_000_000,
               "Volatile corrected ECC errors at or above which a GPU is critical (GCM's limit).", minimum=1),
    _threshold("ecc_sbe_growth_per_hour_warn", T_NUM, 1000,
               "Corrected ECC errors per hour (between two snapshots) above which a GPU is warned about.",
               unit="errors/h"),
    _threshold("remapped_rows_uncorrectable_warn", T_INT, 512,
               "Rows remapped for uncorrectable errors at or above which a GPU is warned about "
               "(DCGM's limit).", unit="rows", minimum=1),
    _threshold("retired_pages_total_crit", T_INT, 63,
               "Retired pages (single- plus double-bit) at or above which a GPU is critical; "
               "pre-Hopper GPUs only (Hopper remaps rows instead).", unit="pages", minimum=1),
    _threshold("retired_pages_dbe_crit", T_INT, 16,
               "Pages retired for double-bit errors at or above which a GPU is critical.", unit="pages", minimum=1),
    _threshold("pcie_replays_per_min", T_NUM, 31,
               "PCIe replays per minute above which a GPU is warned about, for a Gen5 x16 link "
               "(DCGM: a 1e-12 bit error rate). Scaled to the link's current generation and width "
               "(Gen4 x16: 16/min, Gen5 x8: 16/min).", unit="replays/min"),
    _threshold("nvlink_crc_per_min_warn", T_NUM, 100,
               "NVLink CRC (flit) errors per minute, summed over one GPU's links, above which the "
               "GPU is warned about.", unit="errors/min"),
    _threshold("nvlink_crc_per_min_crit", T_NUM, 6000,
               "NVLink CRC errors per minute above which the GPU is critical (DCGM: 100/s).",
               unit="errors/min"),
    _threshold("nvlink_replays_per_min_warn", T_NUM, 0,
               "NVLink replay errors per minute above which the GPU is warned about (0: any new "
               "replay).", unit="errors/min"),
    _threshold("nvlink_recoveries_per_min_warn", T_NUM, 0,
               "NVLink recovery errors per minute above which the GPU is warned about (0: any new "
               "recovery).", unit="errors/min"),
    _threshold("nvlink_idle_window_s", T_NUM, 60,
               "Shortest interval between two snapshots over which an NVLink that carries no traffic "
               "is judged (the daemon keeps about a minute of snapshots); closer snapshots judge "
               "nothing.", unit="s", exclusive_minimum=True),
    _threshold("nvlink_idle_max_kib", T_NUM, 1024,
               "Data (TX plus RX) an up NVLink may move over the window and still count as idle.",
               unit="KiB"),
    _threshold("nvlink_idle_peer_min_kib", T_NUM, 1048576,
               "An idle link is reported only when the median of the GPU's other up links to the same "
               "kind of peer (NVSwitch, or the same GPU) moved at least this much over the window: "
               "a GPU whose links are all idle is an idle GPU.", unit="KiB"),
    _threshold("temp_slowdown_margin_c", T_NUM, 5,
               "Warn when the GPU temperature is within this many degrees of its slowdown "
               "temperature (critical at or above it).", unit="C", maximum=50),
    _threshold("temp_memory_warn_c", T_NUM, 85,
               "HBM temperature at or above which a GPU is warned about (critical at the GPU's own "
               "maximum memory temperature).", unit="C", minimum=30, maximum=120),
    _threshold("power_limit_tolerance_w", T_NUM, 1,
               "Difference between set and desired power limit tolerated as rounding.", unit="W", maximum=100),
    _threshold("xid_window_hours", T_NUM, 24,
               "XIDs this recent (or new since the previous snapshot) are reported.", unit="h", exclusive_minimum=True),
    _threshold("xid_storm_count", T_INT, 10,
               "Events of one XID code on one GPU within the window at or above which it is a "
               "storm (at least warn).", unit="events", minimum=1),
    _threshold("xid_hold_hours", T_NUM, 168,
               "A reset_gpu XID holds until a reset of its GPU is recorded (fleetops-agent reset) or "
               "the node reboots; a reset made outside fleetops is not seen, so the hold ends after "
               "this long.", unit="h", exclusive_minimum=True),
    _threshold("rate_min_interval_s", T_NUM, 10,
               "Shortest interval between two snapshots over which rates (PCIe replays, NVLink "
               "errors, ECC growth) are computed; closer snapshots report totals only.", unit="s", exclusive_minimum=True),
    _threshold("fabric_link_downed_crit", T_INT, 1,
               "Times an RDMA compute port's link_downed counter may grow between two snapshots before the "
               "node is critical (NVSentinel: any increase is fatal; GCM: critical on its own).",
               unit="events", minimum=1),
    _threshold("fabric_symbol_errors_per_s_warn", T_NUM, 10,
               "Symbol errors per second on an RDMA port above which it is warned about (NVSentinel's "
               "degraded).", unit="errors/s"),
    _threshold("fabric_symbol_errors_per_hour_crit", T_NUM, 120,
               "Symbol errors on an RDMA port within an hour (or per hour, over a longer interval) above "
               "which the node is critical (NVSentinel's fatal).", unit="errors/h"),
    _threshold("fabric_link_recoveries_per_min_warn", T_NUM, 5,
               "link_error_recovery events per minute on an RDMA port above which it is warned about "
               "(NVSentinel's degraded).", unit="events/min"),
    _threshold("fabric_flap_down_s", T_NUM, 25,
               "How long an RDMA port must stay down before coming back for the daemon to count a flap "
               "(gpud's definition).", unit="s", exclusive_minimum=True, maximum=3600),
    _threshold("fabric_flap_count", T_INT, 3,
               "Flaps of one port within the daemon's hour of samples that make it a flapping port "
               "(gpud: 3).", unit="flaps", minimum=1),
    _threshold("fabric_drop_down_s", T_NUM, 240,
               "How long an RDMA port must stay down, link_downed unchanged, to be a drop (gpud: 4 "
               "minutes).", unit="s", exclusive_minimum=True, maximum=3600),
    _threshold("fabric_drop_hold_s", T_NUM, 600,
               "How long a drop stays reported after the port came back (gpud: 10 minutes).", unit="s",
               maximum=3600),
)

SCHEMA_BY_PATH: Mapping[str, SchemaKey] = MappingProxyType({k.path: k for k in SCHEMA})


def schema_dicts() -> list[dict[str, Any]]:
    """``SCHEMA`` as plain dicts, in document order, for the docs generator."""
    return [k.to_dict() for k in SCHEMA]


_JSON_TYPES = {T_STR: "string", T_INT: "integer", T_NUM: "number", T_BOOL: "boolean"}
JSON_SCHEMA_ID = "https://fleetops.invalid/schema/baseline.json"


def _json_keys(value: Any) -> Any:
    """An example as JSON has it: mapping keys (XID codes) as text."""
    if isinstance(value, dict):
        return {str(k): _json_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_keys(v) for v in value]
    return value


def _json_key(key: SchemaKey) -> dict[str, Any]:
    out: dict[str, Any] = {"description": key.description}
    children = schema_children(key.path)
    if key.type in (T_MAP, T_MAP_OF, T_MAP_OF_XID, T_MAP_OF_VERSION) or children:
        out["type"] = "object"
        if key.type == T_MAP_OF_XID:  # keys are XID codes; JSON (and YAML tooling) sees them as text
            out["propertyNames"] = {"pattern": "^[1-9][0-9]*$"}
        if "*" in children:
            out["additionalProperties"] = _json_key(children["*"])
            if key.path == "gpu_models":  # the validator refuses a model fleetops does not know
                out["propertyNames"] = {"enum": _gpus.names()}
        else:
            out["properties"] = {name: _json_key(child) for name, child in children.items()}
            out["additionalProperties"] = False
    elif key.type == T_STR_LIST:
        out["type"] = "array"
        out["items"] = {"type": "string", "minLength": 1, "pattern": r"\S"}
    elif key.type == T_INT_LIST:
        out["type"] = "array"
        out["items"] = {"type": "integer", "minimum": 1}
        out["minItems"] = 1
    elif key.type in _JSON_TYPES:
        out["type"] = _JSON_TYPES[key.type]
    # any other type a key brings is described but not constrained here: the validator is the rule
    if key.minimum is not None:
        out["exclusiveMinimum" if key.exclusive_minimum else "minimum"] = key.minimum
    if key.maximum is not None:
        out["maximum"] = key.maximum
    if key.choices is not None:
        out["enum"] = list(key.choices)
    if key.pattern is not None:
        out["pattern"] = "^(?:" + key.pattern.lstrip("^").rstrip("$") + ")$"
    if key.unit:
        out["description"] += f" ({key.unit})"
    if key.default is not None:
        out["default"] = list(key.default) if isinstance(key.default, tuple) else key.default
    if key.example is not None:
        out["examples"] = [_json_keys(key.example)]
    if key.nullable and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"].append(None)
    return out


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of a baseline mapping, generated from ``SCHEMA``, for editors
    (YAML language servers) and the docs. It states types, ranges, choices and the known keys;
    ``from_mapping`` stays the rule (it also orders warn below crit and names file and line)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": JSON_SCHEMA_ID,
        "title": "fleetops baseline",
        "description": "The value of fleetops_baseline (group_vars/host_vars), or a standalone baseline file. "
        "Every key is optional; absent or null is not checked.",
        "type": "object",
        "properties": {k.name: _json_key(k) for k in SCHEMA if k.parent == ""},
        "additionalProperties": False,
    }


# Keys the generated example leaves out: each excludes a key the example sets (a layout needs
# the MIG mode the example turns off; mig.config_file names a file of the site's and excludes
# mig.layout).
EXAMPLE_ALONE = ("mig.layout", "mig.config_file", "mig.config", "gpu_models.*.mig.layout")


def schema_children(parent: str) -> dict[str, SchemaKey]:
    return {k.name: k for k in SCHEMA if k.parent == parent}
