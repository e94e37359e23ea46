"""``fleetops drain`` and ``fleetops resume``: an operator's drains through ops.slurm, against the
strict stand-in scontrol (tests/fake_scontrol.py) found on the controller's PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fake_scontrol
import pytest

from fleetops import cli
from fleetops.common.errors import EXIT_OK, EXIT_USAGE, EXIT_WARN
from fleetops.ops import slurm

HEALTH = "[fleetops] health/20261206T031207Z-7c1e-gpu03: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"
RUN = slurm.operator_run()


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> fake_scontrol.FakeSlurm:
    fake = fake_scontrol.FakeSlurm(tmp_path)
    for key, value in fake.env().items():  # the fake's state, and the slurm.conf a cluster member has
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FLEETOPS_DB", str(tmp_path / "history.db"))  # each drain is recorded there
    nodes = fake_scontrol.cluster(30)
    nodes["gpu03"].update(state="MIXED+DRAIN", reason=HEALTH, by="slurm", at="2026-12-06T03:12:07")
    nodes["gpu04"].update(state="IDLE+DRAIN", reason="[fleetops] operator/carol@ctl02: cabling")
    fake.set(nodes)
    return fake


@pytest.fixture
def inv(tmp_path: Path) -> str:
    hosts = "\n".join(f"        gpu{i:02d}:\n          ansible_host: 127.0.0.{i}" for i in range(1, 31))
    path = tmp_path / "hosts.yml"
    path.write_text(f"all:\n  children:\n    gpu:\n      hosts:\n{hosts}\n")
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_drain_then_resume_an_operators_own_drain(fs, inv, capsys) -> None:
    code, out, _err = run(capsys, "drain", "gpu01", "--reason", "GPU 3 hangs, ticket 4411", "-i", inv)
    assert code == EXIT_OK, out
    want = f"[fleetops] operator/{RUN}: GPU 3 hangs, ticket 4411"
    assert fs.nodes()["gpu01"]["reason"] == want and fs.nodes()["gpu01"]["state"] == "IDLE+DRAIN"
    assert "done" in out and want in out
    code, out, _err = run(capsys, "resume", "gpu01", "-i", inv, "--json")
    assert code == EXIT_OK, out
    doc = json.loads(out)
    assert doc["owner"] == {"kind": "operator", "run": RUN}
    assert doc["results"][0]["outcome"] == "done" and doc["results"][0]["detail"]["owner"]["run"] == RUN
    assert fs.nodes()["gpu01"]["state"] == "IDLE"
    # another operator's drain is an operator's: any operator lifts it
    code, out, _err = run(capsys, "resume", "gpu04", "-i", inv)
    assert code == EXIT_OK, out


def test_another_owners_drain_is_refused_and_named_unless_force(fs, inv, capsys) -> None:
    code, out, _err = run(capsys, "drain", "gpu03", "--reason", "mine now", "-i", inv)
    assert code == EXIT_WARN
    assert (
        "the health program (run 20261206T031207Z-7c1e-gpu03)" in out
        and "slurm at 2026-12-06T03:12:07" in out
    )
    assert fs.nodes()["gpu03"]["reason"] == HEALTH
    code, out, _err = run(capsys, "resume", "gpu03", "-i", inv)
    assert code == EXIT_WARN
    assert "refused" in out and "the health program" in out and "fleetops resume --force" in out
    assert fs.updates() == []
    code, out, _err = run(capsys, "resume", "gpu03", "-i", inv, "--force")
    assert code == EXIT_OK, out
    assert "forced by an operator" in out and fs.nodes()["gpu03"]["state"] == "MIXED"


def test_a_reason_too_long_for_slurms_reason_is_refused_whole_and_nothing_is_sent(fs, inv, capsys) -> None:
    room = 200 - len(f"[fleetops] operator/{RUN}: ")
    code, out, err = run(capsys, "drain", "gpu01", "--reason", "x" * (room + 1), "-i", inv, "--yes")
    assert code == EXIT_USAGE, out + err
    assert f"--reason: the reason is {room + 1} characters; at most {room} fit after" in err
    assert fs.updates() == []
    code, out, err = run(capsys, "drain", "gpu01", "--reason", "x" * room, "-i", inv, "--yes")
    assert code == EXIT_OK, out + err
    assert fs.nodes()["gpu01"]["reason"] == f"[fleetops] operator/{RUN}: " + "x" * room


def test_dry_run_shows_the_decision_and_reason_and_sends_nothing(fs, inv, capsys) -> None:
    code, out, _err = run(
        capsys,
        "drain",
        "gpu01",
        "gpu02",
        "--reason",
        "rack 12 PDU swap",
        "-i",
        inv,
        "--dry-run",
        "--max-drain-share",
        "25%",
    )
    assert code == EXIT_OK, out
    assert out.count("dry-run") == 2 and f"[fleetops] operator/{RUN}: rack 12 PDU swap" in out
    code, out, _err = run(capsys, "resume", "gpu04", "gpu03", "-i", inv, "--dry-run", "--json")
    assert code == EXIT_WARN
    doc = json.loads(out)
    assert [r["outcome"] for r in doc["results"]] == ["dry-run", "refused"]
    assert doc["results"][1]["detail"]["owner"]["kind"] == "health"
    assert fs.updates() == []


def test_several_nodes_without_yes_and_no_terminal_are_refused(fs, inv, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _out, err = run(
        capsys, "drain", "gpu01", "gpu02", "--reason", "x", "-i", inv, "--max-drain-share", "0.25"
    )
    assert code == EXIT_USAGE and "without confirmation: pass --yes" in err
    code, _out, err = run(capsys, "resume", "gpu03", "gpu04", "-i", inv, "--force")
    assert code == EXIT_USAGE and "without confirmation" in err
    assert fs.calls() == []
    code, out, _err = run(
        capsys, "drain", "gpu01", "gpu02", "--reason", "x", "-i", inv, "--yes", "--max-drain-share", "0.25"
    )
    assert code == EXIT_OK, out
    assert [c[1] for c in fs.updates()] == ["NodeName=gpu01", "NodeName=gpu02"]


def test_the_capacity_guard_refuses_the_whole_set(fs, inv, capsys) -> None:
    """30 nodes, 10% is 3; two are out already (gpu03, gpu04): room for one more, not two."""
    code, out, _err = run(capsys, "drain", "gpu01", "gpu02", "--reason", "x", "-i", inv, "--yes")
    assert code == EXIT_WARN and out.count("refused") == 2
    assert "partition gpu: 2 of 30 nodes are out of service already (gpu03, gpu04)" in out
    assert "more than the allowed 3 (10%)" in out and "--max-drain-share" in out
    assert fs.updates() == []
    code, out, _err = run(
        capsys, "drain", "gpu01", "gpu02", "--reason", "x", "-i", inv, "--yes", "--max-drain-share", "15%"
    )
    assert code == EXIT_OK and out.count("done") == 2, out


def test_bad_input_is_a_usage_error_naming_it(fs, inv, capsys) -> None:
    code, _out, err = run(capsys, "drain", "gpu01", "gpu77", "--reason", "x", "-i", inv, "--yes")
    assert code == EXIT_USAGE and "'gpu77' is not in the inventory" in err and inv in err
    code, _out, err = run(capsys, "drain", "gpu01", "--reason", "  ", "-i", inv)
    assert code == EXIT_USAGE and "--reason" in err
    code, _out, err = run(capsys, "drain", "gpu01", "--reason", "x", "-i", inv, "--max-drain-share", "150%")
    assert code == EXIT_USAGE and "--max-drain-share" in err
    with pytest.raises(SystemExit) as exc:
        cli.main(["drain", "gpu01", "-i", inv])  # --reason is required
    assert exc.value.code == EXIT_USAGE
    assert fs.calls() == []


def test_an_unmanaged_host_is_refused_without_scontrol(fs, tmp_path, capsys) -> None:
    path = tmp_path / "mixed.yml"
    path.write_text(
        "all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n"
        "    ws01:\n      ansible_host: 127.0.0.2\n      fleetops_slurm_managed: false\n"
    )
    code, out, _err = run(capsys, "drain", "ws01", "--reason", "x", "-i", str(path))
    assert code == EXIT_WARN and "not managed by Slurm (fleetops_slurm_managed: false)" in out
    assert fs.calls() == []


def test_the_operator_run_id_fits_the_rule() -> None:
    from fleetops.catalog import slurm as rule

    assert slurm.operator_run("alice", "ctl01.dc1.example.com") == "alice@ctl01"
    assert slurm.operator_run("Dr. Who", "ctl 01") == "Dr.-Who@ctl-01"
    for user, host in (("", ""), ("-x-", "."), ("ü" * 80, "h" * 90)):
        assert rule.RUN_RE.match(slurm.operator_run(user, host))


def test_the_commands_run_as_a_program(fs, inv) -> None:
    """The installed entry point, stdin not a terminal: one node needs no confirmation."""
    exe = Path(sys.executable).with_name("fleetops")
    done = subprocess.run(
        [str(exe), "drain", "gpu05", "--reason", "ticket 1", "-i", inv, "--json"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert json.loads(done.stdout)["results"][0]["outcome"] == "done"
