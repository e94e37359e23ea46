"""``fleetops-agent mig apply``: the plan, the change under the lock, and the read-back.

The contract (flags, statuses, report fields, exit codes) is described in ``fleetops.agent.mig``.
The two ways to read and change a node's MIG state are behind one small interface (``MigOps``,
in ``ops``): the simulator's state file (``SimMig``) and NVML (``NvmlMig``, through
``fleetops.gpu.nvml``'s MIG helpers). The planner (``plan``) is a pure function of what they
read; ``apply`` carries the plan out and reads it back. Callers import this package; the
submodules import one another directly.
"""

from fleetops.agent.mig_apply.apply import main_args, run, signal_name
from fleetops.agent.mig_apply.ops import OFF, GpuMig, Inst, MigChangeError, MigOps, NvmlMig, SimMig, make_ops
from fleetops.agent.mig_apply.plan import Source, Want, parse_layout, pending_detail, plan, plan_gpu

__all__ = [
    "OFF",
    "GpuMig",
    "Inst",
    "MigChangeError",
    "MigOps",
    "NvmlMig",
    "SimMig",
    "Source",
    "Want",
    "main_args",
    "make_ops",
    "parse_layout",
    "pending_detail",
    "plan",
    "plan_gpu",
    "run",
    "signal_name",
]
