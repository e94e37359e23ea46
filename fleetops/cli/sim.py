"""``fleetops sim``: a simulated fleet on this machine (real sshd per loopback address,
simulated GPUs): start and stop it, inject and clear faults, show each node's state."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fleetops.cli.parser import Parser
from fleetops.common.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="a simulated fleet: real sshd on loopback with simulated GPUs")
    ssub = p.add_subparsers(dest="sim_command", required=True, parser_class=Parser)
    q = ssub.add_parser("up", help="start N simulated nodes")
    q.add_argument("--nodes", type=int, default=8, help="simulated nodes to start (default 8)")
    q.add_argument("--dir", required=True, help="folder for keys, state, inventory.yml and known_hosts")
    q.add_argument("--scenario", help="scenario YAML (defaults, per-node overrides and faults)")
    q.add_argument("--install", action="store_true", help="apt-get install openssh-server when sshd is missing")
    q.add_argument("--first-address", default="127.0.10.1", help="first loopback address (default 127.0.10.1)")
    q.add_argument("--port", type=int, default=2222, help="sshd port on every address (default 2222)")
    q.add_argument("--daemon", action="store_true", help="also run one fleetops-agent serve for every node")
    q.add_argument("--metrics-port", type=int, default=9401,
                   help="with --daemon: each node's metrics endpoint port on its address (default 9401)")
    q = ssub.add_parser("down", help="stop every sshd the fleet started")
    q.add_argument("--dir", required=True)
    for name in ("inject", "clear"):
        q = ssub.add_parser(name, help=f"{name} a fault on a running node")
        q.add_argument("--dir", required=True)
        q.add_argument("node")
        q.add_argument(
            "fault",
            help="e.g. ecc-dbe, xid:79, host-down, host-hang; the HCAs: ib-port-down, ib-degraded, ib-flap, "
            "ib-symbol-errors, ib-link-downed, ib-fw-drift, ib-missing-hca; for validate: slow-hbm, slow-gemm, "
            "slow-pcie, slow-nvlink, noisy" + (", all" if name == "clear" else ""),
        )
        q.add_argument("--gpu", type=int, help="GPU index (default: GPU 0, or the last for gpu-missing); "
                       "for ib-*: the HCA beside that GPU (mlx5_N); one past the last GPU: the Ethernet "
                       "management port")
        if name == "inject":
            q.add_argument("--peer", type=int, help="slow-nvlink only: the one link between --gpu and this GPU")
    q = ssub.add_parser("status", help="nodes, addresses, up/down/hung, faults")
    q.add_argument("--dir", required=True)
    q.add_argument("--json", action="store_true")
    q = ssub.add_parser("job", help="start or stop a Slurm job on a node: the shipped prolog/epilog over SSH")
    jsub = q.add_subparsers(dest="job_command", required=True, parser_class=Parser)
    for verb in ("start", "stop"):  # fleetops/sim/fleet/jobs.py (imported when run: it loads sim.fleet)
        j = jsub.add_parser(verb, help=f"{verb} a job: runs the {'prolog' if verb == 'start' else 'epilog'}")
        j.add_argument("--dir", required=True)
        j.add_argument("node")
        j.add_argument("job_id", metavar="JOBID")
        j.add_argument("--user", default="alice", help="SLURM_JOB_USER (default alice)")
        j.add_argument("--uid", type=int, default=1000, help="SLURM_JOB_UID (default 1000)")
        if verb == "start":
            j.add_argument("--gpus", help="gres ids, SLURM_JOB_GPUS (0,3): they index the node's gres.conf, "
                           "in device-minor order")
            j.add_argument("--mig", action="append", metavar="INDEX:GI", help="a MIG device: GPU index and GPU "
                           "instance id (repeat for more)")
            j.add_argument("--cpus", type=int, help="the job's CPUs (its cgroup's cpuset; with --profile, "
                           "default 16)")
            j.add_argument("--profile", help="also run a simulated workload on the job's GPUs: steady, input-bound, "
                           "straggler, nvlink-unused or cpu-starved (stop ends it)")
            j.add_argument("--seed", type=int, help="the workload's seed (default: fixed by the job id)")
            j.add_argument("--straggler-elsewhere", action="store_true",
                           help="a straggler job on several nodes: its slow GPU is on another node, and this "
                           "node's GPUs wait for it (start the slow GPU's node without this)")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    from fleetops.sim import fleet

    if args.sim_command == "up":
        info = fleet.up(
            args.nodes,
            args.dir,
            args.scenario,
            first_address=args.first_address,
            port=args.port,
            install=args.install,
            daemon=args.daemon,
            metrics_port=args.metrics_port,
        )
        print(f"started {len(info['nodes'])} simulated nodes in {args.dir}")
        if args.daemon:
            print(f"metrics:     each node's address, port {info['metrics_port']} "
                  f"(fleetops prometheus targets -i {os.path.join(args.dir, 'inventory.yml')})")
        print(f"inventory:   {os.path.join(args.dir, 'inventory.yml')}")
        print(f"known_hosts: {os.path.join(args.dir, 'known_hosts')}")
        print(f"try:         fleetops audit -i {os.path.join(args.dir, 'inventory.yml')}")
        return 0
    if args.sim_command == "down":
        n = fleet.down(args.dir)
        print(f"stopped {n} sshd processes (and the fleet's agent daemon, if it ran one)")
        return 0
    if args.sim_command in ("inject", "clear"):
        peer = getattr(args, "peer", None)  # inject only
        if args.sim_command == "inject":
            fleet.inject(args.dir, args.node, args.fault, args.gpu, peer)
        else:
            fleet.clear(args.dir, args.node, args.fault, args.gpu)
        where = f" GPU {args.gpu}" if args.gpu is not None else ""
        where += f" (link to GPU {peer})" if peer is not None else ""
        print(f"{args.sim_command}: {args.fault} on {args.node}{where}")
        return 0
    if args.sim_command == "status":
        rows = fleet.status(args.dir)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                faults = ", ".join(row.get("faults") or []) or "-"
                print(f"{row['node']:10} {row['address']:16} {row['status']:6} {faults}")
        return 0
    if args.sim_command == "job":
        from fleetops.sim.fleet import jobs as sim_jobs

        return sim_jobs.main(args)
    raise UsageError(f"unknown sim command {args.sim_command!r}")
