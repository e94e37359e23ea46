#!/bin/sh
# The validation levels on a lent GPU machine, a workload only (no clock lock, no power cap, no
# GPU setting changed): the quick and the full level with the torch backend, each timed as the
# whole process, their results kept, a summary of each test's median and spread and of what the
# GPU went through while it ran; then the GPU tier of the tests. Run from the repository root;
# results go to $OUT.
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
Q="name,driver_version,mig.mode.current,persistence_mode,power.limit,clocks.applications.graphics"
nvidia-smi --query-gpu="$Q" --format=csv > "$OUT/before.csv"
for level in quick full; do
  t0=$(date +%s.%N)
  python3 -m fleetops.agent.main validate --level "$level" --backend torch --json > "$OUT/validate_$level.json"
  rc=$?
  t1=$(date +%s.%N)
  echo "validate --level $level: rc=$rc, whole process $(python3 -c "print(round($t1 - $t0, 2))") s"
done
python3 - "$OUT/validate_quick.json" "$OUT/validate_full.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    doc = json.load(open(path))
    print(f"== {doc['level']}: reported {doc['duration_s']:.2f} s, backend {doc['provenance']}")
    for g in doc["gpus"]:
        print(f"GPU {g['index']} {g['name']} power limit {g.get('power_limit_w')} W")
        for metric, t in g["tests"].items():
            if "median" not in t:
                print(f"  {metric}: {t}")
                continue
            spread = (t["max"] - t["min"]) / t["median"] * 100
            seen = g["telemetry"]["during"].get(metric, {})
            print(f"  {metric:18s} median {t['median']:8.1f}  min {t['min']:8.1f}  max {t['max']:8.1f}  "
                  f"spread {spread:4.1f} %  MAD {t['mad']:6.2f}  n={int(t['repeats'])}  | "
                  f"{seen.get('readings')} readings in {seen.get('seconds')} s, reasons {seen.get('clocks_event_readings')}, "
                  f"T max {seen.get('temperature_c_max')} C, P max {seen.get('power_w_max')} W, "
                  f"SM {seen.get('sm_clock_mhz_min')}-{seen.get('sm_clock_mhz_max')} MHz")
PY
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/gpu 2>&1 | tail -4
nvidia-smi --query-gpu="$Q" --format=csv > "$OUT/after.csv"
cmp "$OUT/before.csv" "$OUT/after.csv" && echo "GPU settings unchanged: $(tail -1 "$OUT/after.csv")"
