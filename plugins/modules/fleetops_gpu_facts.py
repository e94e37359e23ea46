#!/usr/bin/python
"""Collect a node snapshot through ``fleetops-agent collect`` and compare it with expectations."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_facts
short_description: Node and GPU facts from fleetops-agent, compared with an expected state
description:
  - Runs C(fleetops-agent collect --json) on the node and sets the fact C(fleetops_gpu) (a summary per GPU).
  - With O(expect), compares the snapshot with the desired state (driver version, power caps, persistence,
    MIG, firmware per GPU model, package versions, services) and returns each difference in C(mismatches).
  - Never changes anything; runs in check mode too.
options:
  expect:
    description:
      - Desired state. Keys (all optional) are C(driver_version), C(cuda_driver_version), C(gpu_count),
        C(power_limit_w), C(persistence_mode), C(mig_mode), C(mig_profile), C(vbios_version),
        C(inforom_image), C(firmware) (GPU model name to C(vbios_version)/C(inforom_image)),
        C(packages) (package name to version or version prefix) and C(services) (unit to state).
    type: dict
    default: {}
  fail_on_mismatch:
    description: Fail the task when the node differs from O(expect).
    type: bool
    default: false
  full:
    description: Also return the whole snapshot as the fact C(fleetops_snapshot).
    type: bool
    default: false
  fresh:
    description:
      - Collect now (C(fleetops-agent collect --fresh)) instead of taking the resident agent's snapshot, which
        may be up to its full interval old (10 s by default).
      - Set it where the task verifies a change made just before (a power cap, a driver reload, a MIG
        mode), so the verification reads the node as it is now.
    type: bool
    default: false
  agent:
    description: Path of fleetops-agent; searched for when unset.
    type: path
  sim_state:
    description: Simulator state file of a simulated node.
    type: path
    aliases: [state_file]
  backend:
    description: Agent backend.
    type: str
    default: auto
    choices: [auto, nvml, sim]
  timeout:
    description: Seconds the agent may take.
    type: int
    default: 120
author: fleetops
"""

EXAMPLES = r"""
- name: The loaded driver must be the pinned one
  fleetops_gpu_facts:
    expect:
      driver_version: "580.159.04"
    fail_on_mismatch: true
    fresh: true
"""

RETURN = r"""
ansible_facts:
  description: C(fleetops_gpu) (summary) and, with O(full), C(fleetops_snapshot).
  returned: always
  type: dict
mismatches:
  description: One entry per difference (check, gpu, observed, expected, message).
  returned: always
  type: list
  elements: dict
compliant:
  description: True when nothing differs from O(expect).
  returned: always
  type: bool
"""

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
EXPECT_KEYS = {
    "driver_version",
    "cuda_driver_version",
    "gpu_count",
    "power_limit_w",
    "persistence_mode",
    "mig_mode",
    "mig_profile",
    "vbios_version",
    "inforom_image",
    "firmware",
    "packages",
    "services",
}
POWER_TOLERANCE_W = 0.5


def _ref(gpu):
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "bus_id": gpu.get("bus_id")}


def _version_matches(installed, wanted):
    """``580.159.04`` matches ``580.159.04``, ``580.159.04-1`` and ``580.159.04-0ubuntu1``."""
    wanted = str(wanted)
    if installed == wanted:
        return True
    return installed.startswith(wanted) and installed[len(wanted)] in "-~+:"


def compare(snapshot, expect):
    found = []

    def miss(check, observed, expected, message, gpu=None):
        found.append(
            {
                "check": check,
                "gpu": _ref(gpu) if gpu else None,
                "observed": observed,
                "expected": expected,
                "message": message,
            }
        )

    gpus = snapshot.get("gpus") or []
    for key in ("driver_version", "cuda_driver_version"):
        if expect.get(key) is not None and str(snapshot.get(key)) != str(expect[key]):
            miss(
                key,
                snapshot.get(key),
                str(expect[key]),
                "%s is %s, expected %s" % (key, snapshot.get(key), expect[key]),
            )
    if expect.get("gpu_count") is not None and snapshot.get("gpu_count") != int(expect["gpu_count"]):
        miss(
            "gpu_count",
            snapshot.get("gpu_count"),
            int(expect["gpu_count"]),
            "%s GPUs visible, expected %s" % (snapshot.get("gpu_count"), expect["gpu_count"]),
        )

    for gpu in gpus:
        where = "GPU %s (%s)" % (gpu.get("index"), gpu.get("uuid"))
        if expect.get("power_limit_w") is not None:
            want = float(expect["power_limit_w"])
            for field in ("power_limit_w", "power_enforced_limit_w"):
                got = gpu.get(field)
                if got is None or abs(float(got) - want) > POWER_TOLERANCE_W:
                    miss(field, got, want, "%s %s is %s W, expected %g W" % (where, field, got, want), gpu)
        if expect.get("persistence_mode") is not None and gpu.get("persistence_mode") != bool(
            expect["persistence_mode"]
        ):
            miss(
                "persistence_mode",
                gpu.get("persistence_mode"),
                bool(expect["persistence_mode"]),
                "%s persistence mode is %s" % (where, gpu.get("persistence_mode")),
                gpu,
            )
        if expect.get("mig_mode") is not None:
            want = bool(expect["mig_mode"])
            if gpu.get("mig_mode_current") != want:
                miss(
                    "mig_mode",
                    gpu.get("mig_mode_current"),
                    want,
                    "%s MIG mode is %s, expected %s" % (where, gpu.get("mig_mode_current"), want),
                    gpu,
                )
        if expect.get("mig_profile") and gpu.get("mig_mode_current"):
            got = sorted({(i or {}).get("profile") or "?" for i in gpu.get("mig_instances") or []})
            want = str(expect["mig_profile"])
            if got != [want]:
                miss(
                    "mig_profile",
                    got,
                    want,
                    "%s MIG instances use %s, expected only %s" % (where, got or "none", want),
                    gpu,
                )
        firmware = dict((expect.get("firmware") or {}).get(gpu.get("name") or "", {}))
        for field in ("vbios_version", "inforom_image"):
            want = firmware.get(field, expect.get(field))
            if want is not None and gpu.get(field) != str(want):
                miss(
                    field,
                    gpu.get(field),
                    str(want),
                    "%s %s is %s, expected %s" % (where, field, gpu.get(field), want),
                    gpu,
                )

    installed = snapshot.get("packages") or {}
    for name, want in sorted((expect.get("packages") or {}).items()):
        got = installed.get(name)
        if got is None or not _version_matches(got, want):
            miss(
                "package",
                got,
                str(want),
                "package %s is %s, expected %s" % (name, got or "not installed", want),
            )
    services = snapshot.get("services") or {}
    for unit, want in sorted((expect.get("services") or {}).items()):
        if services.get(unit) != want:
            miss(
                "service",
                services.get(unit),
                want,
                "service %s is %s, expected %s" % (unit, services.get(unit), want),
            )
    return found


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


def main():
    spec = dict(
        expect=dict(type="dict", default={}),
        fail_on_mismatch=dict(type="bool", default=False),
        full=dict(type="bool", default=False),
        fresh=dict(type="bool", default=False),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    expect = {k: v for k, v in (module.params["expect"] or {}).items() if v is not None}
    unknown = sorted(set(expect) - EXPECT_KEYS)
    if unknown:
        module.fail_json(
            msg="expect: unknown keys %s (known: %s)" % (unknown, sorted(EXPECT_KEYS)), kind="usage"
        )
    try:
        fresh = ["--fresh"] if module.params["fresh"] else []
        snapshot = run_agent(module, ["collect", "--json"] + fresh + backend_args(module))
    except AgentError as exc:
        fail_from(module, exc)

    facts = {"fleetops_gpu": summary(snapshot)}
    if module.params["full"]:
        facts["fleetops_snapshot"] = snapshot
    mismatches = compare(snapshot, expect)
    result = dict(changed=False, ansible_facts=facts, mismatches=mismatches, compliant=not mismatches)
    if mismatches:
        shown = [m["message"] for m in mismatches[:8]]
        more = len(mismatches) - len(shown)
        result["msg"] = "%d difference(s) from the expected state: %s%s" % (
            len(mismatches),
            "; ".join(shown),
            " (and %d more)" % more if more else "",
        )
        if module.params["fail_on_mismatch"]:
            # Without the facts: the failure should read as the differences, not the snapshot.
            module.fail_json(kind="mismatch", msg=result["msg"], mismatches=mismatches, compliant=False)
    else:
        result["msg"] = "driver %s, %s GPUs%s" % (
            snapshot.get("driver_version"),
            snapshot.get("gpu_count"),
            ", as expected" if expect else "",
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
