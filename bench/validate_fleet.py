"""`fleetops validate` over real SSH on a simulated fleet with injected degradations, run after
run: does it flag exactly the degraded GPUs, and how close did a healthy one come?

One loopback fleet of real sshd processes (32 nodes of 8 simulated H200s by default), every
kind of degradation the simulator offers injected on a few GPUs (slow-hbm, slow-gemm, slow-pcie,
slow-nvlink on the one link between two GPUs of a node, noisy), then RUNS runs of

    fleetops validate -i INVENTORY --format json --no-history

each with its own noise draws: before a run every node's state gets the noise level and a seed
of its own (``sim.set_validation_noise``; seed = SEED_BASE + 1000 x run + n for the n-th node, from 0), so any
run can be drawn again. The expected answer is worked out from the simulator's declared figures
and the shipped H200 floors, not from what the judge says:

  - a degraded figure under its floor is crit, above it a straggler (warn); a figure that sits
    within 4 noise sigmas of its floor or of the straggler line is marked "near" (its verdict is
    a matter of the draw, and the bench says so);
  - a noisy GPU is unknown (the issue: "a test that never reached steady state is unknown, not
    failed"), every one of its tests unknown, and so is every node test it takes part in (the
    pairs with it, the node's all_reduce); warn or crit for it counts as wrong, as does ok;
  - nothing else is flagged.

Per run: wall time, exit status, the flagged GPUs and node findings with their status, false
positives, false negatives, wrong statuses. Margins: per metric, the healthy GPUs' (pairs',
nodes') worst distance under the fleet median against the straggler line max(k x MAD, pct x
median), and the degraded ones' least distance, recomputed from the figures the JSON carries.
Needs root (it starts sshd). Usage:
  python bench/validate_fleet.py [--nodes 32] [--runs 20] [--noise 0.02] [--seed-base 0]
                                 [--first-address 127.61.1.1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fleetops.common.errors import EXIT_CRIT, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN
from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.validation.floors import NODE_METRICS, PER_GPU_METRICS, SHIPPED
from fleetops.validation.judge import STRAGGLER_K, STRAGGLER_PCT, mad
from fleetops.validation.node import simbackend

MODEL = "H200 SXM"
# (node, GPU index, fault, peer GPU for a single slow link)
DEGRADATIONS: list[tuple[str, int, str, int | None]] = [
    ("node003", 1, "slow-hbm", None),
    ("node011", 6, "slow-gemm", None),
    ("node020", 0, "slow-pcie", None),
    ("node007", 2, "slow-nvlink", 5),
    ("node029", 4, "noisy", None),
]
RANK = {"ok": 0, "unknown": 1, "warn": 2, "crit": 3}
EXIT_BY_STATUS = {"ok": EXIT_OK, "warn": EXIT_WARN, "crit": EXIT_CRIT, "unknown": EXIT_UNKNOWN}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def factor(fault: str) -> float:
    """The simulator's declared figure of a degraded test, as a fraction of a healthy one."""
    if fault == "slow-nvlink":
        return float(getattr(simbackend, "SLOW_LINK_FACTOR", simbackend.DEGRADED_FACTOR))
    return float(simbackend.DEGRADED_FACTOR)


def healthy_figure(metric: str) -> float:
    if metric in simbackend.HEALTHY:
        return simbackend.HEALTHY[metric]
    if metric == "p2p_gbps":
        return simbackend.P2P_GBPS
    if metric == "p2p_bidir_gbps":
        return simbackend.P2P_BIDIR_GBPS
    return simbackend.ALLREDUCE_NVLS_GBPS["quick"]  # 8 GPUs: NVLS at the quick level's 256 MiB


def floor_of(metric: str) -> float | None:
    floors = SHIPPED[MODEL]
    if metric == "allreduce_busbw_gbps":
        fl = floors.allreduce_floor(8, "NVLS", simbackend.ALLREDUCE_BYTES["quick"])
        return fl.busbw_gbps if fl else None
    if metric == "p2p_bidir_gbps":
        return None
    return floors.metric(metric)


def expected_status(metric: str, fault: str, noise: float) -> tuple[str, str]:
    """The verdict the declared degraded figure earns, and a note when the draw can turn it."""
    value = healthy_figure(metric) * factor(fault)
    sigma = noise / 2  # the simulator's spread of a test's level from run to run
    floor = floor_of(metric)
    note = ""
    if floor is not None and abs(value - floor) / floor < 4 * sigma:
        note = f"near: {value:.1f} within 4 sigma of the floor {floor:.1f}"
    if (1 - factor(fault)) - STRAGGLER_PCT < 4 * sigma:
        note = f"near: {value:.1f} within 4 sigma of the straggler line"
    return ("crit" if floor is not None and value < floor else "warn"), note


def expectations(states: dict[str, dict[str, Any]], noise: float) -> dict[str, Any]:
    """Expected GPU verdicts {uuid: (status, {metric: status})} and node findings
    {(host, metric, label): status}, with the notes on near cases and what is healthy."""
    gpus: dict[str, tuple[str, dict[str, str]]] = {}
    node: dict[tuple[str, str, str], str] = {}
    notes: list[str] = []
    faulted_pairs: set[tuple[str, str]] = set()  # (host, label) of pairs not healthy
    faulted_ar: set[str] = set()
    for host, gpu, fault, peer in DEGRADATIONS:
        uuids = [g["uuid"] for g in states[host]["gpus"]]
        u = uuids[gpu]
        if fault == "noisy":
            gpus[u] = ("unknown", dict.fromkeys(PER_GPU_METRICS, "unknown"))
            for other in uuids:
                if other == u:
                    continue
                for label, metric in ((f"{u}->{other}", "p2p_gbps"), (f"{other}->{u}", "p2p_gbps"),
                                      (f"{min(u, other, key=uuids.index)}<->{max(u, other, key=uuids.index)}",
                                       "p2p_bidir_gbps")):
                    node[(host, metric, label)] = "unknown"
                    faulted_pairs.add((host, label))
            node[(host, "allreduce_busbw_gbps", "*")] = "unknown"
            faulted_ar.add(host)
            continue
        if fault == "slow-nvlink":
            assert peer is not None
            a, b = uuids[min(gpu, peer)], uuids[max(gpu, peer)]
            for label, metric in ((f"{a}->{b}", "p2p_gbps"), (f"{b}->{a}", "p2p_gbps"), (f"{a}<->{b}", "p2p_bidir_gbps"),
                                  ("*", "allreduce_busbw_gbps")):
                status, note = expected_status(metric, fault, noise)
                node[(host, metric, label)] = status
                faulted_pairs.add((host, label))
                if note and f"{host} {fault} {metric}: {note}" not in notes:
                    notes.append(f"{host} {fault} {metric}: {note}")
            faulted_ar.add(host)
            continue
        metrics = {m: expected_status(m, fault, noise) for m in sim.VALIDATION_FAULTS[fault] if m in PER_GPU_METRICS}
        notes += [f"{host} GPU{gpu} {fault} {m}: {note}" for m, (_, note) in metrics.items() if note]
        statuses = {m: s for m, (s, _) in metrics.items()}
        gpus[u] = (max(statuses.values(), key=RANK.__getitem__), statuses)
    worst = max([s for s, _ in gpus.values()] + list(node.values()), key=RANK.__getitem__)
    return {"gpus": gpus, "node": node, "notes": notes, "exit": EXIT_BY_STATUS[worst],
            "faulted_pairs": faulted_pairs, "faulted_ar": faulted_ar}


def compare(doc: dict[str, Any], exp: dict[str, Any]) -> dict[str, Any]:
    got_gpus = {g["gpu"]: (g["status"], {f["metric"]: f["status"] for f in g["findings"]})
                for g in doc["gpus"] if g["status"] != "ok"}
    got_node = {(n["host"], f["metric"], "*" if f["metric"] == "allreduce_busbw_gbps" else f["gpu"]): f["status"]
                for n in doc["nodes"] for f in n["findings"]}
    want_gpus, want_node = exp["gpus"], exp["node"]
    fp = sorted(f"{u} {got_gpus[u][0]}" for u in set(got_gpus) - set(want_gpus))
    fn = sorted(f"{u} (expected {want_gpus[u][0]})" for u in set(want_gpus) - set(got_gpus))
    wrong = sorted(f"{u} {got_gpus[u]} (expected {want_gpus[u]})" for u in set(got_gpus) & set(want_gpus)
                   if got_gpus[u] != want_gpus[u])
    nfp = sorted(f"{k[0]} {k[1]} {k[2]} {got_node[k]}" for k in set(got_node) - set(want_node))
    nfn = sorted(f"{k[0]} {k[1]} {k[2]} (expected {want_node[k]})" for k in set(want_node) - set(got_node))
    nwrong = sorted(f"{k[0]} {k[1]} {k[2]} {got_node[k]} (expected {want_node[k]})"
                    for k in set(got_node) & set(want_node) if got_node[k] != want_node[k])
    return {"flagged": {u: {"status": s, "findings": f} for u, (s, f) in sorted(got_gpus.items())},
            "node_findings": {f"{k[0]} {k[1]} {k[2]}": s for k, s in sorted(got_node.items())},
            "false_positives": fp, "false_negatives": fn, "wrong_status": wrong,
            "node_false_positives": nfp, "node_false_negatives": nfn, "node_wrong_status": nwrong}


def _distances(values: dict[Any, float], healthy: set[Any], degraded: set[Any]) -> dict[str, Any] | None:
    """Fleet median and straggler line over the steady figures; the healthy ones' worst
    distance under the median and the degraded ones' least, as fractions of the median."""
    if len(values) < 3:
        return None
    ref = float(statistics.median(values.values()))
    line = max(STRAGGLER_K * mad(values.values()), STRAGGLER_PCT * ref) / ref
    h = [(ref - v) / ref for k, v in values.items() if k in healthy]
    d = [(ref - v) / ref for k, v in values.items() if k in degraded]
    return {"median": round(ref, 2), "line": round(line, 5), "healthy_worst": round(max(h), 5) if h else None,
            "degraded_least": round(min(d), 5) if d else None, "steady": len(values)}


def margins(doc: dict[str, Any], exp: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    unknown = {(g["gpu"], f["metric"]) for g in doc["gpus"] for f in g["findings"] if f["status"] == "unknown"}
    for metric in PER_GPU_METRICS:
        figures = {g["gpu"]: float(g["figures"][metric]) for g in doc["gpus"]
                   if metric in g.get("figures", {}) and (g["gpu"], metric) not in unknown}
        healthy_gpus = {u for u in figures if u not in exp["gpus"]}
        degraded_gpus = {u for u in figures if exp["gpus"].get(u, ("", {}))[1].get(metric, "unknown") != "unknown"}
        out[metric] = _distances(figures, healthy_gpus, degraded_gpus)
    node_unknown = {(n["host"], f["metric"], f["gpu"]) for n in doc["nodes"] for f in n["findings"]
                    if f["status"] == "unknown"}
    for metric in NODE_METRICS:
        values: dict[Any, float] = {}
        for n in doc["nodes"]:
            for label, v in (n.get("figures", {}).get(metric) or {}).items():
                if (n["host"], metric, label) not in node_unknown:
                    values[(n["host"], label)] = float(v)
        if metric == "allreduce_busbw_gbps":
            healthy = {k for k in values if k[0] not in exp["faulted_ar"]}
        else:
            healthy = {k for k in values if k not in exp["faulted_pairs"]}
        keys = {k: (k[0], metric, "*" if metric == "allreduce_busbw_gbps" else k[1]) for k in values}
        degraded = {k for k in values if exp["node"].get(keys[k], "unknown") != "unknown"}
        out[metric] = _distances(values, healthy, degraded)
    return out


def run_once(inventory: str, env: dict[str, str]) -> tuple[float, int, dict[str, Any] | None, str]:
    cmd = [sys.executable, "-m", "fleetops.cli", "validate", "-i", inventory, "--format", "json", "--no-history"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t0
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    return dt, proc.returncode, doc, proc.stderr[-500:]


def _term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--seed-base", type=int, default=0, help="node n of run r draws with seed BASE + 1000 r + n")
    ap.add_argument("--first-address", default="127.61.1.1", help="first loopback address of the fleet's block")
    ap.add_argument("--json", help="write every run's record and the summary here")
    args = ap.parse_args()
    if args.nodes < 29:
        ap.error("--nodes: the degradations sit on nodes up to node029; give 29 or more")
    if not args.first_address.startswith("127."):
        ap.error("--first-address: the simulated fleet lives on loopback (127.0.0.0/8)")
    signal.signal(signal.SIGTERM, _term)
    directory = tempfile.mkdtemp(prefix="fleetops-validate-bench-")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env.pop("FLEETOPS_SIM_STATE", None)
    records: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        info = fleet.up(args.nodes, directory, first_address=args.first_address, port=free_port(args.first_address))
        up_s = time.perf_counter() - t0
        paths = {name: entry["state"] for name, entry in info["nodes"].items()}
        names = sorted(paths)
        for name, gpu, fault, peer in DEGRADATIONS:
            st = sim.read_state(paths[name])
            sim.inject_validation_fault(st, fault, gpu, peer)
            sim.write_state(paths[name], st)
        states = {name: sim.read_state(p) for name, p in paths.items()}
        exp = expectations(states, args.noise)
        print(f"fleet: {args.nodes} nodes x 8 GPUs on {args.first_address}.., up in {up_s:.1f} s; noise {args.noise:.0%}")
        for name, gpu, fault, peer in DEGRADATIONS:
            print(f"  {name} GPU{gpu}{f'-GPU{peer}' if peer is not None else ''}: {fault}")
        print("expected: " + ", ".join(f"{u[:12]}.. {s}" for u, (s, _) in exp["gpus"].items())
              + f"; {len(exp['node'])} node findings; exit {exp['exit']}")
        for note in exp["notes"]:
            print(f"  {note}")
        for r in range(args.runs):
            seeds = {}
            for n, name in enumerate(names):
                st = sim.read_state(paths[name])
                seeds[name] = args.seed_base + 1000 * r + n
                sim.set_validation_noise(st, args.noise, seeds[name])
                sim.write_state(paths[name], st)
            wall, code, doc, err = run_once(info["inventory"], env)
            rec: dict[str, Any] = {"run": r, "wall_s": round(wall, 2), "exit": code,
                                   "seed_base": args.seed_base + 1000 * r}
            if doc is None:
                rec.update({"error": err, "exact": False})
            else:
                cmp = compare(doc, exp)
                faults = sum(len(cmp[k]) for k in ("false_positives", "false_negatives", "wrong_status",
                                                   "node_false_positives", "node_false_negatives",
                                                   "node_wrong_status"))
                rec.update(cmp)
                rec["unreachable"] = doc["unreachable"]
                rec["exact"] = faults == 0 and code == exp["exit"] and not doc["unreachable"]
                rec["margins"] = margins(doc, exp)
            records.append(rec)
            print(f"run {r:2d}: {wall:6.1f} s exit {code} "
                  f"{'exact match' if rec['exact'] else 'MISMATCH'}"
                  f"  FP {len(rec.get('false_positives', []))}+{len(rec.get('node_false_positives', []))}"
                  f"  FN {len(rec.get('false_negatives', []))}+{len(rec.get('node_false_negatives', []))}"
                  f"  wrong {len(rec.get('wrong_status', []))}+{len(rec.get('node_wrong_status', []))}",
                  flush=True)
            for key in ("false_positives", "false_negatives", "wrong_status", "node_false_positives",
                        "node_false_negatives", "node_wrong_status"):
                for item in rec.get(key, []):
                    print(f"        {key}: {item}")
            if "error" in rec:
                print(f"        error: {rec['error']}")
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
    summary = summarize(records, exp)
    print_summary(summary)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"nodes": args.nodes, "runs": args.runs, "noise": args.noise, "seed_base": args.seed_base,
                       "degradations": [{"node": n, "gpu": g, "fault": f, "peer": p}
                                        for n, g, f, p in DEGRADATIONS],
                       "expected": {"gpus": {u: {"status": s, "findings": f} for u, (s, f) in exp["gpus"].items()},
                                    "node_findings": {" ".join(k): s for k, s in exp["node"].items()},
                                    "exit": exp["exit"], "notes": exp["notes"]},
                       "runs_detail": records, "summary": summary}, fh, indent=1)
    return 0 if summary["exact_runs"] == len(records) else 1


def summarize(records: list[dict[str, Any]], exp: dict[str, Any]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in records]
    total = {k: sum(len(r.get(k, [])) for r in records)
             for k in ("false_positives", "false_negatives", "wrong_status", "node_false_positives",
                       "node_false_negatives", "node_wrong_status")}
    per_metric: dict[str, Any] = {}
    for metric in (*PER_GPU_METRICS, *NODE_METRICS):
        rows = [r["margins"][metric] for r in records if r.get("margins", {}).get(metric)]
        if not rows:
            continue
        worst = max(rows, key=lambda m: (m["healthy_worst"] or -1) - m["line"])
        degraded = [m["degraded_least"] for m in rows if m["degraded_least"] is not None]
        per_metric[metric] = {
            "line_min": min(m["line"] for m in rows), "line_max": max(m["line"] for m in rows),
            "healthy_worst": max(m["healthy_worst"] for m in rows if m["healthy_worst"] is not None),
            "closest_headroom": round(worst["line"] - (worst["healthy_worst"] or 0.0), 5),
            "degraded_least": min(degraded) if degraded else None,
        }
    return {"runs": len(records), "exact_runs": sum(1 for r in records if r["exact"]),
            "exit_codes": sorted({r["exit"] for r in records}), "expected_exit": exp["exit"],
            "wall_s": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)} if walls else {},
            "totals": total, "margins": per_metric}


def print_summary(s: dict[str, Any]) -> None:
    print()
    print(f"runs with an exact match: {s['exact_runs']}/{s['runs']}; exit codes {s['exit_codes']} "
          f"(expected {s['expected_exit']}); wall s median {s['wall_s'].get('median', 0):.1f} "
          f"(min {s['wall_s'].get('min', 0):.1f}, max {s['wall_s'].get('max', 0):.1f})")
    t = s["totals"]
    print(f"GPUs: {t['false_positives']} false positives, {t['false_negatives']} false negatives, "
          f"{t['wrong_status']} wrong status; node tests: {t['node_false_positives']} false positives, "
          f"{t['node_false_negatives']} false negatives, {t['node_wrong_status']} wrong status")
    print(f"{'metric':<22} {'straggler line':>15} {'healthy worst':>14} {'closest headroom':>17} {'degraded least':>15}")
    for metric, m in s["margins"].items():
        line = f"{m['line_min']:.2%}" if m["line_min"] == m["line_max"] else f"{m['line_min']:.2%}-{m['line_max']:.2%}"
        deg = f"{m['degraded_least']:.2%}" if m["degraded_least"] is not None else "-"
        print(f"{metric:<22} {line:>15} {m['healthy_worst']:>14.2%} {m['closest_headroom']:>17.2%} {deg:>15}")
    print("(distances under the fleet median, as fractions of it; the straggler line is max(k x MAD, "
          f"{STRAGGLER_PCT:.0%}) with k = {STRAGGLER_K:g}; a negative healthy distance is above the median)")


if __name__ == "__main__":
    sys.exit(main())
