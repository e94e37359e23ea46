"""Power caps across a simulated fleet: `fleetops apply power` (power_caps.yml through
ansible-runner, idempotent, check mode, verified, persisted) against the ad-hoc command a user
would otherwise run (`ansible all -m command -a "fleetops-agent set power ..."`), same fleet, same
forks, one process run. Prints each figure and the ratio.

    python bench/ansible_power_caps.py [--nodes 20] [--forks 20]     (root: starts sshd)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else (shutil.which(name) or name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--forks", type=int, default=20)
    parser.add_argument("--first-address", default="127.0.60.1")
    args = parser.parse_args()

    from fleetops.rollout.runner import run_playbook
    from fleetops.sim import fleet

    work = tempfile.mkdtemp(prefix="fleetops-bench-")
    directory = os.path.join(work, "fleet")
    import socket

    with socket.socket() as sock:
        sock.bind((args.first_address, 0))
        port = sock.getsockname()[1]
    info = fleet.up(args.nodes, directory, first_address=args.first_address, port=port)
    names = sorted(info["nodes"])
    inventory = os.path.join(directory, "inventory.yml")
    drifted = names[:: max(1, len(names) // 4)]
    figures: dict[str, float] = {}
    try:

        def playbook(check: bool) -> tuple[float, list[str]]:
            started = time.perf_counter()
            result = run_playbook(
                "power_caps.yml",
                [inventory],
                check=check,
                forks=args.forks,
                private_data_dir=os.path.join(work, "runner"),
            )
            assert result.ok, result.rows
            return time.perf_counter() - started, result.changed_hosts()

        def adhoc(dry_run: bool) -> float:
            cmd = [
                _tool("ansible"), "all", "-i", inventory, "-f", str(args.forks), "-m", "ansible.builtin.command",
                "-a", "fleetops-agent set power 700 --gpu all --json" + (" --dry-run" if dry_run else ""),
            ]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
            return time.perf_counter() - started

        figures["adhoc_dry_run_s"] = adhoc(True)
        figures["playbook_first_apply_s"], _ = playbook(False)  # writes the boot units everywhere
        for node in drifted:
            fleet.inject(directory, node, "power-cap-drift", 0)
        figures["playbook_check_s"], changed = playbook(True)
        assert sorted(changed) == sorted(drifted), (changed, drifted)
        figures["playbook_apply_s"], changed = playbook(False)
        assert sorted(changed) == sorted(drifted), (changed, drifted)
        figures["playbook_rerun_s"], changed = playbook(False)
        assert changed == [], changed
        figures["adhoc_apply_s"] = adhoc(False)
    finally:
        fleet.down(directory)
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.nodes} simulated nodes, forks {args.forks}, {len(drifted)} drifted")
    for key, value in figures.items():
        print(f"  {key:<20} {value:6.2f} s")
    print(
        f"  power_caps.yml check / ad-hoc dry run: {figures['playbook_check_s'] / figures['adhoc_dry_run_s']:.2f}x "
        "(the playbook also checks persistence mode, the boot-time unit and reports per GPU)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
