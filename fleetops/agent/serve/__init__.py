"""``fleetops-agent serve``: the resident agent (stdlib and pynvml only).

Each node served gets a ``NodeService`` (``node.py``): sampler, health from
``fleetops.checks.run_node_checks``, XIDs from the kernel-log follower, and a unix socket.
The NVML backend keeps its cursor in ``$FLEETOPS_AGENT_STATE_DIR`` (default
/var/lib/fleetops/agent) and follows ``$FLEETOPS_AGENT_KMSG`` (default /dev/kmsg); tests point
both elsewhere and put a fake NVML module in through ``$FLEETOPS_AGENT_NVML_MODULE``.
Tests replace the backend class through ``$FLEETOPS_AGENT_SERVE_BACKEND`` (``module:Class``).
With ``--backend sim --states A.json B.json ...`` one process serves every simulated node
given, each with its socket ``<state>.agent/agent.sock`` and kernel log ``<state>.kmsg``.

The Prometheus endpoint starts in ``start_metrics`` (``--metrics-address``): each service's
``state()`` is an immutable snapshot, rendered when scraped (``serve/exposition.py``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)

if TYPE_CHECKING:
    from typing import Any

# Only os and sys (loaded with the interpreter) at import: ``collect``'s fast path imports this
# package for its client, and every other module would be paid by each answered collect.

DEFAULT_SOCKET = "/run/fleetops/agent.sock"
DEFAULT_STATE_DIR = "/var/lib/fleetops/agent"
# Test hook: "module:Class" naming a SimAccess replacement (same constructor and methods).
BACKEND_HOOK_ENV = "FLEETOPS_AGENT_SERVE_BACKEND"


def start_metrics(address: str, services: list[Any], web: Any = None) -> None:
    """The Prometheus endpoint (``--metrics-address``): one read-only page per served node;
    ``web`` (``--web-config-file``, loaded by ``exposition.web_source``) adds TLS and basic auth."""
    from fleetops.agent.serve import exposition

    servers = exposition.serve(address, services, web)
    scheme = "https" if web is not None and web.guard().tls_context is not None else "http"
    where = [f"{srv.server_address[0]}:{srv.server_address[1]}" for srv in servers]
    more = f" (and {len(where) - 3} more)" if len(where) > 3 else ""
    sys.stderr.write(f"fleetops-agent serve: metrics ({scheme}) on {', '.join(where[:3])}{more}\n")


def start_textfile(path: str, service: Any) -> None:
    """``--textfile``: the endpoint's page written to ``path`` each time the service publishes
    (every sample, every XID), atomically (a temporary beside it, then a rename), so
    node_exporter's textfile collector never reads half a page. A failed write (full disk) is
    said once on stderr and retried with the next sample."""
    import threading

    from fleetops.agent import metrics
    from fleetops.agent.serve import exposition

    def loop() -> None:
        seen = -1
        failed = False
        while not service.stop.is_set():
            with service.changed:
                service.changed.wait_for(lambda s=seen: service.version != s or service.stop.is_set(), timeout=5.0)
            version, _ = service.state()
            if version == seen or service.stop.is_set():
                continue
            seen = version
            try:
                metrics.write_textfile(path, exposition.page(service))
                failed = False
            except OSError as exc:
                if not failed:
                    sys.stderr.write(f"fleetops-agent serve: --textfile {path}: {exc.strerror or exc}\n")
                failed = True

    threading.Thread(target=loop, name="textfile", daemon=True).start()


CONFIG_KEYS = {"interval_s": "interval_s", "full_interval_s": "full_interval_s", "hang_timeout_s": "hang_s",
               "clear_after_samples": "clear_after"}
COUNT_KEYS = ("clear_after_samples",)  # whole numbers of samples, not seconds


def read_config(path: str | None) -> dict[str, float]:
    """``--config``: a JSON object of the keys in ``CONFIG_KEYS`` (seconds); re-read on SIGHUP.
    A bad file is refused whole with a message naming the file and the key."""
    if not path:
        return {}
    import json

    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    out: dict[str, float] = {}
    for key, value in data.items():
        if key not in CONFIG_KEYS:
            raise ValueError(f"{path}: unknown key {key!r}; known: {', '.join(CONFIG_KEYS)}")
        if key in COUNT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{path}: {key} must be a whole number of samples (1 or more), got {value!r}")
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{path}: {key} must be a positive number of seconds, got {value!r}")
        out[key] = float(value)
    return out


def read_baseline(path: str | None) -> Any:
    """``--baseline``: the same loader (and the same file:line errors) as the controller's
    ``--baseline``, so the daemon judges a node by the baseline its audit uses. Raises
    ``fleetops.baseline.BaselineError``."""
    if not path:
        return None
    from fleetops import baseline

    return baseline.load_file(path)


def _reload(path: str | None, baseline_path: str | None, services: list[Any]) -> None:
    """SIGHUP: the configuration and the baseline are re-read together and taken only when both
    are good; otherwise everything running stays and ``reload_error`` says why."""
    import time

    try:
        config = read_config(path)
        baseline = read_baseline(baseline_path)
    except (OSError, ValueError) as exc:  # the running configuration stays; say why (BaselineError too)
        sys.stderr.write(f"fleetops-agent serve: reload refused: {exc}\n")
        for svc in services:
            svc.reload_error = str(exc)
        return
    for svc in services:
        svc.reload_error = None
        for key, value in config.items():
            setattr(svc, CONFIG_KEYS[key], value)
        svc.baseline = baseline
        svc.reloaded_at = time.time()


def _web_config(args: Any) -> Any:
    """``--web-config-file``, read whole before anything starts; it protects the endpoint, so
    it means nothing without ``--metrics-address``."""
    path = getattr(args, "web_config_file", None)
    if not path:
        return None
    if not args.metrics_address:
        raise ValueError(f"--web-config-file {path}: needs --metrics-address (it protects that endpoint)")
    from fleetops.agent.serve import exposition

    return exposition.web_source(path)


def run(args: Any) -> int:
    import json
    import signal
    import threading

    from fleetops.agent.serve.node import NodeService
    from fleetops.agent.serve.sdnotify import notify

    services: list[NodeService] = []
    try:
        config = read_config(args.config)
        baseline = read_baseline(getattr(args, "baseline", None))
        web = _web_config(args)
    except (OSError, ValueError) as exc:  # a bad web-config (WebConfigError) refuses the start too
        sys.stderr.write(json.dumps({"error": str(exc), "kind": "usage"}) + "\n")
        return 2
    if args.clear_after < 1:
        sys.stderr.write(json.dumps({"error": f"--clear-after must be 1 or more, got {args.clear_after}",
                                     "kind": "usage"}) + "\n")
        return 2
    flags = {"interval_s": "interval", "full_interval_s": "full_interval", "hang_timeout_s": "hang_timeout",
             "clear_after_samples": "clear_after"}
    for key, value in config.items():
        setattr(args, flags[key], value)
    from fleetops.gpu import backend_choice

    try:  # auto is never the simulator on a node with an NVIDIA driver; sim there needs consent
        use_sim = backend_choice.choose(
            args.backend, bool(args.states or args.state or os.environ.get(backend_choice.SIM_STATE_ENV))
        ) == "sim"
    except (ValueError, backend_choice.BackendRefused) as exc:
        sys.stderr.write(json.dumps({"error": str(exc), "kind": "usage"}) + "\n")
        return 2
    if not use_sim and args.states and args.backend == "auto":
        sys.stderr.write(json.dumps({"error": f"--states names simulator state files, but --backend {args.backend} "
                                     "is NVML on this node (it has an NVIDIA driver); pass --backend sim "
                                     f"{backend_choice.CONSENT_FLAG} to simulate here", "kind": "usage"}) + "\n")
        return 2
    if use_sim:
        paths = list(args.states or []) or [args.state or os.environ.get("FLEETOPS_SIM_STATE", "")]
        expanded: list[str] = []
        for p in paths:
            if os.path.isdir(p):
                expanded.extend(sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".json")))
            elif p:
                expanded.append(p)
        if not expanded:
            sys.stderr.write('{"error": "serve --backend sim needs --states or --state", "kind": "usage"}\n')
            return 2
        from fleetops.sim.access import SimAccess

        backend_class: Any = SimAccess
        hook = os.environ.get(BACKEND_HOOK_ENV)
        if hook:  # tests: a backend that hangs or fails on demand, in place of the simulator's
            import importlib

            module_name, _, class_name = hook.partition(":")
            backend_class = getattr(importlib.import_module(module_name), class_name)
        for path in expanded:
            backend = backend_class(path)
            services.append(
                NodeService(
                    backend,
                    os.path.join(backend.run_dir, "agent.sock"),
                    backend.run_dir,
                    backend.kmsg_path,
                    args.interval,
                    args.full_interval,
                    args.hang_timeout,
                    baseline,
                    args.clear_after,
                    jobs_dir=os.path.join(backend.run_dir, "jobs"),
                )
            )
    else:
        from fleetops.gpu.nvml.access import NvmlAccess
        from fleetops.jobs import record as jobs_record

        nvml_access = NvmlAccess()
        nvml_access.N  # noqa: B018 - loads NVML now: without nvidia-ml-py the start fails, not a sample
        state_dir = os.environ.get("FLEETOPS_AGENT_STATE_DIR", DEFAULT_STATE_DIR)
        services.append(
            NodeService(
                nvml_access,
                args.socket or DEFAULT_SOCKET,
                state_dir,
                os.environ.get("FLEETOPS_AGENT_KMSG", "/dev/kmsg"),
                args.interval,
                args.full_interval,
                args.hang_timeout,
                baseline,
                args.clear_after,
                jobs_dir=getattr(args, "jobs_dir", None) or jobs_record.default_dir(),
            )
        )
    textfile = getattr(args, "textfile", None)
    if textfile and len(services) != 1:
        sys.stderr.write(json.dumps({"error": f"--textfile {textfile}: one served node only, got {len(services)}",
                                     "kind": "usage"}) + "\n")
        return 2
    if textfile and not os.path.isdir(os.path.dirname(os.path.abspath(textfile))):
        sys.stderr.write(json.dumps({"error": f"--textfile {textfile}: no such directory", "kind": "usage"}) + "\n")
        return 2
    from fleetops.agent.serve import claim

    claimed: list[int] = []  # one daemon per node: its state locked, its socket answered by nobody else
    for svc in services:
        try:
            claimed.append(claim.claim(svc.socket_path, svc.state_dir))
        except claim.Taken as exc:
            claim.release(claimed)
            sys.stderr.write(json.dumps({"error": f"fleetops-agent serve refused: {exc}", "kind": "in-use"}) + "\n")
            return 1
    stop = threading.Event()

    def _term(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    reload = threading.Event()
    signal.signal(signal.SIGHUP, lambda s, f: reload.set())
    from fleetops.agent.serve import loops

    loops.start(services)
    if args.metrics_address:
        start_metrics(args.metrics_address, services, web)
    if textfile:
        start_textfile(textfile, services[0])
    notify("READY=1")
    while not stop.wait(1.0):  # a signal sets its event at once; this only bounds a SIGHUP's wait
        if reload.is_set():
            reload.clear()
            _reload(args.config, getattr(args, "baseline", None), services)
    notify("STOPPING=1")
    for svc in services:
        svc.stop.set()
        with svc.changed:
            svc.changed.notify_all()
    for svc in services:
        try:
            os.unlink(svc.socket_path)
        except OSError:
            pass
    claim.release(claimed)
    return 0
