"""``fleetops history NODE`` on a real history database: a node no audit has seen is an error
(exit 4, the node and the database named), a known node with nothing in the window is not."""

from __future__ import annotations

import time

from fleetops import cli
from fleetops.common.errors import EXIT_USAGE
from fleetops.fleet import audit
from fleetops.fleet.store.database import Store


def _audit(db: str, node: str, started_at: float) -> None:
    result = audit.AuditResult(
        started_at=started_at, duration_s=1.0, nodes=[audit.NodeResult(node, False, "timed out", None, 30.0)],
        findings=[],
    )  # fmt: skip
    with Store(db) as store:
        store.record(result, 0)


def test_a_node_no_audit_has_seen_is_a_usage_error(tmp_path, capsys) -> None:
    db = str(tmp_path / "history.db")
    _audit(db, "node001", time.time() - 60)
    assert cli.main(["history", "node999", "--db", db]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"fleetops: error: node999: in no audit recorded in {db} (check the name, or --db)\n"


def test_a_known_node_with_nothing_in_the_window_is_not_an_error(tmp_path, capsys) -> None:
    db = str(tmp_path / "history.db")
    _audit(db, "node001", time.time() - 3 * 86400)
    assert cli.main(["history", "node001", "--db", db, "--since", "1h"]) == 0
    assert capsys.readouterr().out == f"no audits recorded for node001 in {db}\n"
    assert cli.main(["history", "node001", "--db", db]) == 0
    assert capsys.readouterr().out.startswith("#1 ")
