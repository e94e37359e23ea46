"""A fed fleet whose snapshots carry jobs, as the daemon tags them (``model.Node.jobs``, each
XID's ``jobs``), for the job view's tests and snapshots. Fixed clock (``simfeed.T0``):

- job 1234 (alice, started 2h05m before): node001 GPUs 0-7 and node005 GPUs 0-3 (node005's GPU 2
  in thermal slowdown, GPU 1's PCIe link downgraded: the conftest's faults);
- job 1240 (bob): node005 GPUs 4-7;
- job 1250 (carol): node003 GPUs 2 and 3, GPU 3 with the uncorrectable ECC error and its XID 48,
  which the daemon attributed to 1250;
- job 1260 (dave): node011 GPUs 4 and 5, GPU 5 fallen off the bus (XID 79, attributed to 1260);
- job 1199 (erin): node004, ended 10 minutes before (node004 runs nothing now: an empty cell);
- job 1300 (frank): node006 GPU 4's MIG instance GI 2, and job 1301 (grace) its GI 1;
- every other node's snapshot has no job records (a cold collect): ``-``.
"""

from __future__ import annotations

from fleetops import model
from fleetops.sim import gpu as sim
from fleetops.tui import data, simfeed

from .conftest import FAULTS, NAMES

T0 = simfeed.T0
# job id -> (user, uid, started, ended, {node: GPU indexes}); MIG jobs below
JOBS: dict[str, tuple[str, int, float, float | None, dict[str, list[int]]]] = {
    "1234": ("alice", 1001, T0 - 7500, None, {"node001": list(range(8)), "node005": [0, 1, 2, 3]}),
    "1240": ("bob", 1002, T0 - 1800, None, {"node005": [4, 5, 6, 7]}),
    "1250": ("carol", 1003, T0 - 3600, None, {"node003": [2, 3]}),
    "1260": ("dave", 1004, T0 - 3000, None, {"node011": [4, 5]}),
    "1199": ("erin", 1005, T0 - 10800, T0 - 600, {"node004": list(range(8))}),
}
MIG_NODE, MIG_GPU = "node006", 4
MIG_JOBS = {"1300": ("frank", 1006, 2), "1301": ("grace", 1007, 1)}  # job -> (user, uid, GPU instance)
BUSY = {"node001", "node005", "node003", "node011"}  # GPUs of running jobs work hard


def _snapshot(name: str) -> model.Node:
    state = simfeed.sim_state(name, FAULTS.get(name, []))
    if name == MIG_NODE:
        state["gpus"][MIG_GPU]["mig_mode_current"] = True
        sim.set_mig_instances(state, MIG_GPU, ["3g.71gb", "2g.35gb"])
    node = simfeed.snapshot(state)
    held = {i for job in JOBS.values() if job[3] is None for i in job[4].get(name, [])}
    for g in node.gpus:
        if g.index in held and not model.gpu_lost(g):
            reasons = [r for r in g.clocks_event_reasons or [] if r != "gpu_idle"]
            hot = "hw_thermal_slowdown" in reasons  # a GPU held down: the job's straggler
            g.utilization_gpu_pct, g.clock_sm_mhz, g.power_draw_w = 97, 1110 if hot else 1755, 455.0 if hot else 612.0
            g.clocks_event_reasons = reasons
            if not hot:
                g.temp_gpu_c = 64
    jobs: list[model.NodeJob] | None = None
    for job_id, (user, uid, started, ended, where) in JOBS.items():
        if name in where:
            gpus = [node.gpus[i].uuid for i in where[name]]
            jobs = (jobs or []) + [model.NodeJob(job_id, uid, user, started, ended, gpus, f"/sys/fs/cgroup/job_{job_id}", 8)]
    if name == MIG_NODE:
        insts = {m.gpu_instance_id: m.uuid for m in node.gpus[MIG_GPU].mig_instances or []}
        jobs = [
            model.NodeJob(job_id, uid, user, T0 - 1200, None, [str(insts[gi])], None, 4)
            for job_id, (user, uid, gi) in MIG_JOBS.items()
        ]
    node.jobs = jobs
    if jobs is not None:
        for ev in node.xids:  # as the daemon tags them: the jobs on the GPU at the XID's time
            ev.jobs = sorted(
                j.job_id for j in jobs
                if ev.gpu_uuid in j.gpus and (j.started_at or 0) <= (ev.timestamp or 0)
                and (j.ended_at is None or (ev.timestamp or 0) <= j.ended_at)
            )  # fmt: skip
    return node


def job_entries() -> list[data.NodeEntry]:
    out = []
    for name in NAMES:
        node = _snapshot(name)
        out.append(data.summarize(name, node, simfeed.findings(node), T0))
    return out
