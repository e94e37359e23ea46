"""Every shell command of docs/quickstart.md's simulated-fleet part, run as the page shows it.

The page's ```bash blocks run in order in one bash session (so ``export`` and ``source`` carry
over), from the top of the checkout, with HOME in a temporary folder and the page's fleet folder
(/tmp/fleetops-quickstart) replaced by a temporary one. A block is skipped when the line before
it is ``<!-- not-tested: REASON -->``. Each command must exit with the code its comment gives
(``# exit N``), else 0. The simulated fleet is stopped at the end, also when a command fails.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetops.sim import fleet

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
PAGE_FLEET_DIR = "/tmp/fleetops-quickstart"
TIMEOUT_S = 420

_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"^<!--\s*not-tested:\s*(.+?)\s*-->$")
_EXIT = re.compile(r"\s#\s*exit\s+(\d+)\b")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    lines: list[str]
    skip: str | None


@dataclass
class Command:
    text: str
    expect: int
    line: int


def fenced_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = _SKIP.match(prev)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        blocks.append(Block(m.group(1), start + 1, body, skip.group(1) if skip else None))
        i += 1
    return blocks


def commands(block: Block) -> list[Command]:
    """Commands of a block: continuation lines joined, here-documents kept whole, comment-only
    and blank lines dropped; the expected exit code from a trailing ``# exit N``."""
    out: list[Command] = []
    lines = block.lines
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        first = i
        text = line
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].strip()
        m = _EXIT.search(text)
        heredoc = _HEREDOC.search(text)
        if heredoc:
            tag = heredoc.group(2)
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() != tag:
                body.append(lines[i])
                i += 1
            text = "\n".join([text, *body, tag])
        out.append(Command(text, int(m.group(1)) if m else 0, block.line + 1 + first))
        i += 1
    return out


def page_commands(page: str) -> list[Command]:
    return [c for b in fenced_blocks(page) if b.lang == "bash" and b.skip is None for c in commands(b)]


def test_page_parses_into_commands() -> None:
    page = PAGE.read_text(encoding="utf-8")
    cmds = page_commands(page)
    assert len(cmds) >= 10, "the quickstart's simulated part should have its commands in ```bash blocks"
    assert any("fleetops sim up" in c.text for c in cmds)
    assert any("fleetops sim down" in c.text for c in cmds[-2:]), "the last tested block must stop the fleet"
    assert any(c.expect == 2 and "fleetops audit" in c.text for c in cmds), "the demo audit exits 2"
    assert PAGE_FLEET_DIR in page, f"the page's fleet folder must be {PAGE_FLEET_DIR} (the test swaps it)"
    skipped = [b for b in fenced_blocks(page) if b.lang == "bash" and b.skip]
    assert any("real fleet" in b.skip for b in skipped if b.skip), "the real-fleet part is marked not-tested"


def _page_address(page: str) -> tuple[str, int]:
    addr = re.search(r"--first-address\s+(\S+)", page)
    port = re.search(r"fleetops sim up[^\n]*--port\s+(\d+)", page)
    return (addr.group(1) if addr else "127.0.10.1"), (int(port.group(1)) if port else 2222)


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.3):
            return True
    except OSError:
        return False


def _script(cmds: list[Command], out_dir: Path, rc_file: Path, activate: str | None) -> str:
    parts = ["set +e", f"cd {shlex.quote(str(ROOT))}", f"exec 3>{shlex.quote(str(rc_file))}"]
    for n, cmd in enumerate(cmds):
        text = cmd.text
        if activate:
            text = text.replace("source .venv/bin/activate", f"source {shlex.quote(activate)}")
        parts.append("{ " + text + "\n} > " + shlex.quote(str(out_dir / f"{n}.out")) + " 2>&1 < /dev/null")
        parts.append(f'echo "{n} $?" >&3')
    return "\n".join(parts) + "\n"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the simulated fleet runs real sshd processes")
@pytest.mark.skipif(fleet.find_sshd() is None, reason="needs sshd: apt-get install -y openssh-server")
def test_quickstart_commands_run_as_the_page_says(tmp_path: Path) -> None:
    page = PAGE.read_text(encoding="utf-8")
    address, port = _page_address(page)
    if _accepts(address, port):
        pytest.skip(
            f"{address}:{port} is in use (a quickstart fleet left running? fleetops sim down --dir ...)"
        )
    # the fleet and HOME in a short folder, as the page's /tmp/fleetops-quickstart is: the daemon's
    # sockets and ansible's SSH control sockets live under them (unix socket paths are at most 107
    # bytes), and tmp_path is longer under pytest-xdist
    top = Path(tempfile.mkdtemp(prefix="fo-qs-", dir="/tmp"))
    fleet_dir = top / "fleet"
    page = page.replace(PAGE_FLEET_DIR, str(fleet_dir))
    cmds = page_commands(page)
    bindir = Path(sys.executable).parent
    activate = bindir / "activate"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    home = top / "home"
    home.mkdir()
    rc_file = tmp_path / "rc"
    script = tmp_path / "quickstart.sh"
    script.write_text(_script(cmds, out_dir, rc_file, str(activate) if activate.exists() else None))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETOPS_", "ANSIBLE_"))}
    env.update(HOME=str(home), PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    timed_out = False
    try:
        try:
            subprocess.run(["bash", str(script)], env=env, cwd=ROOT, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        fleet.down(str(fleet_dir))
        shutil.rmtree(top, ignore_errors=True)
    codes = {}
    for row in rc_file.read_text().splitlines():
        n, rc = row.split()
        codes[int(n)] = int(rc)
    problems = []
    for n, cmd in enumerate(cmds):
        out_path = out_dir / f"{n}.out"
        output = out_path.read_text(errors="replace") if out_path.exists() else ""
        got = codes.get(n)
        if got == cmd.expect:
            continue
        what = (
            "did not run (timed out before it)"
            if got is None
            else f"exited {got}, the page says {cmd.expect}"
        )
        problems.append(
            f"docs/quickstart.md:{cmd.line}: {cmd.text.splitlines()[0]}\n  {what}\n"
            + "\n".join("  | " + ln for ln in output.splitlines()[-25:])
        )
        if got is None:
            break
    assert not timed_out, f"the quickstart took more than {TIMEOUT_S} s:\n\n" + "\n\n".join(problems)
    assert problems == [], "quickstart commands that do not do what the page says:\n\n" + "\n\n".join(problems)
