"""fleetops rollout/apply: argument handling, confirmation, event tracking and the summary."""

from __future__ import annotations

import argparse
import io

import pytest

from fleetops.rollout import cli
from fleetops.rollout.progress import Tracker, summary_text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetops")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_register_adds_rollout_and_apply_with_funcs() -> None:
    args = _parser().parse_args(
        [
            "rollout",
            "driver",
            "--version",
            "580.159.04",
            "-i",
            "inv.yml",
            "--batch",
            "25%",
            "--limit",
            "h200",
            "--check",
        ]
    )
    assert args.func is cli.rollout_driver and args.batch == "25%" and args.check and args.limit == "h200"
    args = _parser().parse_args(["apply", "mig", "-i", "inv.yml", "-e", "gpu_mig_mode=true"])
    assert args.func is cli.apply and args.extra_vars == [("gpu_mig_mode", True)]


@pytest.mark.parametrize("bad", ["0", "0%", "101%", "ten", "-3", "5.5"])
def test_batch_accepts_counts_and_percentages_only(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cli.batch_size(bad)
    assert cli.batch_size("4") == "4" and cli.batch_size("100%") == "100%"


def test_version_must_be_exact() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["rollout", "driver", "--version", "580", "-i", "x"])


def test_a_change_without_yes_is_refused_off_a_terminal(tmp_path, capsys) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    args = _parser().parse_args(["apply", "power", "-i", str(inv)])
    assert args.func(args) == cli.EXIT_USAGE
    assert "without --yes" in capsys.readouterr().err


def test_confirmation_on_a_terminal_needs_a_typed_yes() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    args = argparse.Namespace(check=False, yes=False, limit="node00[1:2]", inventory=["inv.yml"])
    out = io.StringIO()
    assert cli.confirm("cap GPUs", args, stdin=Tty("yes\n"), stdout=out)
    assert "node00[1:2]" in out.getvalue()
    assert not cli.confirm("cap GPUs", args, stdin=Tty("\n"), stdout=io.StringIO())
    args.check = True
    assert cli.confirm("cap GPUs", args, stdin=io.StringIO(""), stdout=io.StringIO())


def test_missing_inventory_is_a_usage_error(capsys) -> None:
    args = _parser().parse_args(["apply", "power", "-i", "/nonexistent/inv.yml", "--check"])
    assert args.func(args) == cli.EXIT_USAGE


def _ev(event: str, **data) -> dict:
    return {"event": event, "event_data": data}


def test_tracker_prints_changes_and_failures_and_builds_the_summary() -> None:
    lines: list[tuple[str, str]] = []
    t = Tracker(emit=lambda kind, line: lines.append((kind, line)))
    events = [
        _ev("playbook_on_play_start", play="Pick the canary batch"),
        _ev("runner_on_ok", host="n1", task="Split", res={"changed": False}),
        _ev("runner_on_ok", host="n2", task="Split", res={"changed": False}),
        _ev("runner_on_ok", host="n3", task="Split", res={"changed": False}),
        _ev("playbook_on_play_start", play="Upgrade the canary batch"),
        _ev(
            "runner_on_ok",
            host="n1",
            role="nvidia_driver",
            task="Install",
            task_action="ansible.builtin.apt",
            res={"changed": True, "msg": "debconf: delaying package configuration"},
        ),
        _ev(
            "runner_on_ok",
            host="n1",
            role="gpu_power",
            task="Set the GPU power cap",
            task_action="fleetops_gpu_set",
            res={"changed": True, "msg": "power 700 W: changed 1 of 8 GPUs (0: 500 W)"},
        ),
        _ev("runner_on_failed", host="n1", task="Verify", res={"msg": "driver_version is 570.133.20"}),
        _ev(
            "runner_on_failed",
            host="n1",
            task="Leave the failed node drained and name it",
            res={"msg": "ROLLOUT FAILED on n1: stays drained"},
        ),
        _ev(
            "playbook_on_stats",
            ok={"n1": 5, "n2": 1, "n3": 1},
            changed={"n1": 2},
            failures={"n1": 1},
            dark={},
            skipped={},
            rescued={"n1": 1},
            ignored={},
        ),
    ]
    assert all(t.handle(e) is True for e in events)
    kinds = [k for k, _ in lines]
    changed = [line for k, line in lines if k == "changed"]
    assert changed[0].endswith("nvidia_driver : Install") and "debconf" not in changed[0]
    assert changed[1].endswith(
        "gpu_power : Set the GPU power cap: power 700 W: changed 1 of 8 GPUs (0: 500 W)"
    )
    assert kinds.count("play") == 2 and "changed" in kinds and kinds.count("failed") == 2
    assert t.failed_hosts() == ["n1"]
    assert t.not_reached() == ["n2", "n3"]
    rows = {r["host"]: r for r in t.summary_rows()}
    assert rows["n1"]["status"] == "failed" and "stays drained" in rows["n1"]["note"]
    assert rows["n2"]["status"] == "not reached"
    text = summary_text(t.summary_rows())
    assert "n1" in text.splitlines()[1] and "1 failed, 2 not reached (3 hosts)" in text


def test_a_check_run_says_what_would_change_never_changed() -> None:
    lines: list[tuple[str, str]] = []
    t = Tracker(emit=lambda kind, line: lines.append((kind, line)), check=True)
    for e in (
        _ev("playbook_on_play_start", play="Enforce GPU power caps"),
        _ev(
            "runner_on_ok",
            host="n1",
            role="gpu_power",
            task="Set the GPU power cap",
            task_action="fleetops_gpu_set",
            res={"changed": True, "msg": "power 650 W: would change 8 of 8 GPUs"},
        ),
        _ev("runner_on_ok", host="n2", task="Set the GPU power cap", res={"changed": False}),
        _ev("playbook_on_stats", ok={"n1": 1, "n2": 1}, changed={"n1": 1}, failures={}, dark={},
            skipped={}, rescued={}, ignored={}),  # fmt: skip
    ):
        t.handle(e)
    (line,) = [line for kind, line in lines if kind == "changed"]
    assert " n1             WOULD CHANGE gpu_power : Set the GPU power cap: power 650 W" in line
    rows = {r["host"]: (r["status"], r["note"]) for r in t.summary_rows()}
    assert rows == {
        "n1": ("would change", "would change: gpu_power : Set the GPU power cap"),
        "n2": ("ok", ""),
    }
    assert summary_text(t.summary_rows()).splitlines()[-1] == "1 ok, 1 would change (2 hosts)"


def test_tracker_keeps_ignored_failures_out_of_the_errors() -> None:
    t = Tracker()
    t.handle(_ev("runner_on_failed", host="n1", task="probe", ignore_errors=True, res={"msg": "x"}))
    t.handle(_ev("runner_on_unreachable", host="n2", task="Gather", res={"msg": "Connection refused"}))
    t.handle(
        _ev(
            "playbook_on_stats",
            ok={"n1": 1},
            changed={},
            failures={},
            dark={"n2": 1},
            skipped={},
            rescued={},
            ignored={"n1": 1},
        )
    )
    rows = {r["host"]: r for r in t.summary_rows()}
    assert rows["n1"]["status"] == "ok" and rows["n2"]["status"] == "unreachable"
    assert "Connection refused" in rows["n2"]["note"]


def test_apply_baseline_is_the_audits_for_every_host_and_a_bad_one_stops_the_run(
    tmp_path, capsys, monkeypatch
) -> None:
    from fleetops.rollout import runner

    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    n1: {}\n  vars:\n    fleetops_baseline: {power_limit_w: 700}\n")
    good = tmp_path / "baseline.yml"
    good.write_text("power_limit_w: 650\npersistence_mode: true\n")
    seen: list[dict] = []

    def fake_run(playbook, inventories, **kw):
        seen.append(kw["extravars"])
        raise runner.RolloutError("stopped here by the test")

    monkeypatch.setattr(runner, "run_playbook", fake_run)
    args = _parser().parse_args(["apply", "power", "-i", str(inv), "--baseline", str(good), "--check"])
    assert args.func(args) == cli.EXIT_USAGE  # the fake's stop, after the extra variables were made
    (extra,) = seen
    assert extra["fleetops_baseline"] == {"power_limit_w": 650, "persistence_mode": True}
    assert "fleetops_baseline_layered" not in extra
    capsys.readouterr()

    bad = tmp_path / "bad.yml"
    bad.write_text("persistence_mode: true\npower_limit_w: fast\n")
    args = _parser().parse_args(["apply", "power", "-i", str(inv), "--baseline", str(bad), "--check"])
    assert args.func(args) == cli.EXIT_USAGE
    assert len(seen) == 1  # no run started
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "power_limit_w" in err
