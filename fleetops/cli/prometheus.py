"""``fleetops prometheus targets``: the file_sd scrape targets of every node's agent, from the
inventory."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetops.cli.parser import Parser
from fleetops.common.errors import UsageError
from fleetops.ops import frontend


def register(sub: Any) -> None:
    p = sub.add_parser("prometheus", help="Prometheus integration: scrape targets from the inventory")
    psub = p.add_subparsers(dest="prometheus_command", required=True, parser_class=Parser)
    q = psub.add_parser("targets", help="write file_sd targets for every node's agent endpoint (fleetops-agent serve)")
    frontend.inventory_arg(q)
    q.add_argument("-o", "--output", help="file_sd JSON file to replace atomically (default: stdout)")
    q.add_argument("--port", type=int, default=9401,
                   help="agent metrics port where the host var fleetops_agent_metrics_port is unset (default 9401)")
    frontend.limit_arg(q)
    q.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    q.set_defaults(func=cmd_prometheus)


def cmd_prometheus(args: argparse.Namespace) -> int:
    from fleetops.fleet import inventory, prom_targets

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port (1-65535)")
    args.inventory = frontend.inventory_path(args.inventory)
    hosts = inventory.load(args.inventory, args.limit)
    text = prom_targets.render(prom_targets.target_groups(args.inventory, hosts, args.port))
    if not args.output:
        sys.stdout.write(text)
        return 0
    prom_targets.write(args.output, text)
    if not args.quiet:
        sys.stderr.write(f"fleetops: {len(hosts)} targets written to {args.output}\n")
    return 0
