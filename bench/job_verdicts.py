"""How often the job diagnosis names exactly the simulated pathology, on the right GPU.

Each run: a fresh simulated node, one job on GPUs 0-3 (32 CPUs) with one workload profile and one
seed, sampled through the daemon's real path (``SimAccess.light`` into the daemon's ``Ring``, the
cgroup's ``cpu.stat`` each tick) every 2 s for ``--seconds`` of simulated time, then
``jobs.diagnose`` (tests/unit/jobsim.py does the driving). Counted per profile:

- exact: runs whose verdicts are exactly the expected set (a steady job's is empty);
- false: verdicts given that were not expected (a wrong code, or the right code on a wrong GPU);
- missed: expected verdicts not given.

Beside it, what a utilisation dashboard alone says (the peer a user has today): the runs whose
job-mean GPU utilisation is under 80 %, which flags a slow job but not why, nor which GPU.

    .venv/bin/python bench/job_verdicts.py --seeds 20 --seconds 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from jobsim import run_job, verdict_keys  # noqa: E402

from fleetops.jobs import diagnose as dg  # noqa: E402
from fleetops.sim import gpu as sim  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()
    rows = []
    wrong: list[str] = []
    for profile in sim.PROFILES:
        exact = false = missed = util_flags = 0
        confidences: list[float] = []
        spent = 0.0
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory() as folder:
                job, expected = run_job(Path(folder), profile, seed, seconds=args.seconds)
                sampled = time.perf_counter()
                d = dg.diagnose(job)
                spent += time.perf_counter() - sampled
            got = verdict_keys(d)
            exact += got == expected
            false += len(got - expected)
            missed += len(expected - got)
            confidences += [v.confidence for v in d.verdicts
                            if (v.code, v.node, tuple(sorted(g["index"] for g in v.gpus))) in expected]
            means = [g.utilization_pct.mean for g in d.gpus if g.utilization_pct.mean is not None]
            util_flags += bool(means) and sum(means) / len(means) < 80.0
            if got != expected:
                wrong.append(f"{profile} seed {seed}: got {sorted(got)}, expected {sorted(expected)}")
        conf = f"{min(confidences):.2f}-{max(confidences):.2f}" if confidences else "-"
        rows.append((profile, args.seeds, exact, false, missed, conf, util_flags, spent / args.seeds * 1000))
    print(f"{args.seeds} seeds x {len(sim.PROFILES)} profiles, {args.seconds:.0f} s of simulated time at 2 s, "
          "GPUs 0-3 of node017, 32 CPUs")
    print()
    print("| profile | runs | exact | false verdicts | missed verdicts | confidence (expected) "
          "| util < 80 % (dashboard) | diagnose ms/job |")
    print("|---|---|---|---|---|---|---|---|")
    for profile, runs, exact, false, missed, conf, flags, ms in rows:
        print(f"| {profile} | {runs} | {exact} | {false} | {missed} | {conf} | {flags} | {ms:.1f} |")
    total = sum(r[1] for r in rows)
    print(f"| **all** | {total} | {sum(r[2] for r in rows)} | {sum(r[3] for r in rows)} | {sum(r[4] for r in rows)} "
          f"| | {sum(r[6] for r in rows)} | |")
    for line in wrong:
        print("wrong:", line)
    return 0 if not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
