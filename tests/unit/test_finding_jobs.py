"""Findings name the jobs they hit (issue 30): a fault seen now, the jobs running on its GPU (or
its MIG instances); an XID, the jobs its events carry, also a job that ended after the XID; a
snapshot without job records (a cold collect), none at all."""

from __future__ import annotations

import io
import json

from fleetops import model
from fleetops.checks import checks_run, run_fleet_checks, run_node_checks
from fleetops.checks.verdict import NodeResult, node_findings
from fleetops.report import junit, values

TARGET = 3


def _jobs(node: model.Node) -> list[model.NodeJob]:
    g = node.gpus
    return [
        model.NodeJob(job_id="1234", user="alice", started_at=node.collected_at - 600, gpus=[g[TARGET].uuid, g[4].uuid]),
        model.NodeJob(job_id="1240", user="bob", started_at=node.collected_at - 300, gpus=[g[TARGET].uuid]),
        model.NodeJob(job_id="1250", user="carol", started_at=node.collected_at - 300, gpus=[g[0].uuid]),
        # ended: a fault seen now does not hit it
        model.NodeJob(job_id="1100", user="dave", started_at=node.collected_at - 900,
                      ended_at=node.collected_at - 700, gpus=[g[TARGET].uuid]),
    ]


def _on(findings: list[model.Finding], check: str) -> model.Finding:
    [f] = [f for f in findings if f.check == check]
    return f


def test_a_live_fault_names_the_jobs_running_on_its_gpu_now(sim_node) -> None:
    node = sim_node(faults=[f"ecc-dbe@{TARGET}"])
    node.jobs = _jobs(node)
    node.xids = []  # the XID's attribution is the next test's
    f = _on(run_node_checks(node, None, None), "memory.ecc_dbe_volatile")
    assert f.jobs == ["1234", "1240"]
    assert f.to_dict()["jobs"] == ["1234", "1240"]
    assert model.Finding.from_dict(f.to_dict()).jobs == ["1234", "1240"]
    assert f.key == f"n1|memory.ecc_dbe_volatile|{node.gpus[TARGET].uuid}"  # identity unchanged
    assert values.jobs_text(f) == "jobs 1234,1240"


def test_a_gpu_without_a_job_names_none_and_a_cold_collect_leaves_jobs_out(sim_node) -> None:
    node = sim_node(faults=["ecc-dbe@2"])
    node.xids = []
    cold = _on(run_node_checks(node, None, None), "memory.ecc_dbe_volatile")
    assert cold.jobs is None
    assert "jobs" not in cold.to_dict()
    assert values.jobs_text(cold) is None
    node.jobs = _jobs(node)
    served = _on(run_node_checks(node, None, None), "memory.ecc_dbe_volatile")
    assert served.jobs == []
    assert served.to_dict()["jobs"] == []
    assert values.jobs_text(served) is None


def test_a_job_on_a_mig_instance_is_named_on_its_gpu(sim_node) -> None:
    node = sim_node(faults=[f"ecc-dbe@{TARGET}"])
    node.xids = []
    node.gpus[TARGET].mig_instances = [model.MigInstance(gpu_instance_id=1, uuid="MIG-aaaa"),
                                       model.MigInstance(gpu_instance_id=2, uuid="MIG-bbbb")]
    node.jobs = [model.NodeJob(job_id="77", user="eve", gpus=["MIG-bbbb"]),
                 model.NodeJob(job_id="78", user="eve", gpus=["MIG-cccc"])]  # another GPU's instance
    f = _on(run_node_checks(node, None, None), "memory.ecc_dbe_volatile")
    assert f.jobs == ["77"]


def test_an_xid_names_the_jobs_its_events_carry_also_one_that_ended_since(sim_node) -> None:
    node = sim_node()
    node.jobs = _jobs(node)
    gpu = node.gpus[TARGET]
    at = node.collected_at - 800  # job 1100 ran then; 1234 and 1240 had not started
    node.xids = [
        model.XidEvent(code=48, bus_id=gpu.bus_id, gpu_uuid=gpu.uuid, gpu_index=TARGET, timestamp=at,
                       raw="a", jobs=["1100"]),
        model.XidEvent(code=13, bus_id=gpu.bus_id, gpu_uuid=gpu.uuid, gpu_index=TARGET, timestamp=at + 10,
                       raw="b", jobs=["1100", "999"]),
    ]
    f = _on(run_node_checks(node, None, None), "xid.recent")
    assert f.jobs == ["999", "1100"]  # by number; the jobs running now (1234, 1240) were not hit
    assert "jobs" not in f.observed[0]


def test_an_xid_without_attribution_names_no_job_even_where_jobs_run_now(sim_node) -> None:
    node = sim_node()
    node.jobs = _jobs(node)
    gpu = node.gpus[TARGET]
    node.xids = [model.XidEvent(code=48, bus_id=gpu.bus_id, gpu_uuid=gpu.uuid, gpu_index=TARGET,
                                timestamp=node.collected_at - 60, raw="a", jobs=None)]
    f = _on(run_node_checks(node, None, None), "xid.recent")
    assert f.jobs is None


def test_fleet_findings_name_the_jobs_on_their_gpu(sim_node) -> None:
    nodes = []
    for i in range(3):
        n = sim_node(host=f"n{i}", faults=["vbios-drift@3"] if i == 0 else [])
        nodes.append(n)
    nodes[0].jobs = [model.NodeJob(job_id="55", user="zed", gpus=[nodes[0].gpus[3].uuid])]
    found = [f for f in run_fleet_checks(nodes, None) if f.check == "versions.vbios" and f.node == "n0"]
    assert [(f.gpu["index"], f.jobs) for f in found] == [(3, ["55"])]


def test_daemon_findings_are_named_with_the_jobs_of_the_snapshot_judged(sim_node) -> None:
    node = sim_node()
    node.xids = []
    node.jobs = _jobs(node)
    uuid = node.gpus[TARGET].uuid
    held = {"check": "thermal_power.throttle", "severity": "warn", "node": "n1", "message": "slowdown",
            "gpu": {"index": TARGET, "uuid": uuid, "bus_id": node.gpus[TARGET].bus_id}, "jobs": ["1"]}
    node.daemon = {"findings": [held], "age_s": 1.0}
    result = NodeResult("n1", True, snapshot=node)
    f = _on(node_findings(result, None, None), "thermal_power.throttle")
    assert f.jobs == ["1234", "1240"]


def test_junit_and_table_lines_name_the_jobs(sim_node) -> None:
    from rich.console import Console

    from fleetops.fleet.audit import AuditResult

    node = sim_node(faults=[f"ecc-dbe@{TARGET}"])
    node.xids = []
    node.jobs = _jobs(node)
    findings = run_node_checks(node, None, None)
    result = AuditResult(started_at=node.collected_at, duration_s=0.1,
                         nodes=[NodeResult("n1", True, snapshot=node, source="daemon", age_s=1.0)],
                         findings=findings, inventory="inv", checks_run={"n1": checks_run(node, None)})
    xml = junit.render(result, 2)
    assert "[jobs 1234,1240]" in xml
    out = io.StringIO()
    from fleetops.report import table

    table.render(result, 2, Console(file=out, width=300, force_terminal=False))
    line = next(x for x in out.getvalue().splitlines() if "[memory.ecc_dbe_volatile]" in x)
    assert line.endswith("(jobs 1234,1240)")
    assert json.loads(json.dumps([f.to_dict() for f in findings]))  # JSON-clean
