"""The simulated fleet as strict as the hardware, through the real paths (sshd per loopback
address, the fleet's resident agent, ``fleetops audit`` over SSH, ``fleetops prometheus
targets``, HTTP):

- ``sim up --daemon`` serves every node's metrics endpoint on that node's own address, at the
  port its inventory names, which is where ``fleetops prometheus targets`` points;
- after ``xid:79`` on GPU 4, GPU 4 stays at index 4 with its UUID, lost, and the others keep
  their indices and UUIDs, in the daemon's snapshot and in a cold collect alike;
- the audit's table and the TUI's node row give the same "n/m GPUs" (7/8) from either source.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polling
import pytest

from fleetops import model
from fleetops.agent.serve import client
from fleetops.sim import fleet
from fleetops.sim import gpu as sim
from fleetops.tui import data

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
FIRST_ADDRESS = "127.0.27.1"  # a block of its own: the endpoints bind on every node's address
NODES = 3
LOST_NODE, LOST_GPU = "node002", 4


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def daemon_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("strictfleet"))
    info = fleet.up(NODES, d, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
                    metrics_port=free_port(FIRST_ADDRESS))
    try:
        yield info
    finally:
        fleet.down(d)


def daemon_snapshot(info: dict[str, Any], node: str) -> dict[str, Any] | None:
    text = client.fetch_snapshot(client.socket_for("sim", info["nodes"][node]["state"], None), max_age_s=3600)
    return json.loads(text) if text else None


def until(what: str, probe: Any, timeout: float = 90.0) -> Any:
    return polling.until(what, probe, timeout, step_s=0.5)


def uuid_labels(page: str) -> set[str]:
    return set(re.findall(r'uuid="(GPU-[0-9a-f-]+)"', page))


def test_sim_up_daemon_serves_each_nodes_page_where_prometheus_targets_points(daemon_fleet: dict[str, Any]) -> None:
    proc = subprocess.run([*CLI, "prometheus", "targets", "-i", daemon_fleet["inventory"], "-q"],
                          capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(proc.stdout)
    assert sorted(g["labels"]["node"] for g in groups) == sorted(daemon_fleet["nodes"])
    for group in groups:
        node = group["labels"]["node"]
        [target] = group["targets"]
        entry = daemon_fleet["nodes"][node]
        assert target == f"{entry['address']}:{daemon_fleet['metrics_port']}"  # the node's own address

        def page(target: str = target) -> str | None:
            try:
                with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as answer:
                    text = answer.read().decode()
            except OSError:
                return None
            return text if "fleetops_gpu_health" in text else None  # the daemon's first snapshot

        text = until(f"{node}'s page at {target}", page)
        own = {g["uuid"] for g in sim.read_state(entry["state"])["gpus"]}
        assert uuid_labels(text) == own, f"{target} serves another node's page than {node}'s"
        assert "fleetops_node_gpus 8" in text


def audit(info: dict[str, Any], tmp: Path, *extra: str) -> dict[str, Any]:
    stamp = time.monotonic_ns()
    report = tmp / f"report-{stamp}.json"
    proc = subprocess.run(
        [*CLI, "audit", "-i", info["inventory"], "--format", "json", "-o", str(report),
         "--db", str(tmp / f"history-{stamp}.db"), "-q", "--connect-timeout", "5", "--timeout", "30", *extra],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO, stdin=subprocess.DEVNULL,
    )
    assert report.exists(), proc.stderr
    doc: dict[str, Any] = json.loads(report.read_text())
    return doc


def table_gpus(info: dict[str, Any], tmp: Path, node: str, *extra: str) -> str:
    """The "GPUs" cell of ``node`` in the audit's table."""
    out = tmp / f"table-{time.monotonic_ns()}.txt"
    subprocess.run(
        [*CLI, "audit", "-i", info["inventory"], "--format", "table", "-o", str(out),
         "--db", str(tmp / f"h-{time.monotonic_ns()}.db"), "-q", "--connect-timeout", "5", "--timeout", "30",
         *extra],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO, stdin=subprocess.DEVNULL,
    )
    row = next(line for line in out.read_text().splitlines() if line.split("│")[1:2] and node in line)
    cells = [c.strip() for c in row.split("│")]
    return next(c for c in cells if re.fullmatch(r"\d+/\d+", c))


def test_lost_gpu_keeps_its_index_in_daemon_and_cold_collect_and_audit_and_tui_agree(
    daemon_fleet: dict[str, Any], tmp_path: Path
) -> None:
    state = daemon_fleet["nodes"][LOST_NODE]["state"]
    healthy = [(g["index"], g["uuid"], g["bus_id"]) for g in sim.read_state(state)["gpus"]]
    lost_uuid = healthy[LOST_GPU][1]
    fleet.inject(daemon_fleet["directory"], LOST_NODE, "xid:79", LOST_GPU)
    try:
        served = until("the daemon marks GPU 4 lost", lambda: (lambda d: d if d and lost_uuid in
                       (d["daemon"]["lost"] or {}) and any(g["uuid"] == lost_uuid and "GpuIsLost" in
                       g["unavailable"].values() for g in d["gpus"]) else None)(daemon_snapshot(daemon_fleet,
                                                                                           LOST_NODE)))
        assert [(g["index"], g["uuid"], g["bus_id"]) for g in served["gpus"]] == healthy
        assert served["gpu_count"] == 8

        by_source = {"daemon": audit(daemon_fleet, tmp_path), "cold": audit(daemon_fleet, tmp_path, "--fresh")}
        for source, doc in by_source.items():
            entry = next(n for n in doc["nodes"] if n["name"] == LOST_NODE)
            assert entry["source"] == ("collect" if source == "cold" else "daemon"), entry["source"]
            snap = model.node_from_dict(entry["snapshot"])
            assert [(g.index, g.uuid, g.bus_id) for g in snap.gpus] == healthy, source
            assert [g.index for g in snap.gpus if model.gpu_lost(g)] == [LOST_GPU], source
            findings = [model.Finding.from_dict(f) for f in doc["findings"] if f["node"] == LOST_NODE]
            lost = [f for f in findings if f.check == "config.gpu_missing"]
            assert [f.gpu for f in lost] == [{"index": LOST_GPU, "uuid": lost_uuid, "bus_id": healthy[LOST_GPU][2]}]
            # the TUI's node row and the audit's count: one rule, the same answer
            tui = data.summarize(LOST_NODE, snap, findings, time.time())
            assert tui.node_row_parts[0][2] == "7/8", source
            assert [g.index for g in tui.gpus if g.lost] == [LOST_GPU]
            assert [(g.index, g.uuid) for g in tui.gpus] == [(i, u) for i, u, _ in healthy]
        assert table_gpus(daemon_fleet, tmp_path, LOST_NODE) == "7/8"
        assert table_gpus(daemon_fleet, tmp_path, LOST_NODE, "--fresh") == "7/8"
    finally:
        fleet.clear(daemon_fleet["directory"], LOST_NODE, "all")
