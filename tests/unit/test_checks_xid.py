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


def test_application_xids_older_than_the_window_are_not_reported(sim_node):
    # 94 (contained memory error, restart the app) ages out with the window; a reset_gpu code
    # such as 48 holds until a reset instead (test_reset_class_xid_holds_until_a_reset_is_recorded)
    node = sim_node()
    node.xids = [_event(node, 0, 94, age_s=25 * 3600)]
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
    recent = model.XidEvent(code=94, bus_id=node.gpus[0].bus_id, uptime_s=99_000.0, raw="r")
    stale = model.XidEvent(code=94, bus_id=node.gpus[1].bus_id, uptime_s=1_000.0, raw="s")
    node.xids = [recent, stale]
    assert [f.gpu["index"] for f in _xid(run_node_checks(node, None, None))] == [0]


def test_many_events_of_one_code_are_a_storm(sim_node):
    node = sim_node()
    # 94 has no escalation: twelve of 13 within a minute would also escalate xid.recent to crit
    node.xids = [_event(node, 4, 94, age_s=60 + i, raw=f"e{i}") for i in range(12)]
    findings = run_node_checks(node, None, None)
    [storm] = _xid(findings, "xid.storm")
    assert storm.severity == "warn" and storm.gpu["index"] == 4 and storm.observed == {"94": 12}
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
    node.gpus[3].recovery_action = "node_reboot"  # NVML agrees; reading "none" would clear the XID
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


# --- holds: which events still count -------------------------------------------------------


def test_xid_79_holds_however_old_until_the_boot_changes(sim_node):
    node = sim_node()
    node.uptime_s = 10 * 86400.0
    lost = node.gpus[3]
    event = model.XidEvent(code=79, bus_id=lost.bus_id, timestamp=node.collected_at - 5 * 86400, raw="x79")
    node.xids = [event]
    node.gpus = [g for g in node.gpus if g.uuid != lost.uuid]
    [f] = _xid(run_node_checks(node, None, None))  # five days old, far past the 24 h window
    assert f.severity == "crit" and f.observed[0]["hold"] == "boot" and "reboot" in f.action.lower()
    # the node rebooted an hour ago: the event is from the earlier boot, and the GPU is back
    rebooted = sim_node()
    rebooted.uptime_s = 3600.0
    rebooted.xids = [event]
    assert _xid(run_node_checks(rebooted, None, None)) == []


def test_an_event_logged_just_after_boot_still_belongs_to_this_boot(sim_node):
    node = sim_node()
    node.uptime_s = 3600.0
    boot = node.collected_at - node.uptime_s
    node.xids = [model.XidEvent(code=79, bus_id=node.gpus[0].bus_id, timestamp=boot + 2.0, raw="early"),
                 model.XidEvent(code=79, bus_id=node.gpus[1].bus_id, timestamp=boot - 120.0, raw="before")]
    assert [f.gpu["index"] for f in _xid(run_node_checks(node, None, None))] == [0]


def test_reset_class_xid_holds_until_a_reset_is_recorded(sim_node):
    node = sim_node()
    node.xids = [_event(node, 2, 48, age_s=3 * 86400)]  # three days: past the window
    [f] = _xid(run_node_checks(node, None, None))
    assert f.severity == "crit" and f.observed[0]["hold"] == "reset"
    node.gpus[2].last_reset_at = node.collected_at - 4 * 86400  # a reset before the event
    assert len(_xid(run_node_checks(node, None, None))) == 1
    node.gpus[2].last_reset_at = node.collected_at - 2 * 86400  # a reset after it
    assert _xid(run_node_checks(node, None, None)) == []
    # the same XID again after that reset counts again
    node.xids.append(_event(node, 2, 48, age_s=60, raw="again"))
    [f] = _xid(run_node_checks(node, None, None))
    assert f.observed[0]["count"] == 1


def test_a_reset_of_another_gpu_does_not_end_the_hold(sim_node):
    node = sim_node()
    node.xids = [_event(node, 2, 48, age_s=3 * 86400)]
    node.gpus[3].last_reset_at = node.collected_at - 60
    [f] = _xid(run_node_checks(node, None, None))
    assert f.gpu["index"] == 2


def test_reset_class_hold_ends_after_xid_hold_hours_without_a_reset(sim_node):
    node = sim_node()
    node.uptime_s = 30 * 86400.0
    node.xids = [_event(node, 2, 48, age_s=167 * 3600)]
    assert len(_xid(run_node_checks(node, None, None))) == 1
    node.xids = [_event(node, 2, 48, age_s=169 * 3600)]
    assert _xid(run_node_checks(node, None, None)) == []
    b = baseline.from_mapping({"thresholds": {"xid_hold_hours": 200}}, "t")
    assert len(_xid(run_node_checks(node, b, None))) == 1


def test_application_xid_ages_out_with_the_window_not_the_hold(sim_node):
    node = sim_node()
    node.xids = [_event(node, 1, 13, age_s=23 * 3600)]
    [f] = _xid(run_node_checks(node, None, None))
    assert f.observed[0]["hold"] == "window"
    node.xids = [_event(node, 1, 13, age_s=25 * 3600)]
    assert _xid(run_node_checks(node, None, None)) == []
    b = baseline.from_mapping({"thresholds": {"xid_window_hours": 12}}, "t")
    node.xids = [_event(node, 1, 13, age_s=13 * 3600)]
    assert _xid(run_node_checks(node, b, None)) == []


def test_xid_154_clears_when_nvml_reads_recovery_action_none(sim_node):
    node = sim_node()
    msg = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    node.xids = [_event(node, 4, 154, message=msg)]
    node.gpus[4].recovery_action = "gpu_reset"
    found = {f.check: f for f in run_node_checks(node, None, None) if f.check.startswith("xid.")}
    assert set(found) == {"xid.recent", "xid.recovery_action"} and found["xid.recent"].severity == "crit"
    node.gpus[4].recovery_action = None  # unreadable proves nothing: the XID still holds
    assert [f.check for f in run_node_checks(node, None, None) if f.check.startswith("xid.")] == ["xid.recent"]
    node.gpus[4].recovery_action = "none"
    assert [f for f in run_node_checks(node, None, None) if f.check.startswith("xid.")] == []


def test_simulated_reset_is_recorded_as_the_gpus_last_reset(tmp_path):
    from fleetops.agent import collect
    from fleetops.sim import gpu as sim

    path = str(tmp_path / "n.json")
    sim.init_state(path, "n")
    assert all(g.last_reset_at is None for g in collect.collect("sim", path).gpus)
    with sim.locked_state(path) as state:
        sim.reset_gpu(state, 5, now=1_700_000_000.0)
    node = collect.collect("sim", path)
    assert [g.index for g in node.gpus if g.last_reset_at is not None] == [5]
    assert node.gpus[5].last_reset_at == 1_700_000_000.0


def test_reset_journal_gives_each_gpus_last_successful_reset(tmp_path):
    from fleetops.agent.reset import host, journal
    from fleetops.gpu import node as gpu_node

    assert (gpu_node.RESET_JOURNAL, gpu_node.RESET_JOURNAL_ENV) == (host.DEFAULT_LOG, host.LOG_ENV)
    log = str(tmp_path / "reset.jsonl")

    def attempt(uuid, result, started, dry_run=False):
        doc = {"node": "n", "gpu": {"uuid": uuid, "bus_id": "0000:18:00.0", "index": 0},
               "result": result, "dry_run": dry_run, "elapsed_s": 4.0, "preconditions": []}
        journal.record(doc, log, use_syslog=False, started=started)

    attempt("GPU-a", "reset", 1000.0)
    attempt("GPU-a", "reset", 2000.0)
    attempt("GPU-a", "failed", 3000.0)  # a failed reset proves nothing
    attempt("GPU-b", "refused", 1500.0)
    attempt("GPU-c", "would-reset", 1500.0, dry_run=True)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write('{"torn": \n')
    assert gpu_node.reset_times(log) == {"GPU-a": 2004.0}
    assert gpu_node.reset_times(str(tmp_path / "missing.jsonl")) == {}
