"""``fleetops sim job start|stop`` give the shipped prolog and epilog the environment a real
slurmd 22.05 gives them (tests/ansible/test_jobs_slurmd_realistic.py compares the two against a
real slurmd): here, that the epilog gets the same GPU lists and CPUs as the prolog did, as
slurmd's do (the simulator once gave the epilog none). The scripts run here, not over SSH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetops.sim import gpu as sim
from fleetops.sim.fleet import jobs


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    state = str(tmp_path / "node001.json")
    sim.write_state(state, sim.build_state("node001", {"gpu_minor_numbers": [1, 0, 2, 3, 4, 5, 6, 7]}))
    monkeypatch.setattr(jobs, "_node_and_job", lambda directory, n, job_id: ({}, "node001", state, job_id))
    seen: list[dict[str, str]] = []

    def run_here(fleet: Any, name: str, path: str, env: dict[str, str]) -> Any:
        seen.append(env)
        full = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "FLEETOPS_SIM_STATE": state, **env}
        done = subprocess.run(["/bin/sh", path], env=full, capture_output=True, text=True, timeout=60, check=False)
        return SimpleNamespace(exit_status=done.returncode, stderr=done.stderr)

    monkeypatch.setattr(jobs, "_run", run_here)
    return seen


def test_the_epilog_gets_the_gpu_lists_and_cpus_the_prolog_got_as_from_slurmd(node: list[dict[str, str]]) -> None:
    started = jobs.start("/unused", "node001", "512", gpus="0,2", cpus=4)
    assert [(g["index"], g["minor"]) for g in started["job"]["gpus"]] == [(1, 0), (2, 2)]
    assert started["job"]["cpus"] == 4
    ended = jobs.stop("/unused", "node001", "512")
    assert ended["job"]["ended_at"] is not None
    prolog, epilog = node
    for key in jobs.GPU_LISTS:
        assert prolog[key] == epilog[key] == "0,2", key
    assert prolog["SLURM_JOB_CPUS_PER_NODE"] == epilog["SLURM_JOB_CPUS_PER_NODE"] == "4"
    assert (prolog["SLURM_SCRIPT_CONTEXT"], epilog["SLURM_SCRIPT_CONTEXT"]) == ("prolog_slurmd", "epilog_slurmd")
    assert prolog["SLURMD_NODENAME"] == "node001" and "SLURM_CPUS_ON_NODE" not in prolog
    assert "SLURM_JOB_EXIT_CODE" in epilog and "SLURM_JOB_EXIT_CODE" not in prolog


def test_mig_devices_of_two_profiles_get_slurmds_type_grouped_gres_ids(node: list[dict[str, str]],
                                                                       tmp_path: Path) -> None:
    state = str(tmp_path / "node001.json")
    with sim.locked_state(state) as st:
        sim.set_mig_mode(st, 2, True)
        sim.set_mig_instances(st, 2, ["1g.18gb", "3g.71gb", "1g.18gb"])
        instances = [dict(m) for m in st["gpus"][2]["mig_instances"]]
    devices = sim.write_slurm_files(state)
    conf = (tmp_path / "node001.agent" / "slurm.conf").read_text().splitlines()
    assert conf[-1] == "NodeName=node001 Gres=gpu:7,gpu:1g.18gb:2,gpu:3g.71gb:1"
    mig = [d for d in devices if d["gi"] is not None]
    by_gi = sorted(mig, key=lambda d: d["gi"])
    # gres.conf lists GPU 2's instances by GPU instance id; slurmd numbers the 1g ones first
    assert [d["profile"] for d in by_gi] == [m["profile"] for m in sorted(instances, key=lambda m: m["gpu_instance_id"])]
    assert sorted(d["gres_id"] for d in mig if d["profile"] == "1g.18gb") == [7, 8]
    assert [d["gres_id"] for d in mig if d["profile"] == "3g.71gb"] == [9]
    for n, inst in enumerate(instances):
        started = jobs.start("/unused", "node001", str(600 + n), mig=[f"2:{inst['gpu_instance_id']}"])
        assert [g["mig_uuid"] for g in started["job"]["gpus"]] == [inst["uuid"]]
        assert "grouped by type" in started["job"]["source"]
