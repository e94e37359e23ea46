"""fleetops audit over real SSH against a simulated fleet: faults land on the right node and GPU."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from expected_faults import EXPECTED, NEEDS_PREVIOUS, NODE_LEVEL

from fleetops.fleet.store.layout import LAYOUT_VERSION
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root]

NODES = 6
CLI = [sys.executable, "-m", "fleetops.cli"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASELINE = os.path.join(REPO, "examples", "baseline.yml")
FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")


def _can_run_fleet() -> str | None:
    if os.geteuid() != 0:
        return "needs root to start sshd"
    from fleetops.sim import fleet

    if not fleet.find_sshd():
        return "sshd not installed (apt-get install -y openssh-server)"
    return None


@pytest.fixture(scope="module")
def simfleet(tmp_path_factory):
    reason = _can_run_fleet()
    if reason:
        pytest.skip(reason)
    from fleetops.sim import fleet

    d = str(tmp_path_factory.mktemp("auditfleet"))
    with socket.socket() as sock:  # a port free at this address now: parallel runs do not collide
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    fleet.up(NODES, d, first_address=FIRST_ADDRESS, port=port)
    yield d
    fleet.down(d)


def audit(d, *extra, db=None):
    args = [*CLI, "audit", "-i", os.path.join(d, "inventory.yml"), "--format", "json", "-q"]
    args += ["--db", db] if db else ["--no-history"]
    args += ["--connect-timeout", "2", "--timeout", "10", *extra]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc.returncode, doc, proc.stderr


def gpu_uuid(d, node, index):
    return sim.read_state(os.path.join(d, "state", f"{node}.json"))["gpus"][index]["uuid"]


def test_clean_fleet_exits_0_with_no_warn_or_crit(simfleet):
    rc, doc, err = audit(simfleet, "--baseline", BASELINE)
    assert doc is not None, err
    bad = [f for f in doc["findings"] if f["severity"] in ("warn", "crit", "unknown")]
    assert bad == [] and rc == 0
    assert doc["summary"]["nodes"] == NODES and doc["summary"]["gpus"] == NODES * 8
    assert all(n["reachable"] and n["snapshot"]["gpu_count"] == 8 for n in doc["nodes"])


# fault -> the GPU it is injected on, and a word the action of its findings must contain.
# The severities are the unit table's (tests/expected_faults.py), not the checks' own answer.
FAULTS = {
    "ecc-dbe": (2, "reset"),
    "ecc-sbe-storm": (1, ""),
    "row-remap-pending": (3, "reset"),
    "row-remap-failure": (4, ""),
    "pcie-downgrade": (5, ""),
    "nvlink-down": (6, ""),
    "thermal-slowdown": (7, ""),
    "power-brake": (0, ""),
    "power-cap-drift": (1, "power"),
    "persistence-off": (2, ""),
    "vbios-drift": (3, ""),
    "stray-process": (4, ""),
    "mig-drift": (5, ""),
    "xid:48": (6, ""),
    "xid:94": (7, ""),
    "xid:13": (0, ""),
    # the HCA beside the GPU (mlx5_N); a flap is audited within its first 30 s, while the port is down
    "ib-port-down": (3, "transceiver"),
    "ib-degraded": (6, "transceiver"),
    "ib-flap": (1, "transceiver"),
    "ib-fw-drift": (2, "firmware"),
    "ib-missing-hca": (5, "lspci"),
}


def expected_serious(fault: str) -> dict[str, str]:
    """The unit table's warn/crit findings less the rate checks: ``--no-history`` gives the
    audit no previous snapshot to take a rate from."""
    return {c: s for c, s in EXPECTED[fault].items() if c not in NEEDS_PREVIOUS}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_found_on_the_right_node_and_gpu(simfleet, fault):
    from fleetops.sim import fleet

    gpu, action_word = FAULTS[fault]
    node = "node003"
    fleet.inject(simfleet, node, fault, gpu)
    try:
        rc, doc, err = audit(simfleet, "--baseline", BASELINE)
    finally:
        fleet.clear(simfleet, node, fault, gpu)
    assert doc is not None, err
    uuid = gpu_uuid(simfleet, node, gpu)
    serious = [f for f in doc["findings"] if f["severity"] in ("warn", "crit")]
    expected = expected_serious(fault)
    assert {f["check"]: f["severity"] for f in serious} == expected, [(f["check"], f["severity"]) for f in serious]
    assert {f["node"] for f in serious} == {node}
    for f in serious:
        want = None if f["check"] in NODE_LEVEL else uuid
        assert (f["gpu"] or {}).get("uuid") == want, f
        assert f["action"], f
    if action_word:
        assert any(action_word in f["action"].lower() for f in serious)
    assert rc == (2 if "crit" in expected.values() else 1), err


def test_gpu_fallen_off_the_bus_is_critical_with_reboot_advice(simfleet):
    from fleetops.sim import fleet

    fleet.inject(simfleet, "node002", "xid:79", 6)
    try:
        rc, doc, _ = audit(simfleet, "--baseline", BASELINE)
    finally:
        fleet.clear(simfleet, "node002", "xid:79", 6)
    assert rc == 2
    node_findings = [f for f in doc["findings"] if f["node"] == "node002" and f["severity"] == "crit"]
    assert {f["check"]: f["severity"] for f in node_findings} == expected_serious("xid:79")
    assert any("reboot" in (f["action"] or "").lower() for f in node_findings)


def test_gpu_missing_is_a_gpu_count_finding(simfleet):
    from fleetops.sim import fleet

    fleet.inject(simfleet, "node004", "gpu-missing", 7)
    try:
        rc, doc, _ = audit(simfleet, "--baseline", BASELINE)
    finally:
        fleet.clear(simfleet, "node004", "gpu-missing", 7)
    assert rc == 2
    serious = [f for f in doc["findings"] if f["severity"] in ("warn", "crit")]
    assert {f["check"]: f["severity"] for f in serious} == expected_serious("gpu-missing")
    hits = [f for f in serious if f["check"] == "config.gpu_count"]
    assert [f["node"] for f in hits] == ["node004"]
    assert hits[0]["observed"] == 7 and hits[0]["expected"] == 8


def test_rates_need_two_audits_and_then_catch_replay_and_crc_storms(simfleet, tmp_path):
    from fleetops.sim import fleet

    db = str(tmp_path / "h.db")
    fleet.inject(simfleet, "node005", "pcie-replay-storm", 2)
    fleet.inject(simfleet, "node005", "nvlink-crc-storm", 3)
    try:
        audit(simfleet, "--baseline", BASELINE, db=db)
        # the storms grow with time; the rate checks refuse intervals under rate_min_interval_s
        time.sleep(11)
        rc, doc, _ = audit(simfleet, "--baseline", BASELINE, db=db)
    finally:
        fleet.clear(simfleet, "node005", "pcie-replay-storm", 2)
        fleet.clear(simfleet, "node005", "nvlink-crc-storm", 3)
    serious = {(f["check"], f["gpu"]["uuid"]): f["severity"] for f in doc["findings"] if f["severity"] in ("warn", "crit")}
    assert serious == {
        ("pcie.replay_rate", gpu_uuid(simfleet, "node005", 2)): EXPECTED["pcie-replay-storm"]["pcie.replay_rate"],
        ("nvlink.error_rate", gpu_uuid(simfleet, "node005", 3)): EXPECTED["nvlink-crc-storm"]["nvlink.error_rate"],
    }
    assert rc == 1


def test_drift_without_baseline_names_the_minority_nodes(simfleet):
    from fleetops.sim import fleet

    fleet.inject(simfleet, "node006", "driver-drift")
    try:
        rc, doc, _ = audit(simfleet)
    finally:
        fleet.clear(simfleet, "node006", "driver-drift")
    drift = [f for f in doc["findings"] if f["check"].startswith("versions.") and f["severity"] in ("warn", "crit")]
    assert drift, [(f["node"], f["check"], f["message"]) for f in doc["findings"]]
    assert {f["node"] for f in drift} == {"node006"}
    assert {f["check"]: f["severity"] for f in drift} == EXPECTED["driver-drift"]
    assert any("570.133.20" in json.dumps(f["observed"]) for f in drift)
    assert rc == 2  # the fabric manager no longer matches the driver: crit


def test_host_down_and_host_hang_are_reported_within_the_timeout(simfleet):
    from fleetops.sim import fleet

    fleet.inject(simfleet, "node001", "host-down")
    fleet.inject(simfleet, "node002", "host-hang")
    try:
        rc, doc, _ = audit(simfleet, "--baseline", BASELINE)
    finally:
        fleet.clear(simfleet, "node001", "host-down")
        fleet.clear(simfleet, "node002", "host-hang")
    # The audit came back (without its timeouts the hung host would hold it until the test's
    # subprocess.run gives up) and says which timeout cut the hung host off, with its figure.
    by_node = {n["name"]: n for n in doc["nodes"]}
    assert not by_node["node001"]["reachable"] and "unreachable" in by_node["node001"]["error"]
    assert not by_node["node002"]["reachable"] and "timeout" in by_node["node002"]["error"]
    assert re.fullmatch(r"timeout: 127\.[0-9.]+:[0-9]+: no SSH banner/handshake within 2s "
                        r"\(host accepts TCP but does not answer\)", by_node["node002"]["error"])
    assert all(by_node[f"node00{i}"]["snapshot"] for i in range(3, NODES + 1))
    unknown = {f["node"]: f for f in doc["findings"] if f["severity"] == "unknown"}
    assert set(unknown) == {"node001", "node002"}
    assert rc == 3


def test_history_records_each_audit_and_tells_new_and_resolved(simfleet, tmp_path):
    from fleetops.sim import fleet

    db = str(tmp_path / "hist.db")
    fleet.inject(simfleet, "node003", "ecc-dbe", 1)
    try:
        rc1, _, _ = audit(simfleet, "--baseline", BASELINE, db=db)
    finally:
        fleet.clear(simfleet, "node003", "ecc-dbe", 1)
    rc2, _, _ = audit(simfleet, "--baseline", BASELINE, db=db)
    assert (rc1, rc2) == (2, 0)
    out = subprocess.run([*CLI, "history", "--db", db, "--format", "json"], capture_output=True, text=True, check=False)
    rows = json.loads(out.stdout)
    assert len(rows) == 2
    latest, first = rows
    assert {f["check"]: f["severity"] for f in latest["resolved"]} == EXPECTED["ecc-dbe"] and not latest["new"]
    assert {f["check"]: f["severity"] for f in first["new"]} == EXPECTED["ecc-dbe"]
    assert all(f["node"] == "node003" for f in first["new"])
    text = subprocess.run([*CLI, "history", "node003", "--db", db], capture_output=True, text=True, check=False).stdout
    assert f"new 0, resolved {len(EXPECTED['ecc-dbe'])}, persisting 0" in text, text
    assert "- [crit] node003 GPU1" in text, text


def test_bad_inputs_exit_4_and_write_no_history(simfleet, tmp_path):
    db = str(tmp_path / "none.db")
    inv = os.path.join(simfleet, "inventory.yml")
    bad_baseline = tmp_path / "bad.yml"
    bad_baseline.write_text("driver_version: '580.159.04'\npower_limt_w: 700\n")
    bad_inventory = tmp_path / "bad.ini"
    bad_inventory.write_text("[gpu\nnode1 ansible_host=127.0.20.1\n")
    cases = [
        (["-i", inv, "--baseline", str(bad_baseline)], ["bad.yml", "power_limt_w", ":2"]),
        (["-i", str(bad_inventory)], ["bad.ini"]),
        (["-i", inv, "--limit", "nosuchhost*"], ["nosuchhost"]),
        (["-i", str(tmp_path / "missing.yml")], ["missing.yml"]),
    ]
    for args, words in cases:
        proc = subprocess.run([*CLI, "audit", *args, "--db", db, "-q"], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 4, (args, proc.stderr)
        for word in words:
            assert word in proc.stderr, (word, proc.stderr)
    if os.path.exists(db):
        assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM audits").fetchone()[0] == 0


@pytest.mark.parametrize("fmt", ["junit", "prom", "table"])
def test_other_formats_render_the_same_audit(simfleet, fmt, tmp_path):
    from fleetops.sim import fleet

    out = tmp_path / f"report.{fmt}"
    fleet.inject(simfleet, "node003", "ecc-dbe", 2)
    try:
        proc = subprocess.run(
            [*CLI, "audit", "-i", os.path.join(simfleet, "inventory.yml"), "--baseline", BASELINE,
             "--format", fmt, "-o", str(out), "--no-history", "-q"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    finally:
        fleet.clear(simfleet, "node003", "ecc-dbe", 2)
    assert proc.returncode == 2, proc.stderr
    text = out.read_text()
    uuid = gpu_uuid(simfleet, "node003", 2)
    if fmt == "junit":
        import xml.etree.ElementTree as ET

        root = ET.fromstring(text)
        suites = {s.get("name"): s for s in root.iter("testsuite")}
        assert set(suites) == {f"node00{i}" for i in range(1, NODES + 1)}
        assert int(suites["node003"].get("failures")) >= 1 and suites["node001"].get("failures") == "0"
        assert uuid in text
    elif fmt == "prom":
        assert 'fleetops_node_health{node="node003"} 3' in text
        assert 'fleetops_node_health{node="node001"} 0' in text
        assert f'fleetops_gpu_ecc_uncorrected_volatile_errors{{node="node003",gpu="2",uuid="{uuid}",bus_id="0000:3a:00.0"}} 2' in text
    else:
        assert "node003" in text and "CRITICAL" in text and uuid in text


# The first release's history layout, as it created it.
FIRST_LAYOUT = (Path(__file__).parent.parent / "fixtures" / "history_layout1.sql").read_text()


def _as_first_release_db(current: str, old: str, age_s: dict[int, float]) -> None:
    """Copy a history database into the first release's layout; audit i is made age_s[i] old."""
    import sqlite3
    import zlib

    src, dst = sqlite3.connect(current), sqlite3.connect(old)
    dst.executescript(FIRST_LAYOUT)
    now = time.time()
    for aid, _started, duration, inv, worst, code, summary in src.execute("SELECT * FROM audits ORDER BY id"):
        dst.execute("INSERT INTO audits VALUES (?,?,?,?,?,?,?)", (aid, now - age_s[aid], duration, inv, worst, code, summary))
    for aid, node, reachable, error, collected, blob in src.execute(
        "SELECT audit_id, node, reachable, error, collected_at, snapshot FROM snapshots"
    ):
        text = zlib.decompress(blob).decode() if blob is not None else None
        dst.execute("INSERT INTO snapshots VALUES (?,?,?,?,?,?)", (aid, node, reachable, error, collected, text))
    for row in src.execute("SELECT * FROM findings"):
        dst.execute("INSERT INTO findings VALUES (?,?,?,?,?)", row)
    dst.commit()
    src.close()
    dst.close()


def test_a_first_release_history_migrates_keeps_its_rate_baseline_and_is_pruned_by_keep(simfleet, tmp_path):
    """An upgrade keeps the history: the first release's database is migrated by the next
    audit, whose rate checks still find a replay storm against the snapshot recorded before the
    upgrade; audits older than --keep go, with their rows."""
    import sqlite3

    from fleetops.sim import fleet

    current, old = str(tmp_path / "current.db"), str(tmp_path / "old.db")
    fleet.inject(simfleet, "node004", "pcie-replay-storm", 2)
    try:
        audit(simfleet, "--baseline", BASELINE, db=current)
        audit(simfleet, "--baseline", BASELINE, db=current)
        _as_first_release_db(current, old, {1: 40 * 86400.0, 2: 11.0})
        time.sleep(11)  # the rate checks refuse intervals under rate_min_interval_s
        rc, doc, err = audit(simfleet, "--baseline", BASELINE, "--keep", "30d", db=old)
    finally:
        fleet.clear(simfleet, "node004", "pcie-replay-storm", 2)
    assert doc is not None, err
    serious = {(f["check"], f["gpu"]["uuid"]): f["severity"] for f in doc["findings"] if f["severity"] in ("warn", "crit")}
    assert serious == {
        ("pcie.replay_rate", gpu_uuid(simfleet, "node004", 2)): EXPECTED["pcie-replay-storm"]["pcie.replay_rate"]
    }
    assert rc == 1
    db = sqlite3.connect(old)
    assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    assert [r[0] for r in db.execute("SELECT id FROM audits ORDER BY id")] == [2, 3]  # the 40-day-old one is gone
    assert db.execute("SELECT COUNT(*) FROM snapshots WHERE audit_id = 1").fetchone()[0] == 0
    assert {type(r[0]) for r in db.execute("SELECT snapshot FROM snapshots WHERE snapshot IS NOT NULL")} == {bytes}
    db.close()
    proc = subprocess.run([*CLI, "history", "--db", old, "--format", "json"], capture_output=True, text=True, check=False)
    assert [row["id"] for row in json.loads(proc.stdout)] == [3, 2]
