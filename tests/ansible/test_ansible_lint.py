"""Lint and syntax of the Ansible half, run as CI runs them (the tools themselves, not mocks)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted(p.name for p in (REPO / "playbooks").glob("*.yml"))
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())
EXPECTED_ROLES = {
    "fleetops_agent",
    "nvidia_driver",
    "cuda_toolkit",
    "fabric_manager",
    "gpu_power",
    "gpu_firmware",
    "gpu_mig",
    "slurm_drain",
    "fleetops_audit",
}


def _tool(name: str) -> str:
    """The tool of this Python's environment (CI runs .venv/bin/python without .venv/bin on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install ansible-lint ansible-core)")
    return found


def test_ansible_lint_production_profile_passes_on_roles_and_playbooks() -> None:
    done = subprocess.run(
        [_tool("ansible-lint"), "--profile", "production", "--offline", "--nocolor", "roles", "playbooks"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_passes_syntax_check(playbook: str) -> None:
    done = subprocess.run(
        [_tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", f"playbooks/{playbook}"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_role_the_issue_asks_for_exists() -> None:
    assert EXPECTED_ROLES <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_role_has_defaults_specs_and_prefixed_documented_variables(role: str) -> None:
    base = REPO / "roles" / role
    for part in ("defaults/main.yml", "meta/main.yml", "meta/argument_specs.yml", "tasks/main.yml"):
        assert (base / part).is_file(), f"{role}: {part} missing"
    defaults = yaml.safe_load((base / "defaults/main.yml").read_text()) or {}
    unprefixed = [k for k in defaults if not k.startswith(f"{role}_")]
    assert not unprefixed, f"{role}: defaults without the role prefix: {unprefixed}"
    specs = yaml.safe_load((base / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"{role}: defaults missing from meta/argument_specs.yml: {undocumented}"
    unknown = sorted(set(options) - set(defaults))
    assert not unknown, f"{role}: argument_specs options with no default: {unknown}"


HELPER = "ansible_collections.fleetops.gpu.plugins.module_utils.agent"


def _top_level_definitions(path: Path) -> dict[str, str]:
    """Each top-level function, class and constant of a file: its name and its code with the name
    blanked (``ast.dump``), so that a copy is found under its own name or under another one."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name, node.name = node.name, ""
            found[name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.dump(node.value)
    return found


def test_the_agent_helper_is_one_file_in_module_utils_and_no_module_carries_a_copy() -> None:
    modules = REPO / "plugins" / "modules"
    helper = _top_level_definitions(REPO / "plugins" / "module_utils" / "agent.py")
    assert {"run_agent", "agent_command", "backend_args", "AgentError", "AGENT_ARGUMENT_SPEC"} <= set(helper)
    callers = sorted(p.stem for p in modules.glob("*.py") if "fleetops-agent" in p.read_text())
    assert callers == ["fleetops_gpu_facts", "fleetops_gpu_mig", "fleetops_gpu_reset", "fleetops_gpu_set", "fleetops_gpu_validate"]
    bodies = {code: name for name, code in helper.items()}
    copies = []
    for path in sorted(modules.glob("*.py")):
        for name, code in _top_level_definitions(path).items():
            if name in helper or code in bodies:
                copies.append(f"{path.name}: {name} (module_utils/agent.py has {bodies.get(code, name)})")
    assert copies == []
    for name in callers:
        tree = ast.parse((modules / f"{name}.py").read_text(encoding="utf-8"))
        sources = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert HELPER in sources, f"{name} does not import {HELPER}"
