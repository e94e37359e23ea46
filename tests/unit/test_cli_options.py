"""One command line (issue 27, item 5): every command that reads an inventory resolves it the
same way (``-i``, else $FLEETOPS_INVENTORY, else $ANSIBLE_INVENTORY; none: exit 4 saying so), a
flag that means the same has the same words and default wherever it appears, every default is
in the help, and every long option is in the generated command reference.

The parsers are read through ``fleetops.docgen.data.command_tree``, the one reader of argparse's
internals (tests/unit/test_argparse_shape.py pins it); that the committed reference is what the
parsers generate now is tests/unit/test_docs.py's ``test_committed_generated_page_matches_the_code``.
"""

from __future__ import annotations

import argparse
import configparser
import re
from pathlib import Path
from typing import Any

import pytest

from fleetops import cli
from fleetops.agent.main import build_parser as agent_parser
from fleetops.docgen import data

ROOT = Path(__file__).resolve().parents[2]
INVENTORY_DEFAULT = "(default: $FLEETOPS_INVENTORY, else $ANSIBLE_INVENTORY)"
NO_INVENTORY = "fleetops: error: no inventory: pass -i INVENTORY (or set FLEETOPS_INVENTORY)"
DB_DEFAULT = "(default: $FLEETOPS_DB, else ~/.local/state/fleetops/history.db)"


def options(parser: argparse.ArgumentParser) -> dict[tuple[str, str], dict[str, Any]]:
    """(command, its first long option, else its only name) -> the argument, every command."""
    out = {}
    for command in data.command_tree(parser):
        for arg in command["arguments"]:
            if arg["positional"]:
                continue
            long = [n for n in arg["names"] if n.startswith("--")]
            out[(command["name"], (long or arg["names"])[0])] = arg
    return out


CONTROLLER = options(cli.build_parser())
AGENT = options(agent_parser())


def with_option(option: str) -> dict[str, dict[str, Any]]:
    return {command: arg for (command, name), arg in CONTROLLER.items() if name == option}


# --- the inventory ------------------------------------------------------------------------

INVENTORY_COMMANDS = {
    "fleetops audit": ["audit"],
    "fleetops prometheus targets": ["prometheus", "targets"],
    "fleetops baseline show": ["baseline", "show", "node001"],
    "fleetops baseline vars": ["baseline", "vars"],
    "fleetops rollout driver": ["rollout", "driver", "--version", "580.159.04", "--check"],
    "fleetops apply": ["apply", "power", "--check"],
    "fleetops reset": ["reset", "node001", "0", "--dry-run"],
    "fleetops remediate": ["remediate"],
    "fleetops drain": ["drain", "node001", "--reason", "test", "--dry-run"],
    "fleetops resume": ["resume", "node001", "--dry-run"],
    "fleetops tui": ["tui"],
    "fleetops validate": ["validate"],
    "fleetops job": ["job", "1234"],
}


def test_every_command_that_reads_an_inventory_takes_an_optional_i_with_the_same_default_words() -> None:
    found = with_option("--inventory")
    assert sorted(found) == sorted(INVENTORY_COMMANDS)
    for command, arg in found.items():
        assert arg["names"] == ["-i", "--inventory"], command
        assert arg["required"] is False, f"{command}: -i is required"
        assert arg["help"].endswith(f" {INVENTORY_DEFAULT}"), f"{command} -i: {arg['help']!r}"


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.delenv("FLEETOPS_INVENTORY", raising=False)
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    monkeypatch.setenv("FLEETOPS_DB", str(tmp_path / "history.db"))
    return monkeypatch


@pytest.mark.parametrize("command", sorted(INVENTORY_COMMANDS))
def test_no_inventory_anywhere_is_a_usage_error_saying_so(
    command: str, no_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(INVENTORY_COMMANDS[command]) == 4
    want = NO_INVENTORY + (", or --sim for a simulated fleet" if command == "fleetops tui" else "")
    assert capsys.readouterr().err == want + "\n"


def _not_found(command: str, path: str) -> str:
    if command in ("fleetops rollout driver", "fleetops apply"):  # ansible-runner's front end says it its way
        return f"fleetops: inventory {path} does not exist\n"
    return f"fleetops: error: {path}: inventory file not found\n"


@pytest.mark.parametrize("env", ["FLEETOPS_INVENTORY", "ANSIBLE_INVENTORY"])
@pytest.mark.parametrize("command", sorted(INVENTORY_COMMANDS))
def test_the_environment_names_the_inventory_when_i_is_left_out(
    command: str, env: str, no_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / f"{env.lower()}.yml")  # absent: the error names the file the command went for
    no_env.setenv(env, path)
    assert cli.main(INVENTORY_COMMANDS[command]) == 4
    assert capsys.readouterr().err == _not_found(command, path)


@pytest.mark.parametrize("command", ["fleetops audit", "fleetops apply", "fleetops tui"])
def test_i_wins_over_fleetops_inventory_which_wins_over_ansible_inventory(
    command: str, no_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours, ansible, given = (str(tmp_path / name) for name in ("ours.yml", "ansible.yml", "given.yml"))
    no_env.setenv("FLEETOPS_INVENTORY", ours)
    no_env.setenv("ANSIBLE_INVENTORY", ansible)
    assert cli.main(INVENTORY_COMMANDS[command]) == 4
    assert capsys.readouterr().err == _not_found(command, ours)
    assert cli.main([*INVENTORY_COMMANDS[command], "-i", given]) == 4
    assert capsys.readouterr().err == _not_found(command, given)


def test_tui_sim_watches_a_simulated_fleet_and_refuses_an_inventory_beside_it(
    no_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    help_text = CONTROLLER[("fleetops tui", "--sim")]["help"]
    assert help_text.startswith("start a simulated fleet in a temporary folder and watch it (instead of an inventory")
    assert cli.main(["tui", "--sim", "-i", "inventory.yml"]) == 4
    assert capsys.readouterr().err == "fleetops: error: tui: give -i INVENTORY or --sim, not both\n"


# --- the same flag, the same words and default --------------------------------------------

SSH_COLLECT = ("fleetops audit", "fleetops remediate", "fleetops tui", "fleetops validate", "fleetops job")
ANSIBLE = ("fleetops rollout driver", "fleetops apply")


def test_every_ssh_collect_command_has_the_same_forks_default() -> None:
    found = with_option("--forks")
    assert sorted(found) == sorted(SSH_COLLECT + ANSIBLE)
    for command in SSH_COLLECT:
        assert found[command]["default"] == 50, command
        assert found[command]["help"].endswith(" (default 50)"), command


def test_ansible_forks_are_ansible_cfg_s_and_the_help_says_how_many() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    forks = cfg.getint("defaults", "forks")
    for command in ANSIBLE:
        arg = CONTROLLER[(command, "--forks")]
        assert arg["default"] is None, command  # ansible.cfg decides unless --forks is given
        assert arg["help"] == f"Ansible worker processes at once (default: ansible.cfg's forks, {forks})", command


def test_connect_timeout_and_the_ssh_options_read_the_same_everywhere() -> None:
    timeouts = with_option("--connect-timeout")
    assert sorted(timeouts) == sorted(
        ["fleetops audit", "fleetops reset", "fleetops remediate", "fleetops drain", "fleetops resume",
         "fleetops tui", "fleetops validate", "fleetops job"]
    )
    for command, arg in timeouts.items():
        assert arg["default"] == 5.0, command
        assert arg["help"].startswith("how long to connect and get the SSH banner ("), command
        assert arg["help"].endswith("; default 5)"), command
    for option in ("--connect-timeout", "--known-hosts", "--accept-new-hostkeys", "--ssh-config"):
        found = with_option(option)
        assert sorted(found) == sorted(timeouts), option
        assert len({arg["help"] for arg in found.values()}) == 1, option


def test_limit_db_and_format_say_their_default_in_the_same_words() -> None:
    limits = with_option("--limit")
    assert sorted(limits) == ["fleetops apply", "fleetops audit", "fleetops baseline vars", "fleetops job",
                              "fleetops prometheus targets",
                              "fleetops remediate", "fleetops rollout driver", "fleetops tui", "fleetops validate"]
    for command, arg in limits.items():
        assert arg["help"] == "Ansible host pattern, as ansible's --limit (default: every host of the inventory)", command
    dbs = with_option("--db")
    assert sorted(dbs) == ["fleetops apply", "fleetops audit", "fleetops drain", "fleetops history", "fleetops job",
                           "fleetops remediate", "fleetops resume", "fleetops rollout driver", "fleetops tui",
                           "fleetops validate"]
    for command, arg in dbs.items():
        assert arg["help"].endswith(f" {DB_DEFAULT}"), command
    formats = with_option("--format")
    assert sorted(formats) == ["fleetops audit", "fleetops history", "fleetops job", "fleetops remediate",
                               "fleetops validate"]
    for command, arg in formats.items():
        assert arg["help"].startswith("output format"), command
        assert arg["help"].endswith(f"(default {arg['default']})"), command
    assert [formats[c]["default"] for c in sorted(formats)] == ["table", "text", "table", "text", "table"]


# --- every default in the help ------------------------------------------------------------
#
# The rule: an option whose default is not None, False or empty (a flag's False, an append
# action's []) says ``default VALUE`` (or ``default: VALUE``) in its help, VALUE as --help would
# print it: the value itself, a float also as %g (5.0 -> 5) and a fraction also as a percentage
# (0.1 -> 10%). argparse's ``%(default)s`` fills in the value itself, so ``default %(default)s``
# passes too.


def _renderings(value: Any) -> list[str]:
    out = [str(value)]
    if isinstance(value, float):
        out.append(f"{value:g}")
        if 0 < value < 1:
            out.append(f"{value * 100:g}%")
    return out


def undocumented(found: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """``command --option`` for each option with a default its help does not state."""
    bad = []
    for (command, option), arg in sorted(found.items()):
        default = arg["default"]
        if default is None or default is False or default == [] or default == ():
            continue
        if not any(re.search(rf"\bdefault:?\s+{re.escape(text)}(?!\w|\.\d)", arg["help"])
                   for text in _renderings(default)):
            bad.append(f"{command} {option}")
    return bad


def test_every_option_of_both_programs_states_its_default_in_its_help() -> None:
    assert undocumented(CONTROLLER) == []
    assert undocumented(AGENT) == []


def test_the_default_rule_names_each_option_whose_help_leaves_its_default_out() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--wait", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--share", type=float, default=0.1, help="a fraction (default 10%%)")
    parser.add_argument("--level", default="quick", help="quick (the default) or full")
    parser.add_argument("--forks", type=int, default=5, help="at once (default 50)")
    parser.add_argument("--port", type=int, default=9401, help="port (default %(default)s)")
    parser.add_argument("--kind", default="a", help="a or b (default: a)")
    parser.add_argument("--fast", action="store_true", help="no default to state")
    parser.add_argument("-e", action="append", default=[], help="repeatable")
    assert undocumented(options(parser)) == ["x --forks", "x --level", "x --nodes"]


# --- the command reference ----------------------------------------------------------------


def _sections(page: str) -> dict[str, str]:
    """Command name -> its part of docs/reference/commands.md (a program's: from its ## heading)."""
    out = {}
    for prog in ("fleetops", "fleetops-agent"):
        out[prog] = page.split(f"\n## {prog}\n", 1)[1].split("\n### ", 1)[0]
    for part in page.split("\n### `")[1:]:
        name, _, body = part.partition("`\n")
        out[name] = body
    return out


def test_every_long_option_of_every_command_is_in_the_command_reference() -> None:
    sections = _sections((ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8"))
    listed = 0
    missing = []
    for (command, _), arg in sorted({**CONTROLLER, **AGENT}.items()):
        for name in arg["names"]:
            if not name.startswith("--"):
                continue
            listed += 1
            if f"`{name}`" not in sections.get(command, ""):
                missing.append(f"{command} {name}")
    assert missing == [], "not in docs/reference/commands.md (run fleetops docs): " + ", ".join(missing)
    assert listed > 200  # both parsers were walked: each has dozens of commands' options
