#!/usr/bin/python
"""Set a GPU power cap, persistence mode or MIG mode through ``fleetops-agent set``."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_set
short_description: Set GPU power cap, persistence mode or MIG mode through fleetops-agent
description:
  - Runs C(fleetops-agent set SETTING VALUE --gpu GPU --json) on the node and reports what changed.
  - The agent reads each GPU first and changes only the GPUs that differ, so the module is idempotent.
  - In check mode the agent runs with C(--dry-run) and changes nothing.
  - After a real change the module collects a fresh snapshot and verifies the value the GPU now enforces
    (C(power_enforced_limit_w) for power caps).
options:
  setting:
    description: Which setting.
    type: str
    required: true
    choices: [power, persistence, mig]
  value:
    description:
      - Watts for C(power) (with O(baseline), for the GPUs whose model it gives no limit); a boolean or on/off for
        C(persistence) and C(mig).
    type: raw
    required: true
  gpu:
    description: C(all), a GPU UUID, a PCI bus id or an index.
    type: str
    default: all
  verify:
    description: After a change, read the GPUs back and fail unless they enforce the value.
    type: bool
    default: true
  baseline:
    description:
      - For C(power) only. A fleetops baseline (the value of C(fleetops_baseline), or a mapping holding that key);
        each GPU takes its own model's limit from it (C(gpu_models.MODEL.power_limit_w), MODEL as NVML names the
        GPU, else C(power_limit_w)), as the audit judges it; O(value) is the cap of a GPU it gives none.
      - The agent matches each GPU to its model (C(fleetops-agent set power --baseline)); only the baseline's power
        keys are passed to it.
      - Empty (the default) caps every selected GPU at O(value).
    type: dict
    default: {}
extends_documentation_fragment:
  - fleetops.gpu.agent
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Cap every GPU at 700 W
  fleetops.gpu.fleetops_gpu_set:
    setting: power
    value: 700

- name: Cap every GPU at its own model's limit in the baseline (700 W where it names none)
  fleetops.gpu.fleetops_gpu_set:
    setting: power
    value: 700
    baseline: "{{ fleetops_baseline }}"

- name: Persistence mode on
  fleetops.gpu.fleetops_gpu_set:
    setting: persistence
    value: true
"""

RETURN = r"""
gpus:
  description: Per GPU as the agent reported it (index, uuid, bus_id, before, after, changed).
  returned: always
  type: list
  elements: dict
changed_gpus:
  description: UUIDs of the GPUs that were (or in check mode would be) changed.
  returned: always
  type: list
  elements: str
reset_required:
  description: UUIDs of GPUs whose new MIG mode is pending until a GPU reset.
  returned: when setting is mig
  type: list
  elements: str
backend:
  description: nvml or sim.
  returned: always
  type: str
persist:
  description:
    - For C(power) - whether a cap must be re-applied at boot - true when a GPU's cap differs from its default
      limit (the one NVML restores after a reboot or driver reload) or the default is unknown. gpu_power installs
      its boot-time unit only then (or when it is already installed).
  returned: when setting is power
  type: bool
agent:
  description: The command that ran the agent (used by gpu_power for its boot-time unit).
  returned: always
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.agent import (
    AGENT_ARGUMENT_SPEC,
    AgentError,
    agent_command,
    backend_args,
    backend_mismatch,
    fail_from,
    gpu_label,
    run_agent,
)

# setting -> (snapshot field the agent sets, field that shows what the GPU enforces)
VERIFY_FIELD = {
    "power": ("power_limit_w", "power_enforced_limit_w"),
    "persistence": ("persistence_mode", "persistence_mode"),
    "mig": ("mig_mode_current", "mig_mode_pending"),
}
POWER_TOLERANCE_W = 0.5


def _raw_value(setting, value):
    if setting == "power":
        if isinstance(value, bool):
            raise ValueError("power: value must be a number of watts, not a boolean")
        try:
            watts = float(value)
        except (TypeError, ValueError):
            raise ValueError("power: %r is not a number of watts" % (value,)) from None
        return "%g" % watts
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "enabled", "enable", "1"):
        return "on"
    if text in ("off", "false", "no", "disabled", "disable", "0"):
        return "off"
    raise ValueError("%s: %r is not on/off" % (setting, value))


def _show(setting, value):
    if setting == "power":
        return "%g W" % float(value) if value is not None else "unknown"
    return {True: "on", False: "off"}.get(value, "unknown")


def _shown_value(setting, want):
    """The value every GPU gets, or "per GPU model" when a baseline gives them different ones."""
    return _show(setting, want) if want is not None else "per GPU model"


def _same(setting, want, got):
    if got is None:
        return False
    if setting == "power":
        return abs(float(got) - float(want)) <= POWER_TOLERANCE_W
    return bool(got) == bool(want)


def power_baseline(baseline):
    """The baseline's power keys only (``gpu_models.*.power_limit_w``, ``power_limit_w``): the rest
    of a host's baseline is not this module's to validate. None when it gives no power limit."""
    baseline = dict(baseline or {})
    if "fleetops_baseline" in baseline:  # a group_vars-shaped mapping
        baseline = dict(baseline["fleetops_baseline"] or {})
    models = {
        str(name): {"power_limit_w": spec["power_limit_w"]}
        for name, spec in (baseline.get("gpu_models") or {}).items()
        if isinstance(spec, dict) and spec.get("power_limit_w") not in (None, "")
    }
    out = {"gpu_models": models} if models else {}
    if baseline.get("power_limit_w") not in (None, ""):
        out["power_limit_w"] = baseline["power_limit_w"]
    return out or None


def _want(setting, gpu, value):
    """The value this GPU is set to (its own with a baseline), as the agent reported it."""
    return gpu.get("after") if gpu.get("after") is not None else value


def main():
    spec = dict(
        setting=dict(type="str", required=True, choices=list(VERIFY_FIELD)),
        value=dict(type="raw", required=True),
        gpu=dict(type="str", default="all"),
        verify=dict(type="bool", default=True),
        baseline=dict(type="dict", default={}),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    setting = module.params["setting"]
    try:
        raw = _raw_value(setting, module.params["value"])
    except ValueError as exc:
        module.fail_json(msg=str(exc), kind="usage")

    argv = ["set", setting, raw, "--gpu", module.params["gpu"], "--json"] + backend_args(module)
    power = power_baseline(module.params["baseline"]) if module.params["baseline"] else None
    if power is not None:
        if setting != "power":
            module.fail_json(msg="baseline: gives power caps only, not %s" % setting, kind="usage")
        path = os.path.join(module.tmpdir, "fleetops-power-baseline.json")
        with open(path, "w") as fh:
            json.dump(power, fh, sort_keys=True)
        argv += ["--baseline", path]
    if module.check_mode:
        argv.append("--dry-run")
    agent = agent_command(module)
    try:
        doc = run_agent(module, argv)
    except AgentError as exc:
        fail_from(module, exc, agent=agent)

    gpus = doc.get("gpus") or []
    changed_gpus = [g for g in gpus if g.get("changed")]
    result = dict(
        changed=bool(doc.get("changed")),
        setting=setting,
        field=doc.get("field"),
        value=doc.get("value"),
        gpus=gpus,
        changed_gpus=[g.get("uuid") for g in changed_gpus],
        backend=doc.get("backend"),
        agent=agent,
    )
    if setting == "power":
        result["persist"] = any(
            g.get("default") is None or not _same(setting, _want(setting, g, doc.get("value")), g.get("default"))
            for g in gpus
        )
    if module._diff:
        result["diff"] = dict(
            before="".join(
                "%s: %s=%s\n" % (gpu_label(g), setting, _show(setting, g.get("before"))) for g in gpus
            ),
            after="".join(
                "%s: %s=%s\n" % (gpu_label(g), setting, _show(setting, g.get("after"))) for g in gpus
            ),
            before_header="%s before" % setting,
            after_header="%s after" % setting,
        )

    want = doc.get("value")
    if module.params["verify"] and not module.check_mode and result["changed"]:
        try:
            snapshot = run_agent(module, ["collect", "--fresh", "--json"] + backend_args(module))
        except AgentError as exc:
            fail_from(module, exc, **result)
        mismatch = backend_mismatch(doc, snapshot, "set %s (verified by a fresh collect)" % setting)
        if mismatch:
            result["msg"] = mismatch
            module.fail_json(kind="backend-mismatch", **result)
        enforced_field = VERIFY_FIELD[setting][1]
        by_uuid = {g.get("uuid"): g for g in snapshot.get("gpus") or []}
        wrong = []
        for gpu in gpus:
            now = by_uuid.get(gpu.get("uuid"))
            got = None if now is None else now.get(enforced_field)
            if not _same(setting, _want(setting, gpu, want), got):
                wrong.append("%s enforces %s=%s" % (gpu_label(gpu), enforced_field, _show(setting, got)))
        if wrong:
            result["msg"] = "%s %s did not take effect: %s" % (
                setting,
                _shown_value(setting, want),
                "; ".join(wrong),
            )
            module.fail_json(kind="verify", **result)
        result["verified"] = True
        if setting == "mig":
            result["reset_required"] = [
                g.get("uuid")
                for g in gpus
                if by_uuid.get(g.get("uuid"), {}).get("mig_mode_current")
                != by_uuid.get(g.get("uuid"), {}).get("mig_mode_pending")
            ]

    verb = "would change" if module.check_mode else "changed"
    if changed_gpus:
        result["msg"] = "%s %s: %s %d of %d GPUs (%s)" % (
            setting,
            _shown_value(setting, want),
            verb,
            len(changed_gpus),
            len(gpus),
            ", ".join(
                "%s: %s%s" % (
                    g.get("index"),
                    _show(setting, g.get("before")),
                    "" if want is not None else " -> " + _show(setting, g.get("after")),
                )
                for g in changed_gpus
            ),
        )
    else:
        result["msg"] = "%s %s: all %d GPUs already set" % (setting, _shown_value(setting, want), len(gpus))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
