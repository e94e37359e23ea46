"""The jobs on the fleet as the TUI shows them (issue 30): which job holds which GPU, the JOBS
cells of the nodes and GPUs views, and one job across the fleet (``JobView``) for the job
filter. The daemon tags each snapshot with its node's jobs (``model.Node.jobs``: running ones
and those ended within its window; ``gpus`` are GPU UUIDs or MIG device UUIDs) and each XID with
the jobs on its GPU at the time (``model.XidEvent.jobs``); a cold collect sets neither (None),
which reads ``-`` here, apart from "no jobs" (an empty cell).

Pure Python, no Textual: the entries build these cells in the refresh thread."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleetops import model
from fleetops.report.values import age_text

UNKNOWN_TEXT = "-"  # the node's snapshot carries no job records (cold collect, older agent)


def job_order(job_id: str) -> tuple[int, Any]:
    """Slurm's ids are plain numbers: ``99`` before ``1234``; anything else after, by text."""
    return (0, int(job_id)) if job_id.isdigit() else (1, job_id)


def running(node: model.Node | None) -> list[model.NodeJob] | None:
    """The jobs running on the node, in id order; None when its snapshot has no job records."""
    if node is None or node.jobs is None:
        return None
    return sorted((j for j in node.jobs if j.ended_at is None), key=lambda j: job_order(j.job_id))


def devices(gpu: model.Gpu | None) -> set[str]:
    """The UUIDs a job record may name this GPU by: its own, and each of its MIG devices'."""
    if gpu is None:
        return set()
    return {gpu.uuid, *(m.uuid for m in gpu.mig_instances or [] if m.uuid)}


def mig_instance(gpu: model.Gpu | None, device: str) -> model.MigInstance | None:
    return next((m for m in (gpu.mig_instances or []) if m.uuid == device), None) if gpu is not None else None


def on_gpu(jobs: Iterable[model.NodeJob] | None, gpu_uuid: str, gpu: model.Gpu | None) -> list[model.NodeJob] | None:
    """The jobs among ``jobs`` that hold the GPU, whole or one of its MIG instances; None: not known."""
    if jobs is None:
        return None
    names = devices(gpu) | {gpu_uuid}
    return [j for j in jobs if any(d in names for d in j.gpus)]


def ids_text(ids: list[str]) -> str:
    """``1234``, ``1234 +2`` (the lowest id and how many more)."""
    if not ids:
        return ""
    return ids[0] if len(ids) == 1 else f"{ids[0]} +{len(ids) - 1}"


def cell(jobs: list[model.NodeJob] | None) -> tuple[str, str, Any]:
    """A JOBS cell (text, style, sort value) of running jobs: ``-`` dim when not known, empty
    for none. Sorted: the most jobs first (Shift+J), nodes without records last."""
    if jobs is None:
        return UNKNOWN_TEXT, "dim", (1, 0, ())
    ids = sorted({j.job_id for j in jobs}, key=job_order)
    return ids_text(ids), "", (0, -len(ids), tuple(job_order(i) for i in ids))


def clock_text(t: float, now: float) -> str:
    """``2027-01-15 07:58:00 UTC (2m ago)``."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))} UTC ({age_text(max(0.0, now - t))} ago)"


def job_line(job: model.NodeJob, now: float, gpu: model.Gpu | None = None) -> str:
    """One job as the dialogs and the GPU tab name it: id, user, since when, its GPUs here (and,
    on ``gpu``, the MIG instances it holds there)."""
    text = f"job {job.job_id}  user {job.user or (job.uid if job.uid is not None else '?')}"
    if job.started_at is not None:
        text += f"  started {clock_text(job.started_at, now)}"
    if job.ended_at is not None:
        text += f"  ENDED {clock_text(job.ended_at, now)}"
    if gpu is not None:
        insts = [m for m in (mig_instance(gpu, d) for d in job.gpus) if m is not None]
        if insts:
            text += "  MIG " + ", ".join(f"GI {m.gpu_instance_id} {m.profile or ''}".rstrip() for m in insts)
    else:
        text += f"  {len(job.gpus)} GPU{'s' if len(job.gpus) != 1 else ''}"
    return text


def running_lines(node: model.Node | None, now: float, indent: str = "  ", listed: int = 12) -> list[str]:
    """The drain dialog's words for one node's running jobs (the first ``listed``, then a count:
    a node of MIG instances may run dozens, and the reason prompt must stay in view)."""
    jobs = running(node)
    if jobs is None:
        return ["Running jobs: unknown (its snapshot carries no job records: no daemon, or an older agent)"]
    if not jobs:
        return ["Running jobs: none"]
    out = [f"Running jobs ({len(jobs)}), which a drain lets finish:"] + [f"{indent}{job_line(j, now)}" for j in jobs[:listed]]
    return out + ([f"{indent}and {len(jobs) - listed} more"] if len(jobs) > listed else [])


# --- one job across the fleet: the job filter ----------------------------------------------


@dataclass(frozen=True)
class JobGpu:
    """One GPU of the job: its node, the GPU's UUID, and the MIG devices of it the job holds."""

    node: str
    uuid: str
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobView:
    """A job as the nodes' snapshots tell it: every node whose records name it, its GPUs there."""

    job_id: str
    user: str | None
    uid: int | None
    started_at: float | None
    ended_at: float | None  # the latest end, once it ended on every node; None while running anywhere
    nodes: tuple[str, ...]
    gpus: tuple[JobGpu, ...]
    ended_on: tuple[str, ...] = ()  # nodes where it ended while others still run it

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def header(self, now: float) -> str:
        """The job view's line: job, user, start (UTC and how long ago), GPUs and nodes, and its end."""
        return "  ".join(self.header_phrases(now))

    def header_phrases(self, now: float) -> list[str]:
        """The header's phrases, which a narrow screen wraps between, never inside."""
        user = self.user or (f"uid {self.uid}" if self.uid is not None else "?")
        out = [f"job {self.job_id}", f"user {user}"]
        out.append(f"started {clock_text(self.started_at, now)}" if self.started_at is not None else "started ?")
        n, m = len(self.gpus), len(self.nodes)
        out.append(f"{n} GPU{'s' if n != 1 else ''} on {m} node{'s' if m != 1 else ''}")
        if self.ended_at is not None:
            out.append(f"ENDED {clock_text(self.ended_at, now)}")
        elif self.ended_on:
            out.append(f"ended on {', '.join(self.ended_on)}")
        return out


def find(job_id: str, nodes: Iterable[tuple[str, model.Node | None]]) -> JobView | None:
    """The job ``job_id`` across ``(name, snapshot)``; None when no node's records name it."""
    records: list[tuple[str, model.Node, model.NodeJob]] = []
    for name, node in nodes:
        if node is None or not node.jobs:
            continue
        records += [(name, node, j) for j in node.jobs if j.job_id == job_id]
    if not records:
        return None
    gpus: list[JobGpu] = []
    for name, node, job in records:
        parent_of = {d: g.uuid for g in node.gpus for d in devices(g)}
        held: dict[str, list[str]] = {}
        for device in job.gpus:
            parent = parent_of.get(device, device)  # a device no GPU reports: shown as named
            held.setdefault(parent, [])
            if parent != device:
                held[parent].append(device)
        gpus += [JobGpu(name, uuid, tuple(mig)) for uuid, mig in held.items()]
    first = min(records, key=lambda r: r[2].started_at if r[2].started_at is not None else float("inf"))[2]
    ended = [r for r in records if r[2].ended_at is not None]
    ends = [r[2].ended_at for r in ended if r[2].ended_at is not None]
    all_ended = len(ended) == len(records)
    return JobView(
        job_id=job_id,
        user=next((r[2].user for r in records if r[2].user), None),
        uid=next((r[2].uid for r in records if r[2].uid is not None), None),
        started_at=first.started_at,
        ended_at=max(ends) if all_ended and ends else None,
        nodes=tuple(dict.fromkeys(r[0] for r in records)),
        gpus=tuple(gpus),
        ended_on=() if all_ended else tuple(dict.fromkeys(r[0] for r in ended)),
    )


def bus_key(bus_id: str | None) -> str:
    """A bus id as one key: the kernel line may drop the function (``0000:ab:00``), the case may differ."""
    b = (bus_id or "").lower()
    return b[:-2] if len(b) == 12 and b[-2] == "." else b


def xids_of(job_id: str, node: model.Node | None, gpu: model.Gpu | None, uuid: str, bus_id: str) -> list[model.XidEvent]:
    """The node's XIDs on this GPU that the daemon attributed to the job (``XidEvent.jobs``)."""
    if node is None:
        return []
    bus = bus_key(bus_id)
    return [
        ev for ev in node.xids
        if ev.jobs and job_id in ev.jobs and (ev.gpu_uuid == uuid or bus_key(ev.bus_id) == bus)
    ]  # fmt: skip
