#!/bin/sh
# fleetops job attribution, Slurm epilog (installed by the fleetops.gpu.fleetops_jobs role).
#
# Marks the job ended in its record (ended_at): `fleetops-agent job end` reads SLURM_JOB_ID from
# slurmd's environment. Records ended more than 24 h ago are pruned by the same call.
#
# Exit status: slurmd drains the node when an epilog exits non-zero. Failing to close a job's
# record is no reason to take a node out, so this script exits 0 whatever the agent
# answered (a bug of ours never drains a node) and reports a failure on stderr (slurmd's log) and
# to syslog, tag fleetops-epilog. FLEETOPS_JOBS_STRICT=1 passes the agent's exit status on
# instead. The agent runs under `timeout` (FLEETOPS_JOBS_TIMEOUT seconds, default 10), so a hung
# agent cannot hold the node either.
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
  err=$(timeout "$limit" "$agent" job end 2>&1 >/dev/null)
else
  err=$("$agent" job end 2>&1 >/dev/null)
fi
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 124 ] && err="no answer within ${limit} s"
  msg="job ${SLURM_JOB_ID:-unknown}: fleetops-agent job end failed (exit $rc): $err"
  printf 'fleetops-epilog: %s\n' "$msg" >&2
  if [ "${FLEETOPS_JOBS_SYSLOG:-1}" = 1 ] && command -v logger >/dev/null 2>&1; then
    logger -t fleetops-epilog -- "$msg" || :
  fi
  if [ "${FLEETOPS_JOBS_STRICT:-0}" = 1 ]; then
    exit "$rc"
  fi
fi
exit 0
