"""The layout's rules, read from the source with ``ast``: the checks are pure (nothing from the GPU
access layer or the agent), and no module reaches into another fleetops module's private names.

Every file is walked (imports inside functions and ``TYPE_CHECKING`` blocks count too); there is
no list of known offenders."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fleetops"
SCANNED = (PACKAGE, REPO / "plugins")
CHECKS_MAY_NOT_IMPORT = ("fleetops.gpu", "fleetops.agent")


def module_name(path: Path) -> str:
    """``fleetops/agent/reset/flow.py`` -> ``fleetops.agent.reset.flow``; a playbook module by its stem."""
    try:
        rel = path.relative_to(REPO).with_suffix("")
    except ValueError:
        return path.stem
    parts = list(rel.parts)
    if parts[0] != "fleetops":
        return parts[-1]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(tree: ast.AST, here: str, is_package: bool) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name imported from it or None) for every import in the tree."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, here, is_package)
            for alias in node.names:
                yield node.lineno, module, alias.name


def _first_party(module: str) -> bool:
    return module == "fleetops" or module.startswith("fleetops.")


def private_uses(source: str, here: str, is_package: bool = False) -> list[str]:
    """Where ``source`` (the module ``here``) uses a private name of another fleetops module:
    ``from fleetops.x import _y``, ``import fleetops.x._y``, or ``y._z`` on a name it imported from
    fleetops (a module, class or function)."""
    tree = ast.parse(source)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> where it came from
    for line, module, name in imports(tree, here, is_package):
        if not _first_party(module):
            continue
        dotted = module if name is None else f"{module}.{name}"
        if any(_is_private(part) for part in dotted.split(".")):
            found.append(f"{here}:{line}: imports {dotted}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _first_party(alias.name):
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.asname and alias.name or local
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, here, is_package)
            if _first_party(module):
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = [node.attr]
        base: ast.expr = node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in bound:
            continue
        # only the outermost attribute of a chain is judged, once (its inner parts are walked too)
        if _is_private(node.attr):
            target = ".".join([bound[base.id], *reversed(chain)])
            if not target.startswith(here + "."):
                found.append(f"{here}:{node.lineno}: uses {base.id}.{'.'.join(reversed(chain))} ({target})")
    return found


def python_files() -> list[Path]:
    return sorted(p for root in SCANNED for p in root.rglob("*.py") if ".venv" not in p.parts)


def test_the_checks_import_nothing_from_the_gpu_layer_or_the_agent() -> None:
    bad = []
    for path in sorted((PACKAGE / "checks").rglob("*.py")):
        here = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, module, name in imports(tree, here, path.name == "__init__.py"):
            dotted = module if name is None else f"{module}.{name}"
            if any(dotted == m or dotted.startswith(m + ".") for m in CHECKS_MAY_NOT_IMPORT):
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {dotted}")
    assert bad == []


def test_no_module_uses_a_private_name_of_another_fleetops_module() -> None:
    files = python_files()
    assert len(files) > 50  # the walk found the tree
    bad = []
    for path in files:
        bad += private_uses(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    assert bad == []


# --- the scanners themselves: each catches what it names ---------------------------------------------


@pytest.mark.parametrize(
    "source, here",
    [
        ("from fleetops.sim import gpu as sim\nsim._inject(state, 'ecc-dbe', 1)\n", "fleetops.tui.simfeed"),
        ("from fleetops.sim.gpu import _inject\n", "fleetops.tui.simfeed"),
        ("import fleetops.sim.gpu\nfleetops.sim.gpu._inject(s, 'x', 1)\n", "fleetops.cli"),
        ("def f():\n    from fleetops.agent import reset as r\n    return r.flow._Attempt\n", "fleetops.remedy.cli"),
        ("from ..gpu import sim\nsim._log_xid(s, 0, 48)\n", "fleetops.agent.collect"),
        ("from fleetops.agent.reset.backends import Backend\nBackend._changing(b, 'x')\n", "fleetops.agent.mig"),
    ],
)
def test_a_private_use_is_found(source: str, here: str) -> None:
    assert len(private_uses(source, here)) == 1


@pytest.mark.parametrize(
    "source, here",
    [
        ("from fleetops.sim import gpu as sim\nsim.inject_into(state, 'ecc-dbe', 1)\n", "fleetops.tui.simfeed"),
        ("import os\nos._exit(0)\n", "fleetops.agent.main"),  # not a fleetops module
        ("from fleetops import model\nmodel.__name__\n", "fleetops.cli"),  # dunders are public
        ("def _mine():\n    pass\n_mine()\n", "fleetops.agent.lock"),  # its own private name
    ],
)
def test_a_public_or_own_use_is_not_reported(source: str, here: str) -> None:
    assert private_uses(source, here) == []


def test_the_checks_rule_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    tree = ast.parse("def f():\n    from fleetops.gpu import nvml\n    return nvml\n")
    seen = [f"{m}.{n}" for _, m, n in imports(tree, "fleetops.checks.xid", False)]
    assert seen == ["fleetops.gpu.nvml"]
    assert any(seen[0].startswith(m + ".") for m in CHECKS_MAY_NOT_IMPORT)
