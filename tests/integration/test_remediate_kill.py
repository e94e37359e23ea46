"""``fleetops remediate --yes --kill-processes`` over real SSH to a simulated fleet: it ends only
processes somebody confirmed, and only on a node it drained in Slurm first (as reset/RUN),
resumed after the verified reset. Slurm is the strict stand-in scontrol (tests/fake_scontrol.py)
first on PATH, with SLURM_CONF naming a file that exists; a wrapper notes when each call ran. The
simulator's inventory says its nodes are outside Slurm (fleetops_slurm_managed: false); these
tests run a copy of it that says they are managed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_scontrol
import pytest
import yaml

from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
NODE = "node002"
GPU = 1

WRAPPER = """#!{python}
import json, os, sys, time
with open({log!r}, "a") as fh:
    fh.write(json.dumps([time.time(), sys.argv[1:]]) + "\\n")
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


class Slurm:
    """The fake scontrol behind a timing wrapper named ``scontrol`` in a folder of its own."""

    def __init__(self, folder: Path, node_names: list[str]) -> None:
        real = folder / "fake"
        real.mkdir(parents=True)
        self.fake = fake_scontrol.FakeSlurm(real)
        self.fake.set({n: {"state": "IDLE", "partitions": ["gpu"]} for n in node_names})
        self.bin = folder / "bin"
        self.bin.mkdir()
        self.times = folder / "times.jsonl"
        wrapper = self.bin / "scontrol"
        wrapper.write_text(
            WRAPPER.format(python=sys.executable, log=str(self.times), real=str(self.fake.scontrol))
        )
        wrapper.chmod(0o755)
        self.conf = folder / "slurm.conf"
        self.conf.write_text("ClusterName=sim\n")

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.fake.env(),
            "SLURM_CONF": str(self.conf),
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
        }

    def updates(self) -> list[tuple[float, list[str]]]:
        if not self.times.exists():
            return []
        calls = [json.loads(line) for line in self.times.read_text().splitlines()]
        return [(t, argv) for t, argv in calls if argv[:1] == ["update"]]


def fleetops(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def state_path(f: Any, node: str) -> Path:
    return Path(f.directory) / "state" / f"{node}.json"


def journal(f: Any, node: str) -> list[dict[str, Any]]:
    path = state_path(f, node).with_suffix(".reset.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def managed_inventory(f: Any, folder: Path) -> str:
    """A copy of the simulator's inventory with its nodes in Slurm (the fake scontrol here)."""
    doc = yaml.safe_load(Path(f.inventory_path).read_text())
    group = doc["all"]["children"]["sim"]
    assert group["vars"]["fleetops_slurm_managed"] is False
    group["vars"]["fleetops_slurm_managed"] = True
    path = folder / "inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def processes(f: Any, node: str, gpu: int) -> list[int]:
    return sorted(p["pid"] for p in sim.gpu_processes(sim.read_state(str(state_path(f, node))), gpu))


@pytest.fixture
def busy(clean_fleet: Any, tmp_path: Path) -> Iterator[tuple[Any, str, Slurm, str]]:
    """node002's GPU 1 with an uncorrectable ECC error and a training process on it, audited;
    the last item is the inventory that puts the nodes in Slurm."""
    f = clean_fleet
    fleet.inject(f.directory, NODE, "ecc-dbe", GPU)
    fleet.inject(f.directory, NODE, "stray-process", GPU)
    db = str(tmp_path / "history.db")
    proc = fleetops("audit", "-i", f.inventory_path, "--db", db, "-q", "--format", "json", "--limit", NODE)
    assert proc.stdout.strip().startswith("{"), proc.stderr
    inv = managed_inventory(f, tmp_path)
    yield f, db, Slurm(tmp_path / "slurm", sorted(f.info["nodes"])), inv
    path = state_path(f, NODE).with_suffix(".reset.jsonl")
    path.unlink(missing_ok=True)


def test_kill_processes_without_confirmed_pids_is_refused_and_nothing_is_sent(busy: Any) -> None:
    f, db, slurm, inv = busy
    before = state_path(f, NODE).read_bytes()
    proc = fleetops(
        "remediate",
        "-i",
        inv,
        "--limit",
        NODE,
        "--db",
        db,
        "--yes",
        "--kill-processes",
        env=slurm.env(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    uuid = sim.read_state(str(state_path(f, NODE)))["gpus"][GPU]["uuid"]
    assert (
        "refusing --kill-processes" in proc.stderr and f"pid {sim.STRAY_PID} (python3 train.py" in proc.stderr
    )
    assert f"--expect-pids {NODE}:{uuid}={sim.STRAY_PID}" in proc.stderr
    assert processes(f, NODE, GPU) == [sim.STRAY_PID]  # the process is still there
    assert journal(f, NODE) == []  # no reset was attempted
    assert slurm.updates() == []  # and no drain
    assert state_path(f, NODE).read_bytes() == before


def test_confirmed_pids_drain_the_node_first_reset_and_resume_it(busy: Any) -> None:
    f, db, slurm, inv = busy
    uuid = sim.read_state(str(state_path(f, NODE)))["gpus"][GPU]["uuid"]
    proc = fleetops(
        "remediate",
        "-i",
        inv,
        "--limit",
        NODE,
        "--db",
        db,
        "--yes",
        "--kill-processes",
        "--expect-pids",
        f"{NODE}:{GPU}={sim.STRAY_PID}",
        "--format",
        "json",
        env=slurm.env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    run = doc["run"]
    (done,) = doc["executed"]
    assert done["result"] == "reset" and done["verified"] is True
    assert [p["pid"] for p in done["processes"]] == [sim.STRAY_PID]
    assert processes(f, NODE, GPU) == []
    (entry,) = journal(f, NODE)
    assert entry["result"] == "reset"
    # drained (by this run, as reset) before the reset started, resumed after it
    (drained_at, drain), (resumed_at, resume) = slurm.updates()
    assert drain[:3] == ["update", f"NodeName={NODE}", "State=DRAIN"]
    assert drain[3].startswith(f"Reason=[fleetops] reset/{run}: reset GPU {GPU} {uuid}")
    assert resume == ["update", f"NodeName={NODE}", "State=RESUME"]
    assert drained_at < entry["time"] < resumed_at
    assert slurm.fake.nodes()[NODE]["state"] == "IDLE"
    assert [s["action"] for s in doc["slurm"]] == ["drain", "resume"]


def test_a_process_that_appeared_unconfirmed_refuses_the_reset(busy: Any) -> None:
    f, db, slurm, inv = busy
    before = processes(f, NODE, GPU)
    proc = fleetops(
        "remediate",
        "-i",
        inv,
        "--limit",
        NODE,
        "--db",
        db,
        "--yes",
        "--kill-processes",
        "--expect-pids",
        f"{NODE}:{GPU}=4242",
        env=slurm.env(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"processes nobody confirmed run on the GPU: pid {sim.STRAY_PID}" in proc.stdout
    assert processes(f, NODE, GPU) == before and journal(f, NODE) == []
    # the drain made for it is lifted again: nothing was done under it
    assert [argv[2] for _, argv in slurm.updates()] == ["State=DRAIN", "State=RESUME"]
