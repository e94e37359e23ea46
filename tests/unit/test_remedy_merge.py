"""remediate plans from each node's newest result across the recorded audits, within the age
limit: a real history database in a temporary file, audits of different ages and scopes."""

from __future__ import annotations

import io
import json
import sys
import time

import pytest

from fleetops import checks, cli, model
from fleetops.agent.collect import collect
from fleetops.checks import verdict
from fleetops.fleet import audit
from fleetops.fleet.store.database import Store
from fleetops.ops import frontend, remediate
from fleetops.sim import gpu as sim


@pytest.fixture
def now() -> float:
    """The time the test runs (not the time the module was imported: a whole suite takes
    minutes, and the ages below are measured against the clock the command reads)."""
    return time.time()


def record(db, started_at, nodes):
    """One audit: ``nodes`` maps a node to the simulator faults it had, or to "timeout" (hung)."""
    results, found = [], []
    for name, faults in nodes.items():
        if faults == "timeout":
            results.append(verdict.NodeResult(name, False, "timed out", None, 30.0))
            found.append(
                model.Finding(
                    check="transport.timeout",
                    severity="unknown",
                    node=name,
                    message="no answer within 30s",
                    observed="timeout",
                    expected="snapshot",
                )
            )
            continue
        path = db.parent / f"{name}-{started_at}.json"
        sim.init_state(str(path), name, {"faults": faults})
        snap = collect("sim", str(path))
        results.append(verdict.NodeResult(name, True, None, snap, 0.1))
        found += checks.run_node_checks(snap)
    result = audit.AuditResult(started_at=started_at, duration_s=1.0, nodes=results, findings=found)
    with Store(str(db)) as store:
        return store.record(result, verdict.exit_code(found))


@pytest.fixture
def history(tmp_path, now):
    db = tmp_path / "history.db"
    ids = {
        "old": record(db, now - 7200, {"node001": ["ecc-dbe@1"], "node002": ["ecc-dbe@2"]}),
        "limited": record(db, now - 120, {"node001": []}),  # an audit --limit node001
        "hung": record(db, now - 60, {"node003": "timeout"}),
    }
    return db, ids


def test_latest_results_is_each_nodes_newest_result_whatever_its_age(history, now):
    db, ids = history
    with Store(str(db)) as store:
        latest = store.latest_results(["node001", "node002", "node003", "node004"])
    assert {n: r.audit_id for n, r in latest.items()} == {
        "node001": ids["limited"],
        "node002": ids["old"],
        "node003": ids["hung"],
    }
    assert latest["node003"].reachable is False and latest["node003"].error == "timed out"
    assert latest["node002"].started_at == pytest.approx(now - 7200)


def test_coverage_sorts_nodes_by_the_age_of_their_newest_result(history, now):
    db, ids = history
    with Store(str(db)) as store:
        latest = store.latest_results(["node001", "node002", "node003", "node004"])
    cov = remediate.coverage(latest, ["node001", "node002", "node003", "node004"], 900, "15m", now=now)
    assert sorted(cov.recent) == ["node001", "node003"] and cov.audit_ids == sorted(
        [ids["limited"], ids["hung"]]
    )
    assert list(cov.stale) == ["node002"] and cov.never == ("node004",)
    assert cov.unplanned == {
        "node002": f"last result audit #{ids['old']}, 2.0 h ago",
        "node004": "never audited",
    }
    assert not cov.ok
    (problem,) = cov.problems()
    assert "2 node(s) have no audit within 15m" in problem and "node004 (never audited)" in problem
    wider = remediate.coverage(latest, ["node001", "node002", "node003"], 3 * 3600, "3h", now=now)
    assert sorted(wider.recent) == ["node001", "node002", "node003"] and wider.ok


@pytest.fixture
def no_ssh(monkeypatch):
    calls = []

    def refuse(args, host, argv, timeout):
        calls.append(argv)
        raise AssertionError(f"remediate asked {host.name} something: {argv}")

    monkeypatch.setattr(frontend, "run_once", refuse)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    return calls


def test_the_plan_merges_audits_and_names_every_node_it_has_no_recent_result_for(history, capsys, no_ssh):
    db, ids = history
    code = cli.main(
        ["remediate", "-i", "node001,node002,node003,node004,", "--db", str(db), "--format", "json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # nodes without a recent result: a warning, never "all clear"
    nodes = {n["node"]: n for n in doc["plan"]["nodes"]}
    # node001's ECC error is from the old audit: its newest result (the --limit audit) is clean
    assert "node001" not in nodes and "node002" not in nodes
    assert nodes["node003"]["blocked"] == "hung"
    assert doc["source"]["missing"] == ["node002", "node004"]
    assert doc["source"]["nodes"]["node001"]["audit_id"] == ids["limited"]
    assert doc["plan"]["unaudited"]["node004"] == "never audited"


def test_a_limited_audit_is_not_taken_for_the_fleet(tmp_path, capsys, no_ssh, now):
    db = tmp_path / "history.db"
    old = record(db, now - 3600, {"node001": [], "node002": ["xid:79@5"]})
    record(db, now - 30, {"node001": []})
    code = cli.main(["remediate", "-i", "node001,node002,", "--db", str(db)])
    out = capsys.readouterr().out
    assert code == 1
    assert "Nothing to do" not in out
    assert (
        f"No finding in the results for 1 node(s); 1 node(s) have no audit within 15m: "
        f"node002 (last result audit #{old}, 60 min ago)"
    ) in out
    assert "WARNING: 1 node(s) have no audit within 15m (--max-audit-age)" in out


def test_yes_is_refused_while_any_node_has_no_recent_result_and_names_them(history, capsys, no_ssh):
    db, _ = history
    code = cli.main(["remediate", "-i", "node001,node002,node003,node004,", "--db", str(db), "--yes"])
    err = capsys.readouterr().err
    assert code == 1 and no_ssh == []
    assert "refusing --yes: 2 node(s) have no audit within 15m" in err
    assert "node002 (last result audit #1, 2.0 h ago), node004 (never audited)" in err
    assert (
        "fleetops audit -i INVENTORY --limit node002,node004" in err and "Nothing was reset or drained" in err
    )


def test_within_a_wider_limit_the_older_result_is_planned(history, capsys, no_ssh):
    db, _ = history
    code = cli.main(["remediate", "-i", "node001,node002,node003,", "--db", str(db), "--max-audit-age", "3h"])
    out = capsys.readouterr().out
    assert code == 0
    assert "node002: GPU actions only" in out and "GPU resets: 1 (node002)" in out
    assert "node003: cannot plan: hung (transport.timeout: no answer within 30s)" in out
    assert "Cannot plan: node003 (hung)" in out
