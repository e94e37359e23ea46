"""Every drain and resume fleetops makes is recorded in the history with its owner, run and
purpose: the helper reads them from ops.slurm's results (never failing the action), and
``fleetops drain``/``resume`` against the strict stand-in scontrol (tests/fake_scontrol.py) write
rows that ``fleetops history --kind drains`` prints."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import fake_scontrol
import pytest

from fleetops import cli
from fleetops.common.errors import EXIT_OK, EXIT_WARN
from fleetops.fleet.store.database import Store
from fleetops.ops import drain_log, slurm
from fleetops.ops.results import ActionResult

HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu03: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
HEALTH_OWNER = (
    "the health program (run 20261206T031207Z-7c1e-gpu03): memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
)
RUN = slurm.operator_run()


def _result(action: str, outcome: str, **detail: object) -> ActionResult:
    return ActionResult("gpu03", action, outcome, f"gpu03: {action} {outcome}", detail=dict(detail))


def test_a_refused_drain_keeps_the_owners_reason_and_names_the_owner() -> None:
    res = _result(
        "drain",
        "refused",
        slurm_name="gpu03",
        reason=HEALTH,
        decision="held",
        owner={"kind": "health"},
        new_reason=f"[fleetops] operator/{RUN}: mine",
    )
    row = drain_log.row_of(res, kind="operator", run=RUN, purpose="  mine \n", source="cli", now=5.0)
    assert (row.at, row.node, row.slurm_name, row.action, row.kind, row.run) == (
        5.0,
        "gpu03",
        "gpu03",
        "drain",
        "operator",
        RUN,
    )
    assert (row.outcome, row.purpose, row.reason, row.previous_owner) == (
        "refused",
        "mine",
        HEALTH,
        HEALTH_OWNER,
    )


def test_a_drain_sent_keeps_the_new_reason_and_a_resume_done_none() -> None:
    new = "[fleetops] reset/RUN-1: reset GPU 0"
    drained = drain_log.row_of(
        _result("drain", "done", reason=None, decision="drain", owner=None, new_reason=new),
        kind="reset",
        run="RUN-1",
        purpose="reset GPU 0",
        source="remediate",
    )
    assert (drained.reason, drained.previous_owner) == (new, None)
    lifted = drain_log.row_of(
        _result(
            "resume", "done", reason=HEALTH, decision="resume", owner={"kind": "health", "purpose": "ecc"}
        ),
        kind="operator",
        run=RUN,
        source="cli",
    )
    assert (lifted.reason, lifted.previous_owner, lifted.purpose) == (None, HEALTH_OWNER, "ecc")


def test_dry_runs_and_hosts_outside_slurm_record_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "h.db")
    assert drain_log.record(db, _result("drain", "dry-run"), kind="operator", run=RUN, source="cli") is None
    assert (
        drain_log.record(
            db, _result("drain", "refused", slurm_managed=False), kind="operator", run=RUN, source="cli"
        )
        is None
    )
    assert not os.path.exists(db)


def test_a_store_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    folder = tmp_path / "not-a-folder"
    folder.write_text("")
    warned = io.StringIO()
    got = drain_log.record(
        str(folder / "h.db"),
        _result("drain", "done", decision="drain"),
        kind="operator",
        run=RUN,
        source="cli",
        warn=warned,
    )
    assert got is None
    assert "gpu03: drain done, but not recorded in the history" in warned.getvalue()


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> fake_scontrol.FakeSlurm:
    fake = fake_scontrol.FakeSlurm(tmp_path)
    for key, value in fake.env().items():  # the fake's state, and the slurm.conf a cluster member has
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FLEETOPS_DB", raising=False)
    nodes = fake_scontrol.cluster(30)
    nodes["gpu03"].update(state="MIXED+DRAIN", reason=HEALTH, by="slurm", at="2026-12-06T03:12:07")
    fake.set(nodes)
    return fake


@pytest.fixture
def inv(tmp_path: Path) -> str:
    hosts = "\n".join(f"        gpu{i:02d}:\n          ansible_host: 127.0.0.{i}" for i in range(1, 31))
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  children:\n    gpu:\n      hosts:\n{hosts}\n")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out, _err = capsys.readouterr()
    return code, out


def test_drain_and_resume_are_recorded_and_history_prints_owner_and_run(fs, inv, tmp_path, capsys) -> None:
    db = str(tmp_path / "history.db")
    assert run(capsys, "drain", "gpu01", "--reason", "GPU 3 hangs", "-i", inv, "--db", db)[0] == EXIT_OK
    assert run(capsys, "resume", "gpu01", "-i", inv, "--db", db)[0] == EXIT_OK
    assert run(capsys, "drain", "gpu02", "--reason", "x", "-i", inv, "--db", db, "--dry-run")[0] == EXIT_OK
    code, out = run(capsys, "history", "--kind", "drains", "--db", db)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TIME", "NODE", "ACTION"]
    resume, drain = lines[1], lines[3]  # newest first; the resume names the drain it lifted
    assert "gpu01" in resume and "resume" in resume and f"operator/{RUN}" in resume and "done" in resume
    assert lines[2].strip() == f"lifted: an operator (run {RUN}): GPU 3 hangs"
    assert "drain" in drain and f"operator/{RUN}" in drain and "GPU 3 hangs" in drain and "cli" in drain
    assert "gpu02" not in out  # the dry run recorded nothing
    code, out = run(
        capsys, "history", "gpu01", "--kind", "drains", "--db", db, "--format", "json", "--since", "1h"
    )
    rows = json.loads(out)
    assert [(r["action"], r["outcome"], r["kind"], r["run"]) for r in rows] == [
        ("resume", "done", "operator", RUN),
        ("drain", "done", "operator", RUN),
    ]
    assert rows[1]["reason"] == f"[fleetops] operator/{RUN}: GPU 3 hangs" and rows[0]["reason"] is None


def test_a_refused_resume_is_recorded_as_refused_with_the_owner_named(fs, inv, tmp_path, capsys) -> None:
    db = str(tmp_path / "history.db")
    assert run(capsys, "resume", "gpu03", "-i", inv, "--db", db)[0] == EXIT_WARN
    with Store(db) as store:
        (row,) = store.drains("gpu03")
    assert (row.action, row.outcome, row.kind, row.run, row.source) == (
        "resume",
        "refused",
        "operator",
        RUN,
        "cli",
    )
    assert row.previous_owner == HEALTH_OWNER and row.reason == HEALTH
    code, out = run(capsys, "history", "gpu03", "--kind", "drains", "--db", db)
    assert "refused" in out and f"held by: {HEALTH_OWNER}" in out
    assert fs.updates() == []


def test_without_db_drains_go_to_fleetops_db(fs, inv, tmp_path, capsys, monkeypatch) -> None:
    db = tmp_path / "env.db"
    monkeypatch.setenv("FLEETOPS_DB", str(db))
    assert run(capsys, "drain", "gpu01", "--reason", "cabling", "-i", inv)[0] == EXIT_OK
    with Store(str(db)) as store:
        assert [(r.node, r.purpose) for r in store.drains()] == [("gpu01", "cabling")]
