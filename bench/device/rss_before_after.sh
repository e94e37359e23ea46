#!/bin/sh
# The resident agent's memory beside the NVML floor, before and after a change, on a lent GPU
# machine (read-only: NVML queries, the daemon, the GPU test tier; no GPU setting is changed).
# Both trees are deployed as the role deploys the agent: a venv of its own without pip, fleetops
# and pynvml copied in, compiled. "before" is a fleetops tree packed as
# bench/device/old/fleetops-REV.tgz (git archive REV fleetops | gzip), "after" this checkout.
# bench/nvml_rss.py is run from /tmp so that `python -c` finds the venv's fleetops, not the
# checkout's. Run from the repository root; results go to $OUT.
set -u
REPO=$PWD
PY=$(python3 -c 'import pynvml; print(pynvml.__file__)')
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,persistence_mode --format=csv | tee "$OUT/before.csv"
for tree in old new; do
    python3 -m venv --without-pip /tmp/v$tree
    SP=$(/tmp/v$tree/bin/python -c 'import site; print(site.getsitepackages()[0])')
    cp "$PY" "$SP/"
    if [ $tree = old ]; then tar -xzf "$REPO"/bench/device/old/fleetops-*.tgz -C "$SP"; else cp -r "$REPO/fleetops" "$SP/"; fi
    find "$SP/fleetops" -name __pycache__ -prune -exec rm -rf {} +
    /tmp/v$tree/bin/python -m compileall -q "$SP" >/dev/null
done
cd /tmp
for tree in old new; do
    /tmp/v$tree/bin/python "$REPO/bench/nvml_rss.py" --seconds 40 > "$OUT/rss-$tree.json"; echo "rss $tree: rc=$?"
done
cd "$REPO"
PYTHONPATH="$REPO" python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/gpu 2>&1 | tail -12
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,persistence_mode --format=csv > "$OUT/after.csv"
cmp "$OUT/before.csv" "$OUT/after.csv" && echo "GPU settings unchanged"
