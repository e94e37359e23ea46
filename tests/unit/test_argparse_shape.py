"""fleetops/docgen/data.py lists a parser's arguments and subcommands through argparse's private
``_actions``, ``_SubParsersAction`` and its ``_choices_actions`` (argparse has no public way to
list them). These tests fail with a message naming the attribute when a Python release changes
their shape, before the generated command reference silently loses rows."""

from __future__ import annotations

import argparse
import sys

from fleetops.docgen import data


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--flag", help="a flag")
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="run it")
    sub.add_parser("secret", help=argparse.SUPPRESS)
    return parser


def test_argparse_private_attributes_keep_the_shape_docs_data_reads() -> None:
    parser = _parser()
    version = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    assert isinstance(getattr(parser, "_actions", None), list), (
        f"{version}: ArgumentParser._actions is gone or not a list; fleetops/docgen/data.py _arguments needs another route"
    )
    assert all(isinstance(a, argparse.Action) for a in parser._actions), f"{version}: _actions holds non-Actions"
    subs = [a for a in parser._actions if isinstance(a, getattr(argparse, "_SubParsersAction", ()))]
    assert len(subs) == 1, f"{version}: argparse._SubParsersAction no longer marks the subparsers action"
    choices = getattr(subs[0], "_choices_actions", None)
    assert isinstance(choices, list) and {c.dest for c in choices} == {"run", "secret"}, (
        f"{version}: _SubParsersAction._choices_actions changed shape; fleetops/docgen/data.py _subcommands reads it"
    )


def test_docs_data_lists_what_the_parser_was_given() -> None:
    parser = _parser()
    assert [a.dest for a in data._arguments(parser)] == ["flag"]
    subs = data._subcommands(parser)
    assert list(subs) == ["run"] and subs["run"][1] == "run it"
