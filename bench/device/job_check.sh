#!/bin/sh
# Issue 30 on a lent GPU machine, read-only (no GPU setting is changed): fleetops' own daemon with
# a job folder of its own, the prolog's command run by hand for a made-up job id on GPU 0 (by
# UUID: the machine has no Slurm and no gres.conf), a bf16 GEMM load on that GPU for LOAD_S
# seconds, the epilog's command, then `fleetops job` over a local connection: the job's GPU, its
# utilisation, power and sw_power_cap share, and its verdicts (a steady GEMM should get none).
# The controller's paramiko travels as wheels (.whl, see the device notes in bench/RESULTS.md).
# Run from the repository root; results go to $OUT.
set -u
REPO=$PWD
LOAD_S=${LOAD_S:-150}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$REPO"
mkdir -p /tmp/fo-bin /tmp/fo-jobs /run/fleetops
printf '#!/bin/sh\nexec python3 -m fleetops.agent.main "$@"\n' > /tmp/fo-bin/fleetops-agent
printf '#!/bin/sh\nexec python3 -m fleetops.cli "$@"\n' > /tmp/fo-bin/fleetops
chmod +x /tmp/fo-bin/*
export PATH="/tmp/fo-bin:$PATH" FLEETOPS_JOBS_DIR=/tmp/fo-jobs
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,persistence_mode,power.limit --format=csv > "$OUT/before.csv"
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
fleetops-agent serve --backend nvml --interval 2 --full-interval 10 > "$OUT/serve.log" 2>&1 &
D=$!
sleep 8
SLURM_JOB_ID=4242 SLURM_JOB_UID=0 SLURM_JOB_USER=root SLURM_JOB_GPUS="$UUID" fleetops-agent job start > "$OUT/job_start.txt" 2>&1; echo "job start: rc=$?"
python3 - "$LOAD_S" <<'PY'
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.time() + float(sys.argv[1]); n = 0
while time.time() < end:
    for _ in range(50): a @ b
    torch.cuda.synchronize(); n += 50
print("gemms", n)
PY
SLURM_JOB_ID=4242 fleetops-agent job end; echo "job end: rc=$?"
sleep 3
printf 'all:\n  hosts:\n    gpu0:\n      ansible_connection: local\n' > /tmp/fo-inv.yml
fleetops job 4242 -i /tmp/fo-inv.yml > "$OUT/job_table.txt" 2>&1; echo "fleetops job (table): rc=$?"
fleetops job 4242 -i /tmp/fo-inv.yml --format json > "$OUT/job.json" 2> "$OUT/job_json.err"; echo "fleetops job (json): rc=$?"
fleetops job 4242 -i /tmp/fo-inv.yml --plot > "$OUT/job_plot.txt" 2>&1
head -c 3000 "$OUT/job_table.txt"
kill -TERM $D; wait $D; echo "daemon exit: $?"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,persistence_mode,power.limit --format=csv > "$OUT/after.csv"
cmp "$OUT/before.csv" "$OUT/after.csv" && echo "GPU settings unchanged"
