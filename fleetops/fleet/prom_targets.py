"""Prometheus file_sd targets from the Ansible inventory: the agent's endpoint on every node.

The inventory already says where the nodes are; a second, hand-kept list of scrape targets
drifts from it. One target group per node, so each carries its own labels: ``node`` (the
inventory name, the identity ``fleetops audit`` reports use) and ``group`` (the group it is
listed in, before the parent groups holding that one; ``ungrouped`` when none), plus ``groups`` (every group, comma-separated and
comma-framed, for regex matches like ``groups=~".*,rack7,.*"``). The agent's page adds no node
label itself, so these do not collide with scraped ones.

A node whose inventory turns TLS on for its endpoint (the ``fleetops_agent`` role's
``fleetops_agent_tls_cert_src``, or a ``tls_server_config`` in ``fleetops_agent_web_config``)
gets ``__scheme__: https``, so one job scrapes a fleet part-way through turning TLS on; its
``tls_config`` and ``basic_auth`` stay in the job (file_sd carries no credentials).

Prometheus re-reads a file_sd file when it changes; the file is replaced whole (a temporary file
in the same folder, then a rename), so it never reads half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from fleetops.fleet.inventory import InventoryError

PORT_VAR = "fleetops_agent_metrics_port"
DEFAULT_PORT = 9401


def _port(inventory_path: str, host: Any, default: int) -> int:
    value = host.vars.get(PORT_VAR)
    if value is None:
        return default
    try:
        port = int(value)
        if isinstance(value, bool) or str(value).strip() != str(port) or not 1 <= port <= 65535:
            raise ValueError
    except (TypeError, ValueError):
        raise InventoryError(
            f"{inventory_path}: host {host.name}: {PORT_VAR} {value!r} is not a TCP port (1-65535)"
        ) from None
    return port


def _tls_on(host: Any) -> bool:
    if str(host.vars.get("fleetops_agent_tls_cert_src") or "").strip():
        return True
    web = host.vars.get("fleetops_agent_web_config")
    return isinstance(web, dict) and bool(web.get("tls_server_config"))


def _address(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{host}:{port}"


def target_groups(inventory_path: str, hosts: list[Any], port: int = DEFAULT_PORT) -> list[dict[str, Any]]:
    """One file_sd group per host, in inventory order."""
    out = []
    for host in hosts:
        groups = [g for g in host.groups if g != "ungrouped"]
        labels = {
            "node": host.name,
            "group": groups[0] if groups else "ungrouped",
            "groups": "," + ",".join(groups) + "," if groups else ",",
        }
        if _tls_on(host):
            labels["__scheme__"] = "https"
        out.append({"targets": [_address(host.address, _port(inventory_path, host, port))], "labels": labels})
    return out


def render(groups: list[dict[str, Any]]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def write(path: str, text: str) -> None:
    """Replace ``path`` whole: a temporary file beside it, then a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # Prometheus usually runs as its own user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
