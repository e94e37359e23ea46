"""``fleetops tui`` on the command line: what it accepts and refuses before any screen opens."""

from __future__ import annotations

import pytest

from fleetops import cli
from fleetops.tui.cli import default_interval


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["tui"], "no inventory: pass -i INVENTORY (or set FLEETOPS_INVENTORY), or --sim for a simulated fleet"),
        (["tui", "--sim", "-i", "inventory.yml"], "tui: give -i INVENTORY or --sim, not both"),
    ],
)
def test_tui_refuses_contradictory_or_missing_input_with_exit_4(
    argv: list[str], error: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FLEETOPS_INVENTORY", raising=False)  # neither -i nor the environment names one
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    assert cli.main(argv) == cli.EXIT_USAGE
    assert capsys.readouterr().err == f"fleetops: error: {error}\n"


def test_a_zero_interval_is_refused_by_the_duration_grammar_with_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["tui", "-i", "inventory.yml", "--interval", "0"])
    assert stop.value.code == cli.EXIT_USAGE
    assert "argument --interval: '0': must be more than 0" in capsys.readouterr().err


def test_tui_options_are_registered_with_the_fleetops_command() -> None:
    args = cli.build_parser().parse_args(
        ["tui", "-i", "inv.yml", "--readonly", "--interval", "5", "--db", "h.db"]
    )
    assert (args.inventory, args.readonly, args.interval, args.db) == ("inv.yml", True, 5.0, "h.db")
    args = cli.build_parser().parse_args(["tui", "--sim", "--nodes", "12"])
    assert args.sim and args.nodes == 12 and args.interval is None


def test_default_interval_grows_with_the_fleet() -> None:
    assert default_interval(12) == 2.0
    assert default_interval(1000) == 6.0
