#!/usr/bin/python
"""Apply a MIG layout (mode, GPU and compute instances) through ``fleetops-agent mig apply``."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_gpu_mig
short_description: Apply a MIG layout through fleetops-agent
description:
  - Runs C(fleetops-agent mig apply --layout PROFILES --gpu GPUS --json) on the node (or C(--config FILE --select NAME)
    for an nvidia-mig-parted file) and reports per GPU the instances before and after.
  - The agent plans per GPU (unchanged, create, recreate, mode-change, refused), refuses while processes run on an
    instance it would destroy, changes nothing on any GPU when one GPU is refused, and reads the result back. A rerun
    reports every GPU unchanged, so the module is idempotent.
  - In check mode the agent runs with C(--dry-run) and changes nothing; diff mode shows the instances of every GPU
    that would change, before and after.
  - With O(model_layouts), GPUs of a model listed there get that model's layout and the others O(layout); every
    group is planned (dry run) before any is changed, so a refusal on one changes none.
  - A refusal is a failure naming the GPU, the busy instances and the processes in them; the result keeps
    C(refused=true) and C(changed=false).
  - Where a MIG mode change waits for a GPU reset, the agent resets the GPU through the safe reset flow (the
    preconditions, steps and journal of C(fleetops-agent reset)) and then creates the instances, unless O(reset=false).
    Check mode shows which GPUs would be reset (RV(reset_gpus)) and the reset preconditions that would refuse; a
    refused reset leaves the GPU's mode pending (RV(reset_required)) with the reason.
options:
  layout:
    description:
      - GPU instance profiles every selected GPU must have (for example C([3g.71gb, 3g.71gb])); an empty list with
        O(mode=false) turns MIG mode off.
    type: list
    elements: str
  mode:
    description: MIG mode wanted; C(false) turns MIG off (and destroys no instance in use). Defaults to true with a layout.
    type: bool
  model_layouts:
    description:
      - GPU model name (as NVML names it, C(NVIDIA H200)) to that model's layout, C(off) (or an empty list) for
        MIG off, or the baseline's C(gpu_models.*.mig) mapping (C(mode), C(layout)).
    type: dict
  config_file:
    description: An nvidia-mig-parted config file on the node (version v1), in place of O(layout). Needs O(config).
    type: path
  config:
    description: The config of O(config_file) to apply (a key of its mig-configs).
    type: str
  gpu:
    description: C(all), or GPU UUIDs / PCI bus ids, comma-separated.
    type: str
    default: all
  reset:
    description:
      - Reset a GPU whose new MIG mode waits for a reset, through the agent's safe reset flow, then create its
        instances. C(false) passes C(--no-reset) - the mode is left pending and reported in RV(reset_required).
    type: bool
    default: true
extends_documentation_fragment:
  - fleetops.gpu.agent
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Two 3g.71gb instances on every H200
  fleetops.gpu.fleetops_gpu_mig:
    layout: [3g.71gb, 3g.71gb]

- name: The site's nvidia-mig-parted config
  fleetops.gpu.fleetops_gpu_mig:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config: all-3g.71gb
"""

RETURN = r"""
gpus:
  description: Per GPU as the agent reported it (uuid, bus_id, index, status, detail, changed, before, after).
  returned: always
  type: list
  elements: dict
changed_gpus:
  description: UUIDs of the GPUs that were (or in check mode would be) changed.
  returned: always
  type: list
  elements: str
refused:
  description: True when the agent refused (nothing was changed on any GPU).
  returned: always
  type: bool
result:
  description: The agent's result (unchanged, applied, would-change, refused, failed, mode-pending).
  returned: always
  type: str
reset_required:
  description: UUIDs of GPUs whose MIG mode waits for a GPU reset (O(reset=false), or a reset the preconditions refuse).
  returned: always
  type: list
  elements: str
reset_gpus:
  description: UUIDs of GPUs reset (or in check mode to be reset) through the safe reset flow for their MIG mode.
  returned: always
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.fleetops.gpu.plugins.module_utils.agent import (
    AGENT_ARGUMENT_SPEC,
    AgentError,
    agent_command,
    backend_args,
    backend_mismatch,
    error_line,
    fail_from,
    gpu_label,
    run_agent,
)

OFF = "off"
# agent results that leave the node as the layout says (or would, in a dry run)
GOOD = ("unchanged", "applied", "would-change")


def _layout_arg(layout, mode):
    """The agent's --layout: the profiles, or ``off``; None when nothing says what to apply."""
    if isinstance(layout, str):
        layout = [p.strip() for p in layout.split(",") if p.strip()]
    if mode is False:
        return OFF
    if layout is None:
        return None
    if not layout:
        return OFF if mode is None else None
    bad = [p for p in layout if not isinstance(p, str) or not p.strip()]
    if bad:
        raise ValueError("layout: every entry must be a profile name such as 3g.71gb, got %r" % (bad,))
    return ",".join(p.strip() for p in layout)


def _apply(module, source_args, gpu, dry_run):
    """One ``mig apply``: its report, also when the agent refused (exit 1 with the report on stdout)."""
    argv = ["mig", "apply"] + source_args + ["--gpu", gpu, "--json"] + backend_args(module)
    if not module.params.get("reset", True):
        argv.append("--no-reset")
    if dry_run:
        argv.append("--dry-run")
    cmd = agent_command(module) + argv
    rc, out, err = module.run_command(cmd, check_rc=False, environ_update={"LC_ALL": "C"})
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("kind") != "fleetops.mig/v1":
        error = error_line(err)
        message = str(error["error"]) if error else "exit %d: %s" % (rc, (err or out).strip()[-2000:])
        raise AgentError(message, kind=str(error.get("kind", "agent")) if error else "agent", rc=rc, stderr=err, cmd=cmd)
    return doc


def _model_arg(own, layout_arg):
    """A model's --layout: its own list, ``off``, or the baseline's {mode, layout} mapping (a
    model with MIG on and no layout of its own takes the group's, as the audit does)."""
    if own is None:
        return layout_arg
    if isinstance(own, dict):
        if own.get("mode") is False:
            return OFF
        if own.get("layout") is None:
            return layout_arg
        return _layout_arg(own["layout"], True) or OFF
    if own == OFF or own == []:
        return OFF
    return _layout_arg(own, None)


def _groups(module, layout_arg):
    """[(agent source args, GPU selector)]: one group for every GPU, or one per model layout."""
    models = module.params.get("model_layouts") or {}
    gpu = module.params["gpu"]
    if module.params.get("config_file"):
        return [(["--config", module.params["config_file"], "--select", module.params["config"]], gpu)]
    if not models:
        if layout_arg is None:
            module.fail_json(msg="fleetops_gpu_mig needs layout (or mode: false), model_layouts, or config_file",
                             kind="usage")
        return [(["--layout", layout_arg], gpu)]
    snapshot = run_agent(module, ["collect", "--fresh", "--json"] + backend_args(module))
    wanted = None if gpu == "all" else {s.strip() for s in gpu.split(",") if s.strip()}
    by_layout = {}
    for g in snapshot.get("gpus") or []:
        if wanted is not None and g.get("uuid") not in wanted and g.get("bus_id") not in wanted:
            continue
        arg = _model_arg(models.get(g.get("name")), layout_arg)
        if arg is None:
            continue  # no layout for this model: left alone
        by_layout.setdefault(arg, []).append(g["uuid"])
    return [(["--layout", arg], ",".join(uuids)) for arg, uuids in sorted(by_layout.items())]


def _resets(gpu, check_mode):
    """Whether the GPU was reset (in check mode: would be) through the safe reset flow."""
    report = gpu.get("reset_report") or {}
    if check_mode:
        return gpu.get("status") == "mode-change" and gpu.get("reset") is True and report.get("result") == "would-reset"
    return report.get("result") == "reset"


def _shown(instances, mode):
    if mode is False:
        return "off"
    if not instances:
        return "on"
    return "on [%s]" % ", ".join(
        "%s GI %s%s" % (m.get("profile"), m.get("gpu_instance_id") if m.get("gpu_instance_id") is not None else "new",
                        " in use" if m.get("in_use") else "")
        for m in instances
    )


def _diff_lines(gpus, side):
    lines = []
    for g in gpus:
        if not g.get("changed") and g.get("status") in ("unchanged", None):
            continue
        if side == "before":
            mode = (g.get("mode") or {}).get("current")
            lines.append("%s: MIG %s\n" % (gpu_label(g), _shown(g.get("before"), mode)))
        else:
            want = g.get("want") or {}
            how = " (after a GPU reset through the safe reset flow)" if g.get("reset") is True else ""
            lines.append("%s: MIG %s%s\n" % (gpu_label(g), _shown(g.get("after"), want.get("mode")), how))
    return "".join(lines)


def main():
    spec = dict(
        layout=dict(type="list", elements="str"),
        mode=dict(type="bool"),
        model_layouts=dict(type="dict"),
        config_file=dict(type="path"),
        config=dict(type="str"),
        gpu=dict(type="str", default="all"),
        reset=dict(type="bool", default=True),
    )
    spec.update(AGENT_ARGUMENT_SPEC)
    module = AnsibleModule(
        argument_spec=spec,
        supports_check_mode=True,
        mutually_exclusive=[("config_file", "layout"), ("config_file", "model_layouts")],
        required_together=[("config_file", "config")],
    )
    try:
        layout_arg = _layout_arg(module.params.get("layout"), module.params.get("mode"))
    except ValueError as exc:
        module.fail_json(msg=str(exc), kind="usage")
    try:
        groups = _groups(module, layout_arg)
        # every group planned before any is changed: a refusal anywhere changes nothing
        plans = [_apply(module, args, gpu, True) for args, gpu in groups]
        docs = plans
        if not module.check_mode and all(p.get("result") in GOOD + ("mode-pending",) for p in plans):
            # a group already waiting for a GPU reset is not asked again (the agent would refuse)
            docs = [_apply(module, groups[i][0], groups[i][1], False) if p.get("result") == "would-change" else p
                    for i, p in enumerate(plans)]
    except AgentError as exc:
        fail_from(module, exc)
    # each change is taken only from the backend its dry run (the plan) was answered by
    mismatches = [m for m in (backend_mismatch(p, docs[i], "mig apply") for i, p in enumerate(plans)) if m]
    if mismatches:
        module.fail_json(msg="; ".join(mismatches), kind="backend-mismatch", changed=True,
                         backend=[d.get("backend") for d in docs], planned_backend=[p.get("backend") for p in plans])

    gpus = [g for d in docs for g in d.get("gpus") or []]
    if module.check_mode:
        changing = [g for g in gpus if g.get("status") not in ("unchanged", "refused", "skipped")]
    else:
        changing = [g for g in gpus if g.get("changed")]
    refused_docs = [d for d in docs if d.get("refused")]
    bad = [d for d in docs if d.get("result") not in GOOD + ("mode-pending",)]
    result = dict(
        changed=bool(changing) and not refused_docs,
        gpus=gpus,
        changed_gpus=[g.get("uuid") for g in changing] if not refused_docs else [],
        refused=bool(refused_docs),
        result=bad[0].get("result") if bad else (
            docs[0].get("result") if len(docs) == 1
            else "applied" if any(d.get("changed") for d in docs)
            else "would-change" if changing
            else "unchanged"
        ),
        reset_required=[g.get("uuid") for g in gpus if g.get("status") == "mode-pending"
                        or (g.get("reset_report") or {}).get("result") in ("refused", "error")],
        reset_gpus=[g.get("uuid") for g in gpus if _resets(g, module.check_mode)],
        backend=docs[0].get("backend") if docs else None,
    )
    if module._diff and changing:
        result["diff"] = dict(before=_diff_lines(gpus, "before"), after=_diff_lines(gpus, "after"),
                              before_header="MIG instances before", after_header="MIG instances after")
    if bad:
        result["msg"] = "; ".join(str(d.get("message") or d.get("result")) for d in bad)
        busy = [dict(uuid=g.get("uuid"), index=g.get("index"), in_use=g.get("in_use"), processes=g.get("processes"))
                for g in gpus if g.get("status") == "refused"]
        module.fail_json(kind=str(bad[0].get("result") or "failed"), busy=busy, **result)
    verb = "would change" if module.check_mode else "changed"
    if changing:
        result["msg"] = "MIG %s %d of %d GPUs (%s)" % (
            verb, len(changing), len(gpus),
            ", ".join("%s: %s -> %s" % (g.get("index"), _shown(g.get("before"), (g.get("mode") or {}).get("current")),
                                        _shown(g.get("after"), (g.get("want") or {}).get("mode")))
                      for g in changing))
    else:
        result["msg"] = "MIG layout: all %d GPUs already as wanted" % len(gpus)
    if result["reset_gpus"]:
        result["msg"] = "%s; %s through the safe reset flow: %s" % (
            result["msg"], "would reset" if module.check_mode else "reset", ", ".join(result["reset_gpus"]))
    if result["reset_required"]:
        why = [str((g.get("reset_report") or {}).get("message")) for g in gpus
               if (g.get("reset_report") or {}).get("result") in ("refused", "error")]
        result["msg"] = "%s%s; MIG mode waits for a GPU reset on %s%s" % (
            result["msg"] if changing else "MIG layout",
            "" if changing else " not complete",
            ", ".join(result["reset_required"]),
            " (the safe reset flow refused: %s)" % "; ".join(why) if why else "")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
