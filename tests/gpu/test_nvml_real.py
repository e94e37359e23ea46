"""The NVML backend on a real GPU, checked against nvidia-smi. Read-only: changes nothing.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops import model

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
QUERY = (
    "index,uuid,pci.bus_id,driver_version,vbios_version,inforom.img,persistence_mode,power.limit,"
    "power.max_limit,pcie.link.gen.max,pcie.link.width.max,ecc.mode.current,mig.mode.current,memory.total"
)


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FLEETOPS_SIM_STATE", None)
    return subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def node() -> model.Node:
    proc = _agent("collect", "--backend", "nvml")
    assert proc.returncode == 0, proc.stderr
    return model.node_from_json(proc.stdout)


@pytest.fixture(scope="module")
def smi_rows() -> list[list[str]]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def _na(text: str) -> bool:
    return text.startswith("[") or text in ("N/A", "")


def _mode(text: str) -> bool | None:
    if _na(text):
        return None
    return {"Enabled": True, "Disabled": False}[text]


def test_snapshot_matches_nvidia_smi(node: model.Node, smi_rows: list[list[str]]) -> None:
    assert node.backend == "nvml"
    assert node.gpu_count == len(smi_rows) == len(node.gpus)
    for row in smi_rows:
        (
            index,
            uuid,
            bus,
            driver,
            vbios,
            inforom,
            persistence,
            limit,
            max_limit,
            gen_max,
            width_max,
            ecc,
            mig,
            mem_total,
        ) = row
        gpu = node.gpu_by_bus_id(bus)  # nvidia-smi prints 00000000:00:06.0
        assert gpu is not None, f"{bus} missing from the snapshot"
        assert gpu.bus_id == model.normalize_bus_id(bus)
        assert gpu.index == int(index)
        assert gpu.uuid == uuid
        assert node.driver_version == driver
        assert gpu.vbios_version == vbios
        assert gpu.inforom_image == (None if _na(inforom) else inforom)
        assert gpu.persistence_mode == _mode(persistence)
        if not _na(limit):
            assert gpu.power_limit_w == pytest.approx(float(limit), abs=0.01)
        if not _na(max_limit):
            assert gpu.power_max_limit_w == pytest.approx(float(max_limit), abs=0.01)
        assert gpu.pcie_gen_max == (None if _na(gen_max) else int(gen_max))
        assert gpu.pcie_width_max == (None if _na(width_max) else int(width_max))
        assert gpu.ecc_mode_current == _mode(ecc)
        assert gpu.mig_mode_current == _mode(mig)
        assert gpu.memory_total_mib == int(mem_total)


def test_snapshot_follows_the_conventions(node: model.Node) -> None:
    assert node.driver_version and node.nvml_version
    assert node.cuda_driver_version and node.cuda_driver_version.count(".") == 1
    assert node.collect_ms is not None and node.collect_ms > 0
    for gpu in node.gpus:
        for name in model.Gpu.__dataclass_fields__:
            if getattr(gpu, name) is None:
                assert name in gpu.unavailable, f"GPU {gpu.index}: {name} is None without a reason"
        assert gpu.clocks_event_reasons is not None or "clocks_event_mask" in gpu.unavailable
        if gpu.power_limit_w is not None and gpu.power_max_limit_w is not None:
            assert gpu.power_limit_w <= gpu.power_max_limit_w
    topo = node.topology
    assert topo is not None and topo.gpus == [g.bus_id for g in node.gpus]
    for i in range(len(topo.gpus)):
        assert topo.links[i][i] == "X"
    assert model.node_from_dict(model.to_dict(node)) == node
    json.dumps(model.to_dict(node))


def test_the_driver_branch_nvml_names_is_the_loaded_drivers(node: model.Node) -> None:
    """NVML's build branch (nvmlSystemGetDriverBranch), where the driver has the call, is a name
    like r582_49 (the H200's 580.159.04 driver), kept in the snapshot; the branch the check
    compares is the driver version's major number, and a baseline allowing it finds nothing.
    Where the call is missing, the reason is recorded. Run with -s to see what this GPU says."""
    import re

    from fleetops import baseline
    from fleetops.checks import run_node_checks, versions

    reason = node.unavailable.get("driver_branch")
    print(f"\ndriver {node.driver_version}: NVML driver branch {node.driver_branch!r}"
          + (f" (unreadable: {reason})" if reason else ""))
    major = versions.driver_branch(node.driver_version)
    assert major is not None and versions.loaded_branch(node) == major
    if node.driver_branch is None:
        assert reason, "driver_branch is None without a reason"
    else:
        assert reason is None and re.fullmatch(r"r\d+_\d+", node.driver_branch), node.driver_branch
    allows = baseline.from_mapping({"driver": {"branches": [major]}}, "b")
    assert [f for f in run_node_checks(node, allows, None) if f.check == "versions.driver_branch"] == []


def test_topology_command_reads_the_same_gpus(node: model.Node) -> None:
    proc = _agent("topology", "--backend", "nvml")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert doc["topology"]["gpus"] == [g.bus_id for g in node.gpus]
