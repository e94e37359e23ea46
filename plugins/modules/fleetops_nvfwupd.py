#!/usr/bin/python
"""Compare and (when asked) update firmware with NVIDIA's nvfwupd, driven by its JSON output."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleetops_nvfwupd
short_description: Firmware versions against a package, and an opt-in update, through nvfwupd -j
description:
  - Runs C(nvfwupd -t TARGET show_version -p PACKAGE -j) and reports every firmware device that is not up to date.
  - With O(update=true) and outdated devices, runs C(nvfwupd -t TARGET update_fw -p PACKAGE -y -j), then reads the
    versions again and lists the devices that show their new version only after activation.
  - States the activation each updated device needs (reboot, power cycle, BMC reset) from O(activation); it never
    power-cycles by itself.
  - In check mode reports what would be updated and changes nothing.
options:
  nvfwupd:
    description: nvfwupd command or path.
    type: str
    default: nvfwupd
  target:
    description: Target (BMC or host Redfish) as C(ip), C(user), C(password), optional C(servertype) and C(port).
    type: dict
    required: true
  package:
    description: Firmware package (.fwpkg) on the host that runs the module.
    type: path
    required: true
  special:
    description: Optional C(-s) JSON file that limits the update to some targets.
    type: path
  update:
    description: Update outdated devices. Off unless asked.
    type: bool
    default: false
  activation:
    description: Device name prefix to the activation it needs after an update; first match wins.
    type: list
    elements: dict
    default:
      - {prefix: "HGX_", action: power-cycle}
      - {prefix: "EROT_", action: power-cycle}
      - {prefix: "BMC", action: bmc-reset}
      - {prefix: "BIOS", action: reboot}
      - {prefix: "CX7", action: reboot}
      - {prefix: "", action: power-cycle}
  timeout:
    description: Seconds an nvfwupd call may take.
    type: int
    default: 7200
author: fleetops (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Audit HGX firmware against the package
  fleetops.gpu.fleetops_nvfwupd:
    target: {ip: "{{ bmc_ip }}", user: "{{ bmc_user }}", password: "{{ bmc_password }}", servertype: HGX}
    package: /srv/firmware/nvfw_HGX_H200.fwpkg
"""

RETURN = r"""
devices:
  description: Every firmware device (name, system version, package version, up_to_date).
  returned: always
  type: list
  elements: dict
outdated:
  description: Names of the devices that are (or were, before the update) not up to date.
  returned: always
  type: list
  elements: str
activation_required:
  description: Activations the update needs before it takes effect (reboot, power-cycle, bmc-reset).
  returned: always
  type: list
  elements: str
"""

import json

from ansible.module_utils.basic import AnsibleModule

DEFAULT_ACTIVATION = [
    {"prefix": "HGX_", "action": "power-cycle"},
    {"prefix": "EROT_", "action": "power-cycle"},
    {"prefix": "BMC", "action": "bmc-reset"},
    {"prefix": "BIOS", "action": "reboot"},
    {"prefix": "CX7", "action": "reboot"},
    {"prefix": "", "action": "power-cycle"},
]


def target_args(target):
    keys = ("ip", "user", "password", "servertype", "port")
    unknown = sorted(set(target) - set(keys))
    if unknown or not target.get("ip"):
        raise ValueError(
            "target needs ip (and user, password; optional servertype, port); unknown keys: %s" % unknown
        )
    return ["-t"] + ["%s=%s" % (k, target[k]) for k in keys if target.get(k) not in (None, "")]


def parse_versions(text):
    """Devices from ``show_version -j``: ``{"Firmware Devices": [{"AP Name", "Sys Version", "Pkg Version", "Up-To-Date"}]}``."""
    doc = _last_json(text)
    if doc is None:
        raise ValueError("nvfwupd show_version -j printed no JSON document")
    status = doc.get("Connection Status")
    if status and str(status).lower() != "successful":
        raise ValueError("nvfwupd could not reach the target: Connection Status %s" % status)
    devices = []
    for entry in doc.get("Firmware Devices") or []:
        up = str(entry.get("Up-To-Date", "")).strip().lower()
        devices.append(
            {
                "name": entry.get("AP Name"),
                "system_version": entry.get("Sys Version"),
                "package_version": entry.get("Pkg Version"),
                "up_to_date": up in ("yes", "true"),
                "in_package": str(entry.get("Pkg Version", "N/A")).upper() != "N/A",
            }
        )
    return doc, devices


def _last_json(text):
    """nvfwupd may print progress lines around its JSON; take the last parseable document."""
    text = text or ""
    try:
        return json.loads(text)
    except ValueError:
        pass
    start = text.find("{")
    while start != -1:
        try:
            return json.loads(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
    return None


def activation_for(name, rules):
    for rule in rules:
        if str(name or "").startswith(str(rule.get("prefix", ""))):
            return str(rule.get("action"))
    return "power-cycle"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvfwupd=dict(type="str", default="nvfwupd"),
            target=dict(type="dict", required=True, no_log=True),
            package=dict(type="path", required=True),
            special=dict(type="path"),
            update=dict(type="bool", default=False),
            activation=dict(type="list", elements="dict", default=DEFAULT_ACTIVATION),
            timeout=dict(type="int", default=7200),
        ),
        supports_check_mode=True,
    )
    params = module.params
    exe = module.get_bin_path(params["nvfwupd"], required=False) or params["nvfwupd"]
    try:
        base = [exe] + target_args(params["target"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    def show():
        rc, out, err = module.run_command(base + ["show_version", "-p", params["package"], "-j"])
        if rc != 0:
            module.fail_json(
                msg="nvfwupd show_version failed (exit %d): %s" % (rc, (err or out).strip()[-1000:])
            )
        try:
            return parse_versions(out)
        except ValueError as exc:
            module.fail_json(msg=str(exc), stdout=out[-2000:])

    devices = show()[1]
    # A device the package carries no image for ("Pkg Version": "N/A") cannot be updated from it.
    outdated = [d["name"] for d in devices if d["in_package"] and not d["up_to_date"]]
    activation = sorted({activation_for(name, params["activation"]) for name in outdated})
    result = dict(
        changed=False,
        devices=devices,
        outdated=outdated,
        activation_required=activation if params["update"] else [],
    )
    if not outdated:
        result["msg"] = "all %d firmware devices in the package are up to date" % sum(
            d["in_package"] for d in devices
        )
        module.exit_json(**result)
    if not params["update"]:
        result["msg"] = "%d device(s) differ from the package: %s (update is off)" % (
            len(outdated),
            ", ".join(outdated),
        )
        result["would_need"] = activation
        module.exit_json(**result)

    result["changed"] = True
    if module.check_mode:
        result["msg"] = "would update %s; then needs %s" % (", ".join(outdated), ", ".join(activation))
        module.exit_json(**result)
    cmd = base + ["update_fw", "-p", params["package"], "-y", "-j"]
    if params["special"]:
        cmd += ["-s", params["special"]]
    rc, out, err = module.run_command(cmd)
    update_doc = _last_json(out)
    result["update_output"] = update_doc if update_doc is not None else out[-2000:]
    if rc != 0:
        module.fail_json(
            msg="nvfwupd update_fw failed (exit %d): %s" % (rc, (err or out).strip()[-1000:]), **result
        )
    after = show()[1]
    still = [d["name"] for d in after if d["name"] in outdated and not d["up_to_date"]]
    result["devices_after"] = after
    # Many devices report their new version only after activation: list them, do not guess.
    result["pending_activation"] = still
    result["msg"] = "updated %s; takes effect after: %s%s" % (
        ", ".join(outdated),
        ", ".join(activation),
        "; still showing the old version until then: %s" % ", ".join(still) if still else "",
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
