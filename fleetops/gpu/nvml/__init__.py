"""The NVML backend, through nvidia-ml-py (``pynvml``): ``core`` (the NVML module and the one
door to it), ``snapshot`` (``collect_into``: the full snapshot of a node), ``topology`` (NVLinks,
fabric, affinity, GPU-to-GPU topology), ``mig`` (MIG reads, the daemon's light MIG sample, and
``MigControl``). ``pynvml`` is imported inside functions only: importing this package costs
nothing.

The host paths the readers open (``snapshot.PROC``, ``topology.SYSFS_PCI``) are not exported
here: a test points them elsewhere in the module that reads them."""

from fleetops.gpu.nvml.core import (
    LOST,
    NVML_MODULE_ENV,
    NvmlUnavailable,
    field_value,
    load_module,
    reason_of,
)
from fleetops.gpu.nvml.mig import (
    CI_PROFILE_FOR_SLICES,
    MIG_PLACEMENTS_MAX,
    RELEASES,
    MigControl,
    MigControlError,
    mig_sample,
    release_process,
)
from fleetops.gpu.nvml.snapshot import (
    COMPUTE_MODES,
    FIELD_IDS,
    RECOVERY_ACTIONS,
    SECTIONS,
    collect_into,
    cuda_version,
)
from fleetops.gpu.nvml.topology import (
    FABRIC_STATES,
    LINK_COUNTERS,
    LINK_ERROR_FIELDS,
    LINK_TRAFFIC,
    REMOTE_TYPES,
    TOPO_LEVELS,
    cpu_list,
)

__all__ = [
    "CI_PROFILE_FOR_SLICES",
    "COMPUTE_MODES",
    "FABRIC_STATES",
    "FIELD_IDS",
    "LINK_COUNTERS",
    "LINK_ERROR_FIELDS",
    "LINK_TRAFFIC",
    "LOST",
    "MIG_PLACEMENTS_MAX",
    "NVML_MODULE_ENV",
    "RECOVERY_ACTIONS",
    "RELEASES",
    "REMOTE_TYPES",
    "SECTIONS",
    "TOPO_LEVELS",
    "MigControl",
    "MigControlError",
    "NvmlUnavailable",
    "collect_into",
    "cpu_list",
    "cuda_version",
    "field_value",
    "load_module",
    "mig_sample",
    "reason_of",
    "release_process",
]
