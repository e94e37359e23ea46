#!/usr/bin/env bash
# The GPU tier on a real NVIDIA node, read-only (no reset, no setting): the tests in tests/gpu
# with the checkout's fleetops, then the agent as the fleetops_agent role deploys it (its own
# virtualenv, nothing else in it but nvidia-ml-py, compiled bytecode) asked which validation
# backend it has, in the layouts the role's fleetops_agent_validate_backend gives it.
#
#   scripts/gpu-tier.sh OUT_DIR [PYTHON]
#
# PYTHON: the node's Python that holds PyTorch (default python3). Needs no network: the agent's
# virtualenv is made without pip, and fleetops and nvidia-ml-py are copied from the checkout and
# from PYTHON's own site-packages.
set -uo pipefail
out=${1:?usage: gpu-tier.sh OUT_DIR [PYTHON]}
py=${2:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader
# GPU_TIER_PYTEST: more pytest arguments (e.g. -k 'not full' to leave out the 10-minute level)
FLEETOPS_GPU_TEST_OUT="$out" timeout 420 "$py" -m pytest -q -ra -p no:cacheprovider tests/gpu ${GPU_TIER_PYTEST:-} 2>&1 \
  | tee "$out/pytest.log"

# the agent as deployed: a virtualenv of its own
pynvml=$("$py" -c 'import pynvml; print(pynvml.__file__)')
torch_site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
deploy() {  # deploy VENV [venv flags...]: the role's layout, by hand
  local venv=$1; shift
  rm -rf "$venv"
  "$py" -m venv --without-pip "$@" "$venv"
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp -r fleetops "$site/"
  cp "$pynvml" "$site/"
  "$venv/bin/python" -m compileall -q "$site/fleetops" "$site/pynvml.py"
  echo "$site"
}
probe() {  # probe NAME VENV: which backend validate would use there
  echo "== $1"
  "$2/bin/python" -m fleetops.agent.main validate --probe 2>&1 | tee "$out/probe-$1.json"
}
deploy /tmp/fleetops-none >/dev/null
probe none /tmp/fleetops-none
deploy /tmp/fleetops-system --system-site-packages >/dev/null
probe system-site-packages /tmp/fleetops-system
# fleetops_agent_validate_backend: system-torch, as the role deploys it: the system's
# site-packages switched on and a .pth naming the folder the node's PyTorch is in
site=$(deploy /tmp/fleetops-pth --system-site-packages)
echo "$torch_site" > "$site/fleetops-system-torch.pth"
probe system-torch /tmp/fleetops-pth
echo "== validate --level quick from the agent's own virtualenv"
( time timeout 200 /tmp/fleetops-pth/bin/python -m fleetops.agent.main validate --level quick --judge ) \
  > "$out/validate-quick.json" 2> "$out/validate-quick.err"
echo "exit $?"; tail -c 3000 "$out/validate-quick.json"; tail -5 "$out/validate-quick.err"
