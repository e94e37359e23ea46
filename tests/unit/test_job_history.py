"""``fleetops job``'s reading of the history store (``job_cli/stored.py``): on a real store written
through ``Store.record``, the faults the audits found during the job on its GPUs and nodes, one
entry per finding across audits, the actions and drains in its span; a missing store is a note,
an unreadable one a warning that leaves the diagnosis and its exit code as they were; a job no
node holds any more is told from the findings that name it.

The job 4242 ran on node001's GPU-a from T0 to T0 + 3600; node001 also has GPU-b; audits run
every 10 minutes from T0 - 1200."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pytest

from fleetops import cli, model
from fleetops.common.errors import EXIT_OK, EXIT_USAGE, EXIT_WARN
from fleetops.fleet import audit, transport
from fleetops.fleet.store.database import Store
from fleetops.fleet.store.rows import ActionRow, DrainRow
from fleetops.job_cli import render, stored

T0 = 1796578000.0
END = T0 + 3600.0
GPU_A = {"index": 0, "uuid": "GPU-a", "bus_id": "00000000:18:00.0"}
GPU_B = {"index": 1, "uuid": "GPU-b", "bus_id": "00000000:2A:00.0"}
SCOPE = stored.Scope("4242", T0, END, frozenset({"node001"}), frozenset({"GPU-a"}))


def _finding(check: str, gpu: dict[str, Any] | None, severity: str = "warn", node: str = "node001",
             jobs: list[str] | None = None, message: str = "") -> model.Finding:
    return model.Finding(check=check, severity=severity, node=node, message=message or f"{check} on {node}",
                         gpu=gpu, jobs=jobs)


def _record(db: str, started_at: float, findings: list[model.Finding]) -> int:
    nodes = sorted({f.node for f in findings} | {"node001"})
    result = audit.AuditResult(started_at=started_at, duration_s=1.0,
                               nodes=[audit.NodeResult(n, False, "timed out", None, 30.0) for n in nodes],
                               findings=findings)
    with Store(db, keep_s=None) as store:
        return store.record(result, 1)


def _ids(section: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(e["node"], e["check"], (e["gpu"] or {}).get("uuid")) for e in section["findings"]]


def test_a_finding_on_the_jobs_gpu_counts_inside_the_span_only(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    _record(db, T0 - 600.0, [_finding("ecc_sram", GPU_A, message="before the job")])
    _record(db, T0 + 600.0, [_finding("thermal", GPU_A)])
    _record(db, END + 600.0, [_finding("power_cap", GPU_A, message="after the job")])
    got = stored.section(db, "4242", SCOPE)
    assert got["error"] is None
    assert got["span"] == [T0, END]
    assert _ids(got) == [("node001", "thermal", "GPU-a")]
    assert got["findings"][0]["first_seen"] == T0 + 600.0


def test_the_store_reads_the_findings_of_the_audits_started_in_the_span(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    for at in (T0 - 600.0, T0, END, END + 600.0):
        _record(db, at, [_finding("thermal", GPU_A), _finding("thermal", GPU_A, node="node009"),
                         _finding("ok_check", GPU_A, severity="ok")])
    with Store(db) as store:
        got = store.findings_between(T0, END, ["node001"], severities=stored.SEVERITIES)
    assert [(audit_id, at, f.node, f.check) for audit_id, at, f in got] == [
        (2, T0, "node001", "thermal"), (3, END, "node001", "thermal")]


def test_the_merge_itself_keeps_to_the_span_unless_the_finding_names_the_job() -> None:
    rows = [(1, T0 - 600.0, _finding("thermal", GPU_A)), (2, T0 - 600.0, _finding("xid", GPU_A, jobs=["4242"]))]
    assert [e["check"] for e in stored.merge(rows, SCOPE)] == ["xid"]


def test_another_gpu_of_the_node_is_left_out_its_node_level_findings_are_not(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    _record(db, T0 + 600.0, [_finding("thermal", GPU_A), _finding("thermal", GPU_B), _finding("nic_down", None),
                             _finding("thermal", GPU_A, node="node009")])
    assert _ids(stored.section(db, "4242", SCOPE)) == [("node001", "nic_down", None), ("node001", "thermal", "GPU-a")]


def test_the_same_finding_in_several_audits_is_one_entry_with_its_first_and_last_audit(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    ids = [_record(db, T0 + 600.0 * k, [_finding("thermal", GPU_A, severity="crit" if k == 2 else "warn",
                                                 message=f"hot, audit {k}")]) for k in (1, 2, 3)]
    [entry] = stored.section(db, "4242", SCOPE)["findings"]
    assert (entry["audits"], entry["first_audit"], entry["last_audit"]) == (3, ids[0], ids[2])
    assert (entry["first_seen"], entry["last_seen"]) == (T0 + 600.0, T0 + 1800.0)
    assert (entry["severity"], entry["message"]) == ("crit", "hot, audit 3")  # worst seen, latest words
    line = render.history_lines(stored.section(db, "4242", SCOPE))[1]
    assert line == (f"  [crit] node001 GPU 0 GPU-a thermal: hot, audit 3 (3 audits, #{ids[0]} 2026-12-06 17:36:40 UTC "
                    f".. #{ids[2]} 2026-12-06 17:56:40 UTC)")


def test_an_xid_naming_the_job_counts_though_an_audit_after_its_end_saw_it(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    _record(db, END + 1800.0, [_finding("xid", GPU_A, severity="crit", jobs=["4242"]),
                               _finding("xid", GPU_B, severity="crit", jobs=["14242", "42"])])
    [entry] = stored.section(db, "4242", SCOPE)["findings"]
    assert (entry["check"], entry["names_job"], entry["last_seen"]) == ("xid", True, END + 1800.0)


def test_actions_and_drains_on_the_jobs_node_and_gpu_in_its_span(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    _record(db, T0 + 600.0, [])
    with Store(db, keep_s=None) as store:
        store.record_action(ActionRow(T0 + 700.0, "node001", "reset", "verified", "GPU-a reset", gpu="GPU-a"))
        store.record_action(ActionRow(T0 + 710.0, "node001", "reset", "sent", "other GPU", gpu="GPU-b"))
        store.record_action(ActionRow(T0 + 720.0, "node002", "drain", "sent", "other node"))
        store.record_action(ActionRow(END + 60.0, "node001", "resume", "sent", "after the job"))
        store.record_drain(DrainRow(at=T0 + 800.0, node="node001", action="drain", kind="remediate", run="r1",
                                    outcome="done", message="drained", source="remediate", purpose="xid 79"))
    got = stored.section(db, "4242", SCOPE)["actions"]
    assert [(a["at"], a["action"], a["gpu"], a["why"]) for a in got] == [
        (T0 + 700.0, "reset", "GPU-a", "GPU-a reset"), (T0 + 800.0, "drain", None, "xid 79")]
    assert got[1]["source"] == "remediate (remediate/r1)"


def test_a_missing_store_is_a_note_and_no_file_is_made(tmp_path) -> None:
    db = str(tmp_path / "nothing" / "history.db")
    got = stored.section(db, "4242", SCOPE)
    assert (got["error"], got["note"], got["findings"]) == (None, f"no history database at {db}", [])
    assert not os.path.exists(db)
    assert render.history_lines(got) == [f"HISTORY  no history database at {db}"]


def test_an_unreadable_store_is_an_error_naming_the_file(tmp_path) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(b"this is not an SQLite database, only text" * 100)
    got = stored.section(str(db), "4242", SCOPE)
    assert got["error"] is not None
    assert got["error"].startswith(f"{db}: ")
    assert got["findings"] == []


# --- through the command, the nodes stubbed at the transport ------------------------------------

def _show(node: str) -> dict[str, Any]:
    ts = [T0 + 2.0 * (k + 1) for k in range(30)]
    return {"kind": "fleetops.job-show/v1", "node": node, "now": END + 10.0,
            "job": {"job_id": "4242", "started_at": T0, "ended_at": END, "user": "alice"},
            "gpus": [{"uuid": "GPU-a", "index": 0, "facts": {"pcie_gen": 5, "pcie_width": 16},
                      "series": {"utilization_gpu_pct": [[t, 95.0] for t in ts]}}],
            "xids": [], "cpu": {}, "notes": []}


@pytest.fixture
def nodes(tmp_path, monkeypatch) -> dict[str, dict[str, Any] | None]:
    """node -> the job's document it answers (None: no such job there); node001 holds it."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("node001\nnode002\n")
    monkeypatch.setenv("FLEETOPS_INVENTORY", str(inventory))
    answers: dict[str, dict[str, Any] | None] = {"node001": _show("node001"), "node002": None}

    def run_all(hosts: list[Any], argv: list[str], **_: Any) -> dict[str, Any]:
        out = {}
        for h in hosts:
            doc = answers[h.name]
            absent = {"kind": "fleetops.job-absent/v1", "job_id": argv[-1], "dir": "/run/fleetops/jobs"}
            out[h.name] = SimpleNamespace(ok=doc is not None, exit_status=0 if doc is not None else 3,
                                          stdout=json.dumps(doc if doc is not None else absent), stderr="",
                                          error_kind=None, error=None)
        return out

    monkeypatch.setattr(transport, "run_all", run_all)
    return answers


def test_the_report_adds_the_history_section_and_the_json_its_history_key(tmp_path, nodes, capsys) -> None:
    db = str(tmp_path / "history.db")
    _record(db, T0 + 600.0, [_finding("thermal", GPU_A, message="GPU-a ran hot")])
    assert cli.main(["job", "4242", "--db", db]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"HISTORY  {db}, audits 2026-12-06 17:26:40 UTC .. 2026-12-06 18:26:40 UTC: 1 finding, 0 actions" in out
    assert "  [warn] node001 GPU 0 GPU-a thermal: GPU-a ran hot (audit #1 2026-12-06 17:36:40 UTC)" in out
    assert cli.main(["job", "4242", "--db", db, "--format", "json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "fleetops.job/v1"
    assert (doc["history"]["db"], doc["history"]["error"]) == (db, None)
    assert [e["message"] for e in doc["history"]["findings"]] == ["GPU-a ran hot"]


def test_an_unreadable_store_leaves_the_diagnosis_and_its_exit_code(tmp_path, nodes, capsys) -> None:
    db = tmp_path / "history.db"
    assert cli.main(["job", "4242", "--db", str(db)]) == EXIT_OK  # missing: a note, not an error
    missing = capsys.readouterr()
    assert f"HISTORY  no history database at {db}" in missing.out
    assert missing.err == ""
    db.write_bytes(b"this is not an SQLite database, only text" * 100)
    assert cli.main(["job", "4242", "--db", str(db)]) == EXIT_OK
    broken = capsys.readouterr()
    assert broken.out.startswith("job 4242  user alice  nodes node001  GPUs 1\n")
    assert f"HISTORY  not read: {db}: " in broken.out
    assert broken.err.startswith(f"fleetops: warning: history not read (the diagnosis stands): {db}: ")


def test_a_job_no_node_holds_is_told_from_the_findings_that_name_it(tmp_path, nodes, capsys) -> None:
    nodes["node001"] = None  # rebooted: /run cleared
    db = str(tmp_path / "history.db")
    _record(db, T0 + 600.0, [_finding("thermal", GPU_A, message="hot, no job named")])
    assert cli.main(["job", "4242", "--db", db]) == EXIT_USAGE
    assert capsys.readouterr().out == ""
    _record(db, T0 + 1200.0, [_finding("xid", GPU_A, severity="crit", jobs=["4242"], message="XID 79")])
    _record(db, T0 + 1800.0, [_finding("nic_down", None, message="ib0 down")])
    assert cli.main(["job", "4242", "--db", db]) == EXIT_WARN
    got = capsys.readouterr()
    assert got.out.startswith("job 4242: no node holds its record any more; what the history store knows of it\n")
    assert "  [crit] node001 GPU 0 GPU-a xid: XID 79 (audit #2 2026-12-06 17:46:40 UTC, names the job)" in got.out
    assert "ib0 down" not in got.out  # after the last audit naming the job: outside what is known of it
    assert "hot, no job named" not in got.out  # before it
    assert "no node holds a record of it any more, but 1 finding in the history name it" in got.err
    assert cli.main(["job", "4242", "--db", db, "--format", "json"]) == EXIT_WARN
    doc = json.loads(capsys.readouterr().out)
    assert (doc["found"], doc["exit_code"]) == (False, EXIT_WARN)
    assert [e["check"] for e in doc["history"]["findings"]] == ["xid"]


def test_stored_findings_set_the_exit_code_only_of_a_job_no_node_holds() -> None:
    from fleetops.job_cli import exit_code

    assert exit_code(False, 0, 0, stored=2) == EXIT_WARN
    assert exit_code(False, 0, 0, stored=0) == EXIT_USAGE
    assert exit_code(False, 0, 1, stored=2) == 3  # an unreachable node still outranks
    assert exit_code(True, 0, 0, stored=2) == EXIT_OK  # a job a node holds: its diagnosis alone


def test_a_drain_recorded_under_the_slurm_name_counts_for_the_jobs_node(tmp_path) -> None:
    db = str(tmp_path / "history.db")
    _record(db, T0 + 600.0, [])
    with Store(db, keep_s=None) as store:
        store.record_drain(DrainRow(at=T0 + 900.0, node="gpu-n1", slurm_name="node001", action="drain",
                                    kind="operator", run="o1", outcome="done", message="drained", source="cli"))
    got = stored.section(db, "4242", SCOPE)["actions"]
    assert [(a["at"], a["node"], a["action"]) for a in got] == [(T0 + 900.0, "gpu-n1", "drain")]
