"""Where the quick validation's time goes on one GPU, to bound it on an 8-GPU node.

A workload only (no GPU setting is changed). In one process: CUDA and the backend started, then
the quick per-GPU tests on GPU 0 twice. The first pass carries the per-process start (context,
cuBLAS, fp8 kernels loaded); the second is what each further GPU of the node adds beyond its own
context creation. Also the whole-process ``fleetops-agent validate --level quick`` for comparison.

    python3 bench/validate_timing.py [--backend torch|cupy] > timing.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["torch", "cupy"], default="torch")
    args = ap.parse_args()
    doc: dict[str, Any] = {"backend": args.backend}
    t0 = time.monotonic()
    if args.backend == "torch":
        import torch

        torch.cuda.init()
        torch.zeros(1, device="cuda:0")
        from fleetops.validation.node import torchbackend as mod
    else:
        import cupy

        cupy.zeros(1)
        from fleetops.validation.node import cupybackend as mod  # type: ignore[no-redef]
    doc["import_and_context_s"] = round(time.monotonic() - t0, 3)
    passes = []
    for _ in range(2):
        t = time.monotonic()
        tests = mod.run_gpu(0, "quick", None)  # no telemetry window: the time alone
        passes.append({"seconds": round(time.monotonic() - t, 3),
                       "tests": sorted(k for k, v in tests.items() if isinstance(v, list))})
    doc["run_gpu_passes"] = passes
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", "from fleetops.agent.main import entry; entry()", "validate",
                          "--level", "quick", "--backend", args.backend, "--json"],
                         check=False, capture_output=True, text=True)
    doc["agent_validate_quick_s"] = round(time.monotonic() - t, 3)
    doc["agent_validate_rc"] = out.returncode
    if out.returncode == 0:
        result = json.loads(out.stdout)
        doc["agent_reported_duration_s"] = result.get("duration_s")
    else:
        doc["agent_stderr"] = out.stderr[-1500:]
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
