"""Front ends call ``fleetops.ops``; they never import one another.

The rule, checked on every module's imports (``import``/``from`` statements anywhere in the
file, and module names given to ``importlib.import_module`` as string constants):

- ``fleetops/tui`` imports neither ``fleetops.cli`` nor ``fleetops.remedy``;
- ``fleetops/remedy`` imports neither ``fleetops.cli`` nor ``fleetops.tui``;
- ``fleetops/cli/`` imports, of ``fleetops.tui`` and ``fleetops.remedy``, only their
  registration entry points (``fleetops.tui.cli``, ``fleetops.remedy.cli``), and uses nothing
  of them but ``register``;
- ``fleetops/ops`` imports no front end (``fleetops.cli``, ``fleetops.tui``, ``fleetops.remedy``,
  ``fleetops.rollout``, ``fleetops.docgen``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "fleetops"
ENTRY_POINTS = {"fleetops.tui.cli", "fleetops.remedy.cli"}
FRONT_ENDS = ("fleetops.cli", "fleetops.tui", "fleetops.remedy", "fleetops.rollout", "fleetops.docgen")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, name: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every module the file imports; ``from a import b`` also yields
    ``a.b`` (b may be a submodule). ``name``: the file's module name (default: from its path)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = (name or module_name(path)).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("fleetops."):
            out.append((node.lineno, node.value))  # importlib.import_module("fleetops....")
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(files: dict[str, Path], forbidden: tuple[str, ...]) -> list[str]:
    """``files``: module name -> path."""
    return [
        f"{mod}:{line} imports {name}"
        for mod, p in sorted(files.items())
        for line, name in imports(p, mod)
        if any(under(name, f) for f in forbidden)
    ]


def package_files(folder: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((PKG / folder).rglob("*.py"))}


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("tui", ("fleetops.cli", "fleetops.remedy")),
        ("remedy", ("fleetops.cli", "fleetops.tui")),
        ("ops", FRONT_ENDS),
    ],
)
def test_no_front_end_imports_another(folder: str, forbidden: tuple[str, ...]) -> None:
    files = package_files(folder)
    assert files, folder
    assert violations(files, forbidden) == []


def test_cli_imports_only_the_registration_entry_points_of_tui_and_remedy() -> None:
    bad = [
        f"{mod}:{line} imports {name}"
        for mod, path in package_files("cli").items()
        for line, name in imports(path, mod)
        if (under(name, "fleetops.tui") or under(name, "fleetops.remedy")) and name not in ENTRY_POINTS
    ]
    assert bad == []
    # and of those modules it uses nothing but register()
    tree = ast.parse((PKG / "cli" / "__init__.py").read_text(encoding="utf-8"))
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "module"
    }
    assert used == {"register"}


def test_the_rule_sees_a_violation(tmp_path: Path) -> None:
    """The checker itself: a TUI module importing the CLI, relatively the remedy package, or by
    importlib, is caught (the probe is parsed as ``fleetops.tui.screens.probe``, never imported)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from fleetops.cli import main\n"
        "from ...remedy import plan\n"
        "import importlib\n"
        "importlib.import_module('fleetops.cli')\n"
    )
    found = violations({"fleetops.tui.screens.probe": probe}, ("fleetops.cli", "fleetops.remedy"))
    assert found == [
        "fleetops.tui.screens.probe:1 imports fleetops.cli",
        "fleetops.tui.screens.probe:1 imports fleetops.cli.main",
        "fleetops.tui.screens.probe:2 imports fleetops.remedy",
        "fleetops.tui.screens.probe:2 imports fleetops.remedy.plan",
        "fleetops.tui.screens.probe:4 imports fleetops.cli",
    ]


def test_registering_every_subcommand_imports_no_front_end_internals() -> None:
    """``fleetops --help`` (the whole parser, every front end's ``register``) loads neither
    Textual nor SSH nor Ansible: the entry points keep their internals behind lazy imports."""
    import subprocess
    import sys

    code = (
        "import sys, fleetops.cli as c; c.build_parser(); "
        "print(','.join(m for m in ('textual', 'paramiko', 'ansible_runner', 'ansible', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PKG.parent)
    assert out.stdout.strip() == ""
