"""Simulated workloads: what a job's GPUs and its cgroup show while it runs, for the pathologies the
job diagnosis names (``fleetops/jobs/diagnose.py``), and for a healthy job that must get none.

A workload is recorded on the GPU (``gpu["workload"]``: profile, job, since) and on the job
(``state["workload_jobs"][job]``: profile, seed, allocated CPUs, the cgroup's CPU so far). It is
overlaid on the stored values each time a snapshot is taken, as a condition fault is, so a GPU
without one looks exactly as before (no PCIe throughput, its stored utilisation and clocks). Every
value is a function of the job's seed, the GPU's UUID and the time since the workload began, never
of the wall clock or a random generator: the same seed sampled at the same times gives the same
series, which is what lets the tests and ``bench/job_verdicts.py`` count verdicts exactly.

Profiles (per GPU; ``set_job_workload`` gives every GPU of a job one):

- ``steady``: a healthy GEMM-bound job. Utilisation 93-98 %, SM clock at its maximum, power near
  the cap, and ``sw_power_cap`` for about 30 % of the time at a slightly lower clock, as real large
  GEMMs show; NVLink traffic on every link; PCIe modest (3-7 % of the link); the cgroup's CPU about
  40 % of its allocation.
- ``input-bound``: the job waits on host-to-device copies: PCIe RX 90-95 % of the link (its
  generation and width as the GPU reports them), utilisation 25-35 %, power low.
- ``straggler``: one GPU of the job (``straggler_uuid``: chosen by the seed among the job's GPUs on
  the node) is in ``hw_slowdown`` for 8 s of every 20 s (40 % of the time) at about 55 % of its SM
  clock; the job's other GPUs wait for it in the same windows (utilisation 35-60 %).
- ``nvlink-unused``: a multi-GPU job whose collectives go over PCIe (NCCL without P2P, a wrong
  ``NCCL_P2P_LEVEL``): no NVLink counter moves on any link, PCIe TX and RX 35-55 % of the link,
  utilisation 60-80 %.
- ``cpu-starved``: the data loader has too few CPUs: the cgroup's CPU is saturated at 96-99 % of
  its allocation while the GPU's utilisation swings between 10 and 90 %.

The cgroup: the job's ``cpu.stat`` (``usage_usec``, ``user_usec``, ``system_usec``, cumulative
microseconds, as cgroup v2 writes them) in its cgroup folder (the job's ``cgroup`` if one was
given, else ``cgroup_dir``), advanced by ``advance_cgroups`` at each light read: the usage is a
closed form of the time since the job's profile last changed, so it only ever grows and does not
depend on how often it is read.
"""

from __future__ import annotations

import math
import os
from typing import Any

from fleetops.catalog import pcie
from fleetops.sim.gpu.base import (
    WORKLOAD_KEY,
    SimError,
    digest,
    require_present,
)
from fleetops.sim.gpu.traffic import (
    fold_traffic,
)

PROFILES = ("steady", "input-bound", "straggler", "nvlink-unused", "cpu-starved")

JOBS_KEY = "workload_jobs"  # on the state: job id -> its profile, seed, CPUs and cgroup usage
SAMPLE_KEY = "_sample"  # on a snapshot's GPU: light-sample values the snapshot has no field for

NOISE_S = 1.0  # a new draw every second: every 2 s daemon sample sees fresh noise

# Each profile's NVLink load is base.WORKLOAD_NVLINK_PCT (traffic.py reads it).

# The cgroup's CPU per profile, as a share of the allocated CPUs: mean and the swing of a slow
# sine (CPU_PERIOD_S) around it; mean >= swing, so the usage only grows.
CPU_SHARE = {
    "steady": (0.40, 0.08),
    "input-bound": (0.55, 0.10),
    "straggler": (0.40, 0.08),
    "nvlink-unused": (0.45, 0.08),
    "cpu-starved": (0.975, 0.015),
}
CPU_PERIOD_S = 37.0

# straggler: the slow GPU's windows
STRAGGLE_PERIOD_S, STRAGGLE_SLOW_S = 20.0, 8.0
STRAGGLE_CLOCK_SHARE = 0.55  # of the maximum SM clock while in hw_slowdown

DEFAULT_JOB_CPUS = 16

SW_POWER_CAP, HW_SLOWDOWN = 0x4, 0x8  # catalog/throttle.py's bits


def _u(seed: int, uuid: str, elapsed: float, salt: str) -> float:
    """A uniform draw in [0, 1) fixed by the seed, the GPU, the second of the workload and a salt."""
    return int(digest("workload", seed, uuid, int(math.floor(elapsed / NOISE_S)), salt)[:8], 16) / 2**32


def job_seed(job_id: str) -> int:
    """The seed of a job given none: fixed by its id."""
    return int(digest("workload-seed", job_id)[:8], 16)


def _position(state: dict[str, Any], selector: str) -> int:
    for i, gpu in enumerate(state["gpus"]):
        if selector in (gpu.get("uuid"), gpu.get("bus_id")):
            return i
    raise SimError(f"no GPU {selector!r} on {state['hostname']} (a workload takes a GPU's UUID or bus id)")


def cpu_usage_usec(job: dict[str, Any], now: float) -> int:
    """The job cgroup's ``usage_usec`` at ``now``: what it had when its profile last changed, plus
    the integral of its CPU rate since (a closed form of the time: the same whenever it is read,
    and never decreasing, the rate's mean being above its swing)."""
    base = int(job.get("base_usec", 0))
    profile = job.get("profile")
    if profile not in CPU_SHARE:
        return base
    elapsed = max(0.0, now - float(job["since"]))
    mean, swing = CPU_SHARE[profile]
    phase = (int(job["seed"]) % 1000) / 1000.0 * 2 * math.pi
    w = 2 * math.pi / CPU_PERIOD_S
    cores = float(job["cpus"]) * (mean * elapsed + swing / w * (math.cos(phase) - math.cos(w * elapsed + phase)))
    return base + int(max(0.0, cores) * 1e6)


def _fold_job(job: dict[str, Any], now: float) -> None:
    job["base_usec"] = cpu_usage_usec(job, now)
    job["since"] = now


def set_workload(
    state: dict[str, Any],
    gpu: str,
    profile: str | None,
    job_id: str | None,
    now: float,
    *,
    seed: int | None = None,
    cpus: int | None = None,
    cgroup: str | None = None,
    straggler: str | None = None,
) -> None:
    """Run ``profile`` on the GPU (UUID or bus id) for job ``job_id`` from ``now``; ``profile``
    None ends the GPU's workload (an idle GPU again). ``seed`` (default: fixed by the job id),
    ``cpus`` (the job's allocated CPUs on this node, default DEFAULT_JOB_CPUS) and ``cgroup`` (its
    cgroup folder, default ``cgroup_dir``) are the job's: the first GPU of a job sets them, a
    later one may change them. ``straggler`` names the slow GPU of a ``straggler`` job (its UUID),
    or ``"elsewhere"``: the slow GPU is on another node, and every GPU of the job here waits for
    it (the seed's choice otherwise: see ``straggler_uuid``). The NVLink counters so far are
    folded first, so they keep growing from where they are at the new rate."""
    position = _position(state, gpu)
    raw = state["gpus"][position]
    jobs: dict[str, Any] = state.setdefault(JOBS_KEY, {})
    if profile is None:
        old = raw.get(WORKLOAD_KEY)
        if old is None:
            return
        fold_traffic(state, position, now)
        raw.pop(WORKLOAD_KEY)
        if not any((g.get(WORKLOAD_KEY) or {}).get("job_id") == old["job_id"] for g in state["gpus"]):
            jobs.pop(old["job_id"], None)  # the job's last GPU here: its cgroup stops moving
        return
    if profile not in PROFILES:
        raise SimError(f"unknown workload profile {profile!r}; known: {', '.join(PROFILES)}")
    if not job_id:
        raise SimError("a workload runs for a job: give its job id")
    require_present(state, position, "run a workload")
    old = raw.get(WORKLOAD_KEY)
    if old is not None and old["job_id"] != job_id:
        set_workload(state, gpu, None, None, now)  # another job's GPU: that job leaves it first
        old = None
    fold_traffic(state, position, now)
    if old is None or old["profile"] != profile:
        raw[WORKLOAD_KEY] = {"profile": profile, "job_id": job_id, "since": now}
    job = jobs.get(job_id)
    if job is None:
        jobs[job_id] = {
            "profile": profile,
            "seed": job_seed(job_id) if seed is None else int(seed),
            "cpus": int(cpus) if cpus is not None else DEFAULT_JOB_CPUS,
            "cgroup": cgroup,
            "since": now,
            "started": now,
            "base_usec": 0,
        }
        if straggler is not None:
            jobs[job_id]["straggler"] = straggler
        return
    changed: dict[str, Any] = {"profile": profile}
    if seed is not None:
        changed["seed"] = int(seed)
    if cpus is not None:
        changed["cpus"] = int(cpus)
    if any(job.get(k) != v for k, v in changed.items()):
        _fold_job(job, now)
        job.update(changed)
    if cgroup is not None:
        job["cgroup"] = cgroup
    if straggler is not None:
        job["straggler"] = straggler


def set_job_workload(
    state: dict[str, Any],
    gpus: list[str],
    profile: str | None,
    job_id: str,
    now: float,
    *,
    seed: int | None = None,
    cpus: int | None = None,
    cgroup: str | None = None,
    straggler: str | None = None,
) -> None:
    """``set_workload`` on each of the job's GPUs on this node, with one seed and allocation. A job
    on several nodes takes the same seed and start on each (its slow windows line up), and
    ``straggler="elsewhere"`` on all nodes but the slow GPU's."""
    for gpu in gpus:
        set_workload(state, gpu, profile, job_id, now, seed=seed, cpus=cpus, cgroup=cgroup, straggler=straggler)


def job_gpus(state: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    """The GPUs running a workload of ``job_id``, by index."""
    found = [g for g in state["gpus"] if (g.get(WORKLOAD_KEY) or {}).get("job_id") == job_id]
    return sorted(found, key=lambda g: int(g["index"]))


def straggler_uuid(state: dict[str, Any], job_id: str) -> str | None:
    """The GPU that straggles in a ``straggler`` job: the one the job names (``set_workload``'s
    ``straggler``; None when that is ``"elsewhere"``), else one of its GPUs on this node with that
    profile, chosen by the job's seed; None when it has none."""
    job = (state.get(JOBS_KEY) or {}).get(job_id)
    candidates = [g for g in job_gpus(state, job_id) if g[WORKLOAD_KEY]["profile"] == "straggler"]
    if job is None or not candidates:
        return None
    if "straggler" in job:
        named = str(job["straggler"])
        return named if any(g["uuid"] == named for g in candidates) else None
    return str(candidates[int(job["seed"]) % len(candidates)]["uuid"])


def _slow(job: dict[str, Any], elapsed: float) -> bool:
    """Whether a straggler job's slow GPU is in hw_slowdown ``elapsed`` s into the workload."""
    phase = (int(job["seed"]) // 1000) % int(STRAGGLE_PERIOD_S)
    return (elapsed + phase) % STRAGGLE_PERIOD_S < STRAGGLE_SLOW_S


def overlay(state: dict[str, Any], raw: dict[str, Any], gpu: dict[str, Any], now: float) -> None:
    """Put the GPU's workload on its snapshot ``gpu`` at ``now``: utilisation, SM clock, clocks
    event mask, power, temperatures, and (under SAMPLE_KEY, for the light sample) the PCIe
    throughput NVML reports in KB/s. A GPU without a workload is left as it is."""
    work = raw.get(WORKLOAD_KEY)
    if not work:
        return
    job = (state.get(JOBS_KEY) or {}).get(work["job_id"])
    if job is None:
        return
    profile = work["profile"]
    seed, uuid = int(job["seed"]), str(raw["uuid"])
    elapsed = max(0.0, now - float(job.get("started", work["since"])))

    def u(salt: str) -> float:
        return _u(seed, uuid, elapsed, salt)

    cap = float(raw.get("power_limit_w") or 700.0)
    clock_max = int(raw.get("clock_sm_max_mhz") or 1980)
    link = pcie.link_kbps(raw.get("pcie_gen_current"), raw.get("pcie_width_current")) or 0.0
    mask, clock = 0, clock_max
    rx_share, tx_share = 0.03 + 0.04 * u("rx"), 0.01 + 0.02 * u("tx")

    def steady_like() -> tuple[float, float, int, int]:
        """(util, power, mask, clock) of a GPU doing GEMMs at full speed."""
        if u("cap") < 0.3:  # at the power cap: the driver trims the clock a little
            return 93 + 5 * u("util"), cap * (0.97 + 0.03 * u("power")), SW_POWER_CAP, clock_max - 15 * (2 + int(8 * u("clk")))
        return 93 + 5 * u("util"), cap * (0.86 + 0.09 * u("power")), 0, clock_max

    if profile == "steady":
        util, power, mask, clock = steady_like()
    elif profile == "input-bound":
        util, power = 25 + 10 * u("util"), cap * (0.30 + 0.08 * u("power"))
        rx_share = 0.90 + 0.05 * u("rx")
    elif profile == "straggler":
        slow = _slow(job, elapsed)
        if uuid == straggler_uuid(state, work["job_id"]):
            if slow:
                util, power, mask = 97 + 2 * u("util"), cap * (0.55 + 0.05 * u("power")), HW_SLOWDOWN
                clock = int(clock_max * STRAGGLE_CLOCK_SHARE) - 15 * int(4 * u("clk"))
            else:
                util, power, mask, clock = steady_like()
        elif slow:  # waiting for the slow GPU at the next collective
            util, power = 35 + 25 * u("util"), cap * (0.40 + 0.10 * u("power"))
        else:
            util, power, mask, clock = steady_like()
    elif profile == "nvlink-unused":
        util, power = 60 + 20 * u("util"), cap * (0.60 + 0.15 * u("power"))
        rx_share, tx_share = 0.35 + 0.20 * u("rx"), 0.35 + 0.20 * u("tx")
    else:  # cpu-starved: bursts of work between batches the loader is late with
        util = 10 + 80 * u("util")
        power = cap * (0.25 + 0.6 * util / 100.0)
        rx_share = 0.05 + 0.10 * u("rx")
    gpu["utilization_gpu_pct"] = int(round(util))
    gpu["utilization_mem_pct"] = int(round(util * 0.45))
    gpu["power_draw_w"] = round(min(power, cap), 1)
    gpu["clock_sm_mhz"] = int(clock)
    gpu["clocks_event_mask"] = mask
    gpu["temp_gpu_c"] = round(36.0 + 0.3 * util, 1)
    gpu["temp_memory_c"] = round(38.0 + 0.3 * util, 1)
    gpu[SAMPLE_KEY] = {"pcie_rx_kbps": int(link * rx_share), "pcie_tx_kbps": int(link * tx_share)}


def cgroup_dir(state_path: str, job_id: str) -> str:
    """The simulated node's cgroup folder of a job: ``<state>.cgroup/job_<id>``, beside its
    ``.sys`` tree (a node's ``/sys/fs/cgroup/.../job_<id>``). Per node: a job on several nodes
    has a cgroup on each, and the simulated fleet keeps every node's state in one folder."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return os.path.join(base + ".cgroup", f"job_{job_id}")


def cpu_stat_text(usage_usec: int) -> str:
    """cgroup v2 ``cpu.stat``'s usage lines (user and system split 90/10, as a Python loader's)."""
    user = usage_usec * 9 // 10
    return f"usage_usec {usage_usec}\nuser_usec {user}\nsystem_usec {usage_usec - user}\n"


def advance_cgroup(folder: str, job: dict[str, Any], now: float) -> int:
    """Write the job's ``cpu.stat`` in ``folder`` (made if missing) as of ``now``; its usage_usec.
    Written whole (temporary file and rename): a sampler never reads half of one."""
    usage = cpu_usage_usec(job, now)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "cpu.stat")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(cpu_stat_text(usage))
    os.replace(tmp, path)
    return usage


def advance_cgroups(state_path: str, state: dict[str, Any], now: float) -> None:
    """Every running job's ``cpu.stat`` as of ``now`` (the light read calls it each tick). A
    folder that cannot be written (a read-only state folder) is left as it is."""
    for job_id, job in (state.get(JOBS_KEY) or {}).items():
        try:
            advance_cgroup(job.get("cgroup") or cgroup_dir(state_path, job_id), job, now)
        except OSError:
            pass
