"""The daemon's Prometheus endpoint: each node service's immutable state, rendered by
``fleetops.agent.metrics`` when scraped (nothing is kept in global metric objects).

One endpoint per served node: ``HOST:PORT`` for the first, ``PORT+1``... for the next, or one
``HOST:PORT`` per node in a comma-separated list (``serve/endpoints.py``: the simulated fleet puts
each node's on its own address), so a simulator process serving many nodes gives each its own
target (as each real node has).
A scrape renders the service's current state document (immutable, replaced whole on each
change), so it never waits on the sampler."""

from __future__ import annotations

import functools
import time
from typing import Any

from fleetops import model
from fleetops.agent import metrics


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (on 127.0.0.1; the endpoint is opened wider only when asked)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "0.0.0.0"  # ":9401" means every address, as asked
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics-address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{metrics.DEFAULT_PORT}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics-address {text!r}: port {number} is not a TCP port")
    return host, number


def metrics_input(doc: dict[str, Any], now: float) -> metrics.MetricsInput:
    """A MetricsInput from a service's state document (a snapshot with its ``daemon`` block)."""
    daemon = dict(doc.get("daemon") or {})
    node = model.node_from_dict({k: v for k, v in doc.items() if k != "daemon"} | {"daemon": None})
    by_bus = {g.bus_id: g for g in node.gpus}
    counts: dict[metrics.XidKey, int] = {}
    for key, count in (daemon.get("xid_counts") or {}).items():
        bus, _, code = str(key).rpartition("/")
        gpu = by_bus.get(bus)
        xkey: metrics.XidKey = (gpu.uuid if gpu else None, bus or None, gpu.index if gpu else None, int(code))
        counts[xkey] = counts.get(xkey, 0) + int(count)
    findings = tuple(model.Finding.from_dict(f) for f in daemon.get("findings") or [])
    collected = daemon.get("collected_at")
    reason = daemon.get("reason")
    agent = metrics.AgentInfo(
        started_at=float(daemon.get("started_at") or now),
        interval_s=float(daemon.get("interval_s") or 0.0),
        degraded=bool(daemon.get("degraded")),
        reason=_reason_token(reason) if reason else None,
        sample_age_s=round(now - float(collected), 3) if collected else None,
    )
    compute = daemon.get("compute_ports")
    return metrics.MetricsInput(node=node, agent=agent, findings=findings, xid_counts=counts,
                                compute_ports=None if compute is None else frozenset(compute))


def _reason_token(reason: str) -> str:
    """The daemon's degraded reason as a short label value (its full text is on the socket)."""
    text = str(reason).lower()
    for needle, token in (("hung", "backend_hung"), ("cursor", "cursor_not_saved"), ("xid events", "xid_events_down"),
                          ("driver", "driver_unloaded")):
        if needle in text:
            return token
    return "other"


def page(service: Any) -> str:
    """The page of one service now; a daemon still starting says so instead of a page. The Slurm
    health program's last report follows either way (``healthcheck_page``)."""
    _, doc = service.state()
    if doc is None:
        return "# no snapshot yet\n" + healthcheck_page(service)
    return metrics.render(metrics_input(doc, time.time())) + healthcheck_page(service)


def healthcheck_page(service: Any) -> str:
    """``fleetops_slurm_healthcheck_*`` from the health program's report file, read now: the
    file its ``--report-file`` defaults to on this node (the simulator's beside the served state),
    so its circuit breaker reaches Prometheus without a second exporter."""
    from fleetops.agent import slurm_healthcheck

    backend = getattr(service, "backend", None)
    sim = getattr(backend, "state_path", None) if getattr(backend, "name", None) == "sim" else None
    return slurm_healthcheck.metrics_text(slurm_healthcheck.report_path(None, sim))


def web_source(path: str | None) -> Any:
    """``--web-config-file``: TLS and basic authentication for every endpoint, checked whole now
    (``fleetops.agent.webconfig.WebConfigError`` names the file and field), so a bad file stops
    the start rather than serving the page unprotected. None without a file."""
    if not path:
        return None
    from fleetops.agent import webconfig

    return webconfig.Source(path)


def serve(address: str, services: list[Any], web: Any = None) -> list[Any]:
    """Start one read-only endpoint per service; returns the servers (for shutdown). ``web``
    (from ``web_source``) is shared by all of them."""
    from fleetops.agent.serve import endpoints

    where = endpoints.parse(address, len(services), parse_address)
    if len(services) == 1:
        host, port = where[0]
        _, server = metrics.start_server(host, port, functools.partial(page, services[0]), poll_s=5.0, web=web)
        return [server]
    # many nodes in one process (the simulated fleet): one accepting thread for all of them
    servers: list[Any] = []
    try:
        for (host, port), svc in zip(where, services, strict=True):
            servers.append(metrics.MetricsServer((host, port), functools.partial(page, svc), web=web))
    except BaseException:
        for made in servers:
            made.server_close()
        raise
    return list(endpoints.serve_all(servers, poll_s=5.0))
