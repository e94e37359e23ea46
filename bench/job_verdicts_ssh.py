"""Job verdicts over real SSH: seeded jobs on a simulated fleet, judged by ``fleetops job``.

The same question as ``bench/job_verdicts.py``, asked the way an operator asks it: a simulated
fleet with its resident daemon (``sim up --daemon``: one sample every 2 s), each job started by
``fleetops sim job start --profile P --seed S`` (the shipped prolog over SSH, then the workload on
the job's GPUs), every job running side by side for real time, then ``fleetops job JOBID
--format json`` (every node asked over SSH for ``fleetops-agent job show``) for each. Per seed,
one job of every profile on four GPUs of a node (two jobs a node), plus one straggler job on two
nodes (four nodes a seed) (the slow GPU on the first, ``--straggler-elsewhere`` on the second). Counted per profile:

- exact: jobs whose verdicts are exactly the expected set (none for steady; the straggler's the
  GPU the simulator made slow, on its node);
- false: verdicts given that were not expected; missed: expected verdicts not given.

Needs root and sshd, as the simulated fleet does; talks to 127.0.71.0/24 only.

    .venv/bin/python bench/job_verdicts_ssh.py --seeds 4
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetops.sim import fleet  # noqa: E402
from fleetops.sim import gpu as sim  # noqa: E402

CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = "127.0.71.1"
CODES = {"steady": None, "straggler": "straggler", "nvlink-unused": "nvlink_unused", "input-bound": "input_bound",
         "cpu-starved": "cpu_starved"}
HALVES = ("0,1,2,3", "4,5,6,7")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env)


def plan(seeds: int, first_seed: int) -> list[dict[str, Any]]:
    """Every job: id, profile, seed and its parts [(node, gres ids, straggler elsewhere)]. Four
    nodes a seed: the five one-node jobs on halves of the first three, the two-node straggler on
    the third's other half and the fourth's first."""
    jobs: list[dict[str, Any]] = []
    for k, seed in enumerate(range(first_seed, first_seed + seeds)):
        base = 4 * k + 1
        for slot, profile in enumerate(CODES):
            jobs.append({"id": str(5000 + len(jobs)), "profile": profile, "seed": seed,
                         "parts": [(f"node{base + slot // 2:03d}", HALVES[slot % 2], False)]})
        jobs.append({"id": str(5000 + len(jobs)), "profile": "straggler", "seed": seed, "two_nodes": True,
                     "parts": [(f"node{base + 2:03d}", HALVES[1], False), (f"node{base + 3:03d}", HALVES[0], True)]})
    return jobs


def expected(info: dict[str, Any], job: dict[str, Any]) -> set[tuple[str, str, tuple[int, ...]]]:
    code = CODES[job["profile"]]
    if code is None:
        return set()
    if code == "straggler":
        node = job["parts"][0][0]
        state = sim.read_state(info["nodes"][node]["state"])
        slow = sim.straggler_uuid(state, job["id"])
        return {(code, node, tuple(int(g["index"]) for g in state["gpus"] if g["uuid"] == slow))}
    node, gpus, _ = job["parts"][0]
    return {(code, node, tuple(int(i) for i in gpus.split(",")))}


def verdicts(doc: dict[str, Any]) -> set[tuple[str, str, tuple[int, ...]]]:
    return {(v["code"], v["node"], tuple(sorted(g["index"] for g in v["gpus"]))) for v in doc["diagnosis"]["verdicts"]}


def judged(env: dict[str, str], inventory: str, job_id: str) -> dict[str, Any] | None:
    done = cli(env, "job", job_id, "-i", inventory, "--format", "json")
    try:
        doc: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        return None
    d = doc.get("diagnosis") or {}
    if d.get("seconds", 0) < 125 or any(g["samples"] < 35 for g in d.get("gpus", [])) \
            or any(c["samples"] < 35 for c in d.get("cpu", [])):
        return None
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--wait", type=float, default=900.0, help="the longest wait for every job's samples (s)")
    args = parser.parse_args()
    if os.geteuid() != 0 or not fleet.find_sshd():
        print("needs root and sshd (apt-get install -y openssh-server)", file=sys.stderr)
        return 2
    jobs = plan(args.seeds, args.first_seed)
    nodes = max(int(n[4:]) for j in jobs for n, _, _ in j["parts"])
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jv") as d:
        env = {**os.environ, "FLEETOPS_DB": os.path.join(d, "history.db")}
        info = fleet.up(nodes, d, None, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
                        metrics_port=free_port(FIRST_ADDRESS))
        inventory = os.path.join(d, "inventory.yml")
        try:
            for job in jobs:
                for node, gpus, elsewhere in job["parts"]:
                    done = cli(env, "sim", "job", "start", "--dir", d, node, job["id"], "--gpus", gpus,
                               "--profile", job["profile"], "--seed", str(job["seed"]),
                               *(["--straggler-elsewhere"] if elsewhere else []))
                    if done.returncode != 0:
                        print(f"job {job['id']} on {node}: {done.stderr.strip()}", file=sys.stderr)
                        return 1
            started = time.monotonic()
            docs: dict[str, dict[str, Any]] = {}
            while len(docs) < len(jobs) and time.monotonic() - started < args.wait:
                time.sleep(10)
                for job in jobs:
                    if job["id"] not in docs:
                        doc = judged(env, inventory, job["id"])
                        if doc is not None:
                            docs[job["id"]] = doc
            if len(docs) < len(jobs):
                print(f"only {len(docs)} of {len(jobs)} jobs had their samples within {args.wait:.0f} s",
                      file=sys.stderr)
                return 1
            judged_at = time.monotonic()
            rows: dict[str, list[int]] = {}
            wrong = []
            for job in jobs:
                want, got = expected(info, job), verdicts(docs[job["id"]])
                label = job["profile"] + (" (2 nodes)" if job.get("two_nodes") else "")
                row = rows.setdefault(label, [0, 0, 0, 0])
                row[0] += 1
                row[1] += got == want
                row[2] += len(got - want)
                row[3] += len(want - got)
                if got != want:
                    wrong.append(f"job {job['id']} {label} seed {job['seed']}: expected {sorted(want)}, got {sorted(got)}")
        finally:
            fleet.down(d)
    print(f"{nodes} nodes, {len(jobs)} jobs, {args.seeds} seeds; judged after {judged_at - started:.0f} s of jobs, "
          f"{time.monotonic() - began:.0f} s in all")
    print("| profile | jobs | exact | false verdicts | missed verdicts |")
    print("|---|---|---|---|---|")
    total = [0, 0, 0, 0]
    for label, row in rows.items():
        print(f"| {label} | {row[0]} | {row[1]} | {row[2]} | {row[3]} |")
        total = [t + r for t, r in zip(total, row, strict=True)]
    print(f"| **all** | {total[0]} | {total[1]} | {total[2]} | {total[3]} |")
    for line in wrong:
        print("  " + line)
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
