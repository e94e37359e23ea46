"""``fleetops-agent holders``: which processes hold the GPU's device files, as ``fuser -v
/dev/nvidia*`` answers it but with each holder's PID, user and whole command in one JSON line.

The driver reload (the nvidia_driver role) asks it when ``modprobe -r nvidia`` left the module
loaded, so its failure names what to stop; read-only, stdlib only (``gpu/holders.py``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def register(sub: Any) -> None:
    about = "list the processes that hold the GPU's device files (from /proc/*/fd); changes nothing"
    p = sub.add_parser("holders", help=about, description=about)
    p.add_argument("--prefix", help="the device files' common start (default /dev/nvidia; sim: the state's)")
    p.add_argument("--state", help="simulator state file: its node's device files (default: $FLEETOPS_SIM_STATE)")
    p.add_argument("--pretty", action="store_true", help="indented JSON")
    p.add_argument("--json", action="store_true", help="JSON output (always on; accepted for scripts)")


def report(prefix: str) -> dict[str, Any]:
    from fleetops.gpu import holders

    found = [h for h in holders.scan(prefix) if h.pid != os.getpid()]
    return {
        "kind": "fleetops.holders/v1",
        "prefix": prefix,
        # not root: only this user's processes could be read, so an empty list proves nothing
        "complete": holders.readable(),
        "holders": [{**h.to_dict(), "line": h.describe()} for h in found],
    }


def run(args: Any) -> int:
    prefix = args.prefix
    if not prefix:
        state = args.state or os.environ.get("FLEETOPS_SIM_STATE")
        if state:
            from fleetops.sim import gpu as sim

            prefix = sim.device_prefix(state)
        else:
            from fleetops.gpu.holders import DEVICE_PREFIX

            prefix = DEVICE_PREFIX
    doc = report(prefix)
    sys.stdout.write(json.dumps(doc, indent=2 if args.pretty else None) + "\n")
    return 0
