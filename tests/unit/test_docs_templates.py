"""The reference pages are Jinja2 templates over plain data, and that arrangement holds up.

- A template's change shows in ``fleetops docs --check`` (exit 1, naming that page alone), run
  as a real process from a copy of the package.
- A field a template names and its data lacks stops generation (StrictUndefined), in output
  and in conditions alike; Markdown is not HTML-escaped.
- The data functions return plain data (what a template can rely on, and JSON can hold).
- The command reference follows the parsers: a subcommand added to either parser (``fleetops
  check``, ``fleetops apply mig``, ``fleetops-agent mig apply``) appears with its help and flags
  without a template edit.
- ``fleetops-agent validate --backend`` has its own help; the other commands keep theirs.
- The templates ship as package data: a wheel built from the tree carries them and runs
  ``fleetops docs --check`` from its own files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import jinja2
import pytest

from fleetops.docgen import data, example, generate, markdown

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleetops"
TEMPLATES = PACKAGE / "docgen" / "templates"


def _copy_package(dest: Path) -> Path:
    shutil.copytree(PACKAGE, dest / "fleetops", ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "fleetops"


def _docs_check(pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """``fleetops docs --check`` against the committed pages, importing fleetops from ``pythonpath``."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [sys.executable, "-m", "fleetops.cli", "docs", "--check", "--out", str(ROOT / "docs")],
        cwd=pythonpath, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


# --- --check sees a template's change ------------------------------------------------------


def test_docs_check_fails_naming_the_page_whose_template_changed(tmp_path: Path) -> None:
    copy = _copy_package(tmp_path)
    same = _docs_check(tmp_path)
    assert same.returncode == 0, same.stderr  # the copy, unchanged, generates the committed pages
    assert "generated pages" in same.stdout and "are current" in same.stdout

    template = copy / "docgen" / "templates" / "xid.md.j2"
    text = template.read_text(encoding="utf-8")
    assert "## Each code\n" in text
    template.write_text(text.replace("## Each code\n", "## Every code\n"), encoding="utf-8")
    changed = _docs_check(tmp_path)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    stale = [line for line in changed.stderr.splitlines() if "differs from what the code generates" in line]
    assert stale == [f"{ROOT / 'docs' / 'reference' / 'xid.md'}: differs from what the code generates"]
    assert "run `fleetops docs` to regenerate them" in changed.stderr


# --- StrictUndefined, no HTML escaping ---------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "field", "typo"),
    [
        ("checks.md.j2", "{{ c.reads }}", "{{ c.raeds }}"),  # printed
        ("checks.md.j2", "{% if c.not_a_fault %}", "{% if c.not_a_falt %}"),  # a condition
        ("baseline.md.j2", "{{ key.description }}", "{{ key.descripton }}"),
        ("commands.md.j2", "{{ arg.help | text | cell }}", "{{ arg.hlep | text | cell }}"),  # through filters
    ],
)
def test_a_typo_in_a_template_field_stops_generation(tmp_path: Path, template: str, field: str, typo: str) -> None:
    folder = tmp_path / "templates"
    shutil.copytree(TEMPLATES, folder)
    text = (folder / template).read_text(encoding="utf-8")
    assert field in text
    (folder / template).write_text(text.replace(field, typo, 1), encoding="utf-8")
    wrong = typo.split(".", 1)[1].split()[0].rstrip("}")
    with pytest.raises(jinja2.UndefinedError, match=wrong):
        generate.generate_all(templates_dir=str(folder))


def test_the_unchanged_template_copy_renders_the_committed_pages(tmp_path: Path) -> None:
    folder = tmp_path / "templates"
    shutil.copytree(TEMPLATES, folder)
    pages = generate.generate_all(templates_dir=str(folder))
    assert generate.differing(str(ROOT / "docs"), pages) == []


def test_markdown_is_not_html_escaped() -> None:
    env = generate.environment()
    assert env.autoescape is False
    page = generate.render("reference/outputs.md", env)
    assert "<testsuite " in page and "&lt;testsuite" not in page  # the JUnit excerpt, a data value
    assert any("'" in c["action"] for c in data.checks_page_data()["checks"])
    assert "&#39;" not in generate.render("reference/checks.md", env)


# --- the data is plain -------------------------------------------------------------------------


PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any, where: str) -> list[str]:
    if isinstance(value, PLAIN):
        return []
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _plain(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in (_plain(k, f"{where} key") + _plain(v, f"{where}.{k}"))]
    return [f"{where}: {type(value).__name__}"]


@pytest.mark.parametrize("path", sorted(generate.PAGES))
def test_each_page_data_function_returns_plain_data(path: str) -> None:
    doc = generate.PAGES[path].data()
    assert isinstance(doc, dict) and doc
    assert _plain(doc, path) == []


def test_page_data_is_the_real_sources() -> None:
    from fleetops import baseline as bl
    from fleetops import checks
    from fleetops.xid import catalog as xid

    assert [k["path"] for k in data.baseline_page_data()["keys"]] == [k.path for k in bl.SCHEMA]
    assert [c["id"] for c in data.checks_page_data()["checks"]] == list(checks.REGISTRY)
    assert [c["code"] for c in data.xid_page_data()["codes"]] == sorted(xid.CATALOG)
    result, code = example.example_audit()
    assert example.outputs_page_data()["summary"]["exit_code"] == code == 3  # a crit node and an unreachable one


# --- the command reference follows the parsers -------------------------------------------------


def _with_new_commands(build: Callable[[], argparse.ArgumentParser], add: Callable[[Any], None]) -> Callable[[], Any]:
    def patched() -> argparse.ArgumentParser:
        parser = build()
        add(parser)
        return parser

    return patched


def _subparsers(parser: argparse.ArgumentParser) -> Any:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_commands_added_to_either_parser_appear_without_a_template_edit() -> None:
    from fleetops import cli
    from fleetops.agent import main as agent_main

    def controller(parser: argparse.ArgumentParser) -> None:
        sub = _subparsers(parser)
        p = sub.add_parser("check", help="run the desired-state checks on one node's snapshot")
        p.add_argument("--baseline", metavar="FILE", required=True, help="baseline YAML, or - for stdin")
        apply = next(c for n, c in sub.choices.items() if n == "apply")
        apply_sub = next((a for a in apply._actions if isinstance(a, argparse._SubParsersAction)), None)
        group = apply_sub or apply.add_subparsers(dest="apply_command")
        q = group.add_parser("mig", help="set MIG mode and the instance layout on every GPU of the hosts")
        q.add_argument("--profiles", help="comma-separated <profile> names")

    def agent(parser: argparse.ArgumentParser) -> None:
        # today's `mig` takes its action as a positional; a nested group stands for `mig apply`
        group = _subparsers(parser).add_parser("mig-layout", help="MIG layouts: apply one")
        q = group.add_subparsers(dest="layout_command").add_parser("apply", help="apply the layout the baseline names")
        q.add_argument("--gpu", default="all", help="all, a UUID or a bus id")

    with mock.patch.object(cli, "build_parser", _with_new_commands(cli.build_parser, controller)), \
            mock.patch.object(agent_main, "build_parser", _with_new_commands(agent_main.build_parser, agent)):
        page = generate.render("reference/commands.md")
    assert "### `fleetops check`\n\nrun the desired-state checks on one node's snapshot\n" in page
    assert "| `--baseline` | `FILE` | required | baseline YAML, or - for stdin |" in page
    assert "### `fleetops apply mig`\n\nset MIG mode and the instance layout on every GPU of the hosts\n" in page
    assert "| `--profiles` | `PROFILES` |  | comma-separated &lt;profile> names |" in page
    assert "[`fleetops apply mig`](#fleetops-apply-mig)" in page
    assert "### `fleetops-agent mig-layout apply`\n\napply the layout the baseline names\n" in page
    assert "[`fleetops-agent mig-layout apply`](#fleetops-agent-mig-layout-apply)" in page
    committed = (ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    assert "fleetops check`" not in committed  # the additions came from the patched parsers alone


def test_every_subcommand_of_both_programs_has_a_section_and_a_listed_link() -> None:
    from fleetops.agent.main import build_parser as agent_parser
    from fleetops.cli import build_parser

    page = generate.render("reference/commands.md")

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
        out = []
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            for name, sub in action.choices.items():
                out.append(" ".join([*words, name]))
                out += walk(sub, [*words, name])
        return out

    names = walk(build_parser(), ["fleetops"]) + walk(agent_parser(), ["fleetops-agent"])
    assert len(names) > 25 and "fleetops sim inject" in names and "fleetops-agent slurm-healthcheck" in names
    for name in names:
        assert f"\n### `{name}`\n" in page, name
        assert f"[`{name}`](#{markdown.slug(name)})" in page, name


def test_synopsis_and_argument_rows_follow_argparse() -> None:
    page = generate.render("reference/commands.md")
    section = page.split("### `fleetops sim up`\n", 1)[1].split("\n### ", 1)[0]
    assert "fleetops sim up [--nodes NODES] --dir DIR [--scenario SCENARIO]" in section
    assert "| `--dir` | `DIR` | required | folder for keys, state, inventory.yml and known_hosts |" in section
    assert "| `--nodes` | `NODES` | `8` | simulated nodes to start (default 8) |" in section
    serve = page.split("### `fleetops-agent serve`\n", 1)[1].split("\n### ", 1)[0]
    assert "[--states STATES [STATES ...]]" in serve
    history = page.split("### `fleetops history`\n", 1)[1].split("\n### ", 1)[0]
    assert "fleetops history [node] " in history
    assert "| `--kind` | `audit`, `validate`, `escalation`, `drains`, `actions` | `audit` |" in history
    for block in page.split("```text\n")[1:]:
        for line in block.split("\n```", 1)[0].splitlines():
            assert len(line) <= 100 or " " not in line.strip(), line


def test_wrap_words_breaks_between_words_only() -> None:
    words = ["prog sub", "[--a A]", "[--format {table,json,junit,prom}]", "[--b B]"]
    assert markdown.wrap_words(words, width=30) == (
        "prog sub [--a A]\n    [--format {table,json,junit,prom}]\n    [--b B]"
    )
    assert markdown.wrap_words(["a", "b"], width=30) == "a b"


# --- fleetops-agent validate --backend ---------------------------------------------------------


def _agent_help(*argv: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", *argv, "--help"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())


def test_validate_backend_help_names_its_own_backends_and_what_auto_picks() -> None:
    from fleetops.validation.node.run import BACKENDS

    text = _agent_help("validate")
    assert "--backend BACKEND torch|cupy|dcgm|sim|auto (default auto: sim with --state or $FLEETOPS_SIM_STATE" in text
    assert "then cupy, then dcgm" in text and "auto|nvml|sim" not in text
    named = text.split("--backend BACKEND ", 1)[1].split(" ", 1)[0].split("|")
    assert sorted(named) == sorted(BACKENDS)
    collect = _agent_help("collect")
    assert ("auto|nvml|sim (default auto: sim when FLEETOPS_SIM_STATE is set and this node has no NVIDIA driver, "
            "else nvml)") in collect
    assert "--sim-on-gpu-node" in collect and "cupy" not in collect
    page = (ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    validate = page.split("### `fleetops-agent validate`\n", 1)[1].split("\n### ", 1)[0]
    assert "| `--backend` | `BACKEND` | `auto` | torch\\|cupy\\|dcgm\\|sim\\|auto (default auto:" in validate


# --- the templates ship in the wheel -----------------------------------------------------------


@pytest.mark.slow
def test_a_built_wheel_carries_the_templates_and_checks_the_pages(tmp_path: Path) -> None:
    tree = tmp_path / "tree"  # built from a copy: the build leaves build/ and egg-info behind
    _copy_package(tree)
    shutil.copy(ROOT / "pyproject.toml", tree)
    proc = subprocess.run(
        # no build isolation: the venv's own setuptools builds it, so no package index is asked
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "dist"), str(tree)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("fleetops-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith("fleetops/docgen/templates/")}
        zf.extractall(tmp_path / "site")
    assert shipped == {f"fleetops/docgen/templates/{p.name}" for p in TEMPLATES.glob("*.j2")}
    assert {page.template for page in generate.PAGES.values()} <= {Path(n).name for n in shipped}
    assert not (tmp_path / "site" / "docs").exists()  # only the package: the pages come from its templates
    run = _docs_check(tmp_path / "site")
    assert run.returncode == 0, run.stderr
    assert f"{len(generate.PAGES)} generated pages in {ROOT / 'docs'} are current" in run.stdout
