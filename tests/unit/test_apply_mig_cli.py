"""``fleetops apply mig --layout``: what it hands the playbook, and the input it refuses."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fleetops.rollout import cli


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {}\n")
    parser = argparse.ArgumentParser(prog="fleetops")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["apply", *argv, "-i", str(inv)])


@pytest.mark.parametrize(("layout", "want"), [
    ("3g.71gb, 3g.71gb", {"gpu_mig_layout": ["3g.71gb", "3g.71gb"], "gpu_mig_mode": True}),
    ("off", {"gpu_mig_layout": [], "gpu_mig_mode": False}),
])
def test_the_layout_becomes_the_roles_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               layout: str, want: dict[str, Any]) -> None:
    seen: list[tuple[str, dict[str, Any], str]] = []
    monkeypatch.setattr(cli, "_run", lambda args, book, extra, action, ident: seen.append((book, extra, action)) or 0)
    args = _args(tmp_path, "mig", "--layout", layout, "--check")
    assert args.func(args) == 0
    [(book, extra, action)] = seen
    assert book == "mig.yml" and extra == want
    assert ("MIG mode off" in action) == (layout == "off")


def test_no_reset_hands_the_role_its_reset_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(cli, "_run", lambda args, book, extra, action, ident: seen.append(extra) or 0)
    args = _args(tmp_path, "mig", "--layout", "7g.141gb", "--no-reset", "--check")
    assert args.func(args) == 0
    args = _args(tmp_path, "mig", "--check")
    assert args.func(args) == 0
    assert seen == [{"gpu_mig_layout": ["7g.141gb"], "gpu_mig_mode": True, "gpu_mig_reset": False}, {}]


@pytest.mark.parametrize(("argv", "said"), [
    (["power", "--layout", "3g.71gb"], "--layout goes with 'apply mig'"),
    (["mig", "--layout", " , "], "--layout: give GPU instance profiles"),
    (["power", "--no-reset"], "--no-reset goes with 'apply mig'"),
])
def test_a_layout_where_it_does_not_belong_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           argv: list[str], said: str) -> None:
    args = _args(tmp_path, *argv, "--check")
    assert args.func(args) == cli.EXIT_USAGE
    assert said in capsys.readouterr().err
