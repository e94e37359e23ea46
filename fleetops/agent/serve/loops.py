"""The loops one serving process shares among the nodes it serves: sampling, the hang watchdog,
the socket acceptor and the simulated kernel logs' poll.

A real node's process serves one node: each loop is then one thread, as a loop per node always
was. ``serve --backend sim`` serves every node of a simulated fleet from one process, and four
threads per node (four thousand threads for a thousand nodes, waking 8,500 times a second and
queueing for the GIL) cost that process more than a core in the kernel alone, before any
sampling. Shared, the threads are a handful whatever the number of nodes.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetops.agent.serve.node import NodeService

# Threads that take sampling ticks: a node whose backend call hangs holds one of them (the
# watchdog reports it), the others keep sampling the remaining nodes.
SAMPLING_WORKERS = 4


def start(services: list[NodeService]) -> None:
    """Start every loop for ``services``; the loops end when every service's ``stop`` is set."""
    from fleetops.agent.serve import server

    files = []
    for svc in services:
        if svc.follower.path == "/dev/kmsg":
            svc.follower.start()  # blocking reads of the device: its own thread
        else:
            files.append(svc)
        svc.start_events()
    Sampling(services).start()
    threading.Thread(target=watchdog, args=(services,), name="watchdog", daemon=True).start()
    threading.Thread(target=server.serve_all, args=(services,), name="socket", daemon=True).start()
    if files:
        threading.Thread(target=poll_files, args=(files,), name="kmsg-files", daemon=True).start()


def _running(services: list[NodeService]) -> bool:
    return not all(svc.stop.is_set() for svc in services)


class Sampling:
    """Each service's ``tick`` every ``interval_s`` (from the end of its previous tick, as a
    sampler thread that waited after each tick did), taken by up to ``SAMPLING_WORKERS`` threads
    from one queue ordered by due time. Every node is due at once at the start: the first
    snapshots come as fast as the workers take them, and the ticks then stay spread by when
    each one ended."""

    def __init__(self, services: list[NodeService], workers: int = SAMPLING_WORKERS) -> None:
        self.services = services
        self.workers = max(1, min(workers, len(services)))
        now = time.monotonic()
        self.queue: list[tuple[float, int, NodeService]] = [(now, i, svc) for i, svc in enumerate(services)]
        self.cond = threading.Condition()
        self.live = len(services)  # services not seen stopped yet

    def start(self) -> None:
        for n in range(self.workers):
            threading.Thread(target=self._work, name=f"sampler-{n}", daemon=True).start()

    def _next(self) -> tuple[int, NodeService] | None:
        """The next due service, waiting until it is due; None once every service stopped (a
        stopped one leaves the queue when it comes first)."""
        with self.cond:
            while self.live:
                if not self.queue:
                    self.cond.wait(1.0)  # every service is being sampled by another worker
                    continue
                due, i, svc = self.queue[0]
                if svc.stop.is_set():
                    heapq.heappop(self.queue)
                    self.live -= 1
                    self.cond.notify_all()
                    continue
                wait = due - time.monotonic()
                if wait <= 0:
                    heapq.heappop(self.queue)
                    return i, svc
                self.cond.wait(min(wait, 1.0))  # bounded: a stop is seen within a second
            return None

    def _work(self) -> None:
        while True:
            picked = self._next()
            if picked is None:
                return
            i, svc = picked
            try:
                svc.tick()
            finally:
                with self.cond:
                    heapq.heappush(self.queue, (time.monotonic() + svc.interval_s, i, svc))
                    self.cond.notify()


def watchdog(services: list[NodeService]) -> None:
    """Every node's ``check_hang`` at least every second (a quarter of the shortest hang
    timeout when that is less); systemd's watchdog is pinged while a node has no backend call
    hung past its ``hang_s``. Degraded and quiesced nodes keep it pinged (``check_hang``)."""
    from fleetops.agent.serve.sdnotify import notify

    pause = threading.Event()
    while _running(services):
        pause.wait(min(1.0, min(svc.hang_s for svc in services) / 4))
        alive = False
        for svc in services:
            if not svc.stop.is_set():
                alive = svc.check_hang() or alive
        if alive:
            notify("WATCHDOG=1")


def poll_files(services: list[NodeService]) -> None:
    """The simulated kernel logs (regular files, which ``select`` cannot wait on), every
    node's polled in turn from this one thread every ``poll_s``."""
    pause = threading.Event()
    followers = [svc.follower for svc in services]
    while _running(services):
        for follower in followers:
            if not follower.stop_event.is_set():
                follower.poll_file()
        pause.wait(min(f.poll_s for f in followers))
