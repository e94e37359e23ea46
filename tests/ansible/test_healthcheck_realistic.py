"""The Slurm health program's circuit breaker against a real slurmctld: five Debian hosts booted
with systemd-nspawn -b (nspawn_hosts.py), slurmd in each, registered with a slurmctld on this
machine, and a DBE on every node at once.

``fleetops-agent slurm-healthcheck`` runs here, on the controller, once for each node, one after
the other (as slurmd's HealthCheckInterval would, staggered), each with its own simulated node's
state and the cluster's scontrol: the first node drains, and every later one finds the health
program's standing drains at the breaker's share (20 % of five nodes: one) and is held, exit 0,
with the breaker open in its report file. Then the drained node, clean again, is resumed by the
next pass, and an operator's drain on a clean node is left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nspawn_hosts
import pytest
from polling import until

from fleetops.catalog import slurm as rule
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root, pytest.mark.slow]

OLD, NEW = "580.159.04", "580.163.01"
NODES = [f"node30{i}" for i in range(1, 6)]
REPO = Path(__file__).resolve().parents[2]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_HEALTHCHECK_TEST_ADDRESS", "127.0.50.1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = nspawn_hosts.skip_reason() or nspawn_hosts.slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("nspawn-healthcheck")
    try:
        c = nspawn_hosts.up(directory, NODES, OLD, NEW, first=FIRST_ADDRESS, slurm=True)
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        yield c
    finally:
        nspawn_hosts.down(c)


def _states(c: Any) -> dict[str, tuple[str | None, str | None]]:
    """Every node's State and Reason as slurmctld has them (``scontrol show nodes -o``)."""
    out = subprocess.run(
        [str(c.slurm.scontrol), "show", "nodes", "-o"], capture_output=True, text=True, check=True
    ).stdout
    return {n.name: (n.state, n.reason) for n in rule.parse_nodes(out)}


def _healthcheck(c: Any, node: str, state: Path) -> tuple[int, dict[str, Any], str]:
    """One pass for ``node`` on the controller, on that node's simulated state."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURMD_NODENAME", "FLEETOPS_SLURM_HEALTHCHECK_REPORT")
    }
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "slurm-healthcheck", "--backend", "sim", "--state", str(state),
         "--node-name", node, "--scontrol", str(c.slurm.scontrol)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def _report(state: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(state.with_name(state.stem + ".slurm-healthcheck.json").read_text())
    return doc


def test_a_dbe_on_every_node_drains_at_most_the_breakers_share_and_the_breaker_reports_open(
    cluster: Any, tmp_path: Path
) -> None:
    assert cluster.slurm is not None
    until("every node idle", lambda: all(s == "IDLE" for s, _ in _states(cluster).values()) or None, 120, 0.5)
    states = {}
    for node in NODES:
        path = tmp_path / f"{node}.json"
        sim.write_state(str(path), sim.build_state(node, {}))
        sim.inject(str(path), "ecc-dbe", 2)
        states[node] = path

    passes = {node: _healthcheck(cluster, node, states[node]) for node in NODES}

    for node, (code, doc, err) in passes.items():
        assert code == 0, (node, err)
        assert doc["source"] == "cold" and any(
            c["check"] == "memory.ecc_dbe_volatile" for c in doc["crit"]
        ), doc
    slurm = _states(cluster)
    drained = sorted(n for n, (s, _) in slurm.items() if rule.is_drained(s))
    limit = rule.allowed_out(len(NODES), 0.2)
    assert limit == 1 and drained == [NODES[0]], slurm
    owner = rule.owner_of(slurm[NODES[0]][1])
    assert owner.kind == "health" and owner.run is not None and owner.run.endswith(f"-{NODES[0]}"), slurm
    gpu = json.loads(states[NODES[0]].read_text())["gpus"][2]
    assert gpu["uuid"] in owner.purpose and gpu["bus_id"] in owner.purpose
    assert passes[NODES[0]][1]["action"] == "drain" and _report(states[NODES[0]])["breaker"]["open"] is False
    for node in NODES[1:]:
        doc = passes[node][1]
        assert doc["action"] == "held-by-breaker" and doc["argv"] is None, doc
        assert f"1 of {len(NODES)} watched nodes stand drained by the health program" in doc["why"], doc[
            "why"
        ]
        report = _report(states[node])
        assert report["action"] == "held-by-breaker" and report["breaker"]["open"] is True, report
        assert slurm[node][0] == "IDLE" and slurm[node][1] is None

    # sinfo, as an operator reads it: one drain, the health program's, with its check
    sinfo = subprocess.run(
        ["sinfo", "-h", "-R", "-o", "%n|%E"], capture_output=True, text=True, check=True,
        env={**os.environ, "SLURM_CONF": str(cluster.slurm.conf)},
    ).stdout.strip().splitlines()  # fmt: skip
    assert len(sinfo) == 1 and sinfo[0].startswith(f"{NODES[0]}|[fleetops] health/"), sinfo

    # the drained node clean again: the next pass lifts the health program's own drain
    sim.clear(str(states[NODES[0]]), "all")
    code, doc, err = _healthcheck(cluster, NODES[0], states[NODES[0]])
    assert code == 0 and doc["action"] == "resume" and doc["outcome"] == "done", (doc, err)
    until(f"{NODES[0]} resumed", lambda: not rule.is_drained(_states(cluster)[NODES[0]][0]), 30, 0.5)

    # an operator's drain on a clean node is never lifted by it
    scontrol = str(cluster.slurm.scontrol)
    operator = "[fleetops] operator/alice@ctl01: PDU swap rack 12"
    subprocess.run(
        [scontrol, "update", f"NodeName={NODES[1]}", "State=DRAIN", f"Reason={operator}"], check=True
    )
    try:
        sim.clear(str(states[NODES[1]]), "all")
        code, doc, err = _healthcheck(cluster, NODES[1], states[NODES[1]])
        assert code == 0 and doc["action"] == "none" and doc["owner"]["kind"] == "operator", (doc, err)
        state, reason = _states(cluster)[NODES[1]]
        assert rule.is_drained(state) and reason == operator, (state, reason)
    finally:
        subprocess.run([scontrol, "update", f"NodeName={NODES[1]}", "State=RESUME"], check=False)
