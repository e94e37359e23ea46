"""The remediation plan, table by table: every check the plan knows keeps its fix (a repair, a
command to run, or a finding to look at), nodes without a snapshot say why they cannot be
planned, and nodes without a recent result are never taken for healthy."""

from __future__ import annotations

import pytest

from fleetops import checks, model
from fleetops.remedy import plan


def finding(check, severity="warn", node="node001", gpu=0, action="", observed=None, expected=None):
    ref = (
        {"index": gpu, "uuid": f"GPU-{node}-{gpu}", "bus_id": f"0000:{0x18 + gpu:02x}:00.0"}
        if gpu is not None
        else None
    )
    return model.Finding(
        check=check,
        severity=severity,
        node=node,
        message=f"{check} on {gpu}",
        gpu=ref,
        observed=observed,
        expected=expected,
        action=action,
    )


def _table():
    for check, rule in sorted(plan.BY_CHECK.items()):
        if isinstance(rule, str):
            yield check, "warn", rule
            yield check, "crit", rule
        else:
            for severity, act in sorted(rule.items()):
                yield check, severity, act


@pytest.mark.parametrize(("check", "severity", "expected"), list(_table()))
def test_every_table_entry_gives_its_action(check, severity, expected):
    want = expected if severity in ("warn", "crit") else "none"  # info and ok need nothing
    assert plan.action_for(finding(check, severity)) == want


@pytest.mark.parametrize(
    ("check", "expected"),
    [
        ("thermal_power.power_limit", "apply_power"),
        ("config.persistence_mode", "apply_power"),
        ("versions.driver", "rollout_driver"),
        ("versions.fabric_manager_match", "rollout_driver"),
        ("versions.packages", "rollout_driver"),
        ("versions.vbios", "apply_firmware"),
        ("config.mig_layout", "apply_mig"),
        ("thermal_power.throttle", "inspect"),
        ("topology.links", "inspect"),
        ("config.stray_processes", "inspect"),
    ],
)
def test_fixes_that_are_not_resets_keep_their_action(check, expected):
    assert plan.action_for(finding(check)) == expected


def test_no_check_the_registry_knows_is_planned_as_nothing():
    """A warn or crit finding of any registered check gets a repair, a command or an inspect."""
    for spec in checks.REGISTRY.values():
        for severity in spec.severities:
            if severity not in ("warn", "crit") or spec.id.endswith(".unreadable"):
                continue
            got = plan.action_for(finding(spec.id, severity, action=spec.action))
            assert got != "none", (spec.id, severity)
            assert got in plan.ACTIONS or got in plan.SIDE_ACTIONS


def test_an_ecc_mode_already_pending_needs_only_the_reset():
    pending = finding("config.ecc_mode", observed={"current": False, "pending": True}, expected=True)
    assert plan.action_for(pending) == "reset_gpu"
    assert (
        plan.action_for(
            finding("config.ecc_mode", observed={"current": False, "pending": False}, expected=True)
        )
        == "inspect"
    )


def test_unknown_checks_map_commands_in_their_action_text():
    assert plan.action_for(finding("new.check", action="Run fleetops apply power.")) == "apply_power"
    assert plan.action_for(finding("new.check", action="Run fleetops rollout driver.")) == "rollout_driver"
    assert plan.action_for(finding("new.check", action="Look at the graphs.")) == "inspect"


def test_a_power_cap_and_a_driver_keep_their_commands_beside_a_reset():
    found = [
        finding("memory.ecc_dbe_volatile", "crit", gpu=2),
        finding("thermal_power.power_limit", gpu=2),
        finding("thermal_power.power_limit", gpu=5),
        finding("versions.driver", gpu=None, expected="580.95.05"),
        finding("thermal_power.throttle", gpu=1, action="Check the node's cooling."),
    ]
    p = plan.build(found, ["node001"], inventory="inv.yml")
    (node,) = p.nodes
    assert [(i.action, (i.gpu or {}).get("index")) for i in node.items] == [
        ("reset_gpu", 2),
        ("inspect", None),
        ("apply_power", None),
        ("rollout_driver", None),
    ]
    assert [i.node for i in p.resets] == ["node001"]
    power = next(i for i in node.fixes if i.action == "apply_power")
    assert power.command == "fleetops apply power -i inv.yml --limit node001"
    assert [r["gpu"]["index"] for r in power.reasons] == [2, 5]  # one fix for the node, every GPU under it
    rollout = next(i for i in node.fixes if i.action == "rollout_driver")
    assert rollout.command == "fleetops rollout driver -i inv.yml --limit node001 --version 580.95.05"
    text = plan.render(p)
    assert "run: fleetops apply power -i inv.yml --limit node001" in text
    assert (
        "Roll out the driver: node001: fleetops rollout driver -i inv.yml --limit node001 --version 580.95.05"
        in text
    )
    assert "what to do: Check the node's cooling." in text
    assert "Inspect (each finding's action says what to do): node001 (thermal_power.throttle)" in text
    doc = p.to_dict()["nodes"][0]
    assert [i["command"] for i in doc["items"] if i["action"] == "apply_power"] == [power.command]


def test_nodes_that_need_only_commands_are_summarised_by_command():
    found = [
        finding("thermal_power.power_limit", node="node003"),
        finding("thermal_power.power_limit", node="node004"),
    ]
    p = plan.build(found, inventory="inv.yml")
    text = plan.render(p)
    assert "node003: apply the power settings" in text
    assert (
        "Apply the power settings: node003, node004: fleetops apply power -i inv.yml --limit node003,node004"
        in text
    )
    assert "Nothing to do" not in text


@pytest.mark.parametrize(
    ("check", "why"),
    [
        ("transport.timeout", "hung"),
        ("transport.unreachable", "unreachable"),
        ("transport.auth", "unknown"),
        ("transport.agent", "unknown"),
    ],
)
def test_a_node_without_a_snapshot_cannot_be_planned_and_says_why(check, why):
    hung = finding(check, "unknown", node="node017", gpu=None)
    p = plan.build([hung, finding("memory.ecc_dbe_volatile", "crit")], ["node001", "node017"])
    node = p.nodes[1]
    assert node.blocked is not None and node.blocked[0] == why
    text = plan.render(p)
    assert f"node017: cannot plan: {why} ({check}: {check} on None)" in text
    assert f"Cannot plan: node017 ({why})" in text
    assert p.to_dict()["nodes"][1]["blocked"] == why


def test_a_check_that_could_not_read_is_listed_but_does_not_block_the_node():
    p = plan.build([finding("memory.ecc_dbe_volatile", "crit"), finding("memory.unreadable", "unknown")])
    (node,) = p.nodes
    assert node.blocked is None and node.resets
    assert "  cannot plan: memory.unreadable" in plan.render(p)


def test_no_finding_but_nodes_without_a_recent_audit_is_never_nothing_to_do():
    p = plan.build(
        [],
        ["node001", "node002", "node003"],
        audited=["node001"],
        unaudited={"node002": "never audited", "node003": "last result audit #4, 2.0 h ago"},
        window="15m",
    )
    text = plan.render(p)
    assert "Nothing to do" not in text
    assert text.startswith(
        "No finding in the results for 1 node(s); 2 node(s) have no audit within 15m: "
        "node002 (never audited), node003 (last result audit #4, 2.0 h ago)"
    )


def test_a_plan_says_which_nodes_it_did_not_look_at():
    p = plan.build(
        [finding("memory.ecc_dbe_volatile", "crit")],
        ["node001", "node002"],
        audited=["node001"],
        unaudited={"node002": "never audited"},
        window="15m",
    )
    text = plan.render(p)
    assert (
        "Not planned: 1 node(s) have no audit within 15m, so nothing is planned for them: node002 (never audited)"
        in text
    )
    assert p.to_dict()["unaudited"] == {"node002": "never audited"}


def test_nothing_to_do_only_when_every_node_was_looked_at():
    assert (
        plan.render(plan.build([], ["node001"], audited=["node001"]))
        == "Nothing to do: no warning or critical finding in the results for 1 node(s).\n"
    )
