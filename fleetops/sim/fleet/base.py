"""The simulated fleet's constants, its error, and the small helpers every part uses
(addresses, names, sshd lookup, atomic writes, keys)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile

from fleetops.sim import gpu as sim

FLEET_FAULTS = ("host-down", "host-hang", "agent-missing")
FLEET_FILE = "fleet.json"
FLEET_VERSION = 1
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
START_TIMEOUT_S = 30.0
# The agent's metrics port on every node unless ``up`` is given another (= prom_targets.DEFAULT_PORT)
METRICS_PORT = 9401
UNIX_PATH_MAX = 107  # sun_path is 108 bytes with its NUL
STOP_TIMEOUT_S = 5.0
SSHD_SEARCH = "/usr/sbin:/usr/local/sbin:/sbin"
INSTALL_HINT = "sshd not found: apt-get install -y openssh-server"

# sshd processes started by this Python process, so that stopping one also reaps it (no zombies).
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class SimFleetError(sim.SimError):
    """The simulated fleet cannot do what was asked; the message says why and what to do."""


# --- small helpers -------------------------------------------------------------------------


def node_names(count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"node{i:0{width}d}" for i in range(1, count + 1)]


def addresses(first: str, count: int) -> list[str]:
    """``count`` loopback addresses from ``first``, skipping .0 and .255 (next /24 after .254)."""
    try:
        addr = ipaddress.ip_address(first)
    except ValueError as exc:
        raise SimFleetError(f"first_address {first!r} is not an IP address") from exc
    if addr not in LOOPBACK:
        raise SimFleetError(
            f"first_address {first} is not a loopback address: the fleet uses 127.0.0.0/8 only"
        )
    out: list[str] = []
    while len(out) < count:
        if addr not in LOOPBACK or addr == LOOPBACK.broadcast_address:
            raise SimFleetError(f"{count} nodes from {first} run past the end of 127.0.0.0/8")
        last = int(addr) & 0xFF
        if last not in (0, 255):
            out.append(str(addr))
        addr += 1
    return out


def find_sshd() -> str | None:
    found = shutil.which("sshd", path=os.environ.get("PATH", "") + os.pathsep + SSHD_SEARCH)
    return os.path.abspath(found) if found else None


def agent_bin_dir() -> str:
    """The folder holding ``fleetops-agent`` of this environment (the venv's bin, not a pyenv shim)."""
    here = os.path.dirname(os.path.abspath(sys.executable))  # not realpath: a venv's python is a symlink
    if os.access(os.path.join(here, "fleetops-agent"), os.X_OK):
        return here
    found = shutil.which("fleetops-agent")
    if found:
        return os.path.dirname(os.path.abspath(found))
    raise SimFleetError(
        f"fleetops-agent not found next to {sys.executable} nor on PATH: pip install -e . first"
    )


def install_sshd() -> None:
    """apt-get install openssh-server without letting its postinst start a system sshd on :22."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    if made_policy:
        with open(policy, "w") as fh:
            fh.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        cmd = ["apt-get", "install", "-y", "-qq", "openssh-server"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True, check=False)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SimFleetError("apt-get install -y openssh-server failed: " + " / ".join(tail))
    except FileNotFoundError as exc:
        raise SimFleetError(f"{INSTALL_HINT} (and apt-get is not available here)") from exc
    finally:
        if made_policy:
            os.unlink(policy)


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ed25519_keypair(private_path: str, comment: str) -> str:
    """Create (or reuse) an OpenSSH ed25519 key at ``private_path``; returns the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if os.path.exists(private_path):
        with open(private_path, "rb") as fh:
            key = serialization.load_ssh_private_key(fh.read(), password=None)
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {comment}"
    write_atomic(private_path + ".pub", line + "\n")
    return line


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"
