"""The desired state of a group of GPU nodes, and the thresholds the checks use.

A baseline is YAML: a standalone file, or the ``fleetops_baseline`` variable of an Ansible
inventory's ``group_vars``/``host_vars``. Every key is optional: a key that is absent (or
``null``) is not checked. ``thresholds`` are the exception: each has a default.

Layering: in an inventory, group baselines layer from parent to child. The host's levels are
``all``, then its groups in Ansible's order (depth first, then ``ansible_group_priority``, then
name: a parent before its children), then the host itself; at each level the inventory file's
inline vars come before its ``group_vars``/``host_vars`` files. ``layer`` merges them in that
order: keys a later level sets win, mappings (``thresholds``, ``mig``, ``pcie``, ``gpu_models``
and each model, ``packages``) merge key by key, lists (``services``,
``stray_process_allowlist``) replace, and an explicit ``null`` unsets the key for that level's
hosts. Each layer is validated on its
own (errors name its file and line); rules that relate two keys (warn below crit) are checked
on the merged result and blame the most specific level. The result remembers which level set
each key (``Baseline.level_of``), which ``fleetops baseline show`` prints. Ansible itself
replaces a dict variable, so a playbook that reads ``fleetops_baseline`` sees only the most
specific level's mapping: the roles get the layered one from ``fleetops`` (see the docs).

``SCHEMA`` describes every key (path, type, default, description, example). The validator is
driven by it, and the docs generator reads it, so the two cannot drift. Errors are
``BaselineError`` and name the source file, the key path (``thresholds.pcie_replays_per_min``)
and the line of the key.

Public API: ``load_file(path)``, ``from_mapping(data, source)``, ``merge(base, override)``,
``layer(layers)``, ``Baseline``, ``Thresholds``, ``SCHEMA``, ``schema_dicts()``,
``json_schema()``, ``flatten(baseline)``, ``BaselineError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

from fleetops.catalog import gpus as _gpus
from fleetops.catalog import mig as _mig_catalog
from fleetops.catalog import migparted as _migparted
from fleetops.validation import floors as _floors  # plain data, cheap for the agent's cold path
from fleetops.xid import catalog as _xid

WRAPPER_KEY = "fleetops_baseline"

SERVICE_PERSISTENCED = "nvidia-persistenced"
SERVICE_FABRICMANAGER = "nvidia-fabricmanager"


class BaselineError(ValueError):
    """A baseline that does not validate. ``source``, ``path`` and ``line`` say where."""

    def __init__(self, source: str, path: str, problem: str, line: int | None = None) -> None:
        self.source = source
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {path}: {problem}" if path else f"{where}: {problem}")


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

VALIDATION_FLOOR_METRICS: tuple[str, ...] = (*_floors.PER_GPU_METRICS, "p2p_gbps")
_FLOOR_UNITS = {"gbps": "GB/s", "tflops": "TFLOP/s"}
_VALIDATION_FLOOR_KEYS = tuple(
    SchemaKey(f"validation.floors.*.{m}", T_NUM, None,
              f"Floor for {m} (replaces the shipped one for this model).",
              _floors.SHIPPED["H200 SXM"].metric(m), minimum=0, unit=_FLOOR_UNITS.get(m.rsplit("_", 1)[-1]))
    for m in VALIDATION_FLOOR_METRICS
)

_VERSION_HINT = "Quote it so YAML keeps it as text."

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
              "Per GPU model (the name NVML reports, e.g. 'NVIDIA H200'): firmware versions and "
              "power limit. GPUs of a model not listed here are not checked for these.",
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
    children = _children(key.path)
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


def _children(parent: str) -> dict[str, SchemaKey]:
    return {k.name: k for k in SCHEMA if k.parent == parent}


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


def _validation(raw: Mapping[str, Any] | None) -> ValidationBaseline:
    raw = raw or {}
    floors: dict[str, dict[str, float]] = {}
    for name, metrics in (raw.get("floors") or {}).items():
        key = name if name in _floors.SHIPPED else (_floors.model_key(name) or name)
        floors.setdefault(key, {}).update({m: float(v) for m, v in (metrics or {}).items() if v is not None})
    return ValidationBaseline(require=raw.get("require"), max_age_days=raw.get("max_age_days"), floors=floors)


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
    xid_policy: Mapping[int, _xid.XidPolicy] = field(default_factory=dict)
    validation: ValidationBaseline = field(default_factory=ValidationBaseline)
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


# --- YAML with line numbers ------------------------------------------------------------


class _LineDict(dict[Any, Any]):
    """A mapping from YAML that remembers the line (1-based) of each of its keys."""

    __slots__ = ("duplicates", "key_lines", "line")

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}
        self.line: int | None = None
        self.duplicates: dict[Any, tuple[int, int]] = {}  # key -> (its line, first line)


def _make_loader(source: str) -> type:
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def construct_map(loader: Any, node: Any) -> Any:
        loader.flatten_mapping(node)
        data = _LineDict()
        data.line = node.start_mark.line + 1
        yield data
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:
                raise BaselineError(source, "", f"a mapping key must be a plain value, got {key!r}", line) from None
            if key in data.key_lines:  # reported by the validator, which knows the key path
                data.duplicates.setdefault(key, (line, data.key_lines[key]))
                continue
            data[key] = loader.construct_object(value_node, deep=False)
            data.key_lines[key] = line

    _Loader.add_constructor("tag:yaml.org,2002:map", construct_map)
    return _Loader


def read_yaml(text: str, source: str) -> Any:
    """``text`` as YAML (PyYAML's safe loader), every mapping remembering the line of each of its
    keys: what the validator reads to say where a bad key is. ``source`` names the text in the
    error for a key that is not a plain value. Raises PyYAML's errors for text that is not YAML."""
    import yaml

    return yaml.load(text, Loader=_make_loader(source))  # a SafeLoader subclass


def _key_line(mapping: Any, key: Any) -> int | None:
    """Line of ``key`` in ``mapping``, where the mapping came from ``read_yaml`` (PyYAML's start
    marks); None for a mapping from anywhere else."""
    lines = getattr(mapping, "key_lines", None)
    if lines and key in lines:
        return int(lines[key])
    return None


def _mapping_line(mapping: Any) -> int | None:
    line = getattr(mapping, "line", None)
    return line if isinstance(line, int) else None


# --- validation ------------------------------------------------------------------------


def _fmt_path(parent: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    return f'{parent}["{key}"]'


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}".replace("True", "true").replace("False", "false")
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class _Validator:
    def __init__(self, source: str) -> None:
        self.source = source
        self.origins: dict[str, tuple[str, int | None]] = {}

    def fail(self, path: str, problem: str, line: int | None) -> NoReturn:
        raise BaselineError(self.source, path, problem, line)

    def mapping(self, data: Any, schema_parent: str, shown_parent: str, line: int | None) -> dict[str, Any]:
        """Validate one mapping level; returns a plain nested dict of the explicit keys."""
        if not isinstance(data, dict):
            self.fail(shown_parent or "(top level)", f"expected a mapping, got {_type_name(data)}", line)
        for key, (dup_line, first) in (getattr(data, "duplicates", None) or {}).items():
            self.fail(_fmt_path(shown_parent, str(key)), f"duplicate key (first at line {first})", dup_line)
        children = _children(schema_parent)
        out: dict[str, Any] = {}
        for key, value in data.items():
            kline = _key_line(data, key)
            if schema_parent == "xid_policy":
                key = self.xid_code(key, shown_parent, kline)
            if not isinstance(key, str):
                self.fail(_fmt_path(shown_parent, str(key)), f"keys are text, got {_type_name(key)}", kline)
            spec: SchemaKey | None
            if "*" in children:
                spec = children["*"]
                shown = _fmt_path(shown_parent, key)
                schema_path = f"{schema_parent}.*" if schema_parent else "*"
                free_key_problem = _FREE_KEY_CHECKS.get(schema_parent)
                problem = free_key_problem(key) if free_key_problem else None
                if problem:
                    self.fail(shown, problem, kline)
            else:
                spec = children.get(key)
                shown = _fmt_path(shown_parent, key)
                schema_path = spec.path if spec else ""
                if spec is None:
                    known = sorted(children)
                    close = difflib.get_close_matches(key, known, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    where = f" under {shown_parent}" if shown_parent else ""
                    self.fail(shown, f"unknown key{where}{hint}; known keys: {', '.join(known)}", kline)
            self.origins[shown] = (self.source, kline)
            out[key] = self.value(value, spec, schema_path, shown, kline)
        return out

    def xid_code(self, key: Any, shown_parent: str, line: int | None) -> str:
        """An ``xid_policy`` key: YAML reads ``31:`` as a number, a quoted ``"31":`` as text."""
        text = str(key).strip() if not isinstance(key, bool) else ""
        if not re.fullmatch(r"[1-9][0-9]{0,4}", text):
            self.fail(_fmt_path(shown_parent, str(key)), "expected an XID code (a positive number)", line)
        return text

    def value(self, value: Any, spec: SchemaKey, schema_path: str, shown: str, line: int | None) -> Any:
        if value is None:
            if spec.nullable:
                return None
            self.fail(shown, f"expected {spec.type}, got null (this key cannot be unset)", line)
        t = spec.type
        if t in (T_MAP, T_MAP_OF, T_MAP_OF_XID, T_MAP_OF_VERSION):
            # gpu_models and packages (free keys), each model, mig, pcie, thresholds
            return self.mapping(value, schema_path, shown, _mapping_line(value) or line)
        if t == T_STR:
            if not isinstance(value, str):
                hint = ""
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    hint = f": quote it (\"{value}\") so YAML keeps it as text"
                self.fail(shown, f"expected a string, got {_type_name(value)}{hint}", line)
            value = str(value)
        elif t == T_INT:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(shown, f"expected an integer, got {_type_name(value)}{_template_hint(value)}", line)
            value = int(value)
        elif t == T_NUM:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                self.fail(shown, f"expected a number, got {_type_name(value)}{_template_hint(value)}", line)
            value = float(value)
        elif t == T_BOOL:
            if not isinstance(value, bool):
                self.fail(shown, f"expected true or false, got {_type_name(value)}{_template_hint(value)}", line)
            value = bool(value)
        elif t == T_INT_LIST:
            if not isinstance(value, (list, tuple)) or not value:
                self.fail(shown, f"expected a non-empty list of integers, got {_type_name(value)}", line)
            numbers = []
            for i, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                    self.fail(f"{shown}[{i}]", f"expected a positive integer, got {_type_name(item)}", line)
                numbers.append(int(item))
            return numbers
        elif t == T_STR_LIST:
            if not isinstance(value, (list, tuple)):
                self.fail(shown, f"expected a list of strings, got {_type_name(value)}", line)
            items = []
            for i, item in enumerate(value):
                if not isinstance(item, str) or not item.strip():
                    self.fail(f"{shown}[{i}]", f"expected a non-empty string, got {_type_name(item)}", line)
                items.append(str(item))
            if schema_path in ("mig.layout", "gpu_models.*.mig.layout"):
                if not items:
                    self.fail(shown, "expected at least one profile (mig.mode: false turns MIG off)", line)
                problem = _layout_problem(shown, items)
                if problem:
                    self.fail(shown, problem, line)
            return items
        problem = _range_problem(spec, value)
        if problem is None and schema_path == "gpu_models.*.power_limit_w":
            problem = _model_power_problem(shown, value)
        if problem:
            self.fail(shown, problem, line)
        if spec.choices is not None and value not in spec.choices:
            self.fail(shown, f"must be one of {', '.join(map(str, spec.choices))}; got {value!r}", line)
        if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
            self.fail(shown, f"{value!r} does not match {spec.pattern}", line)
        return value


def _range_problem(spec: SchemaKey, value: Any) -> str | None:
    """The key's range, stated whole (both ends, and its unit) whichever end is crossed."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    low, high = spec.minimum, spec.maximum
    below = low is not None and (value <= low if spec.exclusive_minimum else value < low)
    above = high is not None and value > high
    if not (below or above):
        return None
    unit = f" {spec.unit}" if spec.unit else ""
    if low is not None and high is not None:
        bound = f"between {low:g} and {high:g}{unit}" if not spec.exclusive_minimum else \
            f"above {low:g} and at most {high:g}{unit}"
    elif low is not None:
        bound = f"above {low:g}{unit}" if spec.exclusive_minimum else f"at least {low:g}{unit}"
    else:
        bound = f"at most {high:g}{unit}"
    return f"must be {bound}, got {value:g}"


def _model_power_problem(shown: str, value: float) -> str | None:
    """A model's power limit above the board's maximum: NVML refuses to set it."""
    m = re.match(r'gpu_models\["(.+?)"\]', shown)
    known = _gpus.known(m.group(1)) if m else None
    if known is None or value <= known.max_power_w:
        return None
    return f"must be at most {known.max_power_w:g} W, the maximum power limit of {known.name}; got {value:g}"


def _gpu_model_problem(name: str) -> str | None:
    """A ``gpu_models`` key must be a product name NVML reports for a model fleetops knows: any
    other key matches no GPU, and the checks it pins (firmware, power limit, MIG layout) would
    silently check nothing."""
    if _gpus.known(name) is not None:
        return None
    known = _gpus.names()
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown GPU model {name!r}{hint}: it would match no GPU, and its firmware and power "
            f"limit would not be checked; known models (the name NVML reports): {', '.join(known)}")


def _floor_model_problem(name: str) -> str | None:
    """A ``validation.floors`` key must name a model with shipped floors: an override for a
    model fleetops has no floors for would silently judge nothing."""
    if name in _floors.SHIPPED or _floors.model_key(name) is not None:
        return None
    close = difflib.get_close_matches(name, list(_floors.SHIPPED), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"no shipped floors for GPU model {name!r}{hint}; models with floors: "
            f"{', '.join(_floors.SHIPPED)} (or their NVML names, e.g. 'NVIDIA H200')")


# Free-key mappings whose keys are checked: schema parent -> problem with a key, or None.
_FREE_KEY_CHECKS: Mapping[str, Any] = MappingProxyType({
    "validation.floors": _floor_model_problem,
    "gpu_models": _gpu_model_problem,
})


def _template_hint(value: Any) -> str:
    if isinstance(value, str) and "{{" in value:
        return " (Jinja templates are not rendered in fleetops_baseline)"
    return ""


# Pairs (warn, crit) that must be ordered.
_ORDERED = (
    ("ecc_sbe_volatile_warn", "ecc_sbe_volatile_crit"),
    ("nvlink_crc_per_min_warn", "nvlink_crc_per_min_crit"),
)


def _build(
    raw: Mapping[str, Any],
    source: str,
    origins: Mapping[str, tuple[str, int | None]],
    recent: Mapping[str, Any] | None = None,
    levels: Mapping[str, str] | None = None,
) -> Baseline:
    """``recent``: the origins of the last layer merged, blamed first for a conflict."""
    th_raw = raw.get("thresholds") or {}
    thresholds = Thresholds(**{k: v for k, v in th_raw.items()})
    for low, high in _ORDERED:
        if getattr(thresholds, low) > getattr(thresholds, high):
            candidates = [f"thresholds.{k}" for k in (high, low) if k in th_raw]
            fresh = [c for c in candidates if recent is not None and c in recent]
            path = (fresh or candidates or [f"thresholds.{low}"])[0]
            src, line = origins.get(path, (source, None))
            raise BaselineError(
                src, path,
                f"{low} ({getattr(thresholds, low):g}) must not exceed {high} ({getattr(thresholds, high):g})",
                line,
            )
    models = {
        name: GpuModelBaseline(**{k: v for k, v in (spec or {}).items() if k != "mig"},
                               mig=_mig(spec.get("mig"), source, origins, f'gpu_models["{name}"].mig')
                               if (spec or {}).get("mig") is not None else None)
        for name, spec in (raw.get("gpu_models") or {}).items()
    }
    mig = _mig(raw.get("mig"), source, origins, "mig")
    pcie = PcieBaseline(**(raw.get("pcie") or {}))
    nvlinks = raw.get("nvlinks_per_gpu")
    if raw.get("services") is not None:
        services = tuple(raw["services"])
    else:
        services = (SERVICE_PERSISTENCED,) + ((SERVICE_FABRICMANAGER,) if nvlinks else ())
    allow = raw.get("stray_process_allowlist")
    policy = _xid_policy(raw.get("xid_policy") or {}, source, origins)
    driver_raw = raw.get("driver") or {}
    branches = driver_raw.get("branches")
    driver = DriverBaseline(branches=tuple(branches) if branches is not None else None,
                            flavour=driver_raw.get("flavour"))
    return Baseline(
        driver_version=raw.get("driver_version"),
        cuda_driver_version=raw.get("cuda_driver_version"),
        fabric_manager_version=raw.get("fabric_manager_version"),
        gpu_models=models,
        power_limit_w=raw.get("power_limit_w"),
        persistence_mode=raw.get("persistence_mode"),
        ecc_mode=raw.get("ecc_mode"),
        compute_mode=raw.get("compute_mode"),
        mig=mig,
        gpu_count=raw.get("gpu_count"),
        pcie=pcie,
        nvlinks_per_gpu=nvlinks,
        expected_topology=raw.get("expected_topology"),
        stray_process_allowlist=tuple(allow) if allow is not None else None,
        services=services,
        driver=driver,
        packages={name: v for name, v in (raw.get("packages") or {}).items() if v is not None},
        thresholds=thresholds,
        xid_policy=policy,
        validation=_validation(raw.get("validation")),
        source=source,
        raw=_plain(raw),
        origins=dict(origins),
        levels=dict(levels or {}),
    )


def _mig(raw: Mapping[str, Any] | None, source: str, origins: Mapping[str, tuple[str, int | None]],
         path: str) -> MigBaseline:
    """The rules between mig keys, and the mig-parted config read and selected (so a bad file
    or a config name it lacks is an error at load time, naming the baseline key's line)."""
    raw = raw or {}

    def fail(key: str, problem: str) -> NoReturn:
        src, line = origins.get(f"{path}.{key}", (source, None))
        raise BaselineError(src, f"{path}.{key}", problem, line)

    layout = raw.get("layout")
    if layout is not None and raw.get("mode") is False:
        fail("layout", "a layout needs MIG mode: mig.mode is false")
    if layout is not None and raw.get("config_file") is not None:
        fail("config_file", "give the layout once: mig.layout or mig.config_file, not both")
    if (raw.get("config_file") is None) != (raw.get("config") is None):
        fail("config" if raw.get("config") is None else "config_file",
             "mig.config_file and mig.config go together (the file, and the config in it to use)")
    parted = None
    if raw.get("config_file") is not None:
        import os

        src, line = origins.get(f"{path}.config_file", (source, None))
        where = raw["config_file"]
        if not os.path.isabs(where) and src and os.path.exists(src):
            where = os.path.join(os.path.dirname(os.path.abspath(src)), where)
        try:
            parsed = _migparted.load(where)
        except _migparted.MigPartedError as exc:
            raise BaselineError(src, f"{path}.config_file", str(exc), line) from None
        try:
            parted = parsed.select(raw["config"])
        except _migparted.MigPartedError as exc:
            fail("config", str(exc))
    return MigBaseline(mode=raw.get("mode"), profile=raw.get("profile"),
                       layout=tuple(_mig_catalog.normalize(p) for p in layout) if layout is not None else None,
                       config_file=raw.get("config_file"), config=raw.get("config"), parted=parted)


def _layout_problem(shown: str, items: list[str]) -> str | None:
    """A layout's profile names against the model's table (``gpu_models["NVIDIA H200"]``),
    or, for the group's layout, against every table fleetops has."""
    m = re.match(r'gpu_models\["(.+?)"\]', shown)
    table = _mig_catalog.table_for(m.group(1)) if m else None
    tables = [table] if table is not None else ([] if m else list(_mig_catalog.TABLES))
    if not tables:
        return None  # a model without a table: its GPU's own table judges the names
    for name in items:
        if not any(t.get(name) for t in tables):
            if table is not None:
                return _mig_catalog.unknown_profile_message(name, table)
            known = sorted({n for t in tables for n in t.names()})
            close = difflib.get_close_matches(_mig_catalog.normalize(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown MIG profile {name!r}{hint}; known: {', '.join(known)}"
    return None


def _xid_policy(
    raw: Mapping[str, Any], source: str, origins: Mapping[str, tuple[str, int | None]]
) -> dict[int, _xid.XidPolicy]:
    out: dict[int, _xid.XidPolicy] = {}
    for code, spec in raw.items():
        spec = spec or {}
        esc = spec.get("escalate")
        escalation = None
        if esc:
            missing = [k for k in ("count", "within_s") if esc.get(k) is None]
            if missing:
                path = f'xid_policy["{code}"].escalate'
                src, line = origins.get(path, (source, None))
                raise BaselineError(src, path, f"needs {' and '.join(missing)}", line)
            base = _xid.lookup(int(code))
            escalation = _xid.Escalation(
                int(esc["count"]), float(esc["within_s"]), esc.get("severity") or "crit",
                esc.get("action") or spec.get("action") or base.action,
            )
        out[int(code)] = _xid.XidPolicy(spec.get("severity"), spec.get("action"), escalation)
    return out


def from_mapping(data: Any, source: str) -> Baseline:
    """Validate a baseline mapping (the value of ``fleetops_baseline``, or a document holding
    that key) and build a ``Baseline``. ``source`` names where it came from, for errors.
    ``None`` or an empty mapping is a baseline with nothing pinned."""
    if data is None:
        data = {}
    if isinstance(data, dict) and WRAPPER_KEY in data:
        data = data[WRAPPER_KEY]
        if data is None:
            data = {}
    validator = _Validator(source)
    raw = validator.mapping(data, "", "", _mapping_line(data))
    return _build(raw, source, validator.origins)


def load_file(path: str) -> Baseline:
    """Load a baseline from YAML: a standalone baseline, or a group_vars file whose
    ``fleetops_baseline`` key holds it (the file's other variables are ignored).

    A file that is a JSON object (JSON is YAML too) is read without PyYAML: the node agent's
    environment has no PyYAML (nodes get only the agent and NVML's bindings), and the
    fleetops_agent role writes the daemon's baseline as JSON for that reason."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise BaselineError(path, "", f"cannot read: {exc.strerror or exc}") from exc
    return load_text(text, path)


def load_text(text: str, path: str) -> Baseline:
    """``load_file`` for a baseline already read (``fleetops-agent check --baseline -`` reads
    stdin); ``path`` names it in errors and as the baseline's source."""
    if text.lstrip().startswith("{"):
        import json

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BaselineError(path, "", f"not valid JSON: {exc.msg}", exc.lineno) from exc
        return from_mapping(doc, path)
    try:
        import yaml
    except ModuleNotFoundError as exc:
        raise BaselineError(path, "", "PyYAML is not installed here: give the baseline as JSON, "
                            "or install PyYAML beside the agent") from exc
    try:
        data = read_yaml(text, path)
    except BaselineError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise BaselineError(path, "", f"not valid YAML: {exc.problem or exc}", line) from exc
    except yaml.YAMLError as exc:
        raise BaselineError(path, "", f"not valid YAML: {exc}") from exc
    if data is None:
        return from_mapping({}, path)
    if not isinstance(data, dict):
        raise BaselineError(path, "", f"a baseline is a mapping, got {_type_name(data)}", 1)
    return from_mapping(data, path)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value  # scalars and lists replace; an explicit null unsets
    return out


def merge(base: Baseline, override: Baseline) -> Baseline:
    """Layer ``override`` (a more specific group) over ``base``: keys ``override`` sets win,
    mappings (thresholds, mig, pcie, gpu_models and each model, packages) merge key by key, lists
    replace, and an explicit ``null`` unsets. Defaults never override explicit values."""
    raw = _deep_merge(_plain(base.raw), _plain(override.raw))
    origins = {**base.origins, **override.origins}
    sources = [s for s in (base.source, override.source) if s and s != "<defaults>"]
    return _build(raw, " + ".join(sources) or "<defaults>", origins, recent=override.origins,
                  levels={**base.levels, **override.levels})


def layer(layers: Sequence[tuple[str, str, Any]]) -> Baseline:
    """Merge baselines given as ``(level, source, mapping)`` from the least to the most specific
    (an inventory's ``all``, its groups parent to child, the host): see the module docstring.
    ``source`` is the file each came from, for errors; ``level`` is remembered per key. No
    layers is a baseline with nothing pinned."""
    raw: dict[str, Any] = {}
    origins: dict[str, tuple[str, int | None]] = {}
    levels: dict[str, str] = {}
    recent: dict[str, tuple[str, int | None]] = {}
    for level, source, data in layers:
        if isinstance(data, dict) and WRAPPER_KEY in data:
            data = data[WRAPPER_KEY]
        if data is None:
            data = {}
        validator = _Validator(source)
        one = validator.mapping(data, "", "", _mapping_line(data))
        raw = _deep_merge(raw, one)
        origins.update(validator.origins)
        levels.update({path: level for path in validator.origins})
        recent = validator.origins
    sources = list(dict.fromkeys(source for _, source, _ in layers))
    return _build(raw, " + ".join(sources) or "<defaults>", origins, recent=recent, levels=levels)


def flatten(b: Baseline) -> list[tuple[str, Any]]:
    """The keys a baseline sets explicitly, as ``(path, value)`` in document order: leaves, and
    mappings set to ``null`` or left empty. Paths are those errors and ``origin`` use
    (``gpu_models["NVIDIA H200"].power_limit_w``)."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, sub in value.items():
                walk(_fmt_path(prefix, str(key)), sub)
        else:
            out.append((prefix, value))

    for key, value in b.raw.items():
        walk(_fmt_path("", key), value)
    return out


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


__all__ = [
    "DEFAULT_THRESHOLDS",
    "SCHEMA",
    "SCHEMA_BY_PATH",
    "Baseline",
    "BaselineError",
    "DriverBaseline",
    "GpuModelBaseline",
    "MigBaseline",
    "PcieBaseline",
    "SchemaKey",
    "Thresholds",
    "flatten",
    "ValidationBaseline",
    "from_mapping",
    "json_schema",
    "layer",
    "load_file",
    "load_text",
    "merge",
    "schema_dicts",
]
