"""``fleetops-agent mig apply``: the plan, the change under the lock, and the read-back.

The contract (flags, statuses, report fields, exit codes) is described in ``fleetops.agent.mig``.
The node's MIG state is read and changed through ``MigOps`` (in ``ops``), on the GPU access the
reset flow's backend holds (``GpuAccess``'s ``mig_*`` methods: the simulator's state file, or
NVML through ``fleetops.gpu.nvml``'s ``MigControl``). The planner (``plan``) is a pure function of what they
read; ``apply`` carries the plan out and reads it back. Callers import this package; the
submodules import one another directly.
"""

from fleetops.agent.mig_apply.apply import main_args, run, signal_name
from fleetops.agent.mig_apply.ops import OFF, GpuMig, Inst, MigChangeError, MigOps, make_ops
from fleetops.agent.mig_apply.plan import Source, Want, parse_layout, pending_detail, plan, plan_gpu

__all__ = [
    "OFF",
    "GpuMig",
    "Inst",
    "MigChangeError",
    "MigOps",
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
