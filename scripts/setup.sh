#!/usr/bin/env bash
# Sets up fleetops on a fresh Debian/Ubuntu machine, as root: the system packages the simulated
# fleet and the test tiers need, and a virtual environment in .venv with fleetops installed.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
# the SSH tier's become tests run the agent through sudo from a throwaway login
command -v sudo >/dev/null 2>&1 || need+=(sudo)
if [ "${FLEETOPS_SETUP_FULL:-0}" = 1 ]; then
  command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
  command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
  # the realistic-host tier drains and resumes nodes through a real slurmctld
  command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
  command -v scontrol >/dev/null 2>&1 || need+=(slurm-client)
  command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
  # promtool checks the Prometheus exposition and alert rules; the server runs the scrape test
  command -v promtool >/dev/null 2>&1 || need+=(prometheus)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q --config-settings editable_mode=compat -e '.[test]'
echo "setup: fleetops $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("fleetops"))') in .venv"
