"""Versions: driver, CUDA, VBIOS and InfoROM per GPU model, Fabric Manager; per node against
the baseline, and across the fleet against the majority for what the baseline does not pin.
The driver's branch and flavour: a data center branch the baseline allows, installed from a
data center package (Ubuntu's ``-server`` packages, NVIDIA's repository), never a consumer one.
Pinned packages at their versions (``packages``), with the one rule a pin matches a version by."""

from __future__ import annotations

import re
from typing import Any

from fleetops import model
from fleetops.baseline import Baseline
from fleetops.checks.base import (
    CMD_ROLLOUT_DRIVER,
    CMD_ROLLOUT_FIRMWARE,
    DEMAND_BASELINE,
    DEMAND_NONE,
    CheckSpec,
    Context,
    Item,
    gpu_label,
    is_not_supported,
    majority_drift,
)

FAMILY = "versions"

_FM_RE = re.compile(r"^(?:nvidia-fabric-?manager|cuda-drivers-fabricmanager)(?:-\d+)?$")
_DRIVER_RE = re.compile(r"^(?:nvidia-driver|nvidia-headless|nvidia-open|cuda-drivers|nvidia-kernel-open)(?:-.*)?$")
_UPSTREAM_RE = re.compile(r"^(?:\d+:)?(\d+(?:\.\d+)+)")
_DRIVER_VERSION_RE = re.compile(r"^\d{3}\.\d+(?:\.\d+)?$")

DRIVER_ACTION = f"Bring the node to the baseline driver: {CMD_ROLLOUT_DRIVER}."

# Driver flavour, from the installed packages' names and origins.
DATACENTER = "datacenter"
CONSUMER = "consumer"
# Ubuntu's data center (ERD/LTSB) drivers: nvidia-driver-580-server, -server-open, the headless
# and prebuilt-module variants (linux-modules-nvidia-580-server-6.8.0-49-generic).
_UBUNTU_SERVER_RE = re.compile(
    r"^(?:nvidia-driver|nvidia-headless(?:-no-dkms)?|linux-modules-nvidia)-\d+-server(?:-open)?(?:-.+)?$"
)
# Ubuntu-shaped names that both Ubuntu's archive (consumer) and NVIDIA's repository ship.
_BRANCH_PACKAGE_RE = re.compile(r"^(?:nvidia-driver|nvidia-headless(?:-no-dkms)?)-\d+(?:-open)?$")
# Only NVIDIA's repository ships these (CUDA repository meta packages, RHEL kmods).
_NVIDIA_REPO_RE = re.compile(
    r"^(?:cuda-drivers(?:-\d+)?|nvidia-open(?:-\d+)?|kmod-nvidia-(?:open|latest)-dkms|nvidia-driver-cuda)$"
)
# The kernel driver's packages: only these say which flavour is installed (the agent records
# the origin of the same names).
_DRIVER_PACKAGE_PREFIXES = (
    "nvidia-driver", "nvidia-headless", "nvidia-open", "nvidia-kernel", "cuda-drivers", "kmod-nvidia",
    "akmod-nvidia", "xorg-x11-drv-nvidia", "linux-modules-nvidia",
)
# RPM Fusion's consumer (GeForce) driver.
_CONSUMER_RPM_RE = re.compile(r"^(?:akmod-nvidia|xorg-x11-drv-nvidia)(?:-.+)?$")
FIRMWARE_ACTION = f"Update the GPU firmware to the baseline: {CMD_ROLLOUT_FIRMWARE}."


def upstream_version(package_version: str | None) -> str | None:
    """``580.159.04-0ubuntu1`` / ``3:580.159.04-1.el9`` -> ``580.159.04``."""
    if not package_version:
        return None
    m = _UPSTREAM_RE.match(package_version.strip())
    return m.group(1) if m else package_version.strip()


def fabric_manager_version(node: model.Node) -> str | None:
    """Upstream version of the installed Fabric Manager package, if one is installed."""
    found = {name: v for name, v in node.packages.items() if _FM_RE.match(name)}
    for name in sorted(found, key=lambda n: (not n.startswith("nvidia-"), n)):
        return upstream_version(found[name])
    return None


_PIN_BOUNDARY = "-~+:"


def package_version_matches(installed: str, pinned: str) -> bool:
    """Whether an installed package version is the one a baseline pins: the same text, or the
    pin followed by a revision (``-``, Debian's ``~`` and ``+``) or, after an epoch pin, its
    version (``:``). ``580.159.04`` matches ``580.159.04-0ubuntu1`` and ``580.159.04-1``, not
    ``580.159.041`` or ``3:580.159.04-1.el9`` (pin ``3:580.159.04`` for that); ``580.159``
    matches no ``580.159.04`` (a pin is a whole upstream version, not a prefix of one)."""
    if installed == pinned:
        return True
    return installed.startswith(pinned) and installed[len(pinned)] in _PIN_BOUNDARY


def driver_package_versions(node: model.Node) -> dict[str, str]:
    """Installed driver packages (name -> upstream version). Only versions shaped like a driver
    release (``580.159.04``) count: helper packages (``nvidia-driver-assistant`` 0.x) do not."""
    out = {}
    for name, version in node.packages.items():
        if not _DRIVER_RE.match(name) or "fabric" in name:
            continue
        upstream = upstream_version(version)
        if upstream is not None and _DRIVER_VERSION_RE.match(upstream):
            out[name] = upstream
    return out


def driver_branch(version: str | None) -> int | None:
    """``580.159.04`` -> 580: the branch is the major number of the version NVML reports."""
    if not version:
        return None
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def loaded_branch(node: model.Node) -> int | None:
    """The loaded driver's branch as baselines and NVIDIA's data center documentation number it
    (R535, R570, R580): the major number of the driver version. NVML's own branch name
    (``node.driver_branch``, from nvmlSystemGetDriverBranch) is the driver's build branch and is
    not that number: on the real H200 the 580.159.04 driver names ``r582_49``. It is shown
    beside a finding, never compared."""
    return driver_branch(node.driver_version)


def package_flavour(name: str, origin: str | None) -> tuple[str | None, str] | None:
    """(flavour, why) for one driver package, ``(None, why)`` when its name could be either and
    its origin is unknown, ``None`` for packages that say nothing about the flavour."""
    if not name.startswith(_DRIVER_PACKAGE_PREFIXES) or name.startswith("nvidia-kernel-common"):
        return None
    if origin and "nvidia" in origin.lower():
        return DATACENTER, f"{name} from NVIDIA's repository ({origin})"
    if _UBUNTU_SERVER_RE.match(name):
        return DATACENTER, f"{name} is Ubuntu's -server (data center) package"
    if _NVIDIA_REPO_RE.match(name):
        return DATACENTER, f"{name} comes only from NVIDIA's repository"
    if _CONSUMER_RPM_RE.match(name):
        return CONSUMER, f"{name} is RPM Fusion's consumer driver"
    if _BRANCH_PACKAGE_RE.match(name):
        if origin:
            return CONSUMER, f"{name} without -server is Ubuntu's consumer package ({origin})"
        return None, f"{name} may be Ubuntu's consumer package or NVIDIA's; its origin was not collected"
    return None


def driver_flavour(node: model.Node) -> tuple[str | None, list[str]]:
    """The installed driver's flavour and the evidence: consumer when any driver package is a
    consumer one, datacenter when one is and none is consumer, else None (unknown)."""
    verdicts = []
    for name in sorted(node.packages):
        found = package_flavour(name, node.package_origins.get(name))
        if found is not None:
            verdicts.append(found)
    for flavour in (CONSUMER, DATACENTER):
        why = [w for f, w in verdicts if f == flavour]
        if why:
            return flavour, why
    return None, [w for _, w in verdicts] or ["no driver package installed (a .run install?)"]


def _pinned(b: Baseline | None, attr: str) -> bool:
    return b is not None and getattr(b, attr) is not None


def _any_model_pins(b: Baseline | None, attr: str) -> bool:
    return b is not None and any(getattr(m, attr) is not None for m in b.gpu_models.values())


SPECS = (
    CheckSpec(
        "versions.driver", FAMILY, "NVIDIA driver version",
        reads="nvmlSystemGetDriverVersion",
        threshold="equal to driver_version; without it, the fleet majority",
        severities=("warn",), action=DRIVER_ACTION, scope="node+fleet", requires="driver_version (node check)",
        applies=lambda n, b: _pinned(b, "driver_version"),
        fleet_applies=lambda b: not _pinned(b, "driver_version"),
    ),
    CheckSpec(
        "versions.cuda", FAMILY, "CUDA driver version",
        reads="nvmlSystemGetCudaDriverVersion_v2",
        threshold="equal to cuda_driver_version; without it, the fleet majority",
        severities=("warn",), action=DRIVER_ACTION, scope="node+fleet", requires="cuda_driver_version (node check)",
        applies=lambda n, b: _pinned(b, "cuda_driver_version"),
        fleet_applies=lambda b: not _pinned(b, "cuda_driver_version"),
    ),
    CheckSpec(
        "versions.vbios", FAMILY, "VBIOS version per GPU model",
        reads="nvmlDeviceGetVbiosVersion",
        threshold="equal to gpu_models.<model>.vbios_version; without it, the majority of that model's GPUs",
        severities=("warn",), action=FIRMWARE_ACTION, scope="node+fleet",
        requires="gpu_models.<model>.vbios_version (node check)",
        applies=lambda n, b: _any_model_pins(b, "vbios_version"),
        fleet_applies=lambda b: True,  # models the baseline does not pin are voted on
    ),
    CheckSpec(
        "versions.inforom", FAMILY, "InfoROM image version per GPU model",
        reads="nvmlDeviceGetInforomImageVersion",
        threshold="equal to gpu_models.<model>.inforom_image; without it, the majority of that model's GPUs",
        severities=("warn",), action=FIRMWARE_ACTION, scope="node+fleet",
        requires="gpu_models.<model>.inforom_image (node check)",
        applies=lambda n, b: _any_model_pins(b, "inforom_image"),
        fleet_applies=lambda b: True,
    ),
    CheckSpec(
        "versions.fabric_manager", FAMILY, "Fabric Manager package version",
        reads="installed package nvidia-fabricmanager[-<branch>] / nvidia-fabric-manager",
        threshold="equal to fabric_manager_version, else driver_version; without either, the fleet majority",
        severities=("warn",),
        action=f"Install the Fabric Manager matching the driver and hold it with the driver: {CMD_ROLLOUT_DRIVER}.",
        scope="node+fleet", requires="fabric_manager_version or driver_version (node check)",
        applies=lambda n, b: b is not None and b.expected_fabric_manager() is not None,
        fleet_applies=lambda b: b is None or b.expected_fabric_manager() is None,
    ),
    CheckSpec(
        "versions.fabric_manager_match", FAMILY, "Fabric Manager matches the running driver",
        reads="installed Fabric Manager package version vs nvmlSystemGetDriverVersion",
        threshold="identical versions (Fabric Manager refuses to start against another driver)",
        severities=("crit",),
        action=f"Align Fabric Manager and driver (same version, both held), then restart "
        f"nvidia-fabricmanager: {CMD_ROLLOUT_DRIVER}.",
        applies=lambda n, b: fabric_manager_version(n) is not None,
    ),
    CheckSpec(
        "versions.driver_package", FAMILY, "Installed driver package is the loaded driver",
        reads="installed nvidia-driver-*/nvidia-headless-*/cuda-drivers package versions vs nvmlSystemGetDriverVersion",
        threshold="every installed driver package has the loaded driver's version",
        severities=("warn",),
        action="The installed driver is not the one loaded (an upgrade waiting for a reboot, or a "
        f"partial upgrade): finish it and reboot the node: {CMD_ROLLOUT_DRIVER}.",
        applies=lambda n, b: bool(driver_package_versions(n)),
    ),
    CheckSpec(
        "versions.driver_branch", FAMILY, "Driver branch allowed",
        reads="nvmlSystemGetDriverVersion's major number (580.159.04 is branch 580); the build branch "
        "nvmlSystemGetDriverBranch names (r582_49 for 580.159.04 on the real H200) is shown beside it, not compared",
        threshold="the loaded driver's branch is one of driver.branches",
        severities=("warn",),
        action=f"Move the node to an allowed data center branch: {CMD_ROLLOUT_DRIVER}.",
        requires="driver.branches",
        applies=lambda n, b: b is not None and b.driver.branches is not None,
    ),
    CheckSpec(
        "versions.driver_flavour", FAMILY, "Data center driver package",
        reads="installed driver packages: names, and dpkg's Maintainer or rpm's Vendor",
        threshold="with driver.flavour datacenter: no consumer driver package (Ubuntu's nvidia-driver-<branch> "
        "without -server, RPM Fusion's akmod-nvidia), and one data center package (Ubuntu's -server "
        "packages, NVIDIA's repository: cuda-drivers, nvidia-open, packages it built)",
        severities=("warn",),
        action="Replace the consumer driver with the data center flavour of the same branch (Ubuntu: "
        f"nvidia-driver-<branch>-server; or NVIDIA's repository): {CMD_ROLLOUT_DRIVER}.",
        not_a_fault="A package name both Ubuntu and NVIDIA ship, without its origin, or a driver installed "
        "from NVIDIA's .run file, is unknown, not consumer.",
        requires="driver.flavour: datacenter",
        applies=lambda n, b: b is not None and b.driver.flavour == DATACENTER,
    ),
    CheckSpec(
        "versions.packages", FAMILY, "Pinned packages installed at their versions",
        reads="installed NVIDIA/CUDA packages and their versions (dpkg's status file, or rpm)",
        threshold="every package of packages is installed at its pinned version: the version itself, or it "
        "followed by a package revision (580.159.04 matches 580.159.04-0ubuntu1 and 580.159.04-1; "
        "3:580.159.04 matches 3:580.159.04-1.el9; 580.159 matches no 580.159.04)",
        severities=("warn",),
        action=f"Install the pinned package versions and hold them: {CMD_ROLLOUT_DRIVER}.",
        not_a_fault="Packages the node could not list (no dpkg status file and no rpm) are unknown, not "
        "missing.",
        requires="packages",
        applies=lambda n, b: b is not None and bool(b.packages),
    ),
    CheckSpec(
        "versions.gpu_model", FAMILY, "GPU model known to the baseline",
        reads="nvmlDeviceGetName",
        threshold="every GPU's model is a key of gpu_models (when gpu_models is set)",
        severities=("info",),
        action="Add the model to gpu_models in the baseline so its firmware and power limit are checked.",
        requires="gpu_models",
        applies=lambda n, b: b is not None and bool(b.gpu_models),
    ),
    CheckSpec(
        "versions.baseline_model", FAMILY, "Baseline GPU models present in the fleet",
        reads="nvmlDeviceGetName of every GPU of the nodes audited against the baseline",
        threshold="every key of gpu_models names the model of at least one GPU of those nodes, while a "
        "node has GPUs of a model gpu_models does not list",
        severities=("warn",),
        action="Key gpu_models by the model name the node's GPUs report (nvidia-smi -L) so their firmware "
        "and power limit are checked.",
        not_a_fault="A baseline listing more models than these nodes have, with every GPU's model listed, "
        "is a baseline shared by several groups: nothing goes unchecked, nothing is reported.",
        scope="fleet", requires="gpu_models",
        applies=lambda n, b: False,
        fleet_applies=lambda b: b is not None and bool(b.gpu_models),
    ),
)


def run(ctx: Context) -> None:
    node, b = ctx.node, ctx.baseline
    driver = ctx.get(FAMILY, node, "driver_version", DEMAND_BASELINE if _pinned(b, "driver_version") else DEMAND_NONE)
    if b is not None:
        _node_value(ctx, "versions.driver", "driver", "driver_version", b.driver_version, DRIVER_ACTION)
        _node_value(ctx, "versions.cuda", "CUDA", "cuda_driver_version", b.cuda_driver_version, DRIVER_ACTION)
        _gpu_versions(ctx, b)
        _fabric_manager_vs_baseline(ctx, b)
        _driver_branch(ctx, b)
        _driver_flavour(ctx, b)
        _packages(ctx, b)
    _fabric_manager_match(ctx, driver)
    _driver_package(ctx, driver)


def _node_value(ctx: Context, check: str, what: str, attr: str, wanted: Any, action: str) -> None:
    if wanted is None:
        return
    have = ctx.get(FAMILY, ctx.node, attr, DEMAND_BASELINE)
    if have is None or str(have).strip() == wanted:
        return
    ctx.add(check, "warn", f"{what} {have} is not the baseline's {wanted}", observed=have, expected=wanted, action=action)


def _gpu_versions(ctx: Context, b: Baseline) -> None:
    for gpu in ctx.node.gpus:
        name = gpu.name
        spec = b.model(name)
        if spec is None:
            if b.gpu_models and name is not None:
                ctx.add("versions.gpu_model", "info",
                        f"{gpu_label(gpu)} is a {name}, which the baseline's gpu_models does not list: "
                        "its firmware and model power limit are not checked",
                        gpu=gpu, observed=name, expected=sorted(b.gpu_models),
                        action="Add the model to gpu_models in the baseline.")
            elif b.gpu_models and name is None:
                ctx.get(FAMILY, gpu, "name", DEMAND_BASELINE)
            continue
        for check, attr, what in (("versions.vbios", "vbios_version", "VBIOS"),
                                  ("versions.inforom", "inforom_image", "InfoROM image")):
            wanted = getattr(spec, attr)
            if wanted is None:
                continue
            have = ctx.get(FAMILY, gpu, attr, DEMAND_BASELINE)
            if have is not None and have.strip() != wanted:
                ctx.add(check, "warn", f"{gpu_label(gpu)} {what} {have} is not the baseline's {wanted} for {name}",
                        gpu=gpu, observed=have, expected=wanted, action=FIRMWARE_ACTION)


def _packages_readable(ctx: Context, demand: str) -> bool:
    if ctx.node.packages:
        return True
    reason = ctx.node.unavailable.get("packages")
    if demand == DEMAND_BASELINE or (reason is not None and not is_not_supported(reason)):
        ctx.unreadable(FAMILY, "packages", reason or "not collected", "node")
    return False


def _fabric_manager_vs_baseline(ctx: Context, b: Baseline) -> None:
    wanted = b.expected_fabric_manager()
    if wanted is None:
        return
    # Only insist on the package where Fabric Manager is expected at all.
    fm_expected = b.fabric_manager_version is not None or bool(b.nvlinks_per_gpu)
    if not _packages_readable(ctx, DEMAND_BASELINE if fm_expected else DEMAND_NONE):
        return
    have = fabric_manager_version(ctx.node)
    if have is None:
        if fm_expected:
            ctx.add("versions.fabric_manager", "warn",
                    f"Fabric Manager is not installed; the baseline expects {wanted}",
                    observed=None, expected=wanted,
                    action=f"Install Fabric Manager {wanted} (required on NVSwitch systems): {CMD_ROLLOUT_DRIVER}.")
        return
    if have != wanted:
        source = "fabric_manager_version" if b.fabric_manager_version else "driver_version"
        ctx.add("versions.fabric_manager", "warn",
                f"Fabric Manager {have} is not the baseline's {wanted} ({source})",
                observed=have, expected=wanted,
                action=f"Install Fabric Manager {wanted}, held together with the driver: {CMD_ROLLOUT_DRIVER}.")


def _driver_branch(ctx: Context, b: Baseline) -> None:
    allowed = b.driver.branches
    if allowed is None:
        return
    driver = ctx.get(FAMILY, ctx.node, "driver_version", DEMAND_BASELINE)
    if driver is None:
        return
    branch = loaded_branch(ctx.node)
    if branch is None:
        ctx.unreadable(FAMILY, "driver_branch", f"driver version {driver!r} has no branch number", "node")
        return
    if branch in allowed:
        return
    listed = ", ".join(str(a) for a in allowed)
    build = ctx.node.driver_branch
    how = f"; NVML names its build branch {build!r}" if build else ""
    ctx.add("versions.driver_branch", "warn",
            f"driver {driver} is branch {branch}{how}, not one of the baseline's data center branches {listed}",
            observed={"branch": branch, "driver_version": driver, "nvml_build_branch": build},
            expected=list(allowed),
            action=f"Move the node to an allowed branch ({listed}): {CMD_ROLLOUT_DRIVER}.")


def _driver_flavour(ctx: Context, b: Baseline) -> None:
    if b.driver.flavour != DATACENTER or not _packages_readable(ctx, DEMAND_BASELINE):
        return
    flavour, why = driver_flavour(ctx.node)
    if flavour == DATACENTER:
        return
    if flavour is None:
        ctx.unreadable(FAMILY, "driver_flavour", "; ".join(why), "node")
        return
    branch = loaded_branch(ctx.node)
    server = f"nvidia-driver-{branch}-server" if branch is not None else "nvidia-driver-<branch>-server"
    ctx.add("versions.driver_flavour", "warn",
            f"consumer driver installed: {'; '.join(why)}; the baseline asks for a data center driver",
            observed={"flavour": flavour, "packages": sorted(n for n in ctx.node.packages
                                                              if package_flavour(n, None) is not None)},
            expected=DATACENTER,
            action=f"Replace it with the data center flavour of the branch ({server} on Ubuntu, or NVIDIA's "
            f"repository), then reboot: {CMD_ROLLOUT_DRIVER}.")


def _packages(ctx: Context, b: Baseline) -> None:
    """One finding per pinned package that is missing or at another version. An empty package
    list the agent read is a node with none installed; one it could not read is unknown."""
    if not b.packages:
        return
    reason = ctx.node.unavailable.get("packages")
    if reason is not None:
        ctx.unreadable(FAMILY, "packages", reason, "node")
        return
    for name, pinned in sorted(b.packages.items()):
        have = ctx.node.packages.get(name)
        if have is not None and package_version_matches(have, pinned):
            continue
        ctx.add("versions.packages", "warn",
                f"package {name} is {have or 'not installed'}, expected {pinned}",
                observed={name: have}, expected={name: pinned},
                action=f"Install {name} {pinned} and hold it: {CMD_ROLLOUT_DRIVER}.")


def _fabric_manager_match(ctx: Context, driver: str | None) -> None:
    have = fabric_manager_version(ctx.node)
    if have is None or driver is None or have == driver.strip():
        return
    ctx.add("versions.fabric_manager_match", "crit",
            f"Fabric Manager {have} does not match the running driver {driver}: it will not start, and "
            "CUDA fails on NVSwitch systems",
            observed=have, expected=driver,
            action=f"Install the Fabric Manager of driver {driver} (or the driver of Fabric Manager {have}), "
            f"hold both and restart nvidia-fabricmanager: {CMD_ROLLOUT_DRIVER}.")


def _driver_package(ctx: Context, driver: str | None) -> None:
    pkgs = driver_package_versions(ctx.node)
    if not pkgs or driver is None:
        return
    wrong = {name: v for name, v in pkgs.items() if v != driver.strip()}
    if not wrong:
        return
    listed = ", ".join(f"{n} {v}" for n, v in sorted(wrong.items()))
    ctx.add("versions.driver_package", "warn",
            f"loaded driver {driver} differs from installed {listed}: a driver upgrade is waiting for a "
            "reboot, or was left half done",
            observed=dict(sorted(pkgs.items())), expected=driver,
            action="Finish the driver upgrade and reboot the node so the installed driver is loaded: "
            f"{CMD_ROLLOUT_DRIVER}.")


# --- fleet -----------------------------------------------------------------------------


def run_fleet(nodes: list[model.Node], b: Baseline | None) -> list[model.Finding]:
    out: list[model.Finding] = []
    if not _pinned(b, "driver_version"):
        out += majority_drift("versions.driver", "driver", "nodes",
                              [Item(n.hostname, n.driver_version) for n in nodes], DRIVER_ACTION)
    if not _pinned(b, "cuda_driver_version"):
        out += majority_drift("versions.cuda", "CUDA", "nodes",
                              [Item(n.hostname, n.cuda_driver_version) for n in nodes], DRIVER_ACTION)
    if b is None or b.expected_fabric_manager() is None:
        out += majority_drift(
            "versions.fabric_manager", "Fabric Manager", "nodes with it installed",
            [Item(n.hostname, fabric_manager_version(n)) for n in nodes],
            f"Install the fleet's Fabric Manager version, held with the driver: {CMD_ROLLOUT_DRIVER}.",
        )
    if b is not None and b.gpu_models:
        out += _unmatched_models(nodes, b)
    for check, attr, what in (("versions.vbios", "vbios_version", "VBIOS"),
                              ("versions.inforom", "inforom_image", "InfoROM image")):
        for model_name, items in per_model_items(nodes, attr).items():
            spec = b.model(model_name) if b is not None else None
            if spec is not None and getattr(spec, attr) is not None:
                continue  # pinned: checked per node
            out += majority_drift(check, what, f"{model_name} GPUs", items, FIRMWARE_ACTION)
    return out


def _unmatched_models(nodes: list[model.Node], b: Baseline) -> list[model.Finding]:
    """A gpu_models key no GPU of these nodes reports, while some GPU's model is not listed: the
    pins meant for those GPUs check nothing (the key names another model than they report). A
    warning on each node with unlisted GPUs, naming the key, where it was set and the models seen."""
    seen = {g.name for n in nodes for g in n.gpus if g.name is not None}
    dead = sorted(name for name in b.gpu_models if name not in seen)
    if not dead:
        return []
    out: list[model.Finding] = []
    for n in nodes:
        unlisted = sorted({g.name for g in n.gpus if g.name is not None and g.name not in b.gpu_models})
        if not unlisted:
            continue
        keys = []
        for name in dead:
            src, line = b.origin(f'gpu_models["{name}"]') or (b.source, None)
            keys.append(f'gpu_models["{name}"] ({src}:{line})' if line is not None else f'gpu_models["{name}"] ({src})')
        out.append(model.Finding(
            check="versions.baseline_model", severity="warn", node=n.hostname,
            observed=unlisted, expected=dead,
            message=f"{', '.join(keys)} matches no GPU of the {len(nodes)} node(s) audited against this "
            f"baseline, and {n.hostname}'s {', '.join(unlisted)} GPUs are not listed: their firmware and "
            "model power limit are not checked",
            action="Key gpu_models by the model name the node's GPUs report (nvidia-smi -L).",
        ))
    return out


def per_model_items(nodes: list[model.Node], attr: str) -> dict[str, list[Item]]:
    groups: dict[str, list[Item]] = {}
    for n in nodes:
        for g in n.gpus:
            if g.name is None:
                continue
            groups.setdefault(g.name, []).append(Item(n.hostname, getattr(g, attr), g))
    return groups
