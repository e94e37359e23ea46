"""``fleetops job``'s rendering (``fleetops/job_cli/render.py``) and its reading of the nodes'
answers (``gather.py``), from a fixed job: two GPUs of node001 reading from the host at 92 % of
their PCIe Gen5 x16 link while 30 % busy, 150 samples at 2 s from 2026-12-06 17:26:40 UTC, the
cgroup at 6 of 16 CPUs. Every figure below follows from those numbers."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from fleetops.job_cli import exit_code, gather, render
from fleetops.jobs import diagnose as dg

T0 = 1796578000.0
LINK_KBPS = 63015384.615384616  # PCIe Gen5 x16 (catalog.pcie)
SAMPLES = 150


def _series(util: float, rx_share: float) -> dict[str, list[tuple[float, Any]]]:
    ts = [T0 + 2.0 * (k + 1) for k in range(SAMPLES)]
    return {
        "utilization_gpu_pct": [(t, util) for t in ts],
        "clock_sm_mhz": [(t, 1980) for t in ts],
        "power_draw_w": [(t, 210.0) for t in ts],
        "clocks_event_mask": [(t, 0x4 if k % 10 < 3 else 0) for k, t in enumerate(ts)],  # sw_power_cap 30 %
        "pcie_rx_kbps": [(t, int(LINK_KBPS * rx_share)) for t in ts],
        "pcie_tx_kbps": [(t, int(LINK_KBPS * 0.02)) for t in ts],
        "ecc_corrected_volatile": [(t, 3) for t in ts],
        "ecc_uncorrected_volatile": [(t, 0) for t in ts],
        "nvlink0_tx_kib": [(t, int(1000 * (t - T0))) for t in ts],  # 1000 KiB/s each way
        "nvlink0_rx_kib": [(t, int(1000 * (t - T0))) for t in ts],
    }


def fixed_job() -> dg.Job:
    facts = dg.GpuFacts(power_limit_w=700.0, clock_sm_max_mhz=1980, pcie_gen=5, pcie_width=16)
    gpus = [dg.JobGpu("node001", f"GPU-{i}", i, _series(30.0, 0.92), facts) for i in (0, 1)]
    cpu = [dg.NodeCpu("node001", [(T0 + 2.0 * k, int(6e6 * 2.0 * k)) for k in range(SAMPLES + 1)], 16)]
    return dg.Job("4242", T0, T0 + 2.0 * SAMPLES, gpus, cpu)


FACTS = {"job_id": "4242", "user": "alice", "nodes": ["node001"], "gpus": 2, "started_at": T0,
         "ended_at": T0 + 300.0, "running": False, "duration_s": 300.0}
NODES: dict[str, Any] = {"absent": ["node002"], "unreachable": {"node003": "unreachable: connection refused"},
                         "notes": {}}

TABLE = """\
job 4242  user alice  nodes node001  GPUs 2
started 2026-12-06 17:26:40 UTC  ended 2026-12-06 17:31:40 UTC  duration 5 min 00 s

NODE     GPU  UTIL mean/p5/p95  SM CLK  THROTTLE           POWER / CAP   PCIE TX/RX  NVLINK TX/RX  ECC c/u  XID
node001  0    30/30/30 %        100 %   sw_power_cap 30 %  210 W (30 %)  2 %/92 %    0.0/0.0 GB/s  0/0      -
node001  1    30/30/30 %        100 %   sw_power_cap 30 %  210 W (30 %)  2 %/92 %    0.0/0.0 GB/s  0/0      -
THROTTLE: share of the job's time per reason; PCIE TX/RX: share of the link's raw rate, Gen5 x16

CPU  node001: 6.0 of 16 CPUs busy (38 %), saturated 0 % of the time, 151 samples

VERDICTS
  input_bound  node001 GPU 0,1  confidence 1.00
    GPUs 0-1 on node001 read from the host at 92 % of their PCIe Gen5 x16 link while their SMs were busy 30 % of the time: input-bound.
    evidence: GPU 0: pcie_rx_share 0.92, pcie_rx_kbps_mean 57,974,153, pcie_link_kbps 63,015,385, utilization_pct_mean 30
    evidence: GPU 1: pcie_rx_share 0.92, pcie_rx_kbps_mean 57,974,153, pcie_link_kbps 63,015,385, utilization_pct_mean 30

NOTES
  - node003: not asked (unreachable: connection refused); the job may have run there
"""


def test_the_table_heads_the_job_then_a_row_per_gpu_the_cpu_the_verdict_with_evidence_and_the_notes() -> None:
    d = dg.diagnose(fixed_job())
    assert render.table(FACTS, d, NODES) == TABLE


def test_the_common_pcie_link_is_named_once_and_a_gpu_on_another_link_in_its_row() -> None:
    """The table fits 120 columns: the link most GPUs have is named under it, and a GPU whose link
    trained lower (Gen4 here) names its own in its row, where it stands out."""
    import dataclasses

    d = dg.diagnose(fixed_job())
    slow = dataclasses.replace(d.gpus[1], pcie_gen=4)
    d = dataclasses.replace(d, gpus=[d.gpus[0], slow])
    lines = render.table(FACTS, d, NODES).splitlines()
    rows = [line for line in lines if line.startswith("node001  ")]
    assert "2 %/92 %    " in rows[0] and "Gen" not in rows[0]
    assert "Gen4 x16" in rows[1]
    assert ("THROTTLE: share of the job's time per reason; PCIE TX/RX: share of the link's raw rate, Gen5 x16 "
            "unless named") in lines
    assert max(len(line) for line in lines[:6]) <= 120


def test_the_json_document_is_versioned_and_carries_the_diagnosis_the_nodes_and_the_exit_code() -> None:
    job = fixed_job()
    d = dg.diagnose(job)
    util = {"node001:0": list(job.gpus[0].series["utilization_gpu_pct"])}
    doc = json.loads(json.dumps(render.document(FACTS, d, NODES, util, 3), allow_nan=False))
    assert doc["schema"] == "fleetops.job/v1"
    assert doc["job"] == {**FACTS, "nodes": ["node001"]}
    assert doc["nodes"] == {"with_job": ["node001"], "absent": ["node002"],
                            "unreachable": {"node003": "unreachable: connection refused"}, "notes": {}}
    assert [(v["code"], v["node"], [g["index"] for g in v["gpus"]], v["confidence"])
            for v in doc["diagnosis"]["verdicts"]] == [("input_bound", "node001", [0, 1], 1.0)]
    assert [(g["index"], g["pcie_rx_share"], g["utilization_pct"]["mean"]) for g in doc["diagnosis"]["gpus"]] == [
        (0, 0.92, 30.0), (1, 0.92, 30.0)]
    assert doc["thresholds"]["input_rx_share"] == {"value": 0.75, "unit": "share of the link, PCIe RX"}
    assert doc["utilization"]["node001:0"][:2] == [[T0 + 2.0, 30.0], [T0 + 4.0, 30.0]]
    assert doc["exit_code"] == 3


def test_the_plot_draws_one_line_per_gpu_in_eight_heights_on_a_utc_axis() -> None:
    util = {
        "node001:0": [(T0 + 10.0 * k, 100.0 * (k % 2)) for k in range(60)],  # 0 %, 100 %, ... one per 10 s
        "node001:1": [(T0 + 10.0 * k, 50.0) for k in range(30)],  # half busy, then no samples
        "node001:2": [(T0 + 20.0 * k + 1.0, 100.0 * k / 29) for k in range(30)],  # a ramp: one sample a column
    }
    out = render.plot(util, T0, T0 + 600.0, width=30)
    assert out == (
        "GPU util   0 % ' ' .. 100 % '█', '·' no sample\n"
        "node001:0 │▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄│  50 %\n"
        "node001:1 │▄▄▄▄▄▄▄▄▄▄▄▄▄▄▄···············│  50 %\n"
        "node001:2 │  ▁▁▁▁▂▂▂▂▃▃▃▄▄▄▄▅▅▅▆▆▆▆▇▇▇▇██│  50 %\n"
        "          17:26:40    17:31:40    17:36:40 UTC\n"
    )


def test_evidence_reads_as_figures_one_line_per_gpu() -> None:
    ev = {"slowdown_share": 0.4, "reason": "hw_slowdown", "reasons": {"hw_slowdown": 0.4}, "samples": 150,
          "peers_utilization_p5": None}
    assert render.evidence_lines(ev) == [
        "slowdown_share 0.4, reason hw_slowdown, reasons hw_slowdown 0.4, samples 150, peers_utilization_p5 -"]
    assert render.evidence_lines({"gpus": {"3": {"nvlink_kib_s": 0.0, "links": 18}}}) == [
        "GPU 3: nvlink_kib_s 0, links 18"]


def test_the_plot_of_nothing_says_so() -> None:
    assert render.plot({}, T0, T0 + 60.0) == "no utilisation samples to plot\n"


def test_exit_codes_follow_the_health_order_unreachable_over_verdicts_over_none() -> None:
    assert exit_code(True, 0, 0) == 0
    assert exit_code(True, 2, 0) == 1
    assert exit_code(True, 2, 1) == 3
    assert exit_code(False, 0, 1) == 3
    assert exit_code(False, 0, 0) == 4


def _result(status: int | None, stdout: str = "", stderr: str = "", error_kind: str | None = None) -> Any:
    return SimpleNamespace(ok=status == 0, exit_status=status, stdout=stdout, stderr=stderr, error_kind=error_kind,
                           error=None if error_kind is None else "connection refused")


def test_a_node_answers_the_job_no_such_job_or_nothing_usable() -> None:
    show = {"kind": "fleetops.job-show/v1", "job": {}, "gpus": []}
    assert gather.read_answer(_result(0, json.dumps(show))) == ("show", show)
    absent = {"kind": "fleetops.job-absent/v1", "job_id": "4242", "dir": "/run/fleetops/jobs"}
    assert gather.read_answer(_result(3, json.dumps(absent))) == ("absent", None)
    assert gather.read_answer(_result(None, error_kind="unreachable")) == ("unreachable", "unreachable: connection refused")
    error = json.dumps({"error": "job record unreadable", "kind": "job-record"})
    assert gather.read_answer(_result(1, "", error)) == ("unreachable", "agent error (job-record): job record unreadable")


def test_the_job_spans_its_nodes_earliest_start_and_ends_only_when_every_part_ended() -> None:
    def doc(start: float, end: float | None) -> dict[str, Any]:
        return {"kind": "fleetops.job-show/v1", "now": T0 + 400.0,
                "job": {"started_at": start, "ended_at": end, "user": "alice"},
                "gpus": [{"uuid": "GPU-a", "index": 2, "facts": {"pcie_gen": 5, "pcie_width": 16},
                          "series": {"utilization_gpu_pct": [[T0 + 2.0, 40.0]]}}],
                "xids": [{"code": 79, "gpu_uuid": "GPU-a", "timestamp": T0 + 100.0}],
                "cpu": {"cpus": 8, "usage_usec": [[T0 + 2.0, 10]]}}

    got = gather.Gathered("4242", docs={"node002": {**doc(T0 + 1.0, T0 + 300.0), "node": "node002"},
                                        "node001": {**doc(T0, None), "node": "node001"}})
    job = gather.build_job(got)
    assert (job.started_at, job.ended_at) == (T0, None)
    assert [(g.node, g.index, g.facts.pcie_gen, list(g.xids)) for g in job.gpus] == [
        ("node001", 2, 5, [(T0 + 100.0, 79)]), ("node002", 2, 5, [(T0 + 100.0, 79)])]
    assert [(c.node, c.cpus) for c in job.cpu] == [("node001", 8), ("node002", 8)]
    got.docs["node001"]["job"]["ended_at"] = T0 + 350.0
    assert gather.build_job(got).ended_at == T0 + 350.0
    assert gather.job_facts(got) == {"job_id": "4242", "user": "alice", "nodes": ["node001", "node002"], "gpus": 2,
                                     "started_at": T0, "ended_at": T0 + 350.0, "running": False, "duration_s": 350.0}


def test_a_job_id_that_is_no_plain_job_number_is_a_usage_error(capsys: Any) -> None:
    from fleetops import cli

    assert cli.main(["job", "1234_7", "-i", "inventory.yml"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("fleetops: error: ")
    assert "1234_7" in err


def test_sim_job_start_refuses_an_unknown_profile_and_a_seed_without_one_before_anything_runs() -> None:
    import pytest

    from fleetops.sim.fleet import SimFleetError
    from fleetops.sim.fleet import jobs as sim_jobs

    with pytest.raises(SimFleetError) as bad:
        sim_jobs.start("/nonexistent", "node001", "1234", "0", profile="slow")
    assert str(bad.value) == ("--profile 'slow': known profiles: steady, input-bound, straggler, nvlink-unused, "
                              "cpu-starved")
    with pytest.raises(SimFleetError) as seedless:
        sim_jobs.start("/nonexistent", "node001", "1234", "0", seed=3)
    assert str(seedless.value) == "--seed seeds a workload: give --profile too"
