#!/usr/bin/python
"""Node and GPU facts, judged by the node agent's checks (``fleetops-agent check``).

The module compares nothing itself: the desired state has one judge, ``fleetops.checks``, run on
the node by the agent; this translates the task's arguments into a baseline and the findings into
``mismatches``/``compliant`` and a failure."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_facts
short_description: Node and GPU facts from fleetops-agent, judged by its checks against a baseline
description:
  - Runs C(fleetops-agent check --json) on the node and sets the fact C(fleetops_gpu) (a summary per GPU).
  - The node is judged by the node-scope checks of fleetops (the ones C(fleetops audit) runs), against
    O(baseline) with the O(expect) keys layered over it; the module compares nothing itself.
  - Every finding is returned in C(findings); those of the checks the O(expect) keys ask for are the
    C(mismatches).
  - Never changes anything; runs in check mode too.
options:
  baseline:
    description:
      - A fleetops baseline (the value of C(fleetops_baseline), or a mapping holding that key); every
        node-scope check runs against it, per GPU model where the baseline says so (C(gpu_models)).
      - Its findings are returned in C(findings); they fail the task only through O(fail_on).
    type: dict
    default: {}
  expect:
    description:
      - Desired state, layered over O(baseline) (these keys win). Keys (all optional) and the baseline keys
        they set are C(driver_version), C(cuda_driver_version), C(gpu_count), C(power_limit_w) (GPUs whose
        model has no limit of its own in O(baseline)), C(persistence_mode), C(mig_mode) (C(mig.mode)),
        C(mig_profile) (C(mig.profile), checked on GPUs in MIG mode), C(firmware) (GPU model name to
        C(vbios_version)/C(inforom_image), C(gpu_models)), C(services) (unit to C(active)), C(packages)
        (package name to its pinned version, C(packages); the version, or its upstream part followed by any
        package revision, as the check C(versions.packages) matches them).
      - A difference in any of them is a mismatch, whatever the finding's severity.
    type: dict
    default: {}
  fail_on_mismatch:
    description: Fail the task when the node differs from O(expect).
    type: bool
    default: false
  fail_on:
    description:
      - Fail the task when any finding (of every check, O(baseline) included) is at or above this severity,
        as C(fleetops audit --fail-on); C(none) never fails on findings.
    type: str
    default: none
    choices: [none, warn, crit]
  full:
    description: Also return the whole snapshot as the fact C(fleetops_snapshot).
    type: bool
    default: false
  fresh:
    description:
      - Collect now (C(fleetops-agent check --fresh)) instead of taking the resident agent's snapshot, which
        may be up to its full interval old (10 s by default).
      - Set it where the task verifies a change made just before (a power cap, a driver reload, a MIG
        mode), so the verification reads the node as it is now.
    type: bool
    default: false
extends_documentation_fragment:
  - fleetops.gpu.agent
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: The loaded driver must be the pinned one
  fleetops.gpu.fleetops_gpu_facts:
    expect:
      driver_version: "580.159.04"
    fail_on_mismatch: true
    fresh: true

- name: Fail the node on a critical finding against the inventory's baseline
  fleetops.gpu.fleetops_gpu_facts:
    baseline: "{{ fleetops_baseline | default({}, true) }}"
    fail_on: crit
"""

RETURN = r"""
ansible_facts:
  description: C(fleetops_gpu) (summary) and, with O(full), C(fleetops_snapshot).
  returned: always
  type: dict
findings:
  description:
    - Every finding of the agent's checks, worst first (check, severity, node, gpu, observed, expected,
      message, action), as C(fleetops audit --format json) reports them.
  returned: always
  type: list
  elements: dict
mismatches:
  description:
    - The findings of the checks the O(expect) keys ask for (and values they need that could not be read);
      one per package that differs from the C(packages) key of O(expect) (check C(versions.packages)).
  returned: always
  type: list
  elements: dict
compliant:
  description: True when nothing differs from O(expect).
  returned: always
  type: bool
agent_check:
  description:
    - The agent's verdict without its findings (kind C(fleetops.check/v1)) - scope (C(node)), checks_run,
      fleet_checks_not_run, counts, exit_code (0 clean, 1 warn, 2 crit, 3 only unknowns), source.
  returned: always
  type: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.agent import (
    AGENT_ARGUMENT_SPEC,
    AgentError,
    backend_args,
    fail_from,
    run_agent,
)

SUMMARY_FIELDS = (
    "index",
    "uuid",
    "bus_id",
    "name",
    "vbios_version",
    "inforom_image",
    "persistence_mode",
    "power_limit_w",
    "power_enforced_limit_w",
    "power_default_limit_w",
    "mig_mode_current",
    "mig_mode_pending",
)
# expect key -> the checks that judge it (their findings are the key's mismatches) and the
# snapshot fields they read (a family's "unreadable" finding naming one is a mismatch too).
EXPECT_CHECKS = {
    "driver_version": (("versions.driver",), ("driver_version",)),
    "cuda_driver_version": (("versions.cuda",), ("cuda_driver_version",)),
    "gpu_count": (("config.gpu_count",), ("gpu_count",)),
    "power_limit_w": (
        ("thermal_power.power_limit", "thermal_power.power_enforced"),
        ("power_limit_w", "power_enforced_limit_w"),
    ),
    "persistence_mode": (("config.persistence_mode",), ("persistence_mode",)),
    "mig_mode": (("config.mig_mode",), ("mig_mode_current",)),
    "mig_profile": (("config.mig_profile",), ("mig_instances",)),
    "firmware": (("versions.vbios", "versions.inforom"), ("vbios_version", "inforom_image")),
    "services": (("config.services",), ("services",)),
    "packages": (("versions.packages",), ("packages",)),
}
FAIL_ON = {"none": (), "warn": ("warn", "crit"), "crit": ("crit",)}
BASELINE_FILE = "fleetops-baseline.json"


def _bool(module, key, value):
    from ansible.module_utils.parsing.convert_bool import boolean

    try:
        return boolean(value, strict=True)
    except TypeError:
        module.fail_json(msg="expect.%s: %r is not a boolean" % (key, value), kind="usage")
        return None  # not reached


def _number(module, key, value, kind):
    try:
        return kind(value)
    except (TypeError, ValueError):
        module.fail_json(msg="expect.%s: %r is not a number" % (key, value), kind="usage")
        return None  # not reached


def expect_layer(module, expect):
    """The baseline keys the ``expect`` shorthand stands for (values as the baseline types them;
    Jinja hands numbers and booleans over as text)."""
    layer = {}
    for key in ("driver_version", "cuda_driver_version"):
        if key in expect:
            layer[key] = str(expect[key])
    if "gpu_count" in expect:
        layer["gpu_count"] = _number(module, "gpu_count", expect["gpu_count"], int)
    if "power_limit_w" in expect:
        layer["power_limit_w"] = _number(module, "power_limit_w", expect["power_limit_w"], float)
    if "persistence_mode" in expect:
        layer["persistence_mode"] = _bool(module, "persistence_mode", expect["persistence_mode"])
    mig = {}
    if "mig_mode" in expect:
        mig["mode"] = _bool(module, "mig_mode", expect["mig_mode"])
    if "mig_profile" in expect:
        # The profile is judged on MIG GPUs only; those not in MIG mode are the mig_mode check's.
        mig.setdefault("mode", True)
        mig["profile"] = str(expect["mig_profile"])
    if mig:
        layer["mig"] = mig
    if "firmware" in expect:
        firmware = expect["firmware"]
        if not isinstance(firmware, dict):
            module.fail_json(msg="expect.firmware: a mapping of GPU model to versions, got %r" % (firmware,), kind="usage")
        layer["gpu_models"] = {str(m): dict(v or {}) for m, v in firmware.items()}
    if "services" in expect:
        services = expect["services"]
        wrong = {u: s for u, s in (services or {}).items() if s != "active"} if isinstance(services, dict) else services
        if wrong:
            module.fail_json(
                msg="expect.services: only 'active' can be expected (the checks require units to run), got %r" % (wrong,),
                kind="usage",
            )
        layer["services"] = sorted(services)
    if "packages" in expect:
        packages = expect["packages"]
        if not isinstance(packages, dict):
            module.fail_json(msg="expect.packages: a mapping of package name to version, got %r" % (packages,),
                             kind="usage")
        odd = sorted(str(n) for n, v in packages.items() if v is None or isinstance(v, (dict, list, bool)))
        if odd:
            module.fail_json(msg="expect.packages: %s: a version is text or a number" % ", ".join(odd), kind="usage")
        # Jinja hands a version over as text or, unquoted, as a number: the pin is its text.
        layer["packages"] = {str(n): str(v) for n, v in packages.items()}
    return layer


def _merge(base, over):
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def desired_baseline(module, baseline, expect):
    baseline = dict(baseline or {})
    if "fleetops_baseline" in baseline:  # a group_vars-shaped mapping
        baseline = dict(baseline["fleetops_baseline"] or {})
    return _merge(baseline, expect_layer(module, expect))


def mismatches_of(findings, expect):
    """The findings of the checks the ``expect`` keys ask for, and the unreadable values they
    need (a value asked for that could not be read is not compliant either)."""
    asked = {check for key in expect for check in EXPECT_CHECKS[key][0]}
    fields = {name for key in expect for name in EXPECT_CHECKS[key][1]}
    out = []
    for f in findings:
        check = f.get("check") or ""
        if f.get("severity") == "info":
            continue
        if check in asked:
            out.append(f)
        elif check.endswith(".unreadable") and isinstance(f.get("observed"), dict):
            if any(str(name).split("[", 1)[0] in fields for name in f["observed"]):
                out.append(f)
    return out


def summary(snapshot):
    return {
        "hostname": snapshot.get("hostname"),
        "backend": snapshot.get("backend"),
        "driver_version": snapshot.get("driver_version"),
        "cuda_driver_version": snapshot.get("cuda_driver_version"),
        "gpu_count": snapshot.get("gpu_count"),
        "packages": snapshot.get("packages") or {},
        "services": snapshot.get("services") or {},
        "gpus": [{k: g.get(k) for k in SUMMARY_FIELDS} for g in snapshot.get("gpus") or []],
    }


def _listed(entries):
    shown = [e["message"] for e in entries[:8]]
    more = len(entries) - len(shown)
    return "; ".join(shown) + (" (and %d more)" % more if more else "")


def main():
    spec = dict(
        baseline=dict(type="dict", default={}),
        expect=dict(type="dict", default={}),
        fail_on_mismatch=dict(type="bool", default=False),
        fail_on=dict(type="str", default="none", choices=["none", "warn", "crit"]),
        full=dict(type="bool", default=False),
        fresh=dict(type="bool", default=False),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    expect = {k: v for k, v in (module.params["expect"] or {}).items() if v is not None}
    unknown = sorted(set(expect) - set(EXPECT_CHECKS))
    if unknown:
        module.fail_json(
            msg="expect: unknown keys %s (known: %s)" % (unknown, sorted(EXPECT_CHECKS)), kind="usage"
        )
    path = os.path.join(module.tmpdir, BASELINE_FILE)
    with open(path, "w") as fh:
        json.dump(desired_baseline(module, module.params["baseline"], expect), fh, indent=1, sort_keys=True)
    try:
        fresh = ["--fresh"] if module.params["fresh"] else []
        argv = ["check", "--json", "--snapshot", "--exit-zero", "--baseline", path] + fresh + backend_args(module)
        doc = run_agent(module, argv)
    except AgentError as exc:
        if exc.kind == "usage":  # the baseline did not validate: name the task's arguments, not the file
            message = str(exc).replace(path, "baseline/expect")
            if "invalid choice: 'check'" in message:
                message = "the node's fleetops-agent has no check command (older than this module); upgrade it " \
                    "with the fleetops_agent role: " + message
            exc = AgentError(message, kind=exc.kind, rc=exc.rc, stderr=exc.stderr, cmd=exc.cmd)
        fail_from(module, exc)
    if not isinstance(doc, dict) or doc.get("kind") != "fleetops.check/v1" or not isinstance(doc.get("snapshot"), dict):
        module.fail_json(msg="the agent's check printed no fleetops.check/v1 report: %r" % (str(doc)[:300],), kind="bad-output")

    snapshot = doc.pop("snapshot")
    findings = doc.pop("findings", None) or []
    facts = {"fleetops_gpu": summary(snapshot)}
    if module.params["full"]:
        facts["fleetops_snapshot"] = snapshot
    mismatches = mismatches_of(findings, expect)
    failing = [f for f in findings if f.get("severity") in FAIL_ON[module.params["fail_on"]]]
    result = dict(
        changed=False, ansible_facts=facts, findings=findings, mismatches=mismatches, compliant=not mismatches,
        agent_check=doc,
    )
    if mismatches:
        result["msg"] = "%d difference(s) from the expected state: %s" % (len(mismatches), _listed(mismatches))
    else:
        result["msg"] = "driver %s, %s GPUs%s" % (
            snapshot.get("driver_version"),
            snapshot.get("gpu_count"),
            ", as expected" if expect else "",
        )
    if failing:
        result["msg"] = "%d finding(s) at or above %s: %s%s" % (
            len(failing), module.params["fail_on"], _listed(failing),
            "; " + result["msg"] if mismatches else "",
        )
    if (mismatches and module.params["fail_on_mismatch"]) or failing:
        # Without the facts: the failure should read as the differences, not the snapshot.
        module.fail_json(
            kind="mismatch" if mismatches and module.params["fail_on_mismatch"] else "findings",
            msg=result["msg"], mismatches=mismatches, findings=findings, compliant=not mismatches,
            agent_check=doc,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
