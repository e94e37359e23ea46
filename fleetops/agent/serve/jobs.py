"""The daemon's view of the node's jobs: the job records (``fleetops.jobs.record``) read each
tick, each job's interval on its GPUs over the daemon's window, and each running job's cgroup CPU
time in a ring.

Cheap by construction: a tick lists the record folder and stats each file; only a file whose
(inode, size, mtime) changed is parsed again (a record is only ever replaced whole, by rename, so
a rewrite is a new inode). The book keeps the jobs running now and those that ended within the
window (``window_s``, the ring's hour), so an XID is attributed to the job that held its GPU at
the XID's time, also after that job ended; a snapshot lists the running ones and the last
``ENDED_LISTED`` ended ones. A record that does not read is reported
(``errors``) and skipped; it never stops the tick.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from typing import Any

from fleetops import model
from fleetops.jobs import cgroup, record

CPU_FIELD = "cpu_usage_usec"
# Ended jobs the snapshot lists, the latest first: a node that runs many short jobs must not make
# every snapshot carry an hour of them. XIDs are attributed from every job within the window.
ENDED_LISTED = 32


class JobBook:
    def __init__(self, directory: str, window_s: float, interval_s: float) -> None:
        self.directory = directory
        self.window_s = window_s
        self.interval_s = interval_s
        self._keys: dict[str, tuple[int, int, int]] = {}  # file name -> (inode, size, mtime_ns) when parsed
        self._parsed: dict[str, record.JobRecord | None] = {}  # file name -> its record (None: did not read)
        self.errors: dict[str, str] = {}  # file name -> why it did not read
        self.records: dict[str, record.JobRecord] = {}  # job id -> record, within the window
        self.cpu: dict[str, deque[tuple[float, int]]] = {}  # job id -> (time, usage_usec), running jobs
        self.list_error: str | None = None
        self._node_jobs: list[model.NodeJob] = []

    # --- reading ---------------------------------------------------------------------------

    def scan(self, now: float) -> bool:
        """Read what changed in the folder; True when the jobs within the window changed."""
        try:
            names = record.record_files(self.directory)
            self.list_error = None
        except record.JobRecordError as exc:
            self.list_error = str(exc)
            return False
        seen = set(names)
        changed = False
        for name in [n for n in self._keys if n not in seen]:
            del self._keys[name]
            self._parsed.pop(name, None)
            self.errors.pop(name, None)
            changed = True
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # removed since the listing: the next tick sees it gone
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._keys.get(name) == key:
                continue
            self._keys[name] = key
            changed = True
            try:
                self._parsed[name] = record.read(path)
                self.errors.pop(name, None)
            except record.JobRecordError as exc:
                self._parsed[name] = None
                self.errors[name] = str(exc)
        start = now - self.window_s
        within = {r.job_id: r for r in self._parsed.values()
                  if r is not None and (r.ended_at is None or r.ended_at >= start)}
        if within.keys() != self.records.keys() or any(within[k] is not self.records[k] for k in within):
            changed = True
        if changed:
            self.records = within
            for job_id in [j for j in self.cpu if j not in within]:
                del self.cpu[job_id]
            running = [r for r in within.values() if r.ended_at is None]
            ended = sorted((r for r in within.values() if r.ended_at is not None),
                           key=lambda r: r.ended_at or 0.0, reverse=True)[:ENDED_LISTED]
            self._node_jobs = [self._node_job(r) for r in sorted(running + ended, key=lambda r: int(r.job_id))]
        return changed

    def sample_cpu(self, now: float) -> None:
        """Each running job's cgroup CPU time into its ring (the hour at the sampling interval)."""
        for job_id, rec in self.records.items():
            if rec.ended_at is not None or rec.cgroup is None:
                continue
            usage = cgroup.cpu_usage_usec(rec.cgroup)
            if usage is None:
                continue
            ring = self.cpu.get(job_id)
            if ring is None:
                ring = self.cpu[job_id] = deque(maxlen=int(self.window_s / max(self.interval_s, 0.1)) + 1)
            ring.append((now, usage))

    def history(self, job_id: str, name: str, since: float) -> list[tuple[float, int]]:
        """``cpu_usage_usec`` samples of a job since ``since``; KeyError for an unknown job or field."""
        if name != CPU_FIELD:
            raise KeyError(name)
        if job_id not in self.records:
            raise LookupError(job_id)
        return [(t, v) for t, v in self.cpu.get(job_id, ()) if t >= since]

    # --- the snapshot ----------------------------------------------------------------------

    @staticmethod
    def _node_job(rec: record.JobRecord) -> model.NodeJob:
        return model.NodeJob(job_id=rec.job_id, uid=rec.uid, user=rec.user, started_at=rec.started_at,
                             ended_at=rec.ended_at, gpus=rec.devices, cgroup=rec.cgroup, cpus=rec.cpus)

    def jobs_at(self, gpu_uuid: str, t: float) -> list[str]:
        """The ids of the jobs on the GPU (whole or one of its MIG instances) at time ``t``."""
        out = []
        for rec in self.records.values():
            if rec.started_at <= t and (rec.ended_at is None or t <= rec.ended_at) and any(
                g.uuid == gpu_uuid for g in rec.gpus
            ):
                out.append(rec.job_id)
        return sorted(out, key=int)

    def tag(self, node: Any) -> Any:
        """A copy of ``node`` with its ``jobs`` and each XID's ``jobs`` (the snapshot the backend
        gave is never mutated: the simulator shares it between calls)."""
        out = dataclasses.replace(node, jobs=list(self._node_jobs))
        if node.xids:
            by_bus = {g.bus_id: g.uuid for g in node.gpus}
            tagged = []
            for ev in node.xids:
                uuid = ev.gpu_uuid or by_bus.get(ev.bus_id or "")
                jobs = self.jobs_at(uuid, ev.timestamp) if uuid and ev.timestamp is not None else None
                tagged.append(dataclasses.replace(ev, jobs=jobs))
            out.xids = tagged
        return out
