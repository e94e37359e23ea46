"""The one duration grammar (fleetops.catalog.durations), and every flag that takes a span of time
reading it: ``2w`` means two weeks to each of them, and garbage is refused naming the flag."""

from __future__ import annotations

import argparse
import time

import pytest

from fleetops.catalog.durations import DurationError, parse_duration, parse_retention

WEEK = 7 * 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("2.5", 2.5),
        ("0.5", 0.5),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1.5h", 5400.0),
        ("12h", 43200.0),
        ("7d", 7 * 86400.0),
        ("2w", 2 * WEEK),
        ("1h30m", 5400.0),
        ("1d12h", 1.5 * 86400.0),
        ("1w2d3h4m5s", WEEK + 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        (" 15M ", 900.0),
    ],
)
def test_a_duration_is_seconds_or_numbers_with_units(text: str, seconds: float) -> None:
    assert parse_duration(text, flag="--x") == seconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "-5m", "-1", "15 minutes", "1y", "m", "h1", "1h 30m", "30m1h", "1h1h", "1e3", "nan", "inf", "1.2.3", "5x"],
)
def test_anything_else_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(DurationError, match=r"^--some-flag .*not a duration; give seconds, or with a unit"):
        parse_duration(text, flag="--some-flag")


@pytest.mark.parametrize("text", ["0", "0s", "0h0m"])
def test_zero_only_where_the_flag_allows_it(text: str) -> None:
    with pytest.raises(DurationError, match="--interval .*must be more than 0"):
        parse_duration(text, flag="--interval")
    assert parse_duration(text, flag="--max-age", allow_zero=True) == 0.0


@pytest.mark.parametrize(("text", "seconds"), [("forever", None), ("ALL", None), ("0", None), ("2w", 2 * WEEK),
                                               ("36h", 129600.0), ("1d12h", 129600.0)])
def test_retention_is_a_duration_or_forever(text: str, seconds: float | None) -> None:
    assert parse_retention(text, flag="--keep") == seconds


def test_retention_with_unit_required_refuses_a_bare_number() -> None:
    """``--keep 30`` would prune every audit older than 30 seconds: whoever typed it meant days."""
    with pytest.raises(DurationError, match=r"--keep '30': give a unit \(e\.g\. 30d\)"):
        parse_retention("30", flag="--keep", unit_required=True)
    assert parse_retention("30", flag="--escalation-lookback") == 30.0


# --- every flag reads the grammar -------------------------------------------------------------


def _controller(argv: list[str]) -> argparse.Namespace:
    from fleetops.cli import build_parser

    return build_parser().parse_args(argv)


def _agent(argv: list[str]) -> argparse.Namespace:
    from fleetops.agent.main import build_parser

    args: argparse.Namespace = build_parser().parse_args(argv)
    return args


INV = ["-i", "inv.ini"]
CONTROLLER_FLAGS = [
    (["audit", *INV], "--keep", "keep"),
    (["audit", *INV], "--max-age", "max_age"),
    (["audit", *INV], "--timeout", "timeout"),
    (["audit", *INV], "--connect-timeout", "connect_timeout"),
    (["validate", *INV], "--keep", "keep"),
    (["validate", *INV], "--connect-timeout", "connect_timeout"),
    (["remediate", *INV], "--app-xid-window", "app_xid_window"),
    (["remediate", *INV], "--escalation-lookback", "escalation_lookback"),
    (["remediate", *INV], "--timeout", "timeout"),
    (["remediate", *INV], "--collect-timeout", "collect_timeout"),
    (["remediate", *INV], "--connect-timeout", "connect_timeout"),
    (["reset", "node1", "0"], "--timeout", "timeout"),
    (["history"], "--escalation-lookback", "escalation_lookback"),
    (["history"], "--app-xid-window", "app_xid_window"),
    (["tui", *INV], "--interval", "interval"),
    (["tui", *INV], "--timeout", "timeout"),
    (["tui", *INV], "--connect-timeout", "connect_timeout"),
    (["tui", *INV], "--stale-after", "stale_after"),
    (["drain", "node1", "--reason", "r", *INV], "--timeout", "timeout"),
    (["drain", "node1", "--reason", "r", *INV], "--connect-timeout", "connect_timeout"),
]
AGENT_FLAGS = [
    (["collect"], "--max-age", "max_age"),
    (["check"], "--max-age", "max_age"),
    (["serve"], "--interval", "interval"),
    (["serve"], "--full-interval", "full_interval"),
    (["serve"], "--hang-timeout", "hang_timeout"),
    (["history", "--gpu", "GPU-1"], "--seconds", "seconds"),
    (["reset", "--gpu", "GPU-1"], "--grace", "grace"),
    (["reset", "--gpu", "GPU-1"], "--reset-timeout", "reset_timeout"),
    (["slurm-healthcheck"], "--max-age", "max_age"),
    (["slurm-healthcheck"], "--scontrol-timeout", "scontrol_timeout"),
    (["slurm-healthcheck"], "--collect-timeout", "collect_timeout"),
]


@pytest.mark.parametrize(("argv", "flag", "dest"), CONTROLLER_FLAGS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_controller_duration_flag_takes_2w_and_1h30m(argv: list[str], flag: str, dest: str) -> None:
    assert getattr(_controller([*argv, flag, "2w"]), dest) == 2 * WEEK
    assert getattr(_controller([*argv, flag, "1h30m"]), dest) == 5400.0


@pytest.mark.parametrize(("argv", "flag", "dest"), CONTROLLER_FLAGS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_controller_duration_is_a_usage_error_naming_the_flag(
    argv: list[str], flag: str, dest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _controller([*argv, flag, "2 weeks"])
    assert exit_.value.code == 4
    err = capsys.readouterr().err
    assert flag in err and "not a duration; give seconds, or with a unit: 90s, 15m, 12h, 7d, 2w, 1h30m" in err


@pytest.mark.parametrize(("argv", "flag", "dest"), AGENT_FLAGS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_agent_duration_flag_takes_2w(argv: list[str], flag: str, dest: str) -> None:
    assert getattr(_agent([*argv, flag, "2w"]), dest) == 2 * WEEK
    assert getattr(_agent([*argv, flag, "90"]), dest) == 90.0


def test_the_defaults_are_seconds() -> None:
    args = _controller(["audit", *INV])
    assert (args.keep, args.max_age, args.timeout) == (30 * 86400.0, 30.0, 30.0)
    assert _controller(["remediate", *INV]).escalation_lookback == WEEK
    assert _controller(["remediate", *INV, "--escalation-lookback", "forever"]).escalation_lookback is None
    assert _controller(["audit", *INV, "--keep", "forever"]).keep is None


def test_audit_keep_refuses_a_bare_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _controller(["audit", *INV, "--keep", "30"])
    assert "give a unit (e.g. 30d)" in capsys.readouterr().err


def test_remediate_max_audit_age_takes_2w_as_the_operator_wrote_it() -> None:
    """Parsed in the command, not by argparse: its messages quote the limit as written (``15m``)."""
    assert _controller(["remediate", *INV, "--max-audit-age", "2w"]).max_audit_age == "2w"


def test_history_since_takes_a_duration_ago_or_an_iso_date() -> None:
    from fleetops.fleet.store.database import parse_since
    from fleetops.fleet.store.layout import StoreError

    assert abs(parse_since("2w") - (time.time() - 2 * WEEK)) < 5
    assert abs(parse_since("1h30m") - (time.time() - 5400)) < 5
    assert parse_since("2026-12-01T08:00") > time.time() - 10 * 365 * 86400
    with pytest.raises(StoreError, match="--since '2 weeks': give a duration ago"):
        parse_since("2 weeks")
