"""The remediation plan names the Slurm jobs each action hits (issue 30): a reset the jobs on its
GPU (MIG instances included), a drain, an inspection or a reboot every job running on the node;
unknown (null) where the node's snapshot has no job records."""

from __future__ import annotations

import json

from fleetops import model
from fleetops.remedy import plan


def _gpu(i: int, node: str = "node001") -> model.Gpu:
    return model.Gpu(index=i, uuid=f"GPU-{node}-{i}", bus_id=f"0000:{0x18 + i:02x}:00.0")


def _finding(check: str, severity: str, node: str, gpu: int | None) -> model.Finding:
    ref = model.gpu_ref(_gpu(gpu, node)) if gpu is not None else None
    return model.Finding(check=check, severity=severity, node=node, message=check, gpu=ref, action="")


def _snap(node: str) -> model.Node:
    gpus = [_gpu(i, node) for i in range(4)]
    gpus[2].mig_instances = [model.MigInstance(gpu_instance_id=1, uuid=f"MIG-{node}-2-1")]
    snap = model.Node(hostname=node, gpus=gpus)
    snap.jobs = [
        model.NodeJob(job_id="1234", user="alice", gpus=[gpus[1].uuid]),
        model.NodeJob(job_id="1240", user="bob", gpus=[f"MIG-{node}-2-1"]),
        model.NodeJob(job_id="1250", user="carol", gpus=[gpus[3].uuid]),
        model.NodeJob(job_id="1100", user="dave", gpus=[gpus[1].uuid], ended_at=5.0),  # ended: hits nothing
    ]
    return snap


def test_a_reset_names_its_gpus_running_jobs_and_a_drain_every_running_job_of_the_node():
    findings = [
        _finding("memory.ecc_dbe_volatile", "crit", "node001", 1),  # reset GPU 1
        _finding("memory.ecc_dbe_volatile", "crit", "node001", 2),  # reset GPU 2 (a MIG instance's job)
        _finding("memory.ecc_dbe_volatile", "crit", "node002", 0),  # reset GPU 0: no job on it
        _finding("memory.row_remap_failure", "crit", "node003", 3),  # drain and inspect node003
        _finding("memory.ecc_dbe_volatile", "crit", "node004", 1),  # no snapshot: unknown
    ]
    snaps = {n: _snap(n) for n in ("node001", "node002", "node003")}
    p = plan.build(findings, ["node001", "node002", "node003", "node004"], snapshots=snaps)
    doc = json.loads(json.dumps(p.to_dict()))
    by_node = {n["node"]: n for n in doc["nodes"]}
    n1 = by_node["node001"]
    assert [(i["gpu"]["index"], i["action"], i["jobs"]) for i in n1["items"]] == [
        (1, "reset_gpu", [{"job_id": "1234", "user": "alice"}]),
        (2, "reset_gpu", [{"job_id": "1240", "user": "bob"}]),
    ]
    assert [(i["gpu"]["index"], i["jobs"]) for i in by_node["node002"]["items"]] == [(0, [])]
    n3 = by_node["node003"]
    assert n3["action"] == "drain_and_inspect"
    everyone = [{"job_id": "1234", "user": "alice"}, {"job_id": "1240", "user": "bob"},
                {"job_id": "1250", "user": "carol"}]
    assert n3["jobs"] == everyone
    assert [i["jobs"] for i in n3["items"]] == [everyone]
    assert by_node["node004"]["jobs"] is None
    assert [i["jobs"] for i in by_node["node004"]["items"]] == [None]
    text = plan.render(p)
    assert "node003: drain the node and have it inspected (jobs 1234 alice, 1240 bob, 1250 carol)" in text
    line = next(x for x in text.splitlines() if "GPU 1 GPU-node001-1" in x)
    assert line.endswith("reset GPU (jobs 1234 alice)")
    line = next(x for x in text.splitlines() if "GPU 0 GPU-node002-0" in x)
    assert line.endswith("reset GPU")


def test_side_fixes_name_no_jobs():
    findings = [_finding("thermal_power.power_limit", "warn", "node001", 1)]
    p = plan.build(findings, ["node001"], snapshots={"node001": _snap("node001")})
    [item] = p.nodes[0].items
    assert item.action == "apply_power"
    assert item.jobs is None
