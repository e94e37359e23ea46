#!/bin/sh
# fleetops job attribution, Slurm prolog (installed by the fleetops.gpu.fleetops_jobs role).
#
# Records which GPUs (by UUID, resolved through gres.conf by device minor) and which cgroup this
# job has: `fleetops-agent job start` reads SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_USER and
# SLURM_JOB_GPUS from slurmd's environment and writes /run/fleetops/jobs/<job id>.json.
#
# Exit status: slurmd drains the node and requeues the job when a prolog exits non-zero. Failing
# to attribute a job is no reason to take a node out, so this script exits 0 whatever the agent
# answered (a bug of ours never blocks a job) and reports a failure on stderr (slurmd's log) and
# to syslog, tag fleetops-prolog. FLEETOPS_JOBS_STRICT=1 passes the agent's exit status on
# instead. The agent runs under `timeout` (FLEETOPS_JOBS_TIMEOUT seconds, default 10), so a hung
# agent cannot hold the job's start either.
#
# Settings come from the environment or from /etc/fleetops/jobs.env (the role writes it):
# FLEETOPS_AGENT (the agent's path), FLEETOPS_JOBS_STRICT, FLEETOPS_JOBS_TIMEOUT,
# FLEETOPS_JOBS_SYSLOG (0: no syslog line) and what the agent reads (FLEETOPS_JOBS_DIR,
# FLEETOPS_GRES_CONF).
env_file="${FLEETOPS_JOBS_ENV:-/etc/fleetops/jobs.env}"
if [ -r "$env_file" ]; then
  set -a
  . "$env_file"
  set +a
fi
# slurmd gives its scripts little of an environment: the system's folders after whatever PATH came
PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
agent="${FLEETOPS_AGENT:-fleetops-agent}"
limit="${FLEETOPS_JOBS_TIMEOUT:-10}"
if command -v timeout >/dev/null 2>&1; then
  err=$(timeout "$limit" "$agent" job start 2>&1 >/dev/null)
else
  err=$("$agent" job start 2>&1 >/dev/null)
fi
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 124 ] && err="no answer within ${limit} s"
  msg="job ${SLURM_JOB_ID:-unknown}: fleetops-agent job start failed (exit $rc): $err"
  printf 'fleetops-prolog: %s\n' "$msg" >&2
  if [ "${FLEETOPS_JOBS_SYSLOG:-1}" = 1 ] && command -v logger >/dev/null 2>&1; then
    logger -t fleetops-prolog -- "$msg" || :
  fi
  if [ "${FLEETOPS_JOBS_STRICT:-0}" = 1 ]; then
    exit "$rc"
  fi
fi
exit 0
