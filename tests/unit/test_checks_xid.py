"""XID events: catalog severity and action, the window, new since the previous snapshot,
storms, and the driver's recovery action."""

from __future__ import annotations

from fleetops import baseline, model
from fleetops.checks import run_node_checks


def _event(node: model.Node, gpu_index: int | None, code: int, age_s: float = 60.0, message: str = "",
           raw: str | None = None, source: str = "kernel") -> model.XidEvent:
    gpu = node.gpus[gpu_index] if gpu_index is not None else None
    stamp = node.collected_at - age_s
    return model.XidEvent(
        code=code, bus_id=gpu.bus_id if gpu else "0000:05:00.0", gpu_uuid=gpu.uuid if gpu else None,
        gpu_index=gpu_index, message=message, timestamp=stamp, source=source,
        raw=raw if raw is not None else f"{stamp:.6f} NVRM: Xid ({code}) {gpu_index} {message}",
    )


def _xid(findings, check="xid.recent"):
    return [f for f in findings if f.check == check]


def test_severity_and_action_come_from_the_catalog(sim_node):
    node = sim_node()
    node.xids = [_event(node, 1, 43), _event(node, 2, 95), _event(node, 3, 13)]
    by_gpu = {f.gpu["index"]: f for f in _xid(run_node_checks(node, None, None))}
    assert by_gpu[1].severity == "info"  # 43: application stopped, GPU fine
    assert by_gpu[2].severity == "crit" and f"fleetops reset n1 {node.gpus[2].uuid}" in by_gpu[2].action
    assert by_gpu[3].severity == "warn" and "restart" in by_gpu[3].action.lower()


def test_several_codes_on_one_gpu_make_one_finding_with_the_worst_severity(sim_node):
    node = sim_node()
    node.xids = [_event(node, 0, 13, raw="a"), _event(node, 0, 48, raw="b"), _event(node, 0, 13, raw="c")]
    [f] = _xid(run_node_checks(node, None, None))
    assert f.severity == "crit" and [c["code"] for c in f.observed] == [48, 13]
    assert [c["count"] for c in f.observed] == [1, 2]


def test_xids_older_than_the_window_are_not_reported(sim_node):
    node = sim_node()
    node.xids = [_event(node, 0, 48, age_s=25 * 3600)]
    assert _xid(run_node_checks(node, None, None)) == []
    b = baseline.from_mapping({"thresholds": {"xid_window_hours": 48}}, "t")
    assert len(_xid(run_node_checks(node, b, None))) == 1


def test_old_xid_new_since_previous_snapshot_is_reported_and_counted_new(sim_node):
    node = sim_node()
    old = _event(node, 0, 48, age_s=25 * 3600, raw="first")
    previous = sim_node(now=node.collected_at - 30)
    previous.xids = []
    node.xids = [old]
    [f] = _xid(run_node_checks(node, None, previous))
    assert f.observed[0]["new"] == 1 and "1 new" in f.message


def test_xid_seen_in_previous_snapshot_is_not_new(sim_node):
    node = sim_node()
    previous = sim_node(now=node.collected_at - 30)
    node.xids = [_event(node, 0, 94)]
    previous.xids = list(node.xids)
    [f] = _xid(run_node_checks(node, None, previous))
    assert f.observed[0]["new"] == 0


def test_age_from_uptime_when_the_log_has_no_wall_clock(sim_node):
    node = sim_node()
    node.uptime_s = 100_000.0
    recent = model.XidEvent(code=48, bus_id=node.gpus[0].bus_id, uptime_s=99_000.0, raw="r")
    stale = model.XidEvent(code=48, bus_id=node.gpus[1].bus_id, uptime_s=1_000.0, raw="s")
    node.xids = [recent, stale]
    assert [f.gpu["index"] for f in _xid(run_node_checks(node, None, None))] == [0]


def test_many_events_of_one_code_are_a_storm(sim_node):
    node = sim_node()
    node.xids = [_event(node, 4, 13, age_s=60 + i, raw=f"e{i}") for i in range(12)]
    findings = run_node_checks(node, None, None)
    [storm] = _xid(findings, "xid.storm")
    assert storm.severity == "warn" and storm.gpu["index"] == 4 and storm.observed == {"13": 12}
    b = baseline.from_mapping({"thresholds": {"xid_storm_count": 20}}, "t")
    assert _xid(run_node_checks(node, b, None), "xid.storm") == []


def test_storm_of_a_crit_code_is_crit(sim_node):
    node = sim_node()
    node.xids = [_event(node, 2, 119, raw=f"e{i}") for i in range(10)]
    [storm] = _xid(run_node_checks(node, None, None), "xid.storm")
    assert storm.severity == "crit"


def test_sxid_from_an_nvswitch_is_node_level(sim_node):
    node = sim_node()
    node.xids = [_event(node, None, 12028, message="Fatal, Link 32 egress error", source="kernel:sxid")]
    [f] = _xid(run_node_checks(node, None, None))
    assert f.gpu is None and f.severity == "crit" and "SXid 12028" in f.message


def test_xid_154_takes_the_recovery_it_asks_for(sim_node):
    node = sim_node()
    node.xids = [_event(node, 3, 154, message="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")]
    [f] = _xid(run_node_checks(node, None, None))
    assert f.severity == "crit" and "reboot" in f.action.lower()


def test_driver_recovery_action_is_reported_per_gpu(sim_node):
    node = sim_node()
    node.gpus[5].recovery_action = "gpu_reset"
    node.gpus[6].recovery_action = "node_reboot"
    found = {f.gpu["index"]: f for f in _xid(run_node_checks(node, None, None), "xid.recovery_action")}
    assert found[5].severity == "crit" and f"fleetops reset n1 {node.gpus[5].uuid}" in found[5].action
    assert found[6].severity == "crit" and "reboot" in found[6].action
    assert set(found) == {5, 6}


def test_simulator_xids_parsed_from_the_kernel_log_reach_the_check(sim_node):
    node = sim_node(faults=["xid:119@1"])
    assert node.xids and node.xids[0].code == 119
    [f] = _xid(run_node_checks(node, None, None))
    assert f.gpu["uuid"] == node.gpus[1].uuid and f.severity == "crit"


def test_window_without_a_timestamp_or_uptime_keeps_the_event(sim_node):
    node = sim_node()
    node.uptime_s = None
    node.xids = [model.XidEvent(code=79, bus_id=node.gpus[0].bus_id, raw="x")]
    assert len(_xid(run_node_checks(node, None, None))) == 1


def test_two_lost_gpus_without_previous_snapshot_share_one_node_finding_with_summed_counts(sim_node):
    node = sim_node()
    node.xids = [
        model.XidEvent(code=79, bus_id="0000:ab:00.0", timestamp=node.collected_at - 5, raw="a"),
        model.XidEvent(code=79, bus_id="0000:ba:00.0", timestamp=node.collected_at - 5, raw="b"),
    ]
    node.gpus = [g for g in node.gpus if g.bus_id not in ("0000:ab:00.0", "0000:ba:00.0")]
    [f] = _xid(run_node_checks(node, None, None))
    assert f.gpu is None and f.observed[0]["count"] == 2
    assert "0000:ab:00.0" in f.message and "0000:ba:00.0" in f.message
