"""MIG layouts through real ansible-playbook (ansible-runner) on a loopback simulated fleet: the
baseline in the inventory's group_vars declares the layout; check mode first (nothing changes,
the diff shows the instances), then the layout applied, the audit clean, a rerun that changes
nothing, a drift the audit finds and the playbook repairs, and a busy instance refused with
its node named while the other nodes are changed; and a node whose MIG mode change waits for
a GPU reset, reset by the role through the agent's safe reset flow (check mode first)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from fleetops.rollout.runner import RunResult, run_playbook
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root, pytest.mark.slow]

LAYOUT = ["3g.71gb", "3g.71gb"]
FLEETOPS = os.path.join(os.path.dirname(sys.executable), "fleetops")


def run(fleet: Any, check: bool = False, limit: str | None = None, **extravars: Any) -> tuple[RunResult, list[str]]:
    lines: list[str] = []
    result = run_playbook(
        "mig.yml",
        [fleet.inventory],
        extravars=extravars,
        limit=limit,
        check=check,
        emit=lambda kind, line: lines.append(line),
        private_data_dir=str(fleet.artifacts),
        keep=5,
    )
    assert not result.errors, result.errors
    return result, lines


def diffs(result: RunResult) -> dict[str, list[dict[str, str]]]:
    """host -> the diffs its tasks returned, from the run's job events."""
    out: dict[str, list[dict[str, str]]] = {}
    for path in sorted(glob.glob(os.path.join(result.artifacts, "job_events", "*.json"))):
        with open(path, encoding="utf-8") as fh:
            event = json.load(fh)
        data = event.get("event_data") or {}
        diff = (data.get("res") or {}).get("diff")
        if event.get("event") == "runner_on_ok" and diff:
            out.setdefault(data["host"], []).extend(diff if isinstance(diff, list) else [diff])
    return out


def layouts(fleet: Any, node: str) -> list[tuple[bool, list[str]]]:
    return [(g["mig_mode_current"], [m["profile"] for m in g["mig_instances"] or []]) for g in fleet.collect(node)["gpus"]]


def audit(fleet: Any) -> tuple[int, list[dict[str, Any]]]:
    done = subprocess.run(
        [FLEETOPS, "audit", "-i", fleet.inventory, "--format", "json", "--no-history"],
        check=False, capture_output=True, text=True, timeout=300,
    )
    report = json.loads(done.stdout)
    return done.returncode, [f for f in report["findings"] if f["severity"] in ("warn", "crit")]


@pytest.fixture(scope="module")
def fleet(sim_fleet: Any) -> Any:
    group_vars = os.path.join(str(sim_fleet.directory), "group_vars")
    os.makedirs(group_vars, exist_ok=True)
    with open(os.path.join(group_vars, "sim.yml"), "w", encoding="utf-8") as fh:
        fh.write("fleetops_baseline:\n  mig:\n    mode: true\n    layout: [3g.71gb, 3g.71gb]\n")
    return sim_fleet


def test_check_mode_shows_the_instances_and_changes_nothing_then_apply_audit_rerun(fleet: Any) -> None:
    before = fleet.state_bytes()
    check, lines = run(fleet, check=True)
    assert check.ok, "\n".join(lines)
    assert check.changed_hosts() == fleet.nodes
    assert fleet.state_bytes() == before, "check mode changed a node's state"
    shown = diffs(check)
    for node in fleet.nodes:
        [d] = shown[node]  # the role's task; the plan before the drain shows none
        gpus = fleet.collect(node)["gpus"]
        for g in gpus:
            assert f"{g['uuid']} {g['bus_id']}: MIG off\n" in d["before"]
            assert f"{g['uuid']} {g['bus_id']}: MIG on [3g.71gb GI new, 3g.71gb GI new]\n" in d["after"]
    code, bad = audit(fleet)
    # what the run is about to fix: MIG mode off where the baseline wants the layout
    assert code != 0 and {(f["node"], f["check"]) for f in bad} == {(n, "config.mig_mode") for n in fleet.nodes}

    applied, lines = run(fleet)
    assert applied.ok and applied.changed_hosts() == fleet.nodes, "\n".join(lines)
    for node in fleet.nodes:
        assert layouts(fleet, node) == [(True, LAYOUT)] * 8, node
    code, bad = audit(fleet)
    assert (code, bad) == (0, [])

    again, lines = run(fleet)
    assert again.ok and sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)


def test_a_drifted_node_is_found_by_the_audit_and_only_it_is_changed(fleet: Any) -> None:
    drifted = fleet.nodes[2]
    with sim.locked_state(str(fleet.state_path(drifted))) as state:  # someone destroyed an instance by hand
        gi = state["gpus"][4]["mig_instances"][1]["gpu_instance_id"]
        sim.destroy_gpu_instance(state, 4, int(gi))
    code, bad = audit(fleet)
    assert code != 0 and [(f["node"], f["check"], f["gpu"]["index"]) for f in bad] == [(drifted, "config.mig_layout", 4)]
    fixed, lines = run(fleet)
    assert fixed.ok and fixed.changed_hosts() == [drifted], "\n".join(lines)
    assert layouts(fleet, drifted) == [(True, LAYOUT)] * 8
    assert audit(fleet) == (0, [])


PARTED = os.path.join(os.path.dirname(__file__), "..", "fixtures", "mig", "mig-parted.yaml")


def test_a_sites_mig_parted_file_is_applied_in_check_mode_by_its_entries(fleet: Any) -> None:
    # "mixed": GPUs 0 and 1 get 1g.18gb x3 + 4g.71gb, GPU 2 MIG off, the others are not covered
    before = fleet.state_bytes()
    check, lines = run(fleet, check=True, gpu_mig_config_file=os.path.abspath(PARTED), gpu_mig_config="mixed")
    assert check.ok and check.changed_hosts() == fleet.nodes, "\n".join(lines)
    assert fleet.state_bytes() == before
    gpus = fleet.collect(fleet.nodes[0])["gpus"]
    [d] = diffs(check)[fleet.nodes[0]]
    assert [g["uuid"] for g in gpus if g["uuid"] in d["after"]] == [g["uuid"] for g in gpus[:3]]
    assert f"{gpus[2]['uuid']} {gpus[2]['bus_id']}: MIG off\n" in d["after"]
    assert "1g.18gb GI new, 1g.18gb GI new, 1g.18gb GI new" in d["after"] and "4g.71gb GI new" in d["after"]
    relative, lines = run(fleet, check=True, gpu_mig_config_file="mig-parted.yaml", gpu_mig_config="mixed")
    # mig.yml runs in serial batches (fleetops_mig_batch, default 1): the first batch fails on the
    # relative path and a failed batch ends the play, so the other nodes are never reached
    assert relative.failed_hosts == fleet.nodes[:1]
    assert any("give its absolute path" in line for line in lines), lines


def test_a_busy_instance_is_refused_and_its_node_named_while_the_others_change(fleet: Any) -> None:
    busy = fleet.nodes[1]
    with sim.locked_state(str(fleet.state_path(busy))) as state:
        inst = state["gpus"][6]["mig_instances"][0]
        inst["in_use"] = True
        busy_uuid = inst["uuid"]
    before = fleet.state_bytes()[busy]
    wanted = ["2g.35gb", "2g.35gb", "2g.35gb"]
    result, lines = run(fleet, gpu_mig_layout=wanted)
    assert result.failed_hosts == [busy], "\n".join(lines)
    assert sorted(result.changed_hosts()) == sorted(n for n in fleet.nodes if n != busy)
    failure = [line for line in lines if busy in line and "MIG layout not applied" in line]
    assert failure and busy_uuid in failure[0] and "nothing changed; node resumed" in failure[0], lines
    assert fleet.state_bytes()[busy] == before, "the refused node was changed"
    for node in fleet.nodes:
        if node != busy:
            assert layouts(fleet, node) == [(True, wanted)] * 8, node


def fleetops_apply(fleet: Any, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [FLEETOPS, "apply", "mig", "-i", fleet.inventory, "--artifacts", str(fleet.artifacts), *args],
        check=False, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stdout + done.stderr


def test_fleetops_apply_mig_asks_checks_and_names_the_refused_node(fleet: Any) -> None:
    # after the test above: node002 still has a busy instance (and 3g.71gb x2), the others run 2g.35gb x3
    busy = fleet.nodes[1]
    before = fleet.state_bytes()
    code, out = fleetops_apply(fleet, "--layout", "3g.71gb,3g.71gb")
    assert code == 4 and "without --yes" in out and fleet.state_bytes() == before
    code, out = fleetops_apply(fleet, "--layout", "3g.71gb,3g.71gb", "--limit", fleet.nodes[0], "--check")
    assert code == 0, out
    assert "CHECK (nothing is changed): apply the MIG layout 3g.71gb, 3g.71gb" in out
    assert "MIG would change 8 of 8 GPUs (0: on [2g.35gb GI 1, 2g.35gb GI 2, 2g.35gb GI 3] -> on [3g.71gb" in out
    assert fleet.state_bytes() == before
    # one instance spanning the GPU: the busy node's instances would all go
    code, out = fleetops_apply(fleet, "--layout", "7g.141gb", "--yes")
    assert code == 1 and f"FAILED: {busy}" in out, out
    assert fleet.state_bytes()[busy] == before[busy], "the refused node was changed"
    for node in fleet.nodes:
        if node != busy:
            assert layouts(fleet, node) == [(True, ["7g.141gb"])] * 8, node


def test_the_role_resets_a_gpu_whose_mig_mode_waits_for_it_check_mode_first(fleet: Any) -> None:
    node = fleet.nodes[2]
    path = fleet.state_path(node)
    with sim.locked_state(str(path)) as state:  # MIG off, and a node that applies a mode change only at a reset
        state["node"][sim.MIG_NEEDS_RESET_FIELD] = True
        for g in state["gpus"]:
            g["mig_mode_current"] = g["mig_mode_pending"] = False
            g["mig_instances"] = []
    journal = path.with_suffix(".reset.jsonl")
    journal.unlink(missing_ok=True)
    before = path.read_bytes()
    check, lines = run(fleet, check=True, limit=node, gpu_mig_layout=LAYOUT)
    assert check.ok and check.changed_hosts() == [node], "\n".join(lines)
    assert path.read_bytes() == before and not journal.exists()
    [d] = diffs(check)[node]
    assert d["after"].count("MIG on [3g.71gb GI new, 3g.71gb GI new] (after a GPU reset through the safe reset flow)") == 8

    applied, lines = run(fleet, limit=node, gpu_mig_layout=LAYOUT)
    assert applied.ok and applied.changed_hosts() == [node], "\n".join(lines)
    assert layouts(fleet, node) == [(True, LAYOUT)] * 8
    uuids = [g["uuid"] for g in fleet.collect(node)["gpus"]]
    resets = [json.loads(line) for line in journal.read_text().splitlines()]
    assert sorted((r["gpu"]["uuid"], r["result"]) for r in resets) == sorted((u, "reset") for u in uuids)

    again, lines = run(fleet, limit=node, gpu_mig_layout=LAYOUT)
    assert again.ok and sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)
    assert len(journal.read_text().splitlines()) == 8
