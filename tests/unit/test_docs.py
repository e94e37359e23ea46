"""The documentation cannot drift from the code.

- The committed generated pages (docs/reference/) equal what ``fleetops docs`` generates now.
- Every check id, baseline key, XID code and Prometheus metric appears in its page.
- Every ``fleetops`` / ``fleetops-agent`` command shown in the docs parses with the real CLI
  (subcommands and flags exist), every playbook named exists, every relative link resolves.
- The quickstart's first-baseline snippet turns an audit into a baseline that validates.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from fleetops import baseline as bl
from fleetops import checks
from fleetops.cli import build_parser
from fleetops.docgen import generate
from fleetops.report import json_report, prometheus
from fleetops.xid import catalog as xid

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REGENERATE = "run `fleetops docs` (or `.venv/bin/fleetops docs`) and commit docs/reference/"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return generate.generate_all()


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


# --- generated pages ---------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(generate.PAGES))
def test_committed_generated_page_matches_the_code(path: str, pages: dict[str, str]) -> None:
    target = DOCS / path
    assert target.exists(), f"docs/{path} is missing: {REGENERATE}"
    committed = target.read_text(encoding="utf-8")
    if committed != pages[path]:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    pages[path].splitlines(keepends=True),
                    f"docs/{path} (committed)",
                    f"docs/{path} (generated)",
                )
            )[:60]
        )
        pytest.fail(f"docs/{path} differs from what the code generates: {REGENERATE}\n\n{diff}")


def test_docs_check_command_agrees(tmp_path: Path, pages: dict[str, str]) -> None:
    from fleetops.cli import main

    assert main(["docs", "--check", "--out", str(tmp_path)]) == 1
    assert main(["docs", "--out", str(tmp_path)]) == 0
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 0
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.md")} == set(pages)
    (tmp_path / "reference" / "xid.md").write_text("stale\n")
    assert generate.differing(str(tmp_path)) == ["reference/xid.md"]


def test_generation_does_not_depend_on_the_clock(pages: dict[str, str]) -> None:
    with mock.patch("time.time", return_value=1_000_000_000.0):
        again = generate.generate_all()
    assert again == pages


def test_every_baseline_key_is_documented(pages: dict[str, str]) -> None:
    text = pages["reference/baseline.md"]
    for key in bl.SCHEMA:
        assert f"### `{key.path}`" in text, key.path


def test_full_example_baseline_validates() -> None:
    base = bl.from_mapping(generate.example_baseline(), source="example")
    for key in bl.SCHEMA:
        if key.parent == "thresholds":
            assert getattr(base.thresholds, key.name) == key.example


def test_every_check_is_documented(pages: dict[str, str]) -> None:
    text = pages["reference/checks.md"]
    for check_id, spec in checks.REGISTRY.items():
        assert f"### `{check_id}`" in text, check_id
        assert spec.action in text, check_id
        if spec.not_a_fault:
            section = text.split("## What is deliberately not a fault", 1)[1]
            assert spec.not_a_fault in section, check_id


def test_not_a_fault_section_states_the_three_cases(pages: dict[str, str]) -> None:
    section = pages["reference/checks.md"].split("## What is deliberately not a fault", 1)[1]
    assert "Not Supported" in section
    assert "gpu_idle" in section and "sw_power_cap" in section
    assert "MIG" in section and "NVLink" in section


def test_every_xid_in_the_catalog_has_a_row_and_a_section(pages: dict[str, str]) -> None:
    text = pages["reference/xid.md"]
    rows = {}
    for line in text.split("## Codes", 1)[1].split("\n## ", 1)[0].splitlines():
        m = re.match(r"^\| \[(\d+)\]\(#xid-\1\) \| ([^|]+) \| (\w+) \| `(\w+)` \|", line)
        if m:
            rows[int(m.group(1))] = (m.group(2).strip(), m.group(3), m.group(4))
    assert rows == {code: (i.name, i.severity, i.action) for code, i in xid.CATALOG.items()}
    sections = [int(c) for c in re.findall(r"^### XID (\d+)$", text, re.MULTILINE)]
    assert sections == sorted(xid.CATALOG)
    for code, info in xid.CATALOG.items():
        section = text.split(f"### XID {code}\n", 1)[1].split("\n### ", 1)[0]
        assert info.name in section and f"`{info.severity}`" in section, code
        assert xid.ACTION_TEXT[info.action] in section, code


def test_every_fleetops_command_the_xid_page_names_parses_with_the_real_cli(pages: dict[str, str]) -> None:
    spans = re.findall(r"`(fleetops(?:-agent)? [^`]+)`", pages["reference/xid.md"])
    commands = {span for span in spans if not any(ch in span for ch in "|[]{}") and "..." not in span}
    assert any(c.startswith("fleetops reset ") for c in commands), commands  # a reset is named somewhere
    problems = {c: why for c in sorted(commands) if (why := _unknown_words(c.split()))}
    assert problems == {}


def _unknown_words(words: list[str]) -> str | None:
    """What in a command fragment the real parser does not know: a subcommand or a flag
    (fragments in prose leave out required arguments, so they are not parsed whole)."""
    parser = build_parser() if words[0] == "fleetops" else _agent_parser()
    rest = words[1:]
    while rest:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or rest[0] not in subs[0].choices:
            break
        parser, rest = subs[0].choices[rest[0]], rest[1:]
    if [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)] and not rest:
        return None  # a command group named on its own
    flags = {o for a in parser._actions for o in a.option_strings}
    unknown = [w for w in rest if w.startswith("-") and w.split("=", 1)[0] not in flags]
    return f"{parser.prog} has no {', '.join(unknown)}" if unknown else None


def test_outputs_page_names_every_metric_and_shows_real_output(pages: dict[str, str]) -> None:
    text = pages["reference/outputs.md"]
    for metric, _, _ in prometheus.GPU_GAUGES:
        assert f"`{metric}`" in text, metric
    result, code = generate.example_audit()
    for line in prometheus.render(result, code).splitlines():
        if line.startswith("# TYPE "):
            assert f"`{line.split()[2]}`" in text, line
    doc = json_report.document(result, code)
    # node002 crit and node003 unreachable: the unreachable node ranks worst (model.HEALTH_ORDER)
    assert code == 3 and doc["summary"]["exit_code"] == 3 and doc["summary"]["worst"] == "unreachable"
    assert json.dumps(doc["findings"], indent=2) in text
    assert {f["check"] for f in doc["findings"]} >= {"memory.ecc_dbe_volatile", "transport.unreachable"}


# --- hand-written pages --------------------------------------------------------------------

_FENCE = re.compile(r"^```(\S*)\s*$", re.MULTILINE)
_SHELL_SPLIT = re.compile(r"\s(?:\||\|\||&&|;|>|2>|<)\s|\s#")


def _doc_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _bash_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) of every ```bash block, continuations joined."""
    out = []
    lines = text.splitlines()
    inside = False
    lang = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            inside = not inside if (m.group(1) or inside) else inside
            lang = m.group(1) if inside else ""
            i += 1
            continue
        if inside and lang == "bash":
            start = i
            text_line = line
            while text_line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text_line = text_line.rstrip()[:-1] + " " + lines[i].strip()
            out.append((start + 1, text_line))
        i += 1
    return out


def _fleetops_argvs(line: str) -> list[list[str]]:
    """``fleetops``/``fleetops-agent`` invocations in a shell line, as argument lists."""
    out = []
    for part in _SHELL_SPLIT.split(" " + line + " "):
        part = part.strip()
        part = re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+", "", part)  # VAR=value prefixes
        for prefix in ("sudo ", "xargs "):
            part = part.removeprefix(prefix)
        if re.match(r"^(fleetops|fleetops-agent)(\s|$)", part) or re.match(
            r"^ssh\s.*\sfleetops-agent\s", part
        ):
            words = shlex.split(part)
            if words[0] == "ssh":
                words = words[words.index("fleetops-agent") :]
            out.append(words)
    return out


def _agent_parser():  # type: ignore[no-untyped-def]
    from fleetops.agent.main import build_parser as agent_parser

    return agent_parser()


def _parses(words: list[str]) -> str | None:
    parser = build_parser() if words[0] == "fleetops" else _agent_parser()
    try:
        parser.parse_args(words[1:])
    except SystemExit as exc:
        if exc.code != 0:  # --help exits 0
            return f"argparse exit {exc.code}"
    return None


def test_every_command_shown_in_the_docs_exists_with_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    problems = []
    seen = 0
    for path in _doc_files():
        text = path.read_text(encoding="utf-8")
        for lineno, line in _bash_lines(text):
            for words in _fleetops_argvs(line):
                seen += 1
                why = _parses(words)
                if why:
                    problems.append(f"{path.relative_to(ROOT)}:{lineno}: {' '.join(words)}: {why}")
            for playbook in re.findall(r"\bplaybooks/[\w./-]+\.yml\b", line):
                if not (ROOT / playbook).exists():
                    problems.append(f"{path.relative_to(ROOT)}:{lineno}: {playbook} does not exist")
        # the checks catalog lists the commands its actions name that do not exist, on purpose
        prose = text.split(f"## {generate.MISSING_COMMANDS_HEADING}", 1)[0]
        for span in re.findall(r"`(fleetops [^`]+)`", prose):
            words = span.split()
            if any(ch in span for ch in "|[]{}") or "..." in span:
                continue
            if not generate.command_exists(words):
                problems.append(f"{path.relative_to(ROOT)}: `{span}`: no such fleetops command")
    capsys.readouterr()
    assert seen > 40, "the docs should show commands in ```bash blocks"
    assert not problems, "commands in the docs that the CLI does not accept:\n" + "\n".join(problems)


def _anchors(text: str) -> set[str]:
    anchors = generate._Anchors()
    found = set()
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m and not inside:
            found.add(anchors(m.group(1)))
    return found


def test_relative_links_resolve() -> None:
    problems = []
    for path in _doc_files():
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{path.relative_to(ROOT)}: link {target}: {file_part} does not exist")
                continue
            if anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{path.relative_to(ROOT)}: link {target}: no heading #{anchor} there")
    assert not problems, "\n".join(problems)


def test_hand_written_pages_exist() -> None:
    for name in (
        "index.md",
        "quickstart.md",
        "runbooks/driver-rollout.md",
        "runbooks/power-cap-change.md",
        "runbooks/incident-tui.md",
        "runbooks/scaling.md",
        "runbooks/ssh.md",
    ):
        assert (DOCS / name).exists(), name
    index = _page("index.md")
    for path in [*generate.PAGES, "quickstart.md", "runbooks/scaling.md", "runbooks/ssh.md"]:
        assert f"({path}" in index, f"index.md does not link {path}"


def test_quickstart_baseline_snippet_makes_a_valid_baseline(tmp_path: Path) -> None:
    page = _page("quickstart.md")
    m = re.search(r"^python3 - first-audit\.json > \S+ <<'EOF'\n(.*?)^EOF$", page, re.DOTALL | re.MULTILINE)
    assert m, "the quickstart's first-baseline snippet is gone"
    result, code = generate.example_audit()
    audit_json = tmp_path / "first-audit.json"
    audit_json.write_text(json_report.render(result, code))
    proc = subprocess.run(
        [sys.executable, "-", str(audit_json)], input=m.group(1), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    base = bl.from_mapping(data, source="snippet output")
    assert base.driver_version == "580.159.04"
    assert base.gpu_count == 8
    assert base.power_limit_for("NVIDIA H200") == 700  # the majority, not node002's drifted 500 W
