"""A real Prometheus (Debian's ``prometheus`` binary) scrapes the agent's endpoint on loopback
with the shipped alert rules loaded, its target found through the file_sd file that
``fleetops prometheus targets`` wrote from an Ansible inventory (``promtool check config``
accepts the configuration): the target is up with the node's labels, the metrics are
queryable, and a DBE on one GPU makes FleetopsGpuCritical fire, all seen through Prometheus's
own HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from promtool_util import INSTALL, promtool

from fleetops import checks, model
from fleetops.agent import metrics
from fleetops.sim import gpu as sim
from fleetops.xid import kernlog as xid

pytestmark = [pytest.mark.promtool, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
RULES = REPO / "prometheus" / "fleetops-rules.yml"
ADDRESS = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((ADDRESS, 0))
        return int(sock.getsockname()[1])


def api(port: int, path: str, **params: str) -> Any:
    url = f"http://{ADDRESS}:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]


def wait_for(what: str, probe: Callable[[], Any], proc: subprocess.Popen[str], timeout: float = 60) -> Any:
    """Polls ``probe`` until it returns something truthy; the failure names what never came."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prometheus exited with {proc.returncode}"
        try:
            last = probe()
        except OSError as exc:  # not listening yet
            last = exc
        if last and not isinstance(last, OSError):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not seen within {timeout:.0f} s (last answer {last!r})")


class Endpoint:
    """The agent's endpoint with a page the test can swap, as the daemon swaps its snapshot."""

    def __init__(self, text: str) -> None:
        self._lock = threading.Lock()
        self._text = text

    def set(self, text: str) -> None:
        with self._lock:
            self._text = text

    def get(self) -> str:
        with self._lock:
            return self._text


def sim_node(faults: tuple[str, ...] = ()) -> model.Node:
    """A simulated node's snapshot with its kernel log's XIDs mapped to GPUs, as the agent has it."""
    data = sim.snapshot(sim.build_state("n1", {"faults": list(faults)}))
    lines = data.pop("_kernel_log", [])
    data["collected_at"] = time.time()
    node = model.node_from_dict(data)
    node.xids = xid.parse_lines(lines, source="sim")
    for event in node.xids:
        gpu = node.gpu_by_bus_id(event.bus_id) if event.bus_id else None
        if gpu is not None:
            event.gpu_uuid, event.gpu_index = gpu.uuid, gpu.index
    return node


def page(node: model.Node) -> str:
    findings = checks.run_node_checks(node)
    return metrics.render(metrics.MetricsInput(
        node=node, agent=metrics.AgentInfo(time.time(), 1.0, sample_age_s=0.2), findings=tuple(findings),
        xid_counts=metrics.xid_counts_from_events(node.xids)))


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip(f"needs the prometheus server: {INSTALL}")
    return path


@pytest.fixture
def served() -> Iterator[tuple[Endpoint, int]]:
    endpoint = Endpoint(page(sim_node()))
    thread, server = metrics.start_server(ADDRESS, 0, endpoint.get)
    try:
        yield endpoint, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_prometheus_scrapes_the_agent_and_fires_on_a_dbe(
    prometheus_bin: str, served: tuple[Endpoint, int], tmp_path: Path
) -> None:
    endpoint, agent_port = served
    port = free_port()
    inventory = tmp_path / "hosts.ini"  # the agent's port from the host var; the other node's from --port
    inventory.write_text(
        f"[gpu]\nn1 ansible_host={ADDRESS} fleetops_agent_metrics_port={agent_port}\n"
        f"[spare]\nn2 ansible_host={ADDRESS}\n"
    )
    targets_file = tmp_path / "sd" / "fleetops.json"
    targets_file.parent.mkdir()
    dead_port = free_port()
    made = subprocess.run([*CLI, "prometheus", "targets", "-i", str(inventory), "-o", str(targets_file),
                           "--port", str(dead_port)],
                          capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    assert made.returncode == 0, made.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\n"
        "scrape_configs:\n  - job_name: fleetops-agent\n"
        f"    file_sd_configs:\n      - files: ['{targets_file.parent}/*.json']\n        refresh_interval: 1s\n"
    )
    checked = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True,
                             timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address={ADDRESS}:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
    )
    try:
        targets = wait_for("target up", lambda: [
            t for t in api(port, "/api/v1/targets")["activeTargets"]
            if t["labels"]["job"] == "fleetops-agent" and t["health"] == "up"
        ], proc)
        assert [t["scrapeUrl"] for t in targets] == [f"http://{ADDRESS}:{agent_port}/metrics"]
        assert {k: targets[0]["labels"][k] for k in ("node", "group", "groups")} == {
            "node": "n1", "group": "gpu", "groups": ",gpu,"}
        every = {t["labels"]["node"]: t["scrapeUrl"] for t in api(port, "/api/v1/targets")["activeTargets"]}
        assert every == {"n1": f"http://{ADDRESS}:{agent_port}/metrics", "n2": f"http://{ADDRESS}:{dead_port}/metrics"}
        healthy = wait_for("fleetops_node_health", lambda: api(port, "/api/v1/query", query="fleetops_node_health")
                           ["result"], proc)
        assert healthy[0]["value"][1] == "0"
        gpus = api(port, "/api/v1/query", query="fleetops_node_gpus")["result"]
        assert gpus[0]["value"][1] == "8"
        alerts = api(port, "/api/v1/alerts")["alerts"]
        assert [a for a in alerts if a["labels"].get("node") == "n1"] == []
        # n2 has no agent listening: the only alert there can be is the agent being down
        assert {(a["labels"]["alertname"], a["labels"]["node"]) for a in alerts} <= {("FleetopsAgentDown", "n2")}

        faulty = sim_node(faults=("ecc-dbe@1",))
        endpoint.set(page(faulty))
        firing = wait_for("FleetopsGpuCritical firing", lambda: [
            a for a in api(port, "/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == "FleetopsGpuCritical" and a["state"] == "firing"
        ], proc)
        gpu1 = next(g for g in faulty.gpus if g.index == 1)
        assert {a["labels"]["uuid"] for a in firing} == {gpu1.uuid}
        assert "memory.ecc_dbe_volatile" in {a["labels"]["check"] for a in firing}
        xid48 = api(port, "/api/v1/query", query='fleetops_gpu_xid_total{code="48"} > 0')["result"]
        assert [r["metric"]["uuid"] for r in xid48] == [gpu1.uuid]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_prometheus_fires_the_fabric_alerts_on_the_rails_only(
    prometheus_bin: str, served: tuple[Endpoint, int], tmp_path: Path
) -> None:
    """``ib-port-down`` on the rail beside GPU 3 and on the Ethernet management port (mlx5_8),
    ``ib-link-downed`` on GPU 5's: the agent's finding pages for the rail at once, the raw
    port-down rule holds it (pending, its 4 minutes are promtool's to test) for mlx5_3 only, the
    management port gets only the warning's pending, and the link that fell and came back fires."""
    endpoint, agent_port = served
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\n"
        "scrape_configs:\n  - job_name: fleetops-agent\n    static_configs:\n"
        f"      - targets: ['{ADDRESS}:{agent_port}']\n        labels: {{node: n1, group: gpu}}\n"
    )
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address={ADDRESS}:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
    )

    def alerts(name: str, state: str) -> list[dict[str, Any]]:
        return [a for a in api(port, "/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == state]

    try:
        # the healthy page first, scraped more than once, so that link_downed has a base
        wait_for("two scrapes of the rails", lambda: [
            r for r in api(port, "/api/v1/query", query='count_over_time(fleetops_rdma_port_up{device="mlx5_5"}[1m])')
            ["result"] if float(r["value"][1]) >= 2], proc)
        roles = {r["metric"]["device"]: r["metric"]["role"]
                 for r in api(port, "/api/v1/query", query="fleetops_rdma_port_up == 1")["result"]}
        assert roles == {**{f"mlx5_{i}": "compute" for i in range(8)}, "mlx5_8": "excluded"}
        assert [a for a in api(port, "/api/v1/alerts")["alerts"] if "Rdma" in a["labels"]["alertname"]] == []

        faulty = sim_node(faults=("ib-port-down@3", "ib-port-down@8", "ib-link-downed@5"))
        endpoint.set(page(faulty))
        fell = wait_for("FleetopsRdmaLinkDowned firing", lambda: alerts("FleetopsRdmaLinkDowned", "firing"), proc)
        assert [(a["labels"]["device"], a["labels"]["port"], a["labels"]["role"], a["labels"]["node"],
                 a["labels"]["severity"]) for a in fell] == [("mlx5_5", "1", "compute", "n1", "critical")]
        down = wait_for("FleetopsRdmaPortDown pending", lambda: alerts("FleetopsRdmaPortDown", "pending"), proc)
        assert [(a["labels"]["device"], a["labels"]["role"]) for a in down] == [("mlx5_3", "compute")]
        assert "mlx5_3 port 1 down on n1" in down[0]["annotations"]["summary"]
        mgmt = wait_for("FleetopsRdmaExcludedPortDown pending",
                        lambda: alerts("FleetopsRdmaExcludedPortDown", "pending"), proc)
        assert [(a["labels"]["device"], a["labels"]["severity"]) for a in mgmt] == [("mlx5_8", "warning")]
        node = wait_for("FleetopsNodeCritical firing", lambda: [
            a for a in alerts("FleetopsNodeCritical", "firing") if a["labels"]["check"] == "fabric.port_down"], proc)
        assert [a["labels"]["node"] for a in node] == ["n1"]
        # nothing critical names the management port
        critical = [a for a in api(port, "/api/v1/alerts")["alerts"] if a["labels"].get("severity") == "critical"]
        assert [a for a in critical if a["labels"].get("device") == "mlx5_8"] == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
