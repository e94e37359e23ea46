"""``fleetops validate -i INVENTORY``: run ``fleetops-agent validate`` on every node over SSH in
parallel and judge each GPU against its model's floors and its fleet peers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleetops.catalog.durations import retention_arg
from fleetops.common.errors import EXIT_CRIT, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN, FleetopsError, UsageError
from fleetops.ops import frontend
from fleetops.validation.judge import GpuVerdict, NodeVerdict, judge, judge_nodes, overall, worse

# The agent's own time budget per level plus SSH; a node past it is unknown, not failed.
COMMAND_TIMEOUT_S = {"quick": 120.0, "full": 720.0}
EXIT_BY_STATUS = {"ok": EXIT_OK, "warn": EXIT_WARN, "crit": EXIT_CRIT, "unknown": EXIT_UNKNOWN}


def _collect(
    args: argparse.Namespace,
) -> tuple[list[Any], list[dict[str, Any]], dict[str, str], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    from fleetops.fleet import answers, inventory, transport

    hosts = inventory.load(args.inventory, args.limit)
    if not hosts:
        raise UsageError(f"{args.inventory}: no hosts match --limit {args.limit!r}")
    extra = ["validate", "--level", args.level]
    results = _per_host(hosts, extra, args, transport)
    gpus: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []  # the node-level tests (P2P matrix, all_reduce), judged per node
    problems: dict[str, str] = {}
    docs: dict[str, dict[str, Any]] = {}
    for host in hosts:
        res = results[host.name]
        doc = _validate_doc(res.stdout) if res.ok else None
        if doc is None:
            problems[host.name] = answers.read(res).describe()
            continue
        docs[host.name] = doc
        for g in doc.get("gpus") or []:
            gpus.append({**g, "host": host.name, "provenance": doc.get("provenance"), "expires": doc.get("expires"),
                         "started": doc.get("started"), "level": doc.get("level", args.level),
                         "duration_s": doc.get("duration_s")})
        if isinstance(doc.get("node"), dict):
            nodes.append({**doc, "host": host.name})
    return hosts, gpus, problems, nodes, docs


def judge_nodes_by_baseline(nodes: list[dict[str, Any]], baselines: dict[str, Any]) -> list[NodeVerdict]:
    """Node tests judged among the nodes that share a baseline (its floors, their peers)."""
    groups: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
    for n in nodes:
        base = baselines.get(str(n["host"]))
        groups.setdefault(id(base), (base, []))[1].append(n)
    verdicts = {}
    for base, members in groups.values():
        for v in judge_nodes(members, floor_overrides(base)):
            verdicts[v.host] = v
    return [verdicts[str(n["host"])] for n in nodes if str(n["host"]) in verdicts]


def floor_overrides(baseline: Any) -> dict[str, dict[str, float]] | None:
    """The baseline's ``validation.floors`` in the shape the judge takes (shipped model ->
    metric -> floor), or None without any."""
    floors = getattr(getattr(baseline, "validation", None), "floors", None)
    return {model: dict(metrics) for model, metrics in floors.items()} if floors else None


def judge_by_baseline(gpus: list[dict[str, Any]], baselines: dict[str, Any]) -> list[GpuVerdict]:
    """Judge each group of hosts that shares a baseline on its own, as the audit's fleet checks
    do: the group's floors apply, and its fleet median is taken over its own GPUs."""
    groups: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
    for g in gpus:
        base = baselines.get(str(g.get("host")))
        groups.setdefault(id(base), (base, []))[1].append(g)
    verdicts: dict[tuple[str, str], GpuVerdict] = {}
    for base, members in groups.values():
        for v in judge(members, floor_overrides(base)):
            verdicts[(v.host, v.gpu)] = v
    return [verdicts[(str(g.get("host", "")), str(g.get("uuid", "")))] for g in gpus]


def _records(gpus: list[dict[str, Any]], verdicts: list[GpuVerdict]) -> list[dict[str, Any]]:
    """One history row per GPU: its verdict, figures and provenance, as the audit will read them."""
    out = []
    for g, v in zip(gpus, verdicts, strict=True):
        out.append({
            "node": v.host, "uuid": v.gpu, "bus_id": g.get("bus_id"), "index": g.get("index"), "model": v.model,
            "level": g.get("level"), "status": v.status, "started_at": g.get("started"), "expires": g.get("expires"),
            "result": {"name": g.get("name"), "tests": g.get("tests"), "telemetry": g.get("telemetry"),
                       "provenance": g.get("provenance"), "duration_s": g.get("duration_s"),
                       "findings": v.to_dict()["findings"]},
        })
    return out


def _record(args: argparse.Namespace, started: float, status: str, code: int, gpus: list[dict[str, Any]],
            verdicts: list[GpuVerdict], problems: dict[str, str], pairs: dict[str, Any] | None = None) -> int | None:
    if args.no_history:
        return None
    import os
    import time

    from fleetops.fleet.store.database import Store

    counts = {s: sum(1 for v in verdicts if v.status == s) for s in ("ok", "warn", "crit", "unknown")}
    summary: dict[str, Any] = {"nodes": len({g["host"] for g in gpus}) + len(problems), "gpus": len(verdicts),
                               "gpus_by_status": counts, "unreachable": problems}
    if pairs is not None:  # the node-pair RDMA test: its outcome in the run's summary, rails and all
        summary["rdma_pairs"] = {"not_applicable": pairs.get("not_applicable"), "skipped": pairs.get("skipped"),
                                 "results": [pv.to_dict() for pv in pairs.get("verdicts", [])]}
    run = {"started_at": started, "duration_s": round(time.time() - started, 3),
           "inventory": os.path.abspath(args.inventory), "level": args.level, "status": status,
           "exit_code": code, "summary": summary}
    with Store(args.db, keep_s=args.keep) as store:
        return store.record_validation(run, _records(gpus, verdicts))


def _per_host(hosts: list[Any], extra: list[str], args: argparse.Namespace, transport: Any) -> dict[str, Any]:
    """Each host has its own agent command (path and simulator state come from its inventory
    vars), so hosts are grouped by command and each group goes through run_all in parallel."""
    from fleetops.ops.reset import agent_argv

    groups: dict[tuple[str, ...], list[Any]] = {}
    for h in hosts:
        groups.setdefault(tuple(agent_argv(h, *extra) + chosen_backend(h)), []).append(h)
    out: dict[str, Any] = {}
    for argv, members in groups.items():
        out.update(transport.run_all(
            members, list(argv), forks=args.forks, connect_timeout=args.connect_timeout,
            command_timeout=COMMAND_TIMEOUT_S[args.level], known_hosts=args.known_hosts,
            accept_new_hostkeys=args.accept_new_hostkeys, idempotent=True,
        ))
    return out


# The fleetops_agent role's fleetops_agent_validate_backend -> the agent's validate --backend, as
# the rollout's gate (fleetops_audit_validate_backend) maps it; none: the agent's auto.
ROLE_BACKENDS = {"system-torch": "torch", "cupy": "cupy", "dcgm": "dcgm"}


def chosen_backend(host: Any) -> list[str]:
    """``--backend`` for the backend the inventory gave ``host``'s agent (placed last: it wins
    over the simulator's ``--backend sim``, as in the Ansible module), else nothing."""
    chosen = ROLE_BACKENDS.get(str(host.vars.get("fleetops_agent_validate_backend", "none")))
    return ["--backend", chosen] if chosen else []


def cmd_probe(args: argparse.Namespace) -> int:
    """``fleetops validate --probe``: each node's ``fleetops-agent validate --probe``. Nothing is
    measured; a node that has no backend is named with what to install, before anything drains it."""
    from fleetops.fleet import answers, inventory, transport

    try:
        hosts = inventory.load(args.inventory, args.limit)
        if not hosts:
            raise UsageError(f"{args.inventory}: no hosts match --limit {args.limit!r}")
    except FleetopsError as exc:
        sys.stderr.write(f"fleetops: error: {exc.message}\n")
        return exc.exit_code
    results = _per_host(hosts, ["validate", "--probe"], args, transport)
    reports: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for host in hosts:
        res = results[host.name]
        try:
            doc = json.loads(res.stdout or "")
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and doc.get("kind") == "validate-probe":
            reports[host.name] = doc
        else:
            unreachable[host.name] = answers.read(res).describe()
    missing = sorted(h for h, d in reports.items() if not d.get("picked"))
    code = EXIT_CRIT if missing else EXIT_UNKNOWN if unreachable else EXIT_OK
    if args.format == "json":
        sys.stdout.write(json.dumps({"nodes": reports, "missing": missing, "unreachable": unreachable}, indent=2) + "\n")
        return code
    lines = [f"{'HOST':<16} {'BACKEND':<8} WHAT TO INSTALL"]
    for name, doc in reports.items():
        if doc.get("picked"):
            lines.append(f"{name:<16} {doc['picked']:<8} -")
        else:
            lines.append(f"{name:<16} {'none':<8} {doc.get('error')}; {doc.get('install')}")
    for name, why in unreachable.items():
        lines.append(f"{name:<16} {'?':<8} no answer: {why}")
    lines.append(f"{len(reports) - len(missing)} node(s) can be validated; {len(missing)} without a backend; "
                 f"{len(unreachable)} without an answer")
    sys.stdout.write("\n".join(lines) + "\n")
    return code


# The node-pair RDMA test: the first rail's TCP port (perftest's default), seconds per rail, and
# how long a client may wait for its server's listener.
PAIR_PORT = 18515
PAIR_DURATION_S = 10
PAIR_CONNECT_S = 30.0
PAIR_WAIT_AFTER_CLIENT_S = 10.0  # then the server that has not ended is stopped


def pair_tests(args: argparse.Namespace, hosts: list[Any], docs: dict[str, dict[str, Any]],
               baselines: dict[str, Any]) -> dict[str, Any]:
    """``--level full``'s node-pair RDMA bandwidth test: the nodes with compute rails in pairs
    (``rails.plan``), each pair's common rails measured by a server on one node and a client on
    the other, the pairs of one round at once, then judged. ``not_applicable`` (never a failure)
    where fewer than two nodes have a compute rail; ``skipped``: each node that takes no part and why."""
    from concurrent.futures import ThreadPoolExecutor

    from fleetops.fleet import transport
    from fleetops.validation import rails

    by_name = {h.name: h for h in hosts}
    members: dict[str, rails.NodeRails] = {}
    skipped: dict[str, str] = {}
    for h in hosts:
        if h.name not in docs:
            continue  # no answer at all: already in unreachable
        nr = rails.node_rails(h.name, docs[h.name], baselines.get(h.name))
        if nr.error or nr.not_applicable:
            skipped[h.name] = str(nr.error or nr.not_applicable)
        else:
            members[h.name] = nr
    plan = rails.plan(list(members))
    if not plan:
        why = ("one node has RDMA compute rails: no peer to measure against" if len(members) == 1
               else "no node has an RDMA compute rail and perftest")
        return {"not_applicable": why, "skipped": skipped, "verdicts": []}
    usual = rails.usual_rate(list(members.values()))

    def one(pair: rails.Pair) -> dict[str, Any]:
        a, b = members[pair.client], members[pair.server]
        run, failed, notes = rails.pair_rails(a, b)
        wanted = [r for r in (a.wanted_rate_gbps, b.wanted_rate_gbps) if r]
        result: dict[str, Any] = {
            "client": pair.client, "server": pair.server, "again": pair.again,
            "model": a.model if a.model == b.model else None, "rate_gbps": min(wanted) if wanted else usual,
            "floors": floor_overrides(baselines.get(pair.client)),
            "rails": {r: {"failed": why} for r, why in failed.items()}, "notes": notes,
        }
        if pair.again:
            notes.insert(0, f"{pair.client} is the odd node out: paired with {pair.server}, which its own pair "
                         "measured already")
        if run:
            result["rails"].update(_measure_pair(by_name[pair.client], by_name[pair.server], run, args, transport))
        return result

    results: list[dict[str, Any]] = []
    for wave in ([p for p in plan if not p.again], [p for p in plan if p.again]):
        if wave:  # the odd node's pair comes after the first round: its partner is then free
            with ThreadPoolExecutor(max_workers=max(1, min(int(args.forks), len(wave)))) as pool:
                results.extend(pool.map(one, wave))
    return {"not_applicable": None, "skipped": skipped, "usual_rate_gbps": usual,
            "verdicts": rails.judge_pairs(results, None)}


def _ib_doc(res: Any) -> dict[str, Any] | None:
    try:
        doc = json.loads(res.stdout or "")
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "ib-bw" else None


def _measure_pair(client: Any, server: Any, run: list[str], args: argparse.Namespace,
                  transport: Any) -> dict[str, dict[str, Any]]:
    """The server on ``server`` and the client on ``client`` over SSH for the rails ``run``; the
    server is stopped (``ib-bw stop``) whenever it has not ended on its own shortly after the
    client, on error too, and bounds itself with ``--wait`` should this process die."""
    import concurrent.futures
    import os
    import uuid

    from fleetops.fleet import answers
    from fleetops.ops.reset import agent_argv

    token = f"fleetops-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    devices = ",".join(run)
    wait = PAIR_CONNECT_S + len(run) * (PAIR_DURATION_S + 20) + 30
    common = ["--devices", devices, "--port", str(PAIR_PORT), "--duration", str(PAIR_DURATION_S)]
    server_argv = agent_argv(server, "ib-bw", "server", *common, "--wait", str(int(wait)), "--token", token,
                             "--listen", server.address)
    client_argv = agent_argv(client, "ib-bw", "client", *common, "--peer", server.address)
    stop_argv = agent_argv(server, "ib-bw", "stop", "--token", token)
    ssh = {"forks": 1, "connect_timeout": args.connect_timeout, "known_hosts": args.known_hosts,
           "accept_new_hostkeys": args.accept_new_hostkeys}
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetops-ib-server") as pool:
        served = pool.submit(transport.run_all, [server], server_argv, command_timeout=wait + 30, **ssh)
        client_res = None
        try:
            client_res = transport.run_all([client], client_argv, command_timeout=wait, idempotent=True,
                                           **ssh)[client.name]
        finally:
            try:
                server_res = served.result(timeout=PAIR_WAIT_AFTER_CLIENT_S)[server.name]
            except concurrent.futures.TimeoutError:
                transport.run_all([server], stop_argv, command_timeout=30, idempotent=True, **ssh)
                server_res = served.result()[server.name]
    client_doc = _ib_doc(client_res) if client_res is not None and client_res.ok else None
    server_doc = _ib_doc(server_res) if server_res.ok else None
    out: dict[str, dict[str, Any]] = {}
    for rail in run:
        mine = dict((client_doc or {}).get("rails", {}).get(rail) or {})
        theirs = (server_doc or {}).get("rails", {}).get(rail) or {}
        if client_doc is None:
            why = answers.read(client_res).describe() if client_res is not None else "no answer"
            mine = {"error": f"the client on {client.name} gave no answer: {why}"}
        if "failed" in theirs and "gbps" not in mine:
            mine = {**mine, "failed": f"{theirs['failed']} (on {server.name})"}
            mine.pop("error", None)
        elif "error" in mine and theirs.get("error"):
            mine["error"] = f"{mine['error']}; server on {server.name}: {theirs['error']}"
        if server_doc is not None and theirs.get("memory") and theirs.get("memory") != "cuda" and "gbps" in mine:
            mine["memory"] = "host"  # one end in host memory: the figure is not a GPUDirect one
            mine["memory_note"] = f"{server.name}: {theirs.get('memory_note')}"
        out[rail] = mine
    return out


def _validate_doc(stdout: str | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(stdout or "")
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "validate" else None


def cmd_validate(args: argparse.Namespace) -> int:
    import time

    from fleetops.ops.baseline import resolve_baselines

    args.inventory = frontend.inventory_path(args.inventory)
    if args.probe:
        return cmd_probe(args)
    started = time.time()
    try:
        hosts, gpus, problems, nodes, docs = _collect(args)
        baselines = resolve_baselines(hosts, args.baseline, args.inventory)
        verdicts = judge_by_baseline(gpus, baselines)
        node_verdicts = judge_nodes_by_baseline(nodes, baselines)
        pairs = pair_tests(args, hosts, docs, baselines) if args.level == "full" else None
    except FleetopsError as exc:
        sys.stderr.write(f"fleetops: error: {exc.message}\n")
        return exc.exit_code
    status = overall([*verdicts, *node_verdicts])
    for pv in (pairs or {}).get("verdicts", []):
        status = worse(status, pv.status)
    if problems and status == "ok":
        status = "unknown"
    code = EXIT_BY_STATUS[status]
    run_id = _record(args, started, status, code, gpus, verdicts, problems, pairs)
    if args.format == "json":
        doc: dict[str, Any] = {"status": status, "gpus": [v.to_dict() for v in verdicts],
               "nodes": [v.to_dict() for v in node_verdicts], "unreachable": problems, "history_run": run_id}
        if pairs is not None:
            doc["pairs"] = {**{k: v for k, v in pairs.items() if k != "verdicts"},
                            "results": [pv.to_dict() for pv in pairs["verdicts"]]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(_table(verdicts, problems, node_verdicts, gpus, args.all, pairs))
    return code


def _table(
    verdicts: list[GpuVerdict],
    problems: dict[str, str],
    node_verdicts: list[NodeVerdict] | None = None,
    gpus: list[dict[str, Any]] | None = None,
    show_all: bool = False,
    pairs: dict[str, Any] | None = None,
) -> str:
    """The operator's table: the GPUs and nodes that are not ok (every one with ``show_all``),
    each GPU by its index and bus id (what ``nvidia-smi -i`` takes), P2P pairs by GPU index,
    then the counts. The JSON form keeps UUIDs and every figure."""
    where: dict[tuple[str, str], tuple[Any, Any]] = {}
    by_host: dict[str, dict[str, str]] = {}  # host -> UUID -> "GPU i", for the node tests' pairs
    for g in gpus or []:
        host, uuid, index = str(g.get("host")), str(g.get("uuid")), g.get("index")
        where[(host, uuid)] = (index, g.get("bus_id"))
        if index is not None:
            by_host.setdefault(host, {})[uuid] = f"GPU {index}"

    def counted(items: list[GpuVerdict] | list[NodeVerdict] | list[Any]) -> str:
        return ", ".join(f"{sum(1 for v in items if v.status == s)} {s}" for s in ("ok", "warn", "crit", "unknown"))

    def gpu_cell(v: GpuVerdict) -> str:
        index, bus = where.get((v.host, v.gpu), (None, None))
        return f"{index} {bus}" if index is not None and bus else v.gpu

    def pair(host: str, text: str) -> str:
        for uuid, name in by_host.get(host, {}).items():
            text = text.replace(uuid, name)
        return text

    lines = [f"{'HOST':<16} {'GPU':<20} {'STATUS':<8} FINDINGS"]
    for v in verdicts:
        if v.status == "ok" and not show_all:
            continue
        finding = "; ".join(f"{x.metric}: {x.reason}" for x in v.verdicts if x.status != "ok")
        lines.append(f"{v.host:<16} {gpu_cell(v):<20} {v.status:<8} {finding}")
    for nv in node_verdicts or []:
        if nv.status == "ok" and not show_all:
            continue
        bad = [x for x in nv.verdicts if x.status != "ok"]
        finding = "; ".join(f"{x.metric} {pair(nv.host, x.gpu)}: {x.reason}" for x in bad) or "; ".join(nv.notes)
        lines.append(f"{nv.host:<16} {'(node: P2P, NCCL)':<20} {nv.status:<8} {finding}")
    pair_verdicts = (pairs or {}).get("verdicts", [])
    for pv in pair_verdicts:
        if pv.status == "ok" and not show_all:
            continue
        finding = "; ".join(f"{x.rail}: {x.reason}" for x in pv.rails if x.status != "ok") or "; ".join(pv.notes)
        lines.append(f"{pv.client + '->' + pv.server:<16} {'(pair: RDMA rails)':<20} {pv.status:<8} {finding}")
    for host, why in problems.items():
        lines.append(f"{host:<16} {'-':<20} {'unknown':<8} {why}")
    summary = f"{len(verdicts)} GPUs: {counted(verdicts)}"
    if node_verdicts:
        summary += f"; {len(node_verdicts)} nodes' P2P and all_reduce: {counted(node_verdicts)}"
    if pairs is not None and pairs.get("not_applicable"):
        summary += f"; RDMA pair test not applicable: {pairs['not_applicable']}"
    elif pairs is not None:
        summary += f"; {len(pair_verdicts)} node pairs' RDMA rails: {counted(pair_verdicts)}"
    summary += f"; {len(problems)} node{'' if len(problems) == 1 else 's'} without a result"
    lines.append(summary)
    if not show_all and (any(v.status == "ok" for v in verdicts) or any(v.status == "ok" for v in node_verdicts or [])
                         or any(v.status == "ok" for v in pair_verdicts)):
        lines.append("(what is ok is not listed: --all lists every GPU and node)")
    return "\n".join(lines) + "\n"


def register(sub: Any) -> None:
    """The ``validate`` subcommand: the only entry point ``fleetops.cli`` uses."""
    about = ("measure every GPU (HBM, GEMM, host copies) and node (P2P, all_reduce) and judge them against "
             "floors and peers; exit 0 ok, 1 warn, 2 crit, 3 unknown")
    p = sub.add_parser("validate", help=about, description=about)
    frontend.inventory_arg(p)
    frontend.limit_arg(p)
    p.add_argument("--level", choices=("quick", "full"), default="quick",
                   help="quick (at most 60 s a node) or full (at most 10 minutes a node, then the node-pair RDMA "
                   "test: ib_write_bw on every compute rail of each pair, about 30 s a rail); default quick")
    frontend.format_arg(p, ("table", "json"), "; json: every GPU's and node's status, findings and figures")
    p.add_argument("--all", action="store_true",
                   help="table: list every GPU and node, ok ones too (default: only what is not ok, then the counts)")
    frontend.forks_arg(p)
    frontend.ssh_args(p)
    p.add_argument("--baseline", help="baseline YAML whose validation.floors override the shipped floors "
                   "(default: fleetops_baseline from the inventory's group_vars)")
    frontend.db_arg(p)
    p.add_argument("--no-history", action="store_true", help="do not record this run's results")
    p.add_argument("--keep", default="30d", type=retention_arg("--keep", unit_required=True), metavar="DURATION",
                   help="history retention, as fleetops audit --keep (default 30d)")
    p.add_argument("--probe", action="store_true",
                   help="measure nothing: ask each node which validation backend it has (fleetops-agent validate "
                   "--probe) and name what to install where it has none; exit 0 every node has one, 2 one has "
                   "none, 3 one did not answer")
    p.set_defaults(func=cmd_validate)
