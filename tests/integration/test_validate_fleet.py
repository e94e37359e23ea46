"""``fleetops validate`` over real SSH on a 32-node simulated fleet with injected degradations."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetops.common.errors import EXIT_CRIT
from fleetops.sim import fleet
from fleetops.sim import gpu as sim

pytestmark = pytest.mark.root


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])

ROOT = Path(__file__).resolve().parents[2]
# A block of its own, apart from the shared session fleet's.
ADDRESS = os.environ.get("FLEETOPS_TEST_VALIDATE_ADDRESS", "127.0.60.1")
DEGRADED = {("node003", 1): "slow-hbm", ("node011", 6): "slow-gemm", ("node020", 0): "slow-pcie"}
SLOW_LINK = ("node007", 2, 5)  # the one NVLink between GPU 2 and GPU 5 of node007
link_uuids: list[str] = []  # its two GPUs' UUIDs, once the fleet is up


@pytest.fixture(scope="module")
def fleet32(root_sshd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    directory = str(tmp_path_factory.mktemp("validate32"))
    info = fleet.up(32, directory, first_address=ADDRESS, port=free_port(ADDRESS))
    try:
        expected: dict[str, str] = {}
        for (name, gpu), fault in DEGRADED.items():  # as `fleetops sim inject NODE FAULT --gpu N` does
            assert fleet.inject(directory, name, fault, gpu) is True
            expected[sim.read_state(info["nodes"][name]["state"])["gpus"][gpu]["uuid"]] = fault
        name, gpu, peer = SLOW_LINK
        inject = _fleetops("sim", "inject", "--dir", directory, name, "slow-nvlink", "--gpu", str(gpu), "--peer", str(peer))
        assert inject.returncode == 0, inject.stderr
        state = sim.read_state(info["nodes"][name]["state"])
        assert state["validation_faults"] == [{"fault": "slow-nvlink", "gpu": gpu, "peer": peer}]
        link_uuids[:] = [state["gpus"][gpu]["uuid"], state["gpus"][peer]["uuid"]]
        yield os.path.join(directory, "inventory.yml"), expected
    finally:
        fleet.down(directory)


def test_validate_flags_exactly_the_degraded(fleet32: tuple[str, dict[str, str]]) -> None:
    inv, expected = fleet32
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "fleetops.cli", "validate", "-i", inv, "--format", "json",
                               "--no-history"],
                              capture_output=True, text=True, env=env, timeout=300, check=False)
        assert proc.returncode == EXIT_CRIT, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["unreachable"] == {}
        assert len(doc["gpus"]) == 32 * 8
        flagged = {g["gpu"] for g in doc["gpus"] if g["status"] != "ok"}
        assert flagged == set(expected)
        # 85 % of healthy: HBM and GEMM stay above their floors (stragglers); 44 GB/s to the host
        # is under the 48 GB/s floor.
        status = {expected[g["gpu"]]: g["status"] for g in doc["gpus"] if g["gpu"] in expected}
        assert status == {"slow-hbm": "warn", "slow-gemm": "warn", "slow-pcie": "crit"}
        # the node tests: every node judged, only node007 flagged, on the pair of its slow link
        # (90 % of healthy: over the P2P and all_reduce floors, stragglers) and its all_reduce
        assert len(doc["nodes"]) == 32
        bad_nodes = {n["host"]: n for n in doc["nodes"] if n["status"] != "ok"}
        assert set(bad_nodes) == {SLOW_LINK[0]}
        a, b = link_uuids
        assert sorted((f["metric"], f["gpu"], f["status"]) for f in bad_nodes[SLOW_LINK[0]]["findings"]) == [
            ("allreduce_busbw_gbps", "8 GPUs NVLS 256 MiB", "warn"),
            ("p2p_bidir_gbps", f"{a}<->{b}", "warn"),
            ("p2p_gbps", f"{a}->{b}", "warn"),
            ("p2p_gbps", f"{b}->{a}", "warn"),
        ]


def _fleetops(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fleetops.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_validate_table_lists_what_is_not_ok_by_gpu_index(fleet32: tuple[str, dict[str, str]]) -> None:
    """The text form: only what is not ok, each GPU by index and bus id, a slow link by its two
    GPU indexes, then the counts; ``--all`` lists every GPU and node."""
    inv, _ = fleet32
    four = "node001,node003,node007,node020"
    proc = _fleetops("validate", "-i", inv, "--no-history", "--limit", four)
    assert proc.returncode == EXIT_CRIT, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["HOST", "GPU", "STATUS", "FINDINGS"]
    rows = [line.split(None, 4) for line in lines[1:-2]]
    states = {name: sim.read_state(os.path.join(os.path.dirname(inv), "state", f"{name}.json")) for name in
              ("node003", "node020")}
    bus = {name: [g["bus_id"] for g in st["gpus"]] for name, st in states.items()}
    assert [r[:4] for r in rows] == [
        ["node003", "1", bus["node003"][1], "warn"],
        ["node020", "0", bus["node020"][0], "crit"],
        ["node007", "(node:", "P2P,", "NCCL)"],
    ]
    assert rows[0][4].startswith("hbm_copy_gbps: straggler") and "d2h_gbps" in rows[1][4]
    node_row = lines[3]
    assert "p2p_gbps GPU 2->GPU 5: straggler" in node_row and "p2p_gbps GPU 5->GPU 2: straggler" in node_row
    assert "GPU-" not in node_row  # indexes, not UUIDs
    assert lines[-2] == (
        "32 GPUs: 30 ok, 1 warn, 1 crit, 0 unknown; 4 nodes' P2P and all_reduce: 3 ok, 1 warn, 0 crit, 0 unknown; "
        "0 nodes without a result"
    )
    every = _fleetops("validate", "-i", inv, "--no-history", "--limit", four, "--all")
    assert every.returncode == EXIT_CRIT, every.stderr
    body = every.stdout.splitlines()[1:-1]
    assert len(body) == 4 * 8 + 4
    statuses = [(p[4] if p[1] == "(node:" else p[3]) for p in (line.split() for line in body)]
    assert {s: statuses.count(s) for s in set(statuses)} == {"ok": 30 + 3, "warn": 2, "crit": 1}


def test_validate_results_are_stored_and_history_shows_them(fleet32: tuple[str, dict[str, str]],
                                                            tmp_path: Path) -> None:
    inv, expected = fleet32
    db = str(tmp_path / "history.db")
    proc = _fleetops("validate", "-i", inv, "--format", "json", "--db", db, "--limit", "node001,node002,node003,node004,node005,node020")
    assert proc.returncode == EXIT_CRIT, proc.stderr
    run_id = json.loads(proc.stdout)["history_run"]
    assert isinstance(run_id, int)

    hist = _fleetops("history", "--kind", "validate", "--db", db, "--format", "json")
    assert hist.returncode == 0, hist.stderr
    runs = json.loads(hist.stdout)
    assert [r["id"] for r in runs] == [run_id]
    run = runs[0]
    assert (run["level"], run["status"], run["exit_code"]) == ("quick", "crit", EXIT_CRIT)
    assert run["summary"]["gpus_by_status"] == {"ok": 46, "warn": 1, "crit": 1, "unknown": 0}
    gpus = run["gpus"]
    assert len(gpus) == 6 * 8
    assert {g["node"] for g in gpus} == {"node001", "node002", "node003", "node004", "node005", "node020"}
    by_status = {g["gpu_uuid"]: g["status"] for g in gpus if g["status"] != "ok"}
    assert by_status == {u: {"slow-hbm": "warn", "slow-pcie": "crit"}[f] for u, f in expected.items()
                         if f != "slow-gemm"}
    for g in gpus:
        # provenance and expiry travel with every stored result: a quick result lasts 7 days
        assert g["result"]["provenance"]["backend"] == "sim"
        assert g["expires"] == pytest.approx(g["started_at"] + 7 * 86400)
        assert g["bus_id"] and g["gpu_index"] in range(8) and g["model"] == "H200 SXM"
        assert set(g["result"]["tests"]) >= {"hbm_triad_gbps", "h2d_gbps"}
    crit = next(g for g in gpus if g["status"] == "crit")
    assert (crit["node"], crit["gpu_index"]) == ("node020", 0)
    assert {f["metric"] for f in crit["result"]["findings"]} == {"h2d_gbps", "d2h_gbps"}

    # the node filter keeps only that node's GPUs, and the text form names the failed GPU
    one = json.loads(_fleetops("history", "--kind", "validate", "--db", db, "--format", "json", "node003").stdout)
    assert {g["node"] for g in one[0]["gpus"]} == {"node003"}
    text = _fleetops("history", "--kind", "validate", "--db", db)
    assert text.returncode == 0, text.stderr
    crit_lines = [line for line in text.stdout.splitlines() if line.strip().startswith("[crit]")]
    assert len(crit_lines) == 1
    assert f"node020 GPU0 {crit['gpu_uuid']} measured" in crit_lines[0]
    assert "h2d_gbps:" in crit_lines[0] and "expires" in crit_lines[0]
    # an audit history left alone: no audits recorded by validate
    audits = _fleetops("history", "--db", db, "--format", "json")
    assert json.loads(audits.stdout) == []


def test_audit_reports_missing_expired_and_failed_validations(fleet32: tuple[str, dict[str, str]],
                                                              tmp_path: Path) -> None:
    import sqlite3

    inv, expected = fleet32
    db = str(tmp_path / "history.db")
    validated = "node001,node002,node003,node020"
    proc = _fleetops("validate", "-i", inv, "--format", "json", "--db", db, "--limit", validated)
    assert proc.returncode == EXIT_CRIT, proc.stderr
    # node001's results are made 10 days old (past the quick level's 7-day expiry)
    con = sqlite3.connect(db)
    con.execute("UPDATE validations SET started_at = started_at - 864000, expires = expires - 864000 "
                "WHERE node = 'node001'")
    con.commit()
    con.close()
    baseline = tmp_path / "baseline.yml"
    baseline.write_text("validation:\n  require: quick\n", encoding="utf-8")

    def validation_findings(base: Path | None) -> dict[tuple[str, int], tuple[str, str, dict[str, object]]]:
        argv = ["audit", "-i", inv, "--db", db, "--format", "json", "--limit", validated + ",node004", "--fresh"]
        if base is not None:
            argv += ["--baseline", str(base)]
        run = _fleetops(*argv)
        assert run.returncode in (0, 1, 2), run.stderr
        doc = json.loads(run.stdout)
        return {(f["node"], f["gpu"]["index"]): (f["check"], f["severity"], f) for f in doc["findings"]
                if f["check"].startswith("validation.")}

    found = validation_findings(baseline)
    uuid_of = {fault: uuid for uuid, fault in expected.items()}
    got = {k: v[:2] for k, v in found.items()}
    assert got == {
        **{("node001", i): ("validation.expired", "warn") for i in range(8)},
        **{("node004", i): ("validation.missing", "warn") for i in range(8)},
        ("node003", 1): ("validation.failed", "warn"),
        ("node020", 0): ("validation.failed", "crit"),
    }
    crit = found[("node020", 0)][2]
    assert crit["gpu"]["uuid"] == uuid_of["slow-pcie"]
    assert "measured" in crit["message"] and "expires" in crit["message"] and "h2d_gbps" in crit["message"]
    assert found[("node003", 1)][2]["gpu"]["uuid"] == uuid_of["slow-hbm"]
    assert "expired" in found[("node001", 0)][2]["message"]
    # the same fleet without a requirement: no validation findings at all
    assert validation_findings(None) == {}
