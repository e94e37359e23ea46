"""The TUI's drain and resume name their owner: an operator (``operator/USER@HOST``), the purpose
the reason prompt's text (it starts as the worst finding's check); a resume of another owner's drain is refused with the owner named (no
force from the TUI). The source goes through ops.slurm against the strict stand-in scontrol
(tests/fake_scontrol.py); the dialog through the Pilot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fake_scontrol
import pytest
from textual.widgets import Input, Static

from fleetops.fleet.inventory import Host
from fleetops.ops import slurm
from fleetops.tui.screens.drain import DrainScreen
from fleetops.tui.source import ActionResult, SshSource

from .conftest import NAMES, FakeSource, drive, fed_app, fed_entries, wait_for

HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu02: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"


class OwnerSource(FakeSource):
    """Records what the app asks to drain, and names its operator run as SshSource does."""

    operator_run = "alice@ctl01"

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.purposes: list[tuple[str, str]] = []

    def drain(self, name: str, purpose: str) -> ActionResult:
        self.purposes.append((name, purpose))
        return super().drain(name, purpose)


def test_the_drain_dialog_shows_the_reason_naming_the_operator_and_the_worst_check() -> None:
    entries = fed_entries()
    worst = next(e for e in entries if e.name == "node011").worst
    assert worst is not None and worst.check  # a check id, e.g. xid.79 or config.gpu_missing
    source = OwnerSource(NAMES)
    app = fed_app(source=source)

    async def body(pilot: Any) -> None:
        app.screen.table().select_key("node011")
        await pilot.press("d")
        assert isinstance(app.screen, DrainScreen)  # the reason prompt, starting from the worst check
        assert app.screen.query_one("#drain-reason", Input).value == worst.check
        text = str(app.screen.query_one("#drain-preview", Static).render())
        assert text == f"Slurm's Reason: [fleetops] operator/alice@ctl01: {worst.check}", text
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.last_action is not None, 30, "the drain")
        assert source.purposes == [("node011", worst.check)]

    drive(app, body, entries)


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fs = fake_scontrol.FakeSlurm(tmp_path)
    monkeypatch.setenv("FAKE_SLURM", str(fs.db))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=test\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    nodes = fake_scontrol.cluster(20)
    nodes["gpu02"].update(state="IDLE+DRAIN", reason=HEALTH, by="slurm", at="2026-12-06T03:12:07")
    fs.set(nodes)
    hosts = [Host(name=f"gpu{i:02d}", address=f"127.0.0.{i}") for i in (1, 2)]
    hosts.append(Host(name="ws01", address="127.0.0.3", vars={"fleetops_slurm_managed": False}))
    source = SshSource(hosts, {}, interval=600.0, connect_timeout=1.0, command_timeout=5.0)
    # the source's own ops.slurm control, pointed at the stand-in scontrol
    source.__dict__["_slurm_control"] = slurm.SlurmControl(hosts, scontrol=str(fs.scontrol))
    source.__dict__["operator_run"] = "alice@ctl01"
    try:
        yield source, fs
    finally:
        source.close()


def test_the_source_drains_and_resumes_as_an_operator(live) -> None:
    source, fs = live
    drained = source.drain("gpu01", "xid.79")
    assert drained.ok and drained.detail["outcome"] == "done", drained
    assert fs.nodes()["gpu01"]["reason"] == "[fleetops] operator/alice@ctl01: xid.79"
    again = source.drain("gpu01", "xid.79")
    assert again.ok and again.detail["decision"] == "ours"
    resumed = source.resume("gpu01")
    assert resumed.ok and fs.nodes()["gpu01"]["state"] == "IDLE", resumed
    assert [c[2] for c in fs.updates()] == ["State=DRAIN", "State=RESUME"]


def test_the_source_refuses_another_owners_drain_and_names_it(live) -> None:
    source, fs = live
    refused = source.resume("gpu02")
    assert not refused.ok and refused.detail["outcome"] == "refused", refused
    assert "the health program (run 20261206T031207Z-7c1e-gpu02)" in refused.message
    assert "set by slurm at 2026-12-06T03:12:07" in refused.message
    assert refused.detail["owner"]["kind"] == "health"
    held = source.drain("gpu02", "xid.79")
    assert not held.ok and "the health program" in held.message
    assert fs.updates() == [] and fs.nodes()["gpu02"]["reason"] == HEALTH


def test_an_unmanaged_host_is_refused_before_the_dialog(live) -> None:
    source, fs = live
    assert "fleetops_slurm_managed: false" in (source.slurm_refusal("ws01", "drain") or "")
    assert not source.drain("ws01", "x").ok
    assert fs.calls() == []


def test_the_sources_drains_and_resumes_are_recorded_in_the_history(live, tmp_path) -> None:
    from fleetops.fleet.store.database import Store

    source, _fs = live
    source.drain_db = str(tmp_path / "history.db")
    assert source.drain("gpu01", "xid.79").ok
    assert not source.resume("gpu02").ok
    with Store(source.drain_db) as store:
        rows = store.drains()
    assert [(r.node, r.action, r.outcome, r.kind, r.run, r.source) for r in rows] == [
        ("gpu02", "resume", "refused", "operator", "alice@ctl01", "tui"),
        ("gpu01", "drain", "done", "operator", "alice@ctl01", "tui"),
    ]
    assert rows[0].previous_owner is not None and rows[0].previous_owner.startswith("the health program")
    assert rows[1].reason == "[fleetops] operator/alice@ctl01: xid.79"


def test_the_resume_precheck_names_another_owner_before_any_dialog(live) -> None:
    source, fs = live
    refusal = source.resume_refusal("gpu02")
    assert refusal is not None and refusal.startswith("resume refused: gpu02: "), refusal
    assert "the health program (run 20261206T031207Z-7c1e-gpu02)" in refusal
    assert source.drain("gpu01", "xid.79").ok
    assert source.resume_refusal("gpu01") is None  # our own drain: the dialog asks
    assert source.resume_refusal("ws01") is None  # said by slurm_refusal, before this
    assert [c[2] for c in fs.updates()] == ["State=DRAIN"]  # the precheck changed nothing
