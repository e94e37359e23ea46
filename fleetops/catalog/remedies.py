"""The machine action code of a finding: what fixes it, as one word from a fixed list.

Repairs, from the least to the most drastic (``ACTIONS``): ``none``, ``restart_app``, ``drain``,
``reset_gpu``, ``drain_and_inspect``, ``reboot_node``; beside them, fixes that are not repairs
(``SIDE_ACTIONS``): ``inspect`` and a setting or version to bring back to the baseline
(``apply_power``, ``apply_mig``, ``apply_firmware``, ``rollout_driver``). Each finding (warn or
crit; anything else is ``none``) is mapped by its check id, XID findings by the action the check
judged per code (the XID policy, escalation included), else the XID catalog's; a check this table
does not know is mapped from its action text.

Domain knowledge, pure: the remediation planner (``fleetops.remedy.plan``) builds its plan on it,
and the audit's JSON report gives each finding its ``action_code`` with it (a controller report
may not import the planner, which builds on the report).
"""

from __future__ import annotations

from fleetops import model

ACTIONS = ("none", "restart_app", "drain", "reset_gpu", "drain_and_inspect", "reboot_node")
RANK = {a: i for i, a in enumerate(ACTIONS)}
# Fixes that are not repairs: kept beside the repair ladder, one per node and kind, printed as
# the command to run (remediate runs none of them) or, for ``inspect``, the finding's own action.
SIDE_ACTIONS = ("inspect", "apply_power", "apply_mig", "apply_firmware", "rollout_driver")

# check id -> action, or {severity: action}
BY_CHECK: dict[str, str | dict[str, str]] = {
    "memory.ecc_dbe_volatile": "reset_gpu",
    "memory.ecc_sbe_volatile": "reset_gpu",
    "memory.ecc_sbe_rate": "reset_gpu",
    "memory.row_remap_pending": "reset_gpu",
    "memory.row_remap_failure": "drain_and_inspect",
    "memory.row_remap_uncorrectable": "drain_and_inspect",
    "memory.retired_pages": {"crit": "drain_and_inspect", "warn": "reset_gpu"},
    "pcie.link_degraded": "reset_gpu",
    "pcie.replay_rate": {"warn": "drain", "info": "none"},
    "nvlink.links_down": "reset_gpu",
    "nvlink.error_rate": {"crit": "reset_gpu", "warn": "reset_gpu", "info": "none"},
    "thermal_power.throttle": "inspect",
    "thermal_power.temperature": {"crit": "drain", "warn": "inspect"},
    "thermal_power.memory_temperature": {"crit": "drain", "warn": "inspect"},
    "thermal_power.power_limit": "apply_power",
    "thermal_power.power_enforced": "inspect",
    "xid.storm": "drain",
    "config.gpu_count": "reboot_node",
    "config.gpu_missing": "reboot_node",
    "config.services": {"crit": "drain", "warn": "inspect"},
    "config.fabric_state": "inspect",
    "config.stray_processes": "inspect",
    "config.ecc_mode": "inspect",  # a mode already pending needs only the reset: see action_for
    "config.persistence_mode": "apply_power",  # the power role enforces persistence mode too
    "config.compute_mode": "inspect",
    "config.mig_mode": "apply_mig",
    "config.mig_profile": "apply_mig",
    "config.mig_layout": "apply_mig",
    "topology.links": "inspect",
    "topology.numa": "inspect",
    "versions.driver": "rollout_driver",
    "versions.cuda": "rollout_driver",
    "versions.fabric_manager": "rollout_driver",
    "versions.fabric_manager_match": "rollout_driver",
    "versions.driver_package": "rollout_driver",
    "versions.driver_branch": "rollout_driver",
    "versions.driver_flavour": "rollout_driver",
    "versions.packages": "rollout_driver",
    "versions.vbios": "apply_firmware",
    "versions.inforom": "apply_firmware",
    "versions.gpu_model": "inspect",
    "validation.missing": "inspect",
    "validation.expired": "inspect",
    "validation.failed": "drain",
    # the HCAs: a compute port's fault (crit) takes the node out for the cable or card; an
    # excluded port's (warn) never drains. HCA firmware has no playbook here: its action says how.
    "fabric.port_down": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.port_degraded": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.port_count": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.link_downed": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.error_counters": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.link_errors": {"crit": "drain_and_inspect", "warn": "inspect"},
    # the daemon's flaps and drops: their action text says "inspect", which alone would drain
    "fabric.flap": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.drop": {"crit": "drain_and_inspect", "warn": "inspect"},
    "fabric.firmware": "inspect",
    "fabric.gpu_without_hca": "inspect",
}
# the XID catalog's action keys -> plan actions
FROM_XID_ACTION = {
    "none": "none",
    "restart_app": "restart_app",
    "reset_gpu": "reset_gpu",
    "reboot_node": "reboot_node",
    "drain_and_inspect": "drain_and_inspect",
    "check_nvlink": "reset_gpu",
    "check_cooling_power": "inspect",
    "follow_other_xid": "none",
}
FROM_RECOVERY = {
    "gpu_reset": "reset_gpu",
    "drain_and_reset": "reset_gpu",
    "drain_p2p": "reset_gpu",
    "node_reboot": "reboot_node",
}


def from_text(text: str | None) -> str:
    """Best guess from an action text, for checks the table does not know; ``inspect`` (the
    action itself says what to do) when it names nothing this plan knows."""
    t = (text or "").lower()
    if "fleetops reset" in t or t.startswith("reset the gpu"):
        return "reset_gpu"
    if "reboot" in t:
        return "reboot_node"
    if "rma" in t or "inspect" in t or "hardware case" in t or "hardware service" in t:
        return "drain_and_inspect"
    if "restart the application" in t or "restart the job" in t or "restarted" in t:
        return "restart_app"
    if "drain" in t:
        return "drain"
    for command, act in (
        ("fleetops apply power", "apply_power"),
        ("fleetops apply mig", "apply_mig"),
        ("fleetops apply firmware", "apply_firmware"),
        ("fleetops rollout driver", "rollout_driver"),
    ):
        if command in t:
            return act
    return "inspect"


def _xid_action(finding: model.Finding) -> str:
    observed = finding.observed if isinstance(finding.observed, list) else []
    try:
        from fleetops.xid import catalog as catalog
    except ImportError:  # pragma: no cover - shipped together
        return from_text(finding.action)
    best = "none"
    side = None
    for entry in observed:
        if not isinstance(entry, dict) or entry.get("severity") not in ("warn", "crit"):
            continue
        code = entry.get("code")
        if not isinstance(code, int):
            continue
        name = str(entry.get("name") or "")
        if entry.get("sxid"):
            act = "drain"  # an NVSwitch error: not one GPU's reset
        elif code == 154 and ":" in name:
            act = FROM_RECOVERY.get(name.rsplit(":", 1)[1].strip(), "reset_gpu")
        else:
            # the check's judgement (the baseline's xid_policy and escalation) when it gives one
            key = entry.get("action") if isinstance(entry.get("action"), str) else catalog.lookup(code).action
            act = FROM_XID_ACTION.get(str(key), "drain_and_inspect")
        if act in SIDE_ACTIONS:
            side = side or act
        elif RANK[act] > RANK[best]:
            best = act
    if not observed:
        return from_text(finding.action)
    return side if best == "none" and side else best


def _ecc_pending(finding: model.Finding) -> bool:
    observed = finding.observed if isinstance(finding.observed, dict) else {}
    return finding.expected is not None and observed.get("pending") == finding.expected


def action_for(finding: model.Finding) -> str:
    """The plan action for one finding."""
    if finding.severity not in ("warn", "crit"):
        return "none"
    if finding.check == "xid.recent":
        return _xid_action(finding)
    if finding.check == "xid.recovery_action":
        return FROM_RECOVERY.get(str(finding.observed), from_text(finding.action))
    if finding.check.startswith("transport.") or finding.check.endswith(".unreadable"):
        return "none"
    if finding.check == "config.ecc_mode" and _ecc_pending(finding):
        return "reset_gpu"  # the mode is set already, only the reset that applies it is missing
    rule = BY_CHECK.get(finding.check)
    if isinstance(rule, dict):
        return rule.get(finding.severity, from_text(finding.action))
    if isinstance(rule, str):
        return rule
    return from_text(finding.action)
