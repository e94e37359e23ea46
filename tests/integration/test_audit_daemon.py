"""``fleetops audit`` of a simulated fleet whose nodes run the resident agent (``sim up --daemon``),
over real SSH: each node answers from its daemon, the report says so and how old the snapshot
was, and one audit with an empty history reports the counter storms happening now, because the
rate checks come from the daemon's window. ``--fresh`` and ``--max-age 0`` take cold collects,
and then the same audit has no rate to report."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from expected_faults import EXPECTED
from promtool_util import assert_clean, promtool

from fleetops.agent.serve import client
from fleetops.checks import verdict
from fleetops.fleet import audit as audit_mod
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "fleetops.cli"]
BASELINE = os.path.join(REPO, "examples", "baseline.yml")
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")
NODES = 4
RATE_MIN_INTERVAL_S = 10.0  # thresholds.rate_min_interval_s: the daemon's window must be longer

# node -> (fault, GPU). The NVLink storm runs from the start (scenario): its counter then grows at
# its steady rate in the daemon's window. The other two are injected while the daemon runs.
INJECTED = {"node001": ("pcie-replay-storm", 1), "node002": ("ecc-sbe-storm", 2)}
FROM_START = {"node003": ("nvlink-crc-storm", 3)}
RATE_OF = {"pcie-replay-storm": "pcie.replay_rate", "ecc-sbe-storm": "memory.ecc_sbe_rate",
           "nvlink-crc-storm": "nvlink.error_rate"}


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def daemon_snapshot(d: str, node: str) -> dict[str, Any] | None:
    """The node's daemon answer, read on its socket as the node's own collect reads it."""
    state = os.path.join(d, "state", f"{node}.json")
    text = client.fetch_snapshot(client.socket_for("sim", state, None), max_age_s=3600)
    return json.loads(text) if text else None


def wait_daemon_after(d: str, nodes: list[str], after: float, timeout: float = 90) -> None:
    """Until every node's daemon has published a full snapshot taken after ``after``."""
    deadline = time.monotonic() + timeout
    pending = set(nodes)
    while pending and time.monotonic() < deadline:
        for node in sorted(pending):
            doc = daemon_snapshot(d, node)
            if doc is not None and float(doc.get("collected_at") or 0) > after:
                pending.discard(node)
        time.sleep(0.5)
    assert not pending, f"no daemon snapshot newer than {after:.1f} from {sorted(pending)} within {timeout:.0f} s"


def wait_window(d: str, nodes: list[str], timeout: float = 90) -> None:
    """Until every node's daemon judged its last full snapshot against a rate base more than
    RATE_MIN_INTERVAL_S old (``rate_since``): each daemon's own first sample, which on a
    loaded machine comes at a different time on each node."""
    deadline = time.monotonic() + timeout
    pending = set(nodes)
    while pending and time.monotonic() < deadline:
        for node in sorted(pending):
            doc = daemon_snapshot(d, node)
            since = ((doc or {}).get("daemon") or {}).get("rate_since")
            if doc is not None and since is not None and float(doc["collected_at"]) - since > RATE_MIN_INTERVAL_S + 1:
                pending.discard(node)
        time.sleep(0.5)
    assert not pending, f"no daemon window over {RATE_MIN_INTERVAL_S:g} s from {sorted(pending)} within {timeout:.0f} s"


@pytest.fixture(scope="module")
def storm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.geteuid() != 0 or not fleet.find_sshd():
        pytest.skip("needs root and sshd (apt-get install -y openssh-server)")
    d = str(tmp_path_factory.mktemp("daemonfleet"))
    scenario = os.path.join(d, "scenario.yml")
    with open(scenario, "w", encoding="utf-8") as fh:
        fh.write("nodes:\n" + "".join(f'  {n}: {{faults: ["{f}@{g}"]}}\n' for n, (f, g) in FROM_START.items()))
    # the daemon serves each node's metrics on its address: a free port, so parallel runs do not collide
    fleet.up(NODES, d, scenario, first_address=FIRST_ADDRESS, port=free_port(FIRST_ADDRESS), daemon=True,
             metrics_port=free_port(FIRST_ADDRESS))
    try:
        nodes = [f"node{i:03d}" for i in range(1, NODES + 1)]
        wait_daemon_after(d, nodes, 0.0)
        # every daemon's window must reach back past the injection by more than the rate
        # interval: its first sample (its rate base while it is young) must be that old
        wait_window(d, nodes)
        for node, (fault, gpu) in INJECTED.items():
            fleet.inject(d, node, fault, gpu)
        wait_daemon_after(d, nodes, time.time())
        yield d
    finally:
        fleet.down(d)


def audit(d: str, tmp: Path, *extra: str, fmt: str = "json") -> tuple[int, str, str]:
    """(exit code, the report, stderr); the report goes through ``-o`` (the table then has the
    file width, not a terminal's)."""
    stamp = time.monotonic_ns()
    db = tmp / f"history-{stamp}.db"  # a store with no earlier audit in it
    report = tmp / f"report-{stamp}.{fmt}"
    proc = subprocess.run(
        [*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--baseline", BASELINE, "--format", fmt,
         "-o", str(report), "--db", str(db), "-q", "--connect-timeout", "5", "--timeout", "30", *extra],
        capture_output=True, text=True, timeout=180, check=False, cwd=REPO, stdin=subprocess.DEVNULL,
    )
    return proc.returncode, report.read_text() if report.exists() else "", proc.stderr


def rate_findings(doc: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """(node, check, GPU uuid) -> severity for every rate check's finding."""
    return {
        (f["node"], f["check"], (f["gpu"] or {}).get("uuid")): f["severity"]
        for f in doc["findings"] if f["check"] in verdict.RATE_CHECKS
    }


def uuid_of(d: str, node: str, gpu: int) -> str:
    return str(sim.read_state(os.path.join(d, "state", f"{node}.json"))["gpus"][gpu]["uuid"])


def test_one_audit_from_the_daemons_reports_the_storms_happening_now(storm_fleet: str, tmp_path: Path) -> None:
    rc, out, err = audit(storm_fleet, tmp_path)
    doc = json.loads(out)
    for n in doc["nodes"]:
        assert n["source"] == "daemon", n["name"]
        assert 0 <= n["snapshot_age_s"] <= audit_mod.DEFAULT_MAX_AGE_S, n
        assert n["rates"] == verdict.RATES_DAEMON, n["name"]
    assert doc["summary"]["from_daemon"] == NODES and doc["summary"]["from_collect"] == 0
    want = {
        (node, RATE_OF[fault], uuid_of(storm_fleet, node, gpu)): EXPECTED[fault][RATE_OF[fault]]
        for node, (fault, gpu) in {**INJECTED, **FROM_START}.items()
    }
    assert rate_findings(doc) == want
    assert rc == 1, err  # warn: the storms, and ecc_sbe_volatile's count


def test_cold_collects_have_no_rate_without_a_previous_audit(storm_fleet: str, tmp_path: Path) -> None:
    """The contrast: the same fleet, the same empty history, no daemon answers: the PCIe and
    NVLink checks can only report totals (info), the SBE rate says nothing (its total has its
    own check), and the report says the snapshots were collected now."""
    want = {
        ("node001", "pcie.replay_rate", uuid_of(storm_fleet, "node001", 1)): "info",
        ("node003", "nvlink.error_rate", uuid_of(storm_fleet, "node003", 3)): "info",
    }
    for extra in (("--fresh",), ("--max-age", "0")):
        _, out, err = audit(storm_fleet, tmp_path, *extra)
        doc = json.loads(out)
        assert [(n["source"], n["snapshot_age_s"], n["rates"]) for n in doc["nodes"]] == [("collect", 0.0, None)] * NODES
        assert rate_findings(doc) == want, extra


def table_sources(table: str) -> dict[str, str]:
    """node -> its "source" cell, from the table's rows (the cells between the box lines)."""
    lines = table.splitlines()
    header = next(line for line in lines if "health" in line and "source" in line)
    column = [c.strip() for c in header.split("┃")].index("source")
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > column and cells[1].startswith("node"):
            rows[cells[1]] = cells[column]
    return rows


def test_the_table_and_junit_say_which_source_answered(storm_fleet: str, tmp_path: Path) -> None:
    names = [f"node{i:03d}" for i in range(1, NODES + 1)]
    _, table, err = audit(storm_fleet, tmp_path, fmt="table")
    sources = table_sources(table)
    assert sorted(sources) == names, table
    assert all(re.fullmatch(r"daemon \d+\.\ds", cell) for cell in sources.values()), sources
    assert f"{NODES} from daemons, 0 cold collects" in table
    _, cold, _ = audit(storm_fleet, tmp_path, "--fresh", fmt="table")
    assert table_sources(cold) == dict.fromkeys(names, "collect"), cold
    assert f"0 from daemons, {NODES} cold collects" in cold
    _, xml, _ = audit(storm_fleet, tmp_path, fmt="junit")
    assert xml.count('<property name="source" value="daemon" />') == NODES, xml[:2000]
    assert xml.count(f'<property name="rates" value="{verdict.RATES_DAEMON}" />') == NODES, xml[:2000]


@pytest.mark.promtool
def test_the_prom_report_carries_the_snapshot_age_and_passes_promtool(storm_fleet: str, tmp_path: Path) -> None:
    promtool()
    for extra, source in (((), "daemon"), (("--fresh",), "collect")):
        _, text, err = audit(storm_fleet, tmp_path, *extra, fmt="prom")
        assert_clean(text)
        ages = [line for line in text.splitlines() if line.startswith("fleetops_audit_snapshot_age_seconds{")]
        assert len(ages) == NODES, text
        assert all(f'source="{source}"' in line for line in ages), ages
        values = [float(line.rsplit(" ", 1)[1]) for line in ages]
        if source == "collect":
            assert values == [0.0] * NODES
        else:
            assert all(0 < v <= audit_mod.DEFAULT_MAX_AGE_S for v in values), values
