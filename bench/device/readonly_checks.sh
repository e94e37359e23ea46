#!/bin/sh
# Read-only checks on a lent GPU machine (never changes a GPU setting): the agent as deployed in
# its own venv (compiled bytecode), its `check` against a small baseline and none, a dry run of
# `mig apply`, the GPU tier of the tests, and where the quick validation's time goes.
# Run from the repository root; results go to $OUT.
PY=$(python3 -c 'import pynvml; print(pynvml.__file__)')
python3 -m venv --without-pip /tmp/vi
SP=$(/tmp/vi/bin/python -c 'import site; print(site.getsitepackages()[0])')
cp "$PY" "$SP/"
/tmp/vi/bin/python -m compileall -q "$SP" fleetops bench >/dev/null
export PYTHONPATH="$PWD"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,mig.mode.pending,persistence_mode --format=csv > "$OUT/before.csv"
/tmp/vi/bin/python -m fleetops.agent.main check --baseline bench/device/h200_vm_baseline.json --json > "$OUT/check_baseline.json"; echo "check with baseline: rc=$?"
/tmp/vi/bin/python -m fleetops.agent.main check --json > "$OUT/check_none.json"; echo "check without baseline: rc=$?"
/tmp/vi/bin/python -m fleetops.agent.main mig apply --layout 3g.71gb,3g.71gb --dry-run --json > "$OUT/mig_dry_run.json"; echo "mig apply dry run: rc=$?"
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/gpu 2>&1 | tail -8
python3 bench/validate_timing.py > "$OUT/validate_timing.json"; echo "validate timing: rc=$?"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,mig.mode.pending,persistence_mode --format=csv > "$OUT/after.csv"
cmp "$OUT/before.csv" "$OUT/after.csv" && echo "GPU settings unchanged"
