"""A simulated job driven through the daemon's real sampling path, for the diagnosis tests and
``bench/job_verdicts.py``: a node's state file, a workload profile on some of its GPUs, the
simulator's ``SimAccess.light`` read every 2 s of *simulated* time (no sleeping), each GPU's row
appended to the daemon's own ``Ring``, the job cgroup's ``cpu.stat`` read after each tick as the
job daemon samples it, and the rings' history handed to ``jobs.diagnose``."""

from __future__ import annotations

import time
from pathlib import Path

from fleetops.agent.serve.node import HISTORY_S
from fleetops.agent.serve.ring import Ring
from fleetops.gpu.backend import GPU_FIELDS
from fleetops.jobs import diagnose as dg
from fleetops.sim import gpu as sim
from fleetops.sim.access import SimAccess

# (code, node, GPU indices) a profile on GPUs ``gpus`` must give, and nothing else; the straggler's
# GPU is the simulator's choice (``sim.straggler_uuid``), filled in by ``run_job``.
EXPECTED = {
    "steady": None,
    "input-bound": "input_bound",
    "straggler": "straggler",
    "nvlink-unused": "nvlink_unused",
    "cpu-starved": "cpu_starved",
}

Expected = set[tuple[str, str, tuple[int, ...]]]


def cpu_stat_usage(path: Path) -> int | None:
    """``usage_usec`` from a cgroup v2 ``cpu.stat``, as a job daemon reads it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    return None


def run_job(
    folder: Path,
    profile: str,
    seed: int,
    *,
    node: str = "node017",
    gpus: tuple[int, ...] = (0, 1, 2, 3),
    cpus: int = 32,
    seconds: float = 300.0,
    interval_s: float = 2.0,
    job_id: str = "4242",
) -> tuple[dg.Job, Expected]:
    """Run ``profile`` on one node for ``seconds`` of simulated time and return the job as the
    diagnosis takes it, with the verdicts it must give."""
    job, slow = run_nodes(folder, {node: (profile, gpus, None)}, seed, cpus=cpus, seconds=seconds,
                          interval_s=interval_s, job_id=job_id)
    code = EXPECTED[profile]
    expected: Expected = set()
    if code == "straggler":
        expected.add((code, node, slow[node]))
    elif code is not None:
        expected.add((code, node, tuple(sorted(gpus))))
    return job, expected


def run_nodes(
    folder: Path,
    plan: dict[str, tuple[str, tuple[int, ...], str | None]],
    seed: int,
    *,
    cpus: int = 32,
    seconds: float = 300.0,
    interval_s: float = 2.0,
    job_id: str = "4242",
) -> tuple[dg.Job, dict[str, tuple[int, ...]]]:
    """One job on several simulated nodes, ``{node: (profile, GPU indices, straggler)}`` (straggler:
    None for the seed's choice, ``"elsewhere"``, or a GPU index as a string), sampled together on
    one simulated clock; the job and the straggling GPU's index per node (``()`` where none)."""
    t0 = float(int(time.time()))
    nodes = {}
    for node, (profile, gpus, straggler) in plan.items():
        path = folder / f"{node}.json"
        state = sim.init_state(str(path), node)
        uuids = [state["gpus"][i]["uuid"] for i in gpus]
        named = uuids[gpus.index(int(straggler))] if straggler not in (None, "elsewhere") else straggler
        with sim.locked_state(str(path)) as st:
            sim.set_job_workload(st, uuids, profile, job_id, t0, seed=seed, cpus=cpus, straggler=named)
            slow = sim.straggler_uuid(st, job_id)
        slow_index = tuple(int(g["index"]) for g in state["gpus"] if g["uuid"] == slow)
        nodes[node] = (path, gpus, slow_index)
    now = [t0]
    accesses = {node: SimAccess(str(path), clock=lambda: now[0]) for node, (path, _, _) in nodes.items()}
    rings: dict[str, dict[str, Ring]] = {node: {} for node in nodes}
    cpu: dict[str, list[dg.Sample]] = {node: [] for node in nodes}
    ticks = int(seconds / interval_s)
    for k in range(1, ticks + 1):
        now[0] = t0 + k * interval_s
        for node, access in accesses.items():
            values, lost = access.light()
            assert not lost
            for uuid, row in values.items():
                ring = rings[node].get(uuid)
                if ring is None:
                    ring = rings[node][uuid] = Ring(int(HISTORY_S / interval_s), GPU_FIELDS)
                for name in row:
                    ring.add_field(name)
                ring.append(now[0], row)
            stat = Path(sim.cgroup_dir(str(nodes[node][0]), job_id)) / "cpu.stat"
            cpu[node].append((now[0], cpu_stat_usage(stat)))
    end = now[0]
    job_gpus = []
    for node, (path, gpus, _) in nodes.items():
        accesses[node].release()
        snap = sim.snapshot(sim.read_state(str(path)), end)
        for i in gpus:
            g = snap["gpus"][i]
            ring = rings[node][g["uuid"]]
            series = {name: ring.samples(name, t0) for name in ring.columns}
            facts = dg.GpuFacts(power_limit_w=g["power_limit_w"], clock_sm_max_mhz=g["clock_sm_max_mhz"],
                                pcie_gen=g["pcie_gen_current"], pcie_width=g["pcie_width_current"])
            job_gpus.append(dg.JobGpu(node=node, uuid=g["uuid"], index=g["index"], series=series, facts=facts))
    job = dg.Job(job_id=job_id, started_at=t0, ended_at=end, gpus=job_gpus,
                 cpu=[dg.NodeCpu(node=node, usage_usec=cpu[node], cpus=cpus) for node in nodes])
    return job, {node: slow for node, (_, _, slow) in nodes.items()}


def verdict_keys(diagnosis: dg.Diagnosis) -> Expected:
    return {(v.code, v.node, tuple(sorted(int(g["index"]) for g in v.gpus))) for v in diagnosis.verdicts}
