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
    """Run ``profile`` for ``seconds`` of simulated time and return the job as the diagnosis takes
    it, with the verdicts it must give."""
    path = folder / f"{node}.json"
    state = sim.init_state(str(path), node)
    t0 = float(int(time.time()))
    uuids = [state["gpus"][i]["uuid"] for i in gpus]
    with sim.locked_state(str(path)) as st:
        sim.set_job_workload(st, uuids, profile, job_id, t0, seed=seed, cpus=cpus)
        slow = sim.straggler_uuid(st, job_id)
    now = [t0]
    access = SimAccess(str(path), clock=lambda: now[0])
    rings: dict[str, Ring] = {}
    cpu: list[dg.Sample] = []
    stat = Path(sim.cgroup_dir(str(path), job_id)) / "cpu.stat"
    ticks = int(seconds / interval_s)
    for k in range(1, ticks + 1):
        now[0] = t0 + k * interval_s
        values, lost = access.light()
        assert not lost
        for uuid, row in values.items():
            ring = rings.get(uuid)
            if ring is None:
                ring = rings[uuid] = Ring(int(HISTORY_S / interval_s), GPU_FIELDS)
            for name in row:
                ring.add_field(name)
            ring.append(now[0], row)
        cpu.append((now[0], cpu_stat_usage(stat)))
    access.release()
    end = now[0]
    snap = sim.snapshot(sim.read_state(str(path)), end)
    job_gpus = []
    for i in gpus:
        g = snap["gpus"][i]
        ring = rings[g["uuid"]]
        series = {name: ring.samples(name, t0) for name in ring.columns}
        facts = dg.GpuFacts(power_limit_w=g["power_limit_w"], clock_sm_max_mhz=g["clock_sm_max_mhz"],
                            pcie_gen=g["pcie_gen_current"], pcie_width=g["pcie_width_current"])
        job_gpus.append(dg.JobGpu(node=node, uuid=g["uuid"], index=g["index"], series=series, facts=facts))
    job = dg.Job(job_id=job_id, started_at=t0, ended_at=end, gpus=job_gpus,
                 cpu=[dg.NodeCpu(node=node, usage_usec=cpu, cpus=cpus)])
    code = EXPECTED[profile]
    expected: Expected = set()
    if code == "straggler":
        index = next(int(g["index"]) for g in snap["gpus"] if g["uuid"] == slow)
        expected.add((code, node, (index,)))
    elif code is not None:
        expected.add((code, node, tuple(sorted(gpus))))
    return job, expected


def verdict_keys(diagnosis: dg.Diagnosis) -> Expected:
    return {(v.code, v.node, tuple(sorted(int(g["index"]) for g in v.gpus))) for v in diagnosis.verdicts}
