"""The repository root as the Ansible collection fleetops.gpu, checked as CI checks it: the tarball
``ansible-galaxy collection build`` makes, ``ansible-test sanity`` on it (the tests that need
neither docker nor a package index), ``ansible-doc`` on every module, and the runner finding the
collection in a checkout and in an installed copy."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from fleetops.rollout import runner

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
# What a collection holds: its metadata, the README, plugins, roles and playbooks; ansible.cfg too,
# because `fleetops rollout` runs the installed copy with it (forks, SSH settings, roles_path).
TOP_LEVEL = {
    "FILES.json",
    "MANIFEST.json",
    "README.md",
    "ansible.cfg",
    "meta",
    "playbooks",
    "plugins",
    "roles",
}
# ansible-test sanity tests that need no container and install nothing from a package index
# (the others, validate-modules, pylint, pep8, yamllint, import, ansible-doc, runtime-metadata,
# pip-install their pinned requirements first).
SANITY_TESTS = [
    "action-plugin-docs",
    "compile",
    "empty-init",
    "ignores",
    "line-endings",
    "no-assert",
    "no-get-exception",
    "no-illegal-filenames",
    "no-smart-quotes",
    "replace-urlopen",
    "shebang",
    "symlinks",
    "use-argspec-type-path",
    "use-compat-six",
]


def _tool(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if not os.access(beside, os.X_OK):
        pytest.skip(f"{name} is not installed beside {sys.executable} (pip install ansible-core)")
    return beside


def _env(home: Path) -> dict[str, str]:
    """A neutral Ansible environment: no ansible.cfg of the checkout or of $HOME, ansible-test's
    virtual environments under a throwaway home, this environment's bin first on PATH."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "ansible.cfg"
    config.write_text("[defaults]\n")
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
    return {
        **os.environ,
        "HOME": str(home),
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": path,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tarball, the folder holding ansible_collections/fleetops/gpu unpacked from it)."""
    base = tmp_path_factory.mktemp("collection")
    out = base / "dist"
    done = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "build", "--output-path", str(out), str(REPO)],
        cwd=base,
        env=_env(base / "home"),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tarballs = sorted(out.glob("*.tar.gz"))
    assert [p.name for p in tarballs] == ["fleetops-gpu-0.1.0.tar.gz"]
    root = base / "installed"
    target = root / "ansible_collections" / "fleetops" / "gpu"
    target.mkdir(parents=True)
    with tarfile.open(tarballs[0]) as tar:
        tar.extractall(target, filter="data")
    return tarballs[0], root


def test_galaxy_and_runtime_metadata_match_the_python_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("fleetops", "gpu")
    assert galaxy["version"] == project["version"]
    pin = next(d for d in project["dependencies"] if d.startswith("ansible-core"))
    bounds = re.findall(r"([<>]=?)(\d+\.\d+)", pin)
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"]
    assert re.findall(r"([<>]=?)(\d+\.\d+)(?:\.0)?", runtime) == bounds, (runtime, pin)


def test_the_tarball_holds_the_collection_and_nothing_of_the_checkout(built: tuple[Path, Path]) -> None:
    tarball, _ = built
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        member = tar.extractfile("MANIFEST.json")
        assert member is not None
        manifest = json.loads(member.read())
    assert {n.split("/")[0] for n in names} == TOP_LEVEL
    assert {f"plugins/modules/{m}.py" for m in MODULES} | {"plugins/module_utils/agent.py"} <= set(names)
    roles = {p.name for p in (REPO / "roles").iterdir() if p.is_dir()}
    assert {n.split("/")[1] for n in names if n.startswith("roles/") and n.count("/") >= 1} == roles
    junk = [n for n in names if re.search(r"(__pycache__|\.pyc$|_cache(/|$)|\.collections|ruff\.toml$)", n)]
    assert junk == []
    assert (
        manifest["collection_info"]["namespace"] == "fleetops"
        and manifest["collection_info"]["name"] == "gpu"
    )


@pytest.mark.slow
def test_ansible_test_sanity_passes_on_the_built_collection(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, root = built
    work = tmp_path / "sanity" / "ansible_collections" / "fleetops"
    shutil.copytree(root / "ansible_collections" / "fleetops" / "gpu", work / "gpu")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = [_tool("ansible-test"), "sanity", "--color", "no", "--python", version]
    argv += ["--python-interpreter", sys.executable]
    for name in SANITY_TESTS:
        argv += ["--test", name]
    done = subprocess.run(
        argv,
        cwd=work / "gpu",
        env=_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    ran = re.findall(r'Running sanity test "([^"]+)"', output)
    assert sorted(ran) == sorted(SANITY_TESTS), output[-3000:]


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_reads_each_module_of_the_installed_collection(
    built: tuple[Path, Path], module: str
) -> None:
    _, root = built
    env = {**_env(root.parent / "home-doc"), "ANSIBLE_COLLECTIONS_PATH": str(root)}
    done = subprocess.run(
        [_tool("ansible-doc"), "-t", "module", "--json", f"fleetops.gpu.{module}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(done.stdout)[f"fleetops.gpu.{module}"]
    assert doc["doc"]["module"] == module
    assert doc["doc"]["collection"] == "fleetops.gpu"
    assert str(root) in doc["doc"]["filename"]


def test_the_runner_puts_the_checkout_link_on_the_collections_path() -> None:
    assert runner.collections_dir(REPO) == REPO / ".collections"
    assert (REPO / ".collections" / "ansible_collections" / "fleetops" / "gpu").resolve() == REPO


def test_the_runner_uses_an_installed_collection_named_by_the_override(
    built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, root = built
    installed = root / "ansible_collections" / "fleetops" / "gpu"
    monkeypatch.setenv(runner.ANSIBLE_DIR_ENV, str(installed))
    assert runner.ansible_dir() == installed
    assert runner.collections_dir(installed) == root


def test_a_folder_that_is_not_the_collection_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(runner.ANSIBLE_DIR_ENV, str(tmp_path))
    with pytest.raises(runner.RolloutError, match=re.escape(str(tmp_path))):
        runner.ansible_dir()
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles").mkdir()
    assert runner.ansible_dir() == tmp_path
    with pytest.raises(runner.RolloutError, match="fleetops.gpu"):
        runner.collections_dir(tmp_path)
