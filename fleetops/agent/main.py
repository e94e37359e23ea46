"""``fleetops-agent``: the node side, started over SSH or by Ansible modules.

Output contract: a command prints one JSON document on stdout and exits 0, or prints a
one-line JSON error ``{"error": ..., "kind": ...}`` on stderr and exits non-zero. ``reset`` and
``mig`` print their report on stdout also when they refuse or fail (exit 1, with the error line
on stderr); a usage error (an index given to ``reset``, ``--kill-processes`` without
``--expect-pids``) is exit 2 with the error line only. A reset or ``mig apply`` ended by SIGTERM,
SIGHUP or SIGINT prints its report (result ``interrupted``) and exits 128 + the signal number. A
deprecated flag (``reset --timeout``) adds one plain-text line on stderr, never JSON.

Reports say what they are in ``kind``, so a reader never guesses from their shape or from stderr
wording: ``collect`` prints ``fleetops.snapshot/v1`` (in ``schema``); ``reset`` prints
``fleetops.reset/v1`` (with ``budget_s``, the reset's worst case in seconds, and ``expect_pids``,
the processes the operator confirmed); ``mig apply`` and ``mig reset`` print ``fleetops.mig/v1``; ``set`` prints
``fleetops.set/v1``; ``check`` prints ``fleetops.check/v1`` with ``--json`` (text lines without;
its exit codes are ``fleetops audit``'s: 0 clean, 1 warn, 2 crit, 3 only unknowns or no snapshot,
4 usage, such as a baseline that does not validate); ``slurm-healthcheck`` prints ``fleetops.slurm-healthcheck/v1`` (in
``kind``; exit 1 with the error line when it could not look or scontrol failed). Error lines' ``kind``:
``usage``, ``no-such-gpu``, ``refused``, ``failed``, ``interrupted``, ``collect``, ``no-daemon``
(``history`` with no daemon answering), ``internal`` and the exception names listed in ``main``.

Nothing heavy is imported here (no textual, rich, ansible, paramiko): this starts on every node
every few seconds during an incident.
"""

from __future__ import annotations

import sys

# The answered ``collect`` is this module's import, the daemon's socket and a write: so nothing
# but sys (loaded with the interpreter) at import time. json, typing and argparse each cost more
# than the answer; commands import what they need.
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _note(text: str) -> None:
    """A plain-text line for people on stderr (a deprecated flag); the JSON error line stays last."""
    sys.stderr.write(text + "\n")


def _fail(kind: str, message: str, code: int = EXIT_FAIL) -> int:
    import json

    sys.stderr.write(json.dumps({"error": message, "kind": kind}) + "\n")
    return code


def _emit(doc: Any, pretty: bool) -> None:
    import json

    sys.stdout.write(json.dumps(doc, indent=2 if pretty else None, separators=None if pretty else (",", ":")))
    sys.stdout.write("\n")


def _parser_class() -> type:
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            sys.exit(_fail("usage", f"{self.prog}: {message}", EXIT_USAGE))

    return _Parser


def build_parser() -> Any:
    from fleetops.catalog.durations import GRAMMAR, duration_arg

    _Parser = _parser_class()
    parser = _Parser(prog="fleetops-agent", description="fleetops node agent: read and safely change this node's GPUs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: Any, backend_help: str = "auto|nvml|sim (default auto: sim when FLEETOPS_SIM_STATE is set and "
               "this node has no NVIDIA driver, else nvml)") -> None:
        p.add_argument("--backend", default="auto", help=backend_help)
        p.add_argument("--state", help="simulator state file (default: $FLEETOPS_SIM_STATE)")
        p.add_argument("--sim-on-gpu-node", action="store_true",
                       help="allow --backend sim on a node with an NVIDIA driver (/dev/nvidiactl); refused without it")
        p.add_argument("--pretty", action="store_true", help="indented JSON")
        p.add_argument("--json", action="store_true", help="JSON output (always on; accepted for scripts)")

    p = sub.add_parser("collect", help="print one snapshot of this node as JSON")
    common(p)
    p.add_argument("--fresh", action="store_true", help="always collect now; never answer from the daemon")
    p.add_argument("--max-age", type=duration_arg("--max-age", allow_zero=True), default=30.0,
                   help=f"oldest daemon snapshot accepted ({GRAMMAR}; default 30)")
    p.add_argument("--resample", action="store_true",
                   help="after an action: the daemon samples now and answers with that snapshot; "
                        "without a daemon answering, a cold collect")
    p.add_argument("--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)")

    p = sub.add_parser("serve", help="run the resident agent: sample, watch XIDs, serve snapshots on a socket")
    common(p)
    p.add_argument("--states", nargs="+", help="sim: state files or directories; one process serves them all")
    p.add_argument("--interval", type=duration_arg("--interval"), default=2.0,
                   help=f"time between samples ({GRAMMAR}; default 2)")
    p.add_argument("--full-interval", type=duration_arg("--full-interval"), default=10.0,
                   help=f"time between full snapshots ({GRAMMAR}; default 10)")
    p.add_argument("--hang-timeout", type=duration_arg("--hang-timeout"), default=10.0,
                   help=f"a backend call longer than this is hung ({GRAMMAR}; default 10)")
    p.add_argument("--socket", help="socket path (default /run/fleetops/agent.sock; sim: <state>.agent/agent.sock)")
    p.add_argument("--metrics-address", help="HOST:PORT of the Prometheus endpoint (off unless given)")
    p.add_argument("--web-config-file", metavar="PATH",
                   help="TLS and basic auth for the endpoint: the web-config file Prometheus exporters share "
                   "(tls_server_config, basic_auth_users as bcrypt hashes; JSON, or YAML with PyYAML)")
    p.add_argument("--textfile", help="also write the endpoint's page to this file (node_exporter's textfile "
                   "collector; atomic, each sample; one served node only)")
    p.add_argument("--config", help="JSON: interval_s, full_interval_s, hang_timeout_s, clear_after_samples (over the "
                   "flags; re-read on SIGHUP)")
    p.add_argument("--baseline", help="baseline YAML the daemon's findings are judged by (as fleetops audit "
                   "--baseline); re-read on SIGHUP")
    p.add_argument("--jobs-dir", help="the node's job records (default $FLEETOPS_JOBS_DIR, else /run/fleetops/jobs; "
                   "sim: each node's <state>.agent/jobs)")
    p.add_argument("--clear-after", type=int, default=30, metavar="N",
                   help="a throttle seen in a sample is reported until N consecutive clean samples (default 30)")

    p = sub.add_parser("watch", help="stream the daemon's snapshot, then its changes, as JSON lines until stdin closes")
    common(p)
    p.add_argument("--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)")

    p = sub.add_parser("history", help="print the daemon's recent samples of one GPU or job: {field: [[t, v], ...]}")
    common(p)
    p.add_argument("--gpu", metavar="UUID", help="the GPU's UUID")
    p.add_argument("--job", metavar="JOBID", help="instead of --gpu: a job's samples (field cpu_usage_usec: its "
                   "cgroup's CPU time in µs, exact; the default field for a job)")
    p.add_argument("--fields", help="comma-separated ring fields (default temp_gpu_c,temp_memory_c,power_draw_w,clock_sm_mhz)")
    p.add_argument("--seconds", type=duration_arg("--seconds"), default=3600.0, metavar="DURATION",
                   help=f"how far back ({GRAMMAR}; default 3600)")
    p.add_argument("--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)")

    p = sub.add_parser("topology", help="print the GPU topology; check it against an expected file")
    common(p)
    p.add_argument("--expected", help="expected topology (JSON or YAML): gpu_count, link, links, numa")

    p = sub.add_parser("set", help="set power cap, persistence or MIG mode (idempotent)")
    common(p)
    p.add_argument("setting", help="power|persistence|mig")
    p.add_argument("value", help="watts for power; on/off for persistence and mig")
    p.add_argument("--gpu", default="all", help="all, a UUID or a PCI bus id (never an index; default all)")
    p.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    p.add_argument("--baseline", metavar="FILE|-",
                   help="power: each GPU takes its own model's limit from this baseline (gpu_models.MODEL."
                   "power_limit_w, else power_limit_w), matched as the audit matches it; VALUE for a GPU the "
                   "baseline gives none. JSON or YAML; '-' reads stdin")  # fmt: skip

    p = sub.add_parser("reset", help="safely reset one GPU: every precondition checked and reported first")
    common(p)
    p.add_argument("--gpu", required=True, help="the GPU's UUID or PCI bus id (never an index)")
    p.add_argument("--bus-id", help="the bus id the caller expects --gpu (a UUID) to be at; refused if not")
    p.add_argument("--dry-run", action="store_true", help="evaluate every precondition; change nothing")
    p.add_argument(
        "--kill-processes", action="store_true", help="end the GPU's compute processes first (needs --expect-pids)"
    )
    p.add_argument(
        "--expect-pids",
        metavar="PID[,PID]",
        help="the processes the operator confirmed may be ended; refused when the GPU runs any other "
        "or one of them is gone ('' confirms none)",
    )
    p.add_argument(
        "--expect-jobs",
        metavar="JOBID[,JOBID]",
        help="with --kill-processes: the Slurm jobs the operator confirmed may lose the GPU; refused when "
        "another job's record holds it ('' confirms none)",
    )
    p.add_argument("--grace", type=duration_arg("--grace", allow_zero=True), default=None,
                   help=f"time between SIGTERM and SIGKILL ({GRAMMAR}; default 10)")
    p.add_argument("--timeout", type=duration_arg("--timeout", allow_zero=True), default=None,
                   help="deprecated spelling of --grace")
    p.add_argument("--reset-timeout", type=duration_arg("--reset-timeout"), default=120.0,
                   help=f"how long the reset and the GPU's return may take ({GRAMMAR}; default 120)")
    p.add_argument(
        "--clients",
        help="comma-separated systemd units stopped before and restarted after the reset "
        "(default: $FLEETOPS_RESET_CLIENTS or nvidia-persistenced,nvidia-dcgm,dcgm-exporter; '' for none); "
        "the resident fleetops-agent is not one: it is paused through its socket, not stopped",
    )
    p.add_argument("--log", help="audit log, JSON lines (default /var/log/fleetops/reset.jsonl; sim: by the state)")
    p.add_argument("--lock-file", help="maintenance lock (default /run/fleetops/maintenance.lock; sim: by the state)")
    p.add_argument("--no-syslog", action="store_true", help="do not send the attempt to syslog")

    about = "measure each GPU (HBM, GEMM, host copies) and the node (P2P, all_reduce); never changes a setting"
    p = sub.add_parser("validate", help=about, description=about)
    p.add_argument("--level", choices=("quick", "full"), default="quick",
                   help="quick (at most 60 s) or full (at most 10 minutes); default quick")
    p.add_argument("--gpu", default="all", help="all, a UUID, an index or a bus id (default all)")
    p.add_argument("--noise", type=float, default=None,
                   help="sim backend: relative noise (default: the state's validation_noise, else 0.02)")
    p.add_argument("--seed", type=int, default=None,
                   help="sim backend: noise seed (default: the state's validation_noise, else fresh draws)")
    p.add_argument("--judge", action="store_true",
                   help="judge the results against the floors alone (no fleet to compare with, as in a "
                   "rollout); exit 1 when a GPU is below its floor or has no steady figure")
    p.add_argument("--floors", help="with --judge: floor overrides as JSON, the baseline's validation.floors")
    p.add_argument("--probe", action="store_true",
                   help="measure nothing: say which backends work here and which --backend would run; exit 1 "
                   "naming what to install when none would (the rollout asks this before it drains a node)")
    common(p, backend_help="torch|cupy|dcgm|sim|auto (default auto: sim with --state or $FLEETOPS_SIM_STATE, "
           "else the first that works here: torch with a CUDA device, then cupy, then dcgm (dcgmi on PATH); "
           "none works: refused, naming what to install)")

    about = ("one end of the node-pair RDMA bandwidth test (perftest's ib_write_bw per rail, GPUDirect where "
             "possible); fleetops validate --level full runs the server on one node and the client on its peer")
    p = sub.add_parser("ib-bw", help=about, description=about)
    p.add_argument("role", choices=("server", "client", "stop"),
                   help="server: listen on each rail; client: measure each rail against --peer; stop: end the "
                   "server of --token")
    p.add_argument("--devices", help="comma-separated RDMA devices, the same list and order on both ends (mlx5_0,...)")
    p.add_argument("--peer", help="client: the server's address")
    p.add_argument("--listen", help="server (simulator only): the address to listen on; ib_write_bw listens on all")
    p.add_argument("--port", type=int, default=18515, help="TCP port of the first rail; rail i uses port + i (default 18515, perftest's)")
    p.add_argument("--duration", type=int, default=10, help="seconds each rail is measured (ib_write_bw -D; default 10)")
    p.add_argument("--wait", type=float, default=300.0,
                   help="server: end after this many seconds whatever its clients did (default 300)")
    p.add_argument("--token", help="server and stop: the name of this server (its pid file)")
    common(p, backend_help="auto|nvml|sim (default auto; sim: the simulated HCAs of --state answer)")

    p = sub.add_parser("mig", help="MIG instances: apply a layout (mode, GPU and compute instances); reset "
                       "destroys and recreates them when none is in use")
    common(p)
    p.add_argument("action", choices=["apply", "reset"], help="apply|reset")
    p.add_argument("--gpu", default="all",
                   help="all (apply: every GPU; reset: the MIG-enabled ones), a UUID or a bus id "
                   "(apply: several, comma-separated; default all)")
    p.add_argument("--layout", help="apply: comma-separated profiles for every selected GPU (3g.71gb,3g.71gb), "
                   "or 'off' for MIG mode off")
    p.add_argument("--config", help="apply: an nvidia-mig-parted config file (version: v1)")
    p.add_argument("--select", help="apply: the config to use from --config (a key of mig-configs)")
    p.add_argument("--profiles", help="reset: comma-separated profiles to create (default: the current layout)")
    p.add_argument("--no-reset", action="store_true",
                   help="apply: leave a MIG mode that waits for a GPU reset pending (mode-pending, exit 1) for "
                   "`fleetops-agent reset`; default: reset the GPU through the safe reset flow under the same lock, "
                   "then create the instances")
    p.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    p.add_argument("--lock-file", help="maintenance lock (default /run/fleetops/maintenance.lock; sim: by the state)")

    from fleetops.agent import check, holders_cli, job_cli, slurm_healthcheck

    holders_cli.register(sub)
    job_cli.add_parser(sub, common)

    slurm_healthcheck.add_parser(sub, common)
    check.add_parser(sub)
    return parser


def _verdict(doc: dict[str, Any], code: int, pretty: bool) -> int:
    """reset/mig: the document always goes to stdout; a non-zero exit adds the one-line error."""
    _emit(doc, pretty)
    if code != EXIT_OK:
        import json

        kind = {"error": "no-such-gpu"}.get(str(doc.get("result")), str(doc.get("result") or "failed"))
        sys.stderr.write(json.dumps({"error": doc.get("message") or kind, "kind": kind}) + "\n")
    return code


def _backend_refusal(backend: str | None, sim_on_gpu_node: bool) -> str | None:
    """Why ``--backend sim`` may not run here (a node with an NVIDIA driver, without
    ``--sim-on-gpu-node``), or None. The flag's consent also reaches the processes this one
    starts (``backend_choice.consent``)."""
    from fleetops.gpu import backend_choice

    if sim_on_gpu_node:
        backend_choice.consent()
    if backend != "sim":
        return None
    try:
        backend_choice.choose("sim")
    except backend_choice.BackendRefused as exc:
        return str(exc)
    return None


def _fast_collect_args(argv: list[str]) -> dict[str, Any] | None:
    """``collect`` with its plain flags, parsed without argparse (it costs more than the
    whole simulator collection); anything else goes through the full parser."""
    if not argv or argv[0] != "collect":
        return None
    opts: dict[str, Any] = {"backend": "auto", "state": None, "pretty": False, "fresh": False, "max_age": 30.0, "socket": None,
                            "resample": False}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("--pretty", "--json"):
            opts["pretty"] = opts["pretty"] or arg == "--pretty"
        elif arg == "--fresh":
            opts["fresh"] = True
        elif arg == "--sim-on-gpu-node":
            opts["sim_on_gpu_node"] = True
        elif arg == "--resample":
            opts["resample"] = True
        elif arg in ("--backend", "--state", "--socket") and i + 1 < len(rest):
            opts[arg[2:]] = rest[i + 1]
            i += 1
        elif arg.startswith(("--backend=", "--state=", "--socket=")):
            key, _, value = arg[2:].partition("=")
            opts[key] = value
        elif arg == "--max-age" and i + 1 < len(rest):
            try:
                opts["max_age"] = float(rest[i + 1])
            except ValueError:
                return None
            i += 1
        else:
            return None
        i += 1
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fast = _fast_collect_args(argv)
    if fast is not None:
        refused = _backend_refusal(fast["backend"], bool(fast.get("sim_on_gpu_node")))
        if refused is not None:
            return _fail("usage", refused, EXIT_USAGE)
        if not fast["fresh"]:
            from fleetops.agent.serve import client

            path = client.socket_for(fast["backend"], fast["state"], fast["socket"])
            if fast["resample"]:  # a snapshot taken now, after the action, or none from the daemon
                served = client.resample(path)
            else:
                served = client.fetch_snapshot(path, fast["max_age"])
            if served is not None:
                if fast["pretty"]:
                    import json

                    _emit(json.loads(served), True)
                else:
                    sys.stdout.write(served + "\n")
                return EXIT_OK
        from fleetops.agent.collect import CollectError, collect_dict

        try:
            _emit(collect_dict(fast["backend"], fast["state"]), fast["pretty"])
        except CollectError as exc:
            return _fail("collect", str(exc))
        except Exception as exc:  # same contract as below: one JSON line, never a traceback  # noqa: BLE001
            return _fail("internal", f"{type(exc).__name__}: {exc}")
        return EXIT_OK
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        if argv[:1] == ["check"] and exc.code == EXIT_USAGE:
            from fleetops.common.errors import EXIT_USAGE as CHECK_USAGE

            return CHECK_USAGE  # check's codes are the audit's: 2 is crit there
        raise
    refused = _backend_refusal(getattr(args, "backend", None), bool(getattr(args, "sim_on_gpu_node", False)))
    if refused is not None:
        from fleetops.common.errors import EXIT_USAGE as CHECK_USAGE

        return _fail("usage", refused, CHECK_USAGE if args.command == "check" else EXIT_USAGE)
    if args.command == "check":
        from fleetops.agent import check

        return check.run(args)
    if args.command == "serve":
        from fleetops.agent import serve

        return serve.run(args)
    if args.command == "holders":
        from fleetops.agent import holders_cli

        return holders_cli.run(args)
    if args.command == "job":
        from fleetops.agent import job_cli

        return job_cli.run(args)
    if args.command == "history":
        from fleetops.agent.serve import history_cli

        return history_cli.run(args)
    if args.command == "slurm-healthcheck":
        from fleetops.agent import slurm_healthcheck as hc

        try:
            doc, code = hc.main_args(args)
        except hc.HealthcheckError as exc:
            return _fail(exc.kind, str(exc), EXIT_USAGE if exc.kind == "usage" else EXIT_FAIL)
        _emit(doc, args.pretty)
        if code != EXIT_OK:
            import json

            sys.stderr.write(json.dumps({"error": doc.get("message") or "scontrol failed", "kind": "failed"}) + "\n")
        return code
    if args.command == "watch":
        from fleetops.agent.serve import client

        return client.watch(client.socket_for(args.backend, args.state, args.socket))
    from fleetops.agent.collect import CollectError, collect

    try:
        if args.command == "collect":
            from fleetops.agent.collect import collect_dict

            if not args.fresh:
                from fleetops.agent.serve import client

                path = client.socket_for(args.backend, args.state, args.socket)
                served = client.resample(path) if args.resample else client.fetch_snapshot(path, args.max_age)
                if served is not None:
                    import json

                    _emit(json.loads(served), args.pretty)
                    return EXIT_OK
            _emit(collect_dict(args.backend, args.state), args.pretty)  # the fast path's document
            return EXIT_OK
        if args.command == "topology":
            from fleetops.agent import topology

            node = collect(args.backend, args.state)
            report = topology.report(node, args.expected)
            _emit(report, args.pretty)
            return EXIT_OK if report["ok"] else EXIT_FAIL
        if args.command == "set":
            from fleetops.agent.check import CheckError, load_baseline
            from fleetops.agent.setters import SetError, apply

            try:
                baseline, _ = load_baseline(args.baseline)
            except CheckError as exc:
                raise SetError(str(exc)) from exc
            done = apply(args.setting, args.value, args.gpu, args.dry_run, args.backend, args.state, baseline)
            if not args.dry_run and done.get("changed"):
                from fleetops.agent.serve import client

                done["daemon"] = client.after_action(client.action_socket(str(done.get("backend")), args.state))
            _emit(done, args.pretty)
            return EXIT_OK
        if args.command == "reset":
            from fleetops.agent import reset

            try:
                doc, code = reset.main_args(args, _note)
            except reset.ResetError as exc:
                return _fail(exc.kind, str(exc), exc.exit_code)
            return _verdict(doc, code, args.pretty)
        if args.command == "validate" and args.probe:
            from fleetops.validation.node.probe import probe

            doc = probe(args.backend, args.state)
            _emit(doc, args.pretty)
            if doc["picked"] is None:
                return _fail("backend", f"{doc['error']}; {doc['install']}", EXIT_FAIL)
            return EXIT_OK
        if args.command == "validate":
            from fleetops.validation.gate import GateError, judge_node, parse_floors
            from fleetops.validation.node.run import ValidateError, validate

            try:
                overrides = parse_floors(args.floors) if args.judge else None
                doc = validate(args.level, args.gpu, args.backend, args.state, args.noise, args.seed)
            except (ValidateError, GateError) as exc:
                return _fail(getattr(exc, "kind", "usage"), str(exc), EXIT_USAGE)
            if args.judge:
                doc = judge_node(doc, overrides)
                _emit(doc, args.pretty)
                return EXIT_OK if doc["gate"]["passed"] else EXIT_FAIL
            _emit(doc, args.pretty)
            return EXIT_OK
        if args.command == "ib-bw":
            from fleetops.validation.node import ibbw

            try:
                doc = ibbw.main_args(args)
            except ibbw.IbBwError as exc:
                return _fail("usage", str(exc), EXIT_USAGE)
            _emit(doc, args.pretty)
            return EXIT_OK
        if args.command == "mig":
            from fleetops.agent import mig

            try:
                if args.action == "apply":  # mig_apply builds on mig (its report kind, its error)
                    from fleetops.agent import mig_apply

                    doc, code = mig_apply.main_args(args)
                else:
                    doc, code = mig.main_args(args)
            except mig.MigError as exc:
                return _fail(exc.kind, str(exc), exc.exit_code)
            if not doc.get("dry_run") and doc.get("changed"):
                from fleetops.agent.serve import client

                doc["daemon"] = client.after_action(client.action_socket(str(doc.get("backend")), args.state))
            return _verdict(doc, code, args.pretty)
    except CollectError as exc:
        return _fail("collect", str(exc))
    except Exception as exc:  # every failure becomes one JSON line, never a traceback on stdout  # noqa: BLE001
        kind = type(exc).__name__
        known = {"SetError", "TopologyError", "SimError", "SchemaError", "LockError", "LockHeld", "DryRunViolation"}
        if kind not in known:
            return _fail("internal", f"{kind}: {exc}")
        return _fail(kind, str(exc))
    return _fail("usage", f"unknown command {args.command!r}", EXIT_USAGE)


def entry() -> None:
    """Console-script entry: a short-lived process, so no cyclic GC during the run and no
    interpreter teardown after it (NVML's and the modules' finalisers cost more than the
    whole simulator collection). Output is flushed first; nothing else needs finalising."""
    import gc
    import os

    gc.disable()
    try:
        code = main()
    except SystemExit as exc:  # argparse usage errors
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
