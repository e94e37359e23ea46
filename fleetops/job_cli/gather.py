"""Asking every node for one job (``fleetops-agent job show JOBID`` over SSH, the audit's transport
and agent path) and putting the answers together as the diagnosis takes them (``diagnose.Job``).

A node answers one of three ways: the job's document (it ran part of the job), the quiet "no such
job here" (``fleetops.job-absent/v1``, exit 3), or no usable answer (unreachable, no agent, an
agent error): the last is ``unreachable`` in the result, and the command says which nodes it could
not ask, since the job may have run there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetops.jobs import diagnose as dg

SHOW_KIND = "fleetops.job-show/v1"
ABSENT_KIND = "fleetops.job-absent/v1"
EXIT_ABSENT = 3  # the agent's job show: no record of the job on the node


@dataclass
class Gathered:
    """What the nodes said: ``docs`` (node -> the job's document, nodes that ran it), ``absent``
    (nodes that never ran it), ``unreachable`` (node -> why there is no answer)."""

    job_id: str
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)


def show_command(agent: str, job_id: str) -> list[str]:
    return [agent, "job", "show", job_id]


def _document(stdout: str | None) -> dict[str, Any] | None:
    try:
        doc = json.loads((stdout or "").strip() or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def read_answer(result: Any) -> tuple[str, Any]:
    """("show", doc) | ("absent", None) | ("unreachable", why) for one transport result."""
    from fleetops.fleet import answers

    doc = _document(result.stdout) if result.ok or result.exit_status == EXIT_ABSENT else None
    if doc is not None and doc.get("kind") == SHOW_KIND and result.ok:
        return "show", doc
    if doc is not None and doc.get("kind") == ABSENT_KIND:
        return "absent", None
    return "unreachable", answers.read(result).describe()


def gather(hosts: list[Any], job_id: str, run: Callable[[list[Any], list[str]], dict[str, Any]]) -> Gathered:
    """Ask ``hosts`` (grouped by their agent path, as the audit does); ``run(hosts, argv)`` is the
    fan-out (``transport.run_all`` with the operator's SSH options)."""
    from fleetops.fleet.audit import AGENT_COMMAND_VAR, DEFAULT_AGENT

    by_agent: dict[str, list[Any]] = {}
    for host in hosts:
        by_agent.setdefault(str(host.vars.get(AGENT_COMMAND_VAR, DEFAULT_AGENT)), []).append(host)
    results: dict[str, Any] = {}
    for agent, group in by_agent.items():
        results.update(run(group, show_command(agent, job_id)))
    out = Gathered(job_id)
    for host in hosts:
        what, value = read_answer(results[host.name])
        if what == "show":
            value["node"] = host.name  # the inventory's name is the node's identity in reports
            out.docs[host.name] = value
        elif what == "absent":
            out.absent.append(host.name)
        else:
            out.unreachable[host.name] = str(value)
    return out


def _points(rows: Any) -> list[dg.Sample]:
    return [(float(t), v) for t, v in rows or []]


def build_job(g: Gathered) -> dg.Job:
    """The job as the diagnosis takes it: its earliest start and, when every node's record is
    ended, its latest end (None while any part still runs)."""
    docs = [g.docs[n] for n in sorted(g.docs)]
    starts = [float(d["job"]["started_at"]) for d in docs]
    ends = [d["job"].get("ended_at") for d in docs]
    ended = None if any(e is None for e in ends) else max(float(e) for e in ends)
    gpus, cpus = [], []
    for d in docs:
        node = d["node"]
        for gpu in d["gpus"]:
            facts = gpu.get("facts") or {}
            xids = [(float(x["timestamp"]), int(x["code"])) for x in d.get("xids", [])
                    if x.get("gpu_uuid") == gpu["uuid"] and x.get("timestamp") is not None]
            gpus.append(dg.JobGpu(
                node=node, uuid=gpu["uuid"], index=int(gpu["index"]) if gpu.get("index") is not None else -1,
                series={name: _points(rows) for name, rows in (gpu.get("series") or {}).items()},
                facts=dg.GpuFacts(power_limit_w=facts.get("power_limit_w"),
                                  clock_sm_max_mhz=facts.get("clock_sm_max_mhz"),
                                  pcie_gen=facts.get("pcie_gen"), pcie_width=facts.get("pcie_width")),
                xids=xids))
        cpu = d.get("cpu") or {}
        if cpu.get("cpus") and cpu.get("usage_usec"):
            cpus.append(dg.NodeCpu(node=node, usage_usec=_points(cpu["usage_usec"]), cpus=int(cpu["cpus"])))
    return dg.Job(job_id=g.job_id, started_at=min(starts), ended_at=ended, gpus=gpus, cpu=cpus)


def job_facts(g: Gathered) -> dict[str, Any]:
    """The job as the report heads it: id, user, nodes, GPUs, start, end, duration."""
    docs = [g.docs[n] for n in sorted(g.docs)]
    users = sorted({str(d["job"].get("user")) for d in docs if d["job"].get("user") is not None})
    job = build_job(g)
    now = max(float(d.get("now") or 0.0) for d in docs)
    end = job.ended_at if job.ended_at is not None else now
    return {"job_id": g.job_id, "user": users[0] if len(users) == 1 else (", ".join(users) or None),
            "nodes": sorted(g.docs), "gpus": sum(len(d["gpus"]) for d in docs),
            "started_at": job.started_at, "ended_at": job.ended_at, "running": job.ended_at is None,
            "duration_s": round(end - job.started_at, 1)}
