"""The simulated fleet's record (``DIR/fleet.json``, read and written under a lock) and what is
written from it: each node's sshd config, the scenario's faults per node, the inventory."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetops.sim.fleet.base import (
    FLEET_FILE,
    FLEET_VERSION,
    METRICS_PORT,
    SimFleetError,
    write_atomic,
)

# --- fleet record --------------------------------------------------------------------------


@contextmanager
def locked(directory: str) -> Iterator[None]:
    with open(os.path.join(directory, ".fleet.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_fleet(directory: str, required: bool = True) -> dict[str, Any] | None:
    path = os.path.join(directory, FLEET_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        if required:
            raise SimFleetError(
                f"{directory} holds no simulated fleet ({FLEET_FILE} missing): run up first"
            ) from None
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise SimFleetError(f"{path}: unreadable fleet record: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != FLEET_VERSION or "nodes" not in data:
        raise SimFleetError(f"{path}: not a fleetops simulated fleet record")
    return data


def write_fleet(directory: str, fleet: dict[str, Any]) -> None:
    write_atomic(os.path.join(directory, FLEET_FILE), json.dumps(fleet, indent=1) + "\n")


def resolve_node(fleet: dict[str, Any], node: str | int) -> str:
    nodes = fleet["nodes"]
    names = sorted(nodes)
    key = str(node).strip()
    if key in nodes:
        return key
    if key.isdigit() and 1 <= int(key) <= len(names):
        return str(names[int(key) - 1])
    shown = ", ".join(names[:4]) + (f", ... {names[-1]}" if len(names) > 4 else "")
    raise SimFleetError(f"unknown node {key!r} in {fleet['directory']}; known: {shown} ({len(names)} nodes)")


# --- config and scenario -------------------------------------------------------------------


def sshd_config(fleet: dict[str, Any], name: str) -> str:
    node = fleet["nodes"][name]
    path = [fleet["agent_bin"], "/usr/local/bin", "/usr/bin", "/bin"]
    if "agent-missing" in node.get("faults", []):
        path = path[1:]
    # FLEETOPS_SIM_ON_GPU_NODE: these nodes are simulated even on a machine with a GPU driver, where
    # the agent refuses an explicit --backend sim without it (gpu/backend_choice.py)
    env = (f"FLEETOPS_SIM_STATE={node['state']} FLEETOPS_SIM_ON_GPU_NODE=1 HOME={node['home']} "
           f"PATH={':'.join(path)}")
    return "\n".join(
        [
            f"# fleetops simulated node {name}; written by fleetops.sim.fleet",
            f"ListenAddress {node['address']}",
            f"Port {node['port']}",
            f"HostKey {fleet['host_key']}",
            "PidFile none",
            "KexAlgorithms ecdh-sha2-nistp256",
            "MaxStartups 1000",
            "MaxSessions 100",
            "LoginGraceTime 30",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            f"AuthorizedKeysFile {fleet['authorized_keys']}",
            "StrictModes no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
            f"SetEnv {env}",
            "",
        ]
    )


def node_scenarios(scenario: dict[str, Any], names: list[str], source: str) -> dict[str, dict[str, Any]]:
    """Per-node scenario: top-level defaults merged with that node's entry under ``nodes:``."""
    base = {k: v for k, v in scenario.items() if k != "nodes"}
    per = scenario.get("nodes") or {}
    if not isinstance(per, dict):
        raise SimFleetError(f"{source}: 'nodes' is a mapping of node name or number -> overrides")
    out = {name: copy.deepcopy(base) for name in names}
    for key, overrides in per.items():
        text = str(key).strip()
        if text in out:
            name = text
        elif text.isdigit() and 1 <= int(text) <= len(names):
            name = names[int(text) - 1]
        else:
            raise SimFleetError(
                f"{source}: nodes: {key!r} is not a node of this fleet ({names[0]}..{names[-1]}, or 1..{len(names)})"
            )
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise SimFleetError(f"{source}: nodes: {key}: expected a mapping of node, gpu, gpu_count, faults")
        unknown = set(overrides) - {"node", "gpu", "gpu_count", "gpu_minor_numbers", "uptime_s", "faults"}
        if unknown:
            raise SimFleetError(f"{source}: nodes: {key}: unknown keys {sorted(unknown)}")
        merged = out[name]
        for field in ("node", "gpu"):
            if field in overrides:
                merged[field] = {**(merged.get(field) or {}), **(overrides[field] or {})}
        for field in ("gpu_count", "gpu_minor_numbers", "uptime_s"):
            if field in overrides:
                merged[field] = overrides[field]
        if "faults" in overrides:
            merged["faults"] = list(merged.get("faults") or []) + list(overrides["faults"] or [])
    return out


def inventory_yaml(fleet: dict[str, Any]) -> str:
    import yaml

    hosts = {}
    for name, node in sorted(fleet["nodes"].items()):
        hosts[name] = {
            "ansible_host": node["address"],
            "ansible_port": node["port"],
            "ansible_user": "root",
            "ansible_ssh_private_key_file": fleet["client_key"],
            "ansible_remote_tmp": os.path.join(node["home"], ".ansible", "tmp"),
            "ansible_python_interpreter": sys.executable,
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={fleet['known_hosts']}",
            "fleetops_sim_state": node["state"],
            "fleetops_agent_metrics_port": int(fleet.get("metrics_port") or METRICS_PORT),
        }
    header = (
        f"# simulated fleet in {fleet['directory']}; written by fleetops.sim.fleet.up\n"
        "# fleetops_slurm_managed: false -- the simulator runs no Slurm; set it true where a site\n"
        "# or a test provides scontrol\n"
    )
    group = {"hosts": hosts, "vars": {"fleetops_slurm_managed": False}}
    return header + yaml.safe_dump({"all": {"children": {"sim": group}}}, sort_keys=False)
