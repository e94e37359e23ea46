"""A stand-in for ``scontrol``, as strict as the real one, run as a real subprocess (no shell).

Node states live in a JSON file (``$FAKE_SLURM``); every call is logged, one argv per line as
JSON, so a test sees exactly what was run. It answers as slurmctld does:

- ``show node -o NAME``: one line of Key=Value pairs, Reason last with slurmctld's
  ``[user@time]`` stamp; an unknown node is ``Node NAME not found`` on stderr, exit 1;
- ``show nodes -o``: every node, one line each, with ``Partitions=``;
- ``update NodeName=N State=DRAIN Reason=R``: an unknown node is ``Invalid node name
  specified``, a drain without a Reason is denied; ``State=RESUME`` of a node that is not
  drained (or down) is ``Invalid node state specified``. Everything else is refused.
- Nothing at all without a configuration, as the real one fails before it asks slurmctld
  anything: ``$SLURM_CONF`` must name a file, or (unset) the default ``/etc/slurm/slurm.conf``
  or configless slurmd's cached copy must exist. ``FakeSlurm.env()`` points SLURM_CONF at a
  ``slurm.conf`` in its folder, as a cluster member has one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCRIPT = r"""#!/usr/bin/env python3
import json, os, sys, time
db = os.environ["FAKE_SLURM"]
nodes = json.load(open(db))
with open(db + ".log", "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
conf = os.environ.get("SLURM_CONF")
if not any(os.path.exists(p) for p in ([conf] if conf else ["/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf"])):
    if conf:
        print(f"scontrol: error: s_p_parse_file: unable to status file {conf}: No such file or directory, "
              "retrying in 1sec up to 60sec", file=sys.stderr)
        print("scontrol: fatal: Unable to process configuration file", file=sys.stderr)
    else:
        print("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
              "scontrol: error: fetch_config: DNS SRV lookup failed\n"
              "scontrol: error: _establish_config_source: failed to fetch config\n"
              "scontrol: fatal: Could not establish a configuration source", file=sys.stderr)
    sys.exit(1)

def line(name, n):
    parts = ",".join(n.get("partitions", ["gpu"]))
    text = (f"NodeName={name} Arch=x86_64 CoresPerSocket=8 CPUAlloc=0 CPUTot=16 "
            f"State={n['state']} ThreadsPerCore=1 Partitions={parts} BootTime=2026-12-01T08:00:00")
    if n.get("reason"):
        text += f" Reason={n['reason']} [{n.get('by', 'root')}@{n.get('at', '2026-12-02T10:00:00')}]"
    return text

def fail(text, code=1):
    print(text, file=sys.stderr)
    sys.exit(code)

if args[:3] == ["show", "node", "-o"] and len(args) == 4:
    name = args[3]
    if name not in nodes:
        fail(f"Node {name} not found")
    print(line(name, nodes[name]))
elif args == ["show", "nodes", "-o"]:
    for name, n in nodes.items():
        print(line(name, n))
elif args[:1] == ["update"]:
    kv = dict(a.split("=", 1) for a in args[1:])
    if kv.get("NodeName") not in nodes:
        fail("slurm_update error: Invalid node name specified")
    n = nodes[kv["NodeName"]]
    base, _, flags = n["state"].partition("+")
    if kv.get("State") == "DRAIN":
        if not kv.get("Reason"):
            fail("You must specify a reason when DOWNING or DRAINING a node. Request denied")
        n["state"] = base + "+DRAIN"
        n["reason"] = kv["Reason"]
        n["by"] = os.environ.get("FAKE_SLURM_USER", "root")
        n["at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    elif kv.get("State") == "RESUME":
        if "DRAIN" not in flags and base != "DOWN":
            fail("slurm_update error: Invalid node state specified")
        n["state"] = "IDLE" if base == "DOWN" else base
        n.pop("reason", None)
    else:
        fail(f"unexpected update {args}", 2)
    json.dump(nodes, open(db, "w"))
else:
    fail(f"unexpected {args}", 2)
"""


class FakeSlurm:
    """The fake's files in ``folder``: ``scontrol`` (the script), ``slurm.json``, its log."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.scontrol = folder / "scontrol"
        self.scontrol.write_text(SCRIPT.replace("/usr/bin/env python3", sys.executable, 1))
        self.scontrol.chmod(0o755)
        self.db = folder / "slurm.json"
        self.conf = folder / "slurm.conf"
        self.conf.write_text("ClusterName=fake\nSlurmctldHost=ctl01\n")

    def env(self) -> dict[str, str]:
        return {"FAKE_SLURM": str(self.db), "SLURM_CONF": str(self.conf)}

    def set(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """Nodes by Slurm name: ``{"state": "IDLE", "reason": ..., "by": ..., "partitions": [...]}``."""
        self.db.write_text(json.dumps(nodes))

    def nodes(self) -> dict[str, dict[str, Any]]:
        data: dict[str, dict[str, Any]] = json.loads(self.db.read_text())
        return data

    def calls(self) -> list[list[str]]:
        log = Path(str(self.db) + ".log")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]


def cluster(count: int, partition: str = "gpu", **states: str) -> dict[str, dict[str, Any]]:
    """``count`` idle nodes gpu01.. in one partition; ``states`` overrides some (gpu02="MIXED")."""
    out: dict[str, dict[str, Any]] = {}
    for i in range(1, count + 1):
        name = f"gpu{i:02d}"
        out[name] = {"state": states.get(name, "IDLE"), "partitions": [partition]}
    return out
