"""Where the resident agent's memory goes on an NVML node, and what glibc's allocator settings do to it.

Read-only (NVML queries only; no GPU setting is changed). Two parts, one JSON document on stdout:

- ``stages``: a fresh interpreter per allocator variant, its ``/proc/self/status`` memory lines
  after start, ``import pynvml``, ``nvmlInit()``, one read of every GPU through fleetops' NVML
  backend, and ``malloc_trim(0)``; with the mappings that hold the most resident memory after the read.
- ``daemons``: ``fleetops-agent serve --backend nvml`` run in each variant at once (own socket,
  state directory and endpoint port each), sampled every 5 s for ``--seconds``; RSS max and final,
  the anonymous/file split, PSS, and the top mappings at the end.

    python3 bench/nvml_rss.py --seconds 60 > rss.json

Variants: ``default``; ``arena1`` (MALLOC_ARENA_MAX=1 in the environment, as a unit file's
``Environment=`` would set it); ``arena1_trim`` (the same, and ``malloc_trim(0)`` once the first
snapshot is taken and every 30 s after, from a wrapper around the agent's entry point).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

STAGES = r"""
import ctypes, json, os, sys
def mem():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads", "VmHWM"):
                out[k] = v.strip()
    return out
def top():
    rows, cur = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
                cur = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rows[cur] = rows.get(cur, 0) + int(parts[1])
    return sorted(rows.items(), key=lambda kv: -kv[1])[:12]
res = {"start": mem()}
import pynvml
res["import_pynvml"] = mem()
pynvml.nvmlInit()
res["nvmlInit"] = mem()
res["top_after_init"] = top()
from fleetops import model
from fleetops.gpu import nvml as fnvml
node = model.Node(hostname="probe", backend="nvml", collected_at=0.0)
fnvml.collect_into(node)
res["gpus_read"] = len(node.gpus)
res["after_read"] = mem()
res["top_after_read"] = top()
libc = ctypes.CDLL("libc.so.6")
libc.malloc_trim(0)
res["after_trim"] = mem()
print(json.dumps(res))
"""

RAW = r"""
import ctypes, json
def mem():
    with open("/proc/self/status") as f:
        return {k: v.strip() for k, _, v in (l.partition(":") for l in f) if k in ("VmRSS", "RssAnon", "RssFile", "Threads")}
res = {"start": mem()}
lib = ctypes.CDLL("libnvidia-ml.so.1")
res["dlopen"] = mem()
rc = lib.nvmlInit_v2()
res["nvmlInit_v2"] = {"rc": rc, **mem()}
n = ctypes.c_uint(0)
lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
h = ctypes.c_void_p()
for i in range(n.value):
    lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    t = ctypes.c_uint(0)
    lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(t))
res["handles_and_temp"] = {"gpus": n.value, **mem()}
print(json.dumps(res))
"""

WRAP = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL("libc.so.6")
def trim():
    time.sleep(15)
    while True:
        libc.malloc_trim(0)
        time.sleep(30)
threading.Thread(target=trim, daemon=True).start()
from fleetops.agent.main import entry
sys.argv = ["fleetops-agent", *sys.argv[1:]]
entry()
"""


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
                out[k] = int(v.split()[0])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Pss:", "Private_Dirty:", "Private_Clean:", "Shared_Clean:"):
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def _top(pid: int) -> list[tuple[str, int]]:
    rows: dict[str, int] = {}
    cur = "[anon]"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if "-" in parts[0] and not parts[0].endswith(":"):
                cur = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rows[cur] = rows.get(cur, 0) + int(parts[1])
    return sorted(rows.items(), key=lambda kv: -kv[1])[:12]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    variants = {"default": {}, "arena1": {"MALLOC_ARENA_MAX": "1"}, "arena1_trim": {"MALLOC_ARENA_MAX": "1"}}
    doc: dict[str, Any] = {"stages": {}, "daemons": {}}
    for name, extra in variants.items():
        if name.endswith("_trim"):
            continue
        env = {**os.environ, **extra}
        out = subprocess.run([sys.executable, "-c", STAGES], check=False, env=env, capture_output=True, text=True)
        doc["stages"][name] = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-2000:]}
    out = subprocess.run([sys.executable, "-c", RAW], check=False, capture_output=True, text=True)
    doc["stages"]["ctypes_only"] = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-2000:]}
    with tempfile.TemporaryDirectory() as d:
        procs = {}
        for name, extra in variants.items():
            env = {**os.environ, **extra, "FLEETOPS_AGENT_STATE_DIR": os.path.join(d, name, "lib")}
            env.pop("FLEETOPS_SIM_STATE", None)
            sock = os.path.join(d, name, "run", "agent.sock")
            argv = ["serve", "--backend", "nvml", "--socket", sock, "--metrics-address", f"127.0.0.1:{_free_port()}"]
            if name.endswith("_trim"):
                cmd = [sys.executable, "-c", WRAP, *argv]
            else:
                cmd = [sys.executable, "-c", "from fleetops.agent.main import entry; entry()", *argv]
            procs[name] = subprocess.Popen(cmd, env=env)
        samples: dict[str, list[dict[str, int]]] = {n: [] for n in procs}
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            time.sleep(5.0)
            for n, p in procs.items():
                if p.poll() is None:
                    samples[n].append(_status(p.pid))
        for n, p in procs.items():
            if p.poll() is not None:
                doc["daemons"][n] = {"error": f"exited {p.returncode}"}
                continue
            rss = [s["VmRSS"] for s in samples[n]]
            doc["daemons"][n] = {"rss_mib_max": round(max(rss) / 1024, 1), "final": samples[n][-1],
                                 "rss_kib_series": rss, "top": _top(p.pid)}
            p.terminate()
        for p in procs.values():
            p.wait(10)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
