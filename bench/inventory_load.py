"""How long ``inventory.load`` takes on a 1000-host INI inventory with a group_vars file,
warm (imports done) and in a fresh process (ansible's imports included). Usage:
  python bench/inventory_load.py [--hosts 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetops.fleet import inventory


def write_inventory(directory: str, hosts: int) -> str:
    lines = ["[gpu]"] + [
        f"gpu{i:04d} ansible_host=10.{i // 250}.0.{i % 250 + 1} ansible_port=22" for i in range(hosts)
    ]
    lines += ["[gpu:vars]", "ansible_user=ops"]
    path = os.path.join(directory, "big.ini")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.makedirs(os.path.join(directory, "group_vars"))
    with open(os.path.join(directory, "group_vars", "gpu.yml"), "w") as fh:
        fh.write("fleetops_baseline: {driver_version: '580.159.04'}\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = write_inventory(d, args.hosts)
        inventory.load(path)  # warm-up: imports
        warm = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            hosts = inventory.load(path, "gpu")
            warm.append(time.perf_counter() - t0)
            assert len(hosts) == args.hosts
        code = (
            "import time; t=time.perf_counter(); from fleetops.fleet import inventory; "
            f"inventory.load({path!r}); print(time.perf_counter()-t)"
        )
        cold = [
            float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(args.runs)
        ]
    print(f"{args.hosts}-host inventory, {args.runs} runs: warm median {statistics.median(warm):.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f}); fresh process median {statistics.median(cold):.3f} s "
          f"(min {min(cold):.3f}, max {max(cold):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
