"""playbooks/library/fleetops_gpu_mig.py in-process, calling the real fleetops-agent on a
simulated node: check mode and diff, idempotence, per-model layouts, a busy instance refused
with nothing changed, bad input named, and a MIG mode that waits for a GPU reset: applied
through the safe reset flow (check mode first), refused by its preconditions, or left pending
with ``reset: false``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetops.sim import gpu as sim

MODULE = "fleetops_gpu_mig"
LAYOUT = ["3g.71gb", "3g.71gb"]


def _instances(state_path: str) -> list[tuple[bool, list[str]]]:
    doc = sim.snapshot(sim.read_state(state_path))
    return [(bool(g["mig_mode_current"]), [m["profile"] for m in g["mig_instances"] or []]) for g in doc["gpus"]]


def test_check_mode_changes_nothing_and_the_diff_shows_each_gpus_instances(run_module: Any, sim_state: str) -> None:
    before = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state}, check=True, diff=True)
    assert code == 0 and res["changed"] is True and res["result"] == "would-change"
    assert Path(sim_state).read_bytes() == before
    gpus = sim.read_state(sim_state)["gpus"]
    assert res["changed_gpus"] == [g["uuid"] for g in gpus]
    for g in gpus:
        label = f"GPU {g['index']} {g['uuid']} {g['bus_id']}"
        assert f"{label}: MIG off\n" in res["diff"]["before"]
        assert f"{label}: MIG on [3g.71gb GI new, 3g.71gb GI new]\n" in res["diff"]["after"]


def test_apply_then_a_rerun_changes_nothing(run_module: Any, sim_state: str) -> None:
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state})
    assert code == 0 and res["changed"] is True and res["result"] == "applied"
    assert _instances(sim_state) == [(True, LAYOUT)] * 8
    after = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state}, diff=True)
    assert code == 0 and res["changed"] is False and res["changed_gpus"] == [] and "diff" not in res
    assert res["msg"] == "MIG layout: all 8 GPUs already as wanted"
    assert Path(sim_state).read_bytes() == after


def test_a_models_own_layout_wins_over_the_groups_and_other_models_get_the_groups(
    run_module: Any, sim_state: str
) -> None:
    uuids = [g["uuid"] for g in sim.read_state(sim_state)["gpus"]]
    args = {"layout": LAYOUT, "model_layouts": {"NVIDIA H100 80GB HBM3": ["7g.80gb"]}, "sim_state": sim_state,
            "gpu": ",".join(uuids[:2])}
    code, res = run_module(MODULE, args)
    assert code == 0 and res["changed_gpus"] == uuids[:2]  # no H100 here: the group's layout, on the two named
    assert _instances(sim_state) == [(True, LAYOUT)] * 2 + [(False, [])] * 6
    args = {"layout": LAYOUT, "model_layouts": {"NVIDIA H200": ["7g.141gb"]}, "sim_state": sim_state}
    code, res = run_module(MODULE, args)
    assert code == 0 and res["changed_gpus"] == uuids
    assert _instances(sim_state) == [(True, ["7g.141gb"])] * 8
    # the baseline's gpu_models.*.mig mapping, as the role passes it: mode false turns MIG off
    args = {"layout": LAYOUT, "model_layouts": {"NVIDIA H200": {"mode": False}}, "sim_state": sim_state}
    code, res = run_module(MODULE, args)
    assert code == 0 and res["changed_gpus"] == uuids and _instances(sim_state) == [(False, [])] * 8
    # mode true without a layout of its own: the group's layout
    args = {"layout": LAYOUT, "model_layouts": {"NVIDIA H200": {"mode": True}}, "sim_state": sim_state}
    code, res = run_module(MODULE, args)
    assert code == 0 and _instances(sim_state) == [(True, LAYOUT)] * 8


def test_a_busy_instance_is_refused_and_no_gpu_changes(run_module: Any, sim_state: str) -> None:
    assert run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state})[0] == 0
    with sim.locked_state(sim_state) as state:
        state["gpus"][5]["mig_instances"][1]["in_use"] = True
        busy_uuid = state["gpus"][5]["mig_instances"][1]["uuid"]
        gpu_uuid = state["gpus"][5]["uuid"]
    before = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": ["7g.141gb"], "sim_state": sim_state})
    assert code == 1 and res["failed"] and res["refused"] is True and res["changed"] is False
    assert res["changed_gpus"] == [] and res["result"] == "refused"
    assert busy_uuid in res["msg"] and gpu_uuid in res["msg"]
    assert [b["uuid"] for b in res["busy"]] == [gpu_uuid]
    assert Path(sim_state).read_bytes() == before


def test_bad_input_is_named_before_anything_runs(run_module: Any, sim_state: str) -> None:
    before = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": ["3g.71gb", " "], "sim_state": sim_state})
    assert code == 1 and res["kind"] == "usage" and "layout" in res["msg"]
    code, res = run_module(MODULE, {"layout": ["3g.70gb"], "sim_state": sim_state})
    assert code == 1 and res["kind"] == "usage" and "did you mean '3g.71gb'" in res["msg"]
    code, res = run_module(MODULE, {"sim_state": sim_state})
    assert code == 1 and res["kind"] == "usage" and "needs layout" in res["msg"]
    assert Path(sim_state).read_bytes() == before


def _needs_reset(sim_state: str) -> list[str]:
    with sim.locked_state(sim_state) as state:
        state["node"][sim.MIG_NEEDS_RESET_FIELD] = True  # this node applies a MIG mode change at a GPU reset
    return [g["uuid"] for g in sim.read_state(sim_state)["gpus"]]


def _journal(sim_state: str) -> list[dict[str, Any]]:
    path = Path(sim_state[: -len(".json")] + ".reset.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_mode_that_waits_for_a_reset_is_applied_through_the_reset_flow_check_mode_first(
    run_module: Any, sim_state: str
) -> None:
    uuids = _needs_reset(sim_state)
    before = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state}, check=True, diff=True)
    assert code == 0 and res["changed"] is True and res["result"] == "would-change"
    assert res["reset_gpus"] == uuids and res["reset_required"] == []
    assert "would reset through the safe reset flow: " + ", ".join(uuids) in res["msg"]
    assert "MIG on [3g.71gb GI new, 3g.71gb GI new] (after a GPU reset through the safe reset flow)" in res["diff"]["after"]
    assert Path(sim_state).read_bytes() == before and _journal(sim_state) == []
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state})
    assert code == 0 and res["changed"] is True and res["result"] == "applied"
    assert res["reset_gpus"] == uuids and res["reset_required"] == []
    assert _instances(sim_state) == [(True, LAYOUT)] * 8
    assert sorted((r["gpu"]["uuid"], r["result"]) for r in _journal(sim_state)) == sorted((u, "reset") for u in uuids)
    after = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state})
    assert code == 0 and res["changed"] is False and res["reset_gpus"] == []
    assert Path(sim_state).read_bytes() == after and len(_journal(sim_state)) == 8


def test_a_reset_the_preconditions_refuse_is_reported_with_its_reason_and_nothing_changes(
    run_module: Any, sim_state: str
) -> None:
    uuids = _needs_reset(sim_state)
    with sim.locked_state(sim_state) as state:
        state["node"]["services"]["nvidia-fabricmanager"] = "inactive"
    before = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, {"layout": LAYOUT, "sim_state": sim_state})
    assert code == 0 and res["changed"] is False and res["reset_required"] == uuids and res["reset_gpus"] == []
    assert "the safe reset flow refused" in res["msg"] and "nvidia-fabricmanager is inactive" in res["msg"]
    assert Path(sim_state).read_bytes() == before and _journal(sim_state) == []


def test_with_reset_false_a_mode_that_waits_is_reported_and_not_asked_again(run_module: Any, sim_state: str) -> None:
    uuids = _needs_reset(sim_state)
    args = {"layout": LAYOUT, "sim_state": sim_state, "reset": False}
    code, res = run_module(MODULE, args)
    assert code == 0 and res["changed"] is True and res["result"] == "mode-pending" and res["reset_required"] == uuids
    assert "MIG mode waits for a GPU reset on " + ", ".join(uuids) in res["msg"]
    pending = Path(sim_state).read_bytes()
    code, res = run_module(MODULE, args)
    assert code == 0 and res["changed"] is False and res["reset_required"] == uuids
    assert res["msg"].startswith("MIG layout not complete; MIG mode waits for a GPU reset on ")
    assert Path(sim_state).read_bytes() == pending and _journal(sim_state) == []
