"""NVML calls one daemon tick makes (the NVML backend's light read), counted with the fake NVML
of the unit tests, for a node whose GPUs have ``--links`` NVLinks each.

    python bench/light_read_calls.py [--links 18] [--ticks 100]

Prints the calls per tick, the field ids carried by each ``nvmlDeviceGetFieldValues`` call, the
ring values per GPU, and the mean time per tick against the fake (Python overhead only: the fake
reads a JSON file per call, a real driver does not). Run it with ``PYTHONPATH`` pointing at
another checkout to count that checkout's light read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "unit"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", type=int, default=18, help="NVLinks per GPU (0: NVLink not supported)")
    parser.add_argument("--ticks", type=int, default=100)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as ctl:
        json.dump({"mode": "ok", "temp": 40, "nvlinks": args.links}, ctl)
    os.environ["FAKE_NVML_CONTROL"] = ctl.name
    os.environ["FLEETOPS_AGENT_NVML_MODULE"] = "fake_nvml"
    try:
        from fleetops.gpu.nvml.access import NvmlAccess

        backend = NvmlAccess()
        fake = backend.N
        sizes: list[int] = []
        real = fake.nvmlDeviceGetFieldValues

        def counted(h: Any, ids: list[Any]) -> Any:
            sizes.append(len(ids))
            return real(h, ids)

        fake.nvmlDeviceGetFieldValues = counted
        backend.light()  # NVML init and the link count: once, not per tick
        fake.reset_calls()
        sizes.clear()
        start = time.perf_counter()
        for _ in range(args.ticks):
            values, _ = backend.light()
        elapsed_ms = (time.perf_counter() - start) / args.ticks * 1000.0
        gpus = len(values)
        calls = fake.calls()
        per_tick = sum(calls.values()) / args.ticks
        print(f"{gpus} GPUs x {args.links} NVLinks: {per_tick:.0f} NVML calls per tick "
              f"({per_tick / gpus:.0f} per GPU: " + ", ".join(f"{k} {v / args.ticks / gpus:g}" for k, v in
                                                            sorted(calls.items())) + ")")
        print(f"field ids per nvmlDeviceGetFieldValues call: {sorted(set(sizes))}; "
              f"ring values per GPU: {len(next(iter(values.values())))}")
        print(f"{elapsed_ms:.2f} ms per tick against the fake (loaded machine; not a driver figure)")
    finally:
        os.unlink(ctl.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
