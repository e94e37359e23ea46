"""Node facts that do not come from NVML: kernel, OS, uptime, services, installed packages.

Each reader is cheap (a few file reads; at most one short subprocess with an argument list)
and returns None plus a reason instead of raising.
"""

from __future__ import annotations

import os
import platform
import subprocess

SERVICES = ("nvidia-fabricmanager", "nvidia-persistenced")
PACKAGE_PREFIXES = ("nvidia-", "cuda-", "libnvidia-", "datacenter-gpu-manager")


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
    """Installed NVIDIA/CUDA packages from dpkg's status file (no subprocess), else rpm."""
    status = "/var/lib/dpkg/status"
    if os.path.exists(status):
        found: dict[str, str] = {}
        try:
            with open(status, encoding="utf-8", errors="replace") as fh:
                name = version = None
                installed = False
                for line in fh:
                    if line.startswith("Package: "):
                        name, version, installed = line[9:].strip(), None, False
                    elif line.startswith("Status: "):
                        installed = line.rstrip().endswith(" installed")
                    elif line.startswith("Version: "):
                        version = line[9:].strip()
                    elif line == "\n":
                        if name and version and installed and name.startswith(PACKAGE_PREFIXES):
                            found[name] = version
                        name = version = None
                if name and version and installed and name.startswith(PACKAGE_PREFIXES):
                    found[name] = version
        except OSError as exc:
            return {}, f"{status}: {exc.strerror}"
        return found, None
    try:
        proc = subprocess.run(
            ["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n"],
            capture_output=True,
            text=True,
            timeout=5.0,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return {}, "no dpkg status file and no rpm"
    found = {}
    for line in proc.stdout.splitlines():
        name, _, version = line.partition(" ")
        if name.startswith(PACKAGE_PREFIXES):
            found[name] = version
    return found, None
