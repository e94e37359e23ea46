#!/usr/bin/env python3
"""TUI at fleet scale: 1000 nodes x 8 GPUs of simulated snapshots fed straight to the app.

    python3 bench/tui_refresh.py                 # 1000 nodes, 20 refreshes
    python3 bench/tui_refresh.py --nodes 2000 --refreshes 30

No SSH: snapshots come from the simulator (``fleetops.tui.simfeed``) and the real checks, built
once, then fed to ``FleetApp.feed`` as the refresh thread would hand them over. Measured in one
process, headless (``App.run_test``), terminal 160x45:

- first paint: from starting the app to the first frame that shows all the nodes (and from the
  feed alone). Target < 1 s.
- refresh: main-thread time to take one round in which 5% of the nodes view's cells change
  (about 80 of 1000 nodes change health, GPUs, XIDs, worst finding and age: 350 of 7000 cells):
  ``feed`` (swap entries, rows, diff, ``update_cell``) and feed-to-painted (including the
  frame). Target < 50 ms. Also the same round on the 8000-row GPUs view, the later fading
  of the lit cells, and the per-node refresh-thread cost (parse-free: summarize + checks),
  which is off the main thread.
- peer: the naive refresh many table UIs do, forget the table and draw every row anew, timed on the
  same rounds in the same process; its ratio to ours is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetops import model
from fleetops.tui import data, simfeed
from fleetops.tui.app import FleetApp
from fleetops.tui.widgets.fleet_table import FleetTable

SIZE = (160, 45)
FAULTS = [
    "ecc-dbe@3",
    "pcie-downgrade@1",
    "nvlink-down@6",
    "thermal-slowdown@2",
    "row-remap-pending@0",
    "xid:79@5",
]


def build(nodes: int, count: int) -> tuple[list[data.NodeEntry], list[list[data.NodeEntry]]]:
    """Entries for every node (3% of them faulty), and per refresh round the 5% that change."""
    names = [f"gpu{i:04d}" for i in range(1, nodes + 1)]
    healthy = simfeed.snapshot(simfeed.sim_state("template"))
    faulty = {f: simfeed.snapshot(simfeed.sim_state("template", [f])) for f in FAULTS}
    entries = []
    for i, name in enumerate(names):
        base = faulty[FAULTS[i % len(FAULTS)]] if i % 33 == 0 else healthy
        node = simfeed.clone_node(base, name)
        entries.append(data.summarize(name, node, simfeed.findings(node), simfeed.T0))
    target = nodes * len(data.COLUMNS["nodes"]) * 5 // 100  # 5% of the nodes view's cells
    now = simfeed.T0 + 30

    def node_cells(e: data.NodeEntry) -> tuple[str, ...]:
        one = data.FleetState(clock=lambda: now)
        one.update([e])
        return one.rows("nodes")[0].cells

    rounds = []
    latest = list(entries)
    for r in range(1, count + 1):
        batch, changed, k = [], 0, 0
        while changed < target:
            i = (r * 37 + k * 13) % nodes
            k += 1
            e = latest[i]
            fault = FAULTS[(i + r) % len(FAULTS)]
            node = simfeed.clone_node(faulty[fault] if e.health == "ok" else healthy, e.name)
            new = data.summarize(e.name, node, simfeed.findings(node), simfeed.T0 + r, e)
            changed += sum(a != b for a, b in zip(node_cells(e), node_cells(new), strict=True))
            batch.append(new)
            latest[i] = new
        rounds.append(batch)
    return entries, rounds


class Naive(FleetTable):
    """The peer: a refresh that forgets what is shown and draws every row anew (no diff, no
    kept lines), as a table cleared and refilled on each round would."""

    def apply(self, rows: list[data.Row], highlight: bool = True) -> int:
        self._shown = {}
        self._line_cache.clear()
        super().apply(rows, highlight=False)
        self.last_changed_cells = len(rows) * len(self.spec)
        return self.last_changed_cells


async def painted(app: FleetApp) -> None:
    done = asyncio.get_running_loop().create_future()
    app.call_after_refresh(lambda: done.done() or done.set_result(None))
    await done


async def first_paint(entries: list[data.NodeEntry]) -> tuple[float, float, float]:
    """(wall from app start, wall from the feed, main-thread CPU from the feed) to the first
    frame showing every node."""
    started = time.perf_counter()
    app = FleetApp(names=[e.name for e in entries], clock=lambda: simfeed.T0 + 30, tick_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await painted(app)
        t_feed, c_feed = time.perf_counter(), time.thread_time()
        app.feed(entries)
        await painted(app)
        end, c_end = time.perf_counter(), time.thread_time()
        assert len(app.screen.table().keys) == len(entries)
        await pilot.pause()
    return end - started, end - t_feed, c_end - c_feed


class RefreshThread(threading.Thread):
    """What ``SshSource`` does with every answer, flat out: parse the agent's JSON, run the
    checks, build the entry. It competes with the screen for the GIL."""

    def __init__(self, text: str) -> None:
        super().__init__(daemon=True)
        self.text = text
        self.stop = threading.Event()
        self.nodes = 0

    def run(self) -> None:
        while not self.stop.is_set():
            node = model.node_from_json(self.text)
            data.summarize(node.hostname, node, simfeed.findings(node), simfeed.T0)
            self.nodes += 1


def refresh_thread_cost(text: str, n: int = 200) -> float:
    started = time.perf_counter()
    for _ in range(n):
        node = model.node_from_json(text)
        data.summarize(node.hostname, node, simfeed.findings(node), simfeed.T0)
    return (time.perf_counter() - started) * 1000 / n


async def refreshes(
    entries: list[data.NodeEntry],
    rounds: list[list[data.NodeEntry]],
    count: int,
    view: str,
    naive: bool,
    busy: str | None = None,
) -> dict[str, list[float]]:
    app = FleetApp(names=[e.name for e in entries], clock=lambda: simfeed.T0 + 30, tick_s=0, highlight_s=0.05)
    out: dict[str, list[float]] = {"feed": [], "paint": [], "wall": [], "cells": [], "fade": []}
    async with app.run_test(size=SIZE) as pilot:
        app.feed(entries)
        await painted(app)
        if view != "nodes":
            await pilot.press({"gpus": "2"}[view])
            await painted(app)
        table = app.screen.table()
        if naive:
            table.__class__ = Naive
        table.select_key(table.keys[len(table.keys) // 2])
        await painted(app)
        worker = RefreshThread(busy) if busy else None
        if worker:
            worker.start()
        for batch in rounds[:count]:
            # main-thread CPU time (thread_time) is what the screen pays; wall time also counts
            # whatever else runs on this machine
            w0, t0 = time.perf_counter(), time.thread_time()
            app.feed(batch)
            t1 = time.thread_time()
            await painted(app)
            t2, w2 = time.thread_time(), time.perf_counter()
            out["feed"].append((t1 - t0) * 1000)
            out["paint"].append((t2 - t0) * 1000)
            out["wall"].append((w2 - w0) * 1000)
            out["cells"].append(table.last_changed_cells)
            await asyncio.sleep(0.06)
            t3 = time.thread_time()
            table.fade()
            await painted(app)
            out["fade"].append((time.thread_time() - t3) * 1000)
        if worker:
            worker.stop.set()
            worker.join()
            out["busy_nodes"] = [float(worker.nodes)]
        await pilot.pause()
    return out


def busy_nodes(result: dict[str, list[float]]) -> int:
    return int(result.get("busy_nodes", [0])[0])


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.95) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=20)
    args = parser.parse_args()

    t = time.perf_counter()
    entries, rounds = build(args.nodes, args.refreshes)
    gpus = sum(len(e.gpus) for e in entries)
    print(f"fleet: {args.nodes} nodes, {gpus} GPUs; built in {time.perf_counter() - t:.1f}s")
    agent_json = model.node_to_json(simfeed.snapshot(simfeed.sim_state("gpu0001")))
    per_node = refresh_thread_cost(agent_json)
    print(
        f"refresh thread, per node answer (parse {len(agent_json) // 1024} KiB of JSON + checks + entry), off the "
        f"main thread: {per_node:.2f} ms; a round of {args.nodes} nodes: {per_node * args.nodes / 1000:.1f} s of CPU"
    )

    total, from_feed, cpu = asyncio.run(first_paint(entries))
    print(
        f"first paint: {total * 1000:.0f} ms from app start, {from_feed * 1000:.0f} ms from the feed "
        f"({cpu * 1000:.0f} ms main-thread CPU)  target < 1000 ms"
    )

    cells_nodes = args.nodes * len(data.COLUMNS["nodes"])
    results: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for view in ("nodes", "gpus"):
        for naive in (False, True):
            results[(view, naive)] = asyncio.run(refreshes(entries, rounds, args.refreshes, view, naive))
    busy = asyncio.run(refreshes(entries, rounds, args.refreshes, "nodes", False, agent_json))
    ours, peer = results[("nodes", False)], results[("nodes", True)]
    changed = med(ours["cells"])
    print(
        f"refresh, nodes view: {changed:.0f} of {cells_nodes} cells changed ({changed * 100 / cells_nodes:.1f}%); "
        f"main-thread CPU: feed median {med(ours['feed']):.1f} ms (p95 {p95(ours['feed']):.1f}), "
        f"feed+paint median {med(ours['paint']):.1f} ms (p95 {p95(ours['paint']):.1f})  target < 50 ms; "
        f"wall feed-to-painted median {med(ours['wall']):.1f} ms"
    )
    print(f"  fading the lit cells afterwards (+ its paint): median {med(ours['fade']):.1f} ms")
    print(
        f"  peer (clear + re-add every row): feed {med(peer['feed']):.1f} ms, "
        f"feed+paint {med(peer['paint']):.1f} ms; ratio ours/peer {med(ours['paint']) / med(peer['paint']):.2f}"
    )
    g, gp = results[("gpus", False)], results[("gpus", True)]
    cells_gpus = gpus * len(data.COLUMNS["gpus"])
    print(
        f"refresh, gpus view ({gpus} rows): {med(g['cells']):.0f} of {cells_gpus} cells changed; main-thread CPU "
        f"feed median {med(g['feed']):.1f} ms (p95 {p95(g['feed']):.1f}), feed+paint {med(g['paint']):.1f} ms "
        f"(p95 {p95(g['paint']):.1f}); peer {med(gp['paint']):.1f} ms, ratio {med(g['paint']) / med(gp['paint']):.2f}"
    )
    print(
        f"refresh, nodes view, with the refresh thread parsing and checking flat out beside it "
        f"({busy_nodes(busy)} node answers meanwhile): main-thread CPU feed+paint median {med(busy['paint']):.1f} ms "
        f"(p95 {p95(busy['paint']):.1f}); wall feed-to-painted median {med(busy['wall']):.1f} ms "
        f"(p95 {p95(busy['wall']):.1f})"
    )
    print(
        f"machine load average while running: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
