"""The import rules of docs/architecture.md, held: every arrow between rooms is one the table
allows, no two modules import each other (round any loop), and the node agent's entry points
load nothing of the controller side."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fleetops"
ARCHITECTURE = REPO / "docs" / "architecture.md"
NODE, CONTROLLER = "node", "controller"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the fleetops module imported (a submodule named by ``from pkg import sub`` is the submodule)
    path: str  # repo-relative file of the importing module
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``


@dataclass(frozen=True)
class Table:
    sides: dict[str, str]  # room -> NODE | CONTROLLER
    allowed: dict[str, frozenset[str]]  # room -> rooms it may import
    pending_cycles: list[frozenset[str]]


def read_table(text: str) -> Table:
    blocks = re.findall(r"^```rooms\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) == 1, "docs/architecture.md needs exactly one ```rooms block"
    sides: dict[str, str] = {}
    allowed: dict[str, frozenset[str]] = {}
    pending: list[frozenset[str]] = []
    for raw in blocks[0].splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.partition(":")
        if head.strip() == "pending-cycle":
            pending.append(frozenset(rest.split()))
            continue
        m = re.fullmatch(r"([\w.]+)\s*\[(node|controller)\]", head.strip())
        assert m, f"architecture.md rooms: cannot read {raw!r} (want 'room [node|controller]: a, b')"
        room, side = m.groups()
        assert room not in sides, f"room {room} listed twice"
        sides[room] = side
        allowed[room] = frozenset(r.strip() for r in rest.split(",") if r.strip())
    return Table(sides, allowed, pending)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    for sub in ast.walk(child):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _known(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(mods: dict[str, Path]) -> list[Import]:
    """Every import of a fleetops module anywhere in a module (top level, functions, classes)."""
    out: list[Import] = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        typed = _type_checking_lines(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        rel = str(path.relative_to(REPO))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    assert base, f"{rel}:{node.lineno}: relative import above the package"
                    source = ".".join(base) + (f".{node.module}" if node.module else "")
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in mods else source)
            for target in targets:
                if target.split(".")[0] != "fleetops":
                    continue
                known = _known(target, mods)
                assert known, f"{rel}:{node.lineno}: imports {target}, which is no module of fleetops"
                out.append(Import(mod, known, rel, node.lineno, node.lineno in typed))
    return out


def room_of(module: str, table: Table) -> str | None:
    rel = module.removeprefix("fleetops").lstrip(".") or "fleetops"
    best = None
    for room in table.sides:
        if rel == room or rel.startswith(room + "."):
            if best is None or len(room) > len(best):
                best = room
    return best


@pytest.fixture(scope="module")
def table() -> Table:
    return read_table(ARCHITECTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Import]]:
    mods = modules()
    return mods, imports(mods)


def test_the_table_reads_and_no_node_room_may_import_the_controller(table: Table) -> None:
    problems = []
    for room, may in table.allowed.items():
        for other in sorted(may):
            if other not in table.sides:
                problems.append(f"{room} may import {other}: no such room in the table")
            elif table.sides[room] == NODE and table.sides[other] == CONTROLLER:
                problems.append(f"{room} (node side) may import {other} (controller side)")
    assert table.sides.get("agent") == NODE and table.sides.get("fleet") == CONTROLLER
    assert not problems, "\n".join(problems)


def test_every_module_has_a_room_and_every_room_a_module(table: Table, graph: tuple[dict[str, Path], list[Import]]) -> None:
    mods, _ = graph
    homeless = [m for m in mods if room_of(m, table) is None]
    assert not homeless, f"modules in no room of docs/architecture.md: {homeless}"
    used = {room_of(m, table) for m in mods}
    empty = sorted(set(table.sides) - used)
    assert not empty, f"rooms in docs/architecture.md with no module: {empty}"


def test_every_import_is_an_arrow_the_table_allows(table: Table, graph: tuple[dict[str, Path], list[Import]]) -> None:
    _, found = graph
    wrong = []
    for imp in found:
        src, dst = room_of(imp.source, table), room_of(imp.target, table)
        assert src is not None and dst is not None
        if src != dst and dst not in table.allowed[src]:
            wrong.append(f"{imp.path}:{imp.line}: {imp.source} ({src}) imports {imp.target} ({dst})")
    assert not wrong, "arrows docs/architecture.md does not allow:\n" + "\n".join(sorted(set(wrong)))


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(frozenset(comp))
    return out


def test_no_two_modules_import_each_other(table: Table, graph: tuple[dict[str, Path], list[Import]]) -> None:
    """Run-time imports only (``TYPE_CHECKING`` ones never run); a module importing its own package
    (``from fleetops.agent.serve import x`` in a submodule of it) is not a loop."""
    mods, found = graph
    edges: dict[str, set[str]] = {m: set() for m in mods}
    where: dict[tuple[str, str], str] = {}
    for imp in found:
        if imp.type_only or imp.source == imp.target or imp.source.startswith(imp.target + "."):
            continue
        edges[imp.source].add(imp.target)
        where.setdefault((imp.source, imp.target), f"{imp.path}:{imp.line}")
    cycles = _cycles(edges)
    new = [c for c in cycles if c not in table.pending_cycles]
    gone = [sorted(c) for c in table.pending_cycles if c not in cycles]
    lines = []
    for comp in new:
        arrows = [f"{where[(a, b)]}: {a} -> {b}" for a in sorted(comp) for b in sorted(edges[a] & comp)]
        lines.append(f"loop {sorted(comp)}:\n  " + "\n  ".join(arrows))
    assert not new, "import loops between modules:\n" + "\n".join(lines)
    assert not gone, f"pending-cycle lines in docs/architecture.md for loops that are gone: {gone}"


def _reachable(start: list[str], found: list[Import]) -> set[str]:
    edges: dict[str, set[str]] = {}
    for imp in found:
        if not imp.type_only:
            edges.setdefault(imp.source, set()).add(imp.target)
    seen, todo = set(), list(start)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # a submodule runs its packages
        todo.extend(edges.get(mod, ()))
    return seen


AGENT_ENTRIES = ["fleetops.agent.main", "fleetops.agent.serve"]


def test_nothing_the_agent_can_reach_is_controller_side(table: Table, graph: tuple[dict[str, Path], list[Import]]) -> None:
    """Every module ``fleetops-agent`` could import on any path (function-level imports too)."""
    _, found = graph
    reach = _reachable(AGENT_ENTRIES, found)
    bad = sorted(m for m in reach if table.sides[room_of(m, table) or ""] == CONTROLLER)
    assert not bad, f"controller modules the agent can import: {bad}"


_CHILD = r"""
import json, sys
from fleetops.agent.main import main
state = sys.argv[1]
codes = {}
for argv in (["collect", "--backend", "sim", "--state", state, "--fresh"],
             ["collect", "--backend", "sim", "--state", state, "--fresh", "--pretty"],
             ["check", "--backend", "sim", "--state", state, "--fresh"]):
    codes[argv[0] + (" --pretty" if "--pretty" in argv else "")] = main(argv)
import importlib
for name in sys.argv[2:]:  # the daemon's entry and every module its run path imports
    importlib.import_module(name)
from fleetops.agent.serve import exposition
exposition.healthcheck_page(None)  # the health program's metrics, which every scrape reads
heavy = sorted(m for m in ("hashlib", "_hashlib", "ssl", "_ssl", "secrets") if m in sys.modules)
spare = sorted(m for m in ("statistics", "fractions", "decimal", "random", "difflib") if m in sys.modules)
print(json.dumps({"codes": codes, "heavy": heavy, "spare": spare,
                  "modules": sorted(m for m in sys.modules if m.split(".")[0] == "fleetops")}))
"""


def test_a_fresh_agent_loads_nothing_of_the_controller(table: Table, graph: tuple[dict[str, Path], list[Import]], tmp_path: Path) -> None:
    """In a fresh interpreter: ``fleetops-agent collect`` and ``check`` on the simulator, then the
    daemon's entry (``fleetops.agent.serve``) and every module its run path imports."""
    _, found = graph
    state = tmp_path / "state.json"
    subprocess.run([sys.executable, "-c", f"from fleetops.sim import gpu as sim; sim.init_state({str(state)!r}, 'n1')"],
                   check=True, cwd=REPO)  # fmt: skip
    daemon = sorted(m for m in _reachable(["fleetops.agent.serve"], found) if m.startswith("fleetops.agent.serve"))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(state), *daemon], check=False,
                         capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["codes"]["collect"] == 0 and doc["codes"]["collect --pretty"] == 0, doc["codes"]
    assert doc["codes"]["check"] == 0, doc["codes"]  # a fresh simulated node is healthy
    loaded = doc["modules"]
    assert "fleetops.agent.serve.loops" in loaded and "fleetops.checks.verdict" in loaded
    bad = [m for m in loaded if table.sides[room_of(m, table) or ""] == CONTROLLER]
    assert not bad, f"controller modules loaded by the agent: {bad}"
    # hashlib maps OpenSSL's libcrypto (3.5 MiB resident in the daemon on a GPU node); nothing
    # the agent does without TLS or a run id needs it
    assert doc["heavy"] == [], f"modules that load OpenSSL on the agent's path: {doc['heavy']}"
    # statistics (with fractions, decimal and random) is 2.2 MiB for a median, difflib 1.3 MiB
    # for a did-you-mean on bad input: common.stats and a function-level import instead
    assert doc["spare"] == [], f"modules the agent loads for little: {doc['spare']}"
