"""The history store at fleet scale: bytes per node-audit, write time, and queries over 30 days.

What it measures, in one run:
  1. bytes per node-audit in the first release's layout (snapshots as JSON text) against the
     current one (compressed), from the same sample audits of N simulated nodes;
  2. the time to write one N-node audit through ``Store.record`` (median of the samples);
  3. a database holding D days of that fleet audited every I minutes (the sample audits' rows
     repeated, with their real compressed sizes), its size on disk, then the time of
     ``fleetops history NODE --since Dd`` (the real CLI, a whole process) and of a rate check
     (the latest snapshot of every node read back and the checks run against it), and of one
     more audit written with the retention window pruning the oldest one.
Usage:
  python bench/store.py [--nodes 1000] [--days 30] [--interval-min 10] [--samples 5] [--dir DIR [--reuse]]
Needs only the CPU and disk: about (nodes x days x 144 x 2.3 KB) for the full database.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetops import checks, model
from fleetops.checks.verdict import NodeResult
from fleetops.fleet.audit import AuditResult
from fleetops.fleet.store.database import DEFAULT_KEEP_S, Store
from fleetops.sim import gpu as sim

# The first release's layout (no user_version, snapshots as JSON text): the "before" figure.
FIRST_LAYOUT = (Path(__file__).parent.parent / "tests" / "fixtures" / "history_layout1.sql").read_text()


def node_snapshot(state: dict, now: float) -> model.Node:
    data = sim.snapshot(state, now=now)
    data.pop("_kernel_log", None)
    data["collected_at"] = now
    return model.node_from_dict(data)


def file_size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def checkpoint(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--interval-min", type=float, default=10.0)
    ap.add_argument("--samples", type=int, default=5, help="audits written through Store.record")
    ap.add_argument("--dir", help="where the databases go (default: a temporary folder, removed after)")
    ap.add_argument("--reuse", action="store_true", help="with --dir: measure the queries on the database a run left")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="fleetops-bench-store-")
    os.makedirs(work, exist_ok=True)
    names = [f"node{i:04d}" for i in range(1, args.nodes + 1)]
    states = [sim.build_state(n, {}) for n in names]
    step = args.interval_min * 60
    audits_total = int(args.days * 86400 / step)
    t_first = time.time() - audits_total * step
    try:
        old_path, new_path = os.path.join(work, "layout1.db"), os.path.join(work, "history.db")
        reuse = args.reuse and os.path.exists(new_path)
        if reuse:
            size = file_size(new_path)
            print(f"reusing {new_path}: {size / 1e9:.2f} GB (steps 1-3 skipped)")
        else:
            # 1 + 2: the same sample audits into both layouts
            for p in (old_path, new_path):
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(p + suffix):
                        os.remove(p + suffix)
            old = sqlite3.connect(old_path)
            old.executescript(FIRST_LAYOUT)
            writes = []
            with Store(new_path, keep_s=None) as store:
                for k in range(args.samples):
                    at = t_first + k * step
                    nodes = [node_snapshot(s, at) for s in states]
                    result = AuditResult(at, 30.0, [NodeResult(n.hostname, True, None, n, 0.1) for n in nodes], [], "inv.yml")
                    t0 = time.perf_counter()
                    store.record(result, 0)
                    writes.append(time.perf_counter() - t0)
                    with old:
                        cur = old.execute(
                            "INSERT INTO audits (started_at, duration_s, inventory, worst, exit_code, summary)"
                            " VALUES (?,?,?,?,?,?)",
                            (at, 30.0, "inv.yml", "ok", 0, '{"worst": "ok"}'),
                        )
                        old.executemany(
                            "INSERT INTO snapshots VALUES (?,?,?,?,?,?)",
                            [(cur.lastrowid, n.hostname, 1, None, n.collected_at, model.node_to_json(n)) for n in nodes],
                        )
            old.close()
            checkpoint(new_path)
            per_old = file_size(old_path) / (args.samples * args.nodes)
            per_new = file_size(new_path) / (args.samples * args.nodes)
            print(f"bytes per node-audit: first layout {per_old:,.0f} B, current {per_new:,.0f} B "
                  f"(ratio {per_old / per_new:.1f}x; target <= 4096 B)")
            print(f"write one {args.nodes}-node audit (Store.record): median {statistics.median(writes):.2f} s "
                  f"(min {min(writes):.2f}, n={len(writes)})")

            # 3: fill to D days by repeating the sample audits' rows (same sizes, new ids and times)
            db = sqlite3.connect(new_path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            sample_ids = [r[0] for r in db.execute("SELECT id FROM audits ORDER BY id")]
            rows = {a: db.execute("SELECT node, reachable, error, collected_at, snapshot, schema FROM snapshots"
                                  " WHERE audit_id = ?", (a,)).fetchall() for a in sample_ids}
            t0 = time.perf_counter()
            for k in range(args.samples, audits_total):
                at = t_first + k * step
                src = rows[sample_ids[k % len(sample_ids)]]
                db.execute("BEGIN")
                cur = db.execute(
                    "INSERT INTO audits (started_at, duration_s, inventory, worst, exit_code, summary) VALUES (?,?,?,?,?,?)",
                    (at, 30.0, "inv.yml", "ok", 0, json.dumps({"worst": "ok", "nodes": args.nodes})),
                )
                aid = cur.lastrowid
                db.executemany("INSERT INTO snapshots VALUES (?,?,?,?,?,?,?)",
                               [(aid, r[0], r[1], r[2], at, r[4], r[5]) for r in src])
                db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            fill_s = time.perf_counter() - t0
            size = file_size(new_path)
            print(f"{args.days:g} days of {args.nodes} nodes every {args.interval_min:g} min: {audits_total} audits, "
                  f"{audits_total * args.nodes:,} node-audits, {size / 1e9:.2f} GB on disk "
                  f"({size / (audits_total * args.nodes):,.0f} B per node-audit; target <= 20 GB) [filled in {fill_s:.0f} s]")

        fleetops_bin = shutil.which("fleetops", path=os.path.dirname(sys.executable)) or "fleetops"
        node = names[len(names) // 2]
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            proc = subprocess.run([fleetops_bin, "history", node, "--since", f"{args.days:g}d", "--db", new_path],
                                  capture_output=True, text=True, check=False)
            times.append(time.perf_counter() - t0)
            if proc.returncode != 0 or not proc.stdout.startswith("#"):
                print(f"fleetops history failed (exit {proc.returncode}): {proc.stderr[-300:]}")
                return 1
        print(f"fleetops history {node} --since {args.days:g}d: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, n=5; target <= 1 s)")

        with Store(new_path, keep_s=None) as store:
            t0 = time.perf_counter()
            prev = store.previous_snapshots(names)
            read_s = time.perf_counter() - t0
            now = t_first + audits_total * step
            current = [node_snapshot(s, now) for s in states]
            t0 = time.perf_counter()
            found = [f for n in current for f in checks.run_node_checks(n, None, prev.get(n.hostname))]
            check_s = time.perf_counter() - t0
        if len(prev) != args.nodes or store.unreadable:
            print(f"rate check baseline incomplete: {len(prev)} of {args.nodes}, unreadable {len(store.unreadable)}")
            return 1
        bad = [f for f in found if f.severity in ("warn", "crit")]
        print(f"rate check over the latest snapshots: read {args.nodes} baselines {read_s:.2f} s, "
              f"checks {check_s:.2f} s ({len(bad)} warn/crit findings on a healthy fleet)")

        with Store(new_path, keep_s=DEFAULT_KEEP_S) as store:
            result = AuditResult(time.time(), 30.0, [NodeResult(n.hostname, True, None, n, 0.1) for n in current],
                                 [], "inv.yml")
            t0 = time.perf_counter()
            store.record(result, 0)
            print(f"one more audit with 30-day retention (write + prune + incremental vacuum): "
                  f"{time.perf_counter() - t0:.2f} s")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
