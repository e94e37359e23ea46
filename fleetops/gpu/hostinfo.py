"""Node facts that do not come from NVML: kernel, OS, uptime, services, installed packages.

Here, in the GPU layer, because the node snapshot an access object builds (``snapshot``) reports
them around its GPUs; the reset flow reads the service states through it too. Nothing here is
about the agent: ``/proc``, ``/etc``, dpkg's status file, one ``systemctl``/``rpm`` call.

Each reader is cheap (a few file reads; at most one short subprocess with an argument list)
and returns None plus a reason instead of raising.
"""

from __future__ import annotations

import os
import platform
import subprocess

SERVICES = ("nvidia-fabricmanager", "nvidia-persistenced")
PACKAGE_PREFIXES = (
    "nvidia-", "cuda-", "libnvidia-", "datacenter-gpu-manager",
    # RPM-based drivers: NVIDIA's repository (kmod-nvidia-open-dkms) and RPM Fusion's consumer ones
    "kmod-nvidia", "akmod-nvidia", "xorg-x11-drv-nvidia",
)
# Packages whose origin is recorded: the kernel driver's, which say which flavour is installed.
DRIVER_PACKAGE_PREFIXES = (
    "nvidia-driver", "nvidia-headless", "nvidia-open", "nvidia-kernel", "cuda-drivers", "kmod-nvidia",
    "akmod-nvidia", "xorg-x11-drv-nvidia", "linux-modules-nvidia",
)


def kernel() -> str:
    return platform.release()


def os_name() -> str | None:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        return None
    return None


def uptime_s() -> float | None:
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def service_states(units: tuple[str, ...] = SERVICES) -> tuple[dict[str, str | None], str | None]:
    """``systemctl is-active`` for each unit in one call; ("unit": None) where unknown."""
    try:
        proc = subprocess.run(
            ["systemctl", "is-active", *units], capture_output=True, text=True, timeout=2.0, check=False
        )
    except FileNotFoundError:
        return {u: None for u in units}, "systemctl not found"
    except subprocess.TimeoutExpired:
        return {u: None for u in units}, "systemctl timed out"
    states = proc.stdout.split()
    if len(states) != len(units):
        return {u: None for u in units}, f"systemctl answered {proc.stdout.strip()!r}"
    return dict(zip(units, states, strict=True)), None


def nvidia_packages() -> tuple[dict[str, str], str | None]:
    """Installed NVIDIA/CUDA packages (name -> version); see ``nvidia_packages_with_origins``."""
    found, _, reason = nvidia_packages_with_origins()
    return found, reason


DPKG_STATUS = "/var/lib/dpkg/status"


def nvidia_packages_with_origins(status: str = DPKG_STATUS) -> tuple[dict[str, str], dict[str, str], str | None]:
    """Installed NVIDIA/CUDA packages (name -> version), who built each driver package (dpkg's
    Maintainer, rpm's Vendor: Ubuntu's archive, NVIDIA's repository, RPM Fusion), and why none
    could be read. dpkg's status file is read directly (no subprocess); without it, one ``rpm``
    query (an argument list). Neither present: empty, with the reason."""
    if os.path.exists(status):
        return dpkg_status_packages(status)
    try:
        proc = subprocess.run(
            ["rpm", "-qa", "--qf", "%{NAME}\\t%{VERSION}-%{RELEASE}\\t%{VENDOR}\\n"],
            capture_output=True,
            text=True,
            timeout=5.0,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return {}, {}, "no dpkg status file and no rpm"
    found: dict[str, str] = {}
    origins: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        name, _, rest = line.partition("\t")
        version, _, vendor = rest.partition("\t")
        if name.startswith(PACKAGE_PREFIXES):
            found[name] = version
            if name.startswith(DRIVER_PACKAGE_PREFIXES) and vendor and vendor != "(none)":
                origins[name] = vendor
    return found, origins, None


def dpkg_status_packages(status: str) -> tuple[dict[str, str], dict[str, str], str | None]:
    """``nvidia_packages_with_origins`` from one dpkg status file."""
    found: dict[str, str] = {}
    origins: dict[str, str] = {}

    def keep(name: str | None, version: str | None, installed: bool, maintainer: str | None) -> None:
        if name and version and installed and name.startswith(PACKAGE_PREFIXES):
            found[name] = version
            if maintainer and name.startswith(DRIVER_PACKAGE_PREFIXES):
                origins[name] = maintainer

    try:
        with open(status, encoding="utf-8", errors="replace") as fh:
            name = version = maintainer = None
            installed = False
            for line in fh:
                if line.startswith("Package: "):
                    name, version, maintainer, installed = line[9:].strip(), None, None, False
                elif line.startswith("Status: "):
                    installed = line.rstrip().endswith(" installed")
                elif line.startswith("Version: "):
                    version = line[9:].strip()
                elif line.startswith("Maintainer: "):
                    maintainer = line[12:].strip()
                elif line == "\n":
                    keep(name, version, installed, maintainer)
                    name = version = maintainer = None
            keep(name, version, installed, maintainer)
    except OSError as exc:
        return {}, {}, f"{status}: {exc.strerror}"
    return found, origins, None
