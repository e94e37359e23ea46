"""The repository root as the Ansible collection fleetops.gpu, checked as CI checks it: the tarball
``ansible-galaxy collection build`` makes, every ``ansible-test sanity`` test on it (those with
requirements on this environment's packages, nothing fetched: sanity_venvs.py), ``ansible-doc`` on
every module, and the runner finding the collection in a checkout and in an installed copy."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import sanity_venvs
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
# ansible-test sanity's tests (ansible-core 2.19 lists 24 for a collection), all run on the built
# collection: those with requirements (ansible-doc, import, pep8, pylint, runtime-metadata,
# validate-modules, yamllint) on this environment's packages through the environments
# sanity_venvs.py makes, so nothing is fetched. None needs a container or a network.
SANITY_PASSED = [
    "action-plugin-docs",
    "ansible-doc",
    "compile",
    "ignores",
    "import",
    "line-endings",
    "no-assert",
    "no-get-exception",
    "no-illegal-filenames",
    "no-smart-quotes",
    "pep8",
    "pylint",
    "replace-urlopen",
    "runtime-metadata",
    "shebang",
    "symlinks",
    "use-argspec-type-path",
    "use-compat-six",
    "validate-modules",
    "yamllint",
]
# The tests that run and find nothing of theirs in the collection ("No tests applicable."): why.
SANITY_NOTHING_TO_CHECK = {
    "changelog": "the collection keeps no changelogs/ folder",
    "empty-init": "plugins/ has no __init__.py",
    "pslint": "no PowerShell",
    "shellcheck": "no shell scripts",
}
# The environments ansible-test uses for them (sanity_venvs.py's labels): "sanity" is the empty one
# of the tests without requirements and of import's module check; each other installs the pins of
# its requirement file.
SANITY_VENVS = {
    "sanity",
    "sanity.ansible-doc",
    "sanity.changelog",
    "sanity.import",
    "sanity.import.plugin",
    "sanity.pep8",
    "sanity.pylint",
    "sanity.runtime-metadata",
    "sanity.validate-modules",
    "sanity.yamllint",
}
# What those environments hold that fleetops pins otherwise, because the package or ansible-lint
# needs them too (pyproject.toml): ansible-test's pins of them are not copied.
SHARED_REQUIREMENTS = {"jinja2", "markupsafe", "packaging", "pathspec", "platformdirs", "pyyaml"}


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


def _ansible_core_minor() -> str:
    return ".".join(importlib.metadata.version("ansible-core").split(".")[:2])


def _pins(lines: list[str]) -> dict[str, str]:
    """name -> version of the ``name==version`` lines (names normalised as pip compares them)."""
    pins = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([^\s;#]+).*", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return pins


def test_the_test_extras_pin_what_ansible_test_pins_for_the_sanity_tests_that_run() -> None:
    """The sanity tests run on .venv's packages (sanity_venvs.py); ansible-test ships the versions
    it runs them with (pylint's findings, for one, change between its versions). A newer
    ansible-core that moves a pin fails here, naming it."""
    requirements = importlib.resources.files("ansible_test") / "_data" / "requirements"
    theirs: dict[str, str] = {}
    for label in sorted(SANITY_VENVS - {"sanity", "sanity.changelog"}):
        theirs |= _pins((requirements / f"{label}.txt").read_text().splitlines())
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ours = _pins(extras["test"])
    wanted = {name: version for name, version in theirs.items() if name not in SHARED_REQUIREMENTS}
    assert {name: ours.get(name) for name in wanted} == wanted
    assert set(theirs) - set(wanted) == SHARED_REQUIREMENTS
    installed = {name: importlib.metadata.version(name) for name in wanted}
    assert installed == wanted, "run ./scripts/setup.sh"


def _junit_results(folder: Path) -> dict[str, str]:
    """test -> "passed", "failed" or "skipped: REASON", from ansible-test's --junit files."""
    results = {}
    for path in sorted(folder.glob("ansible-test-sanity-*.xml")):
        case = ET.parse(path).getroot().find("./testsuite/testcase")
        assert case is not None, path
        name = re.sub(r"-python-\d+\.\d+$", "", case.attrib["name"])
        skipped = case.find("skipped")
        if skipped is not None:
            results[name] = f"skipped: {skipped.text}"
        elif case.find("failure") is not None or case.find("error") is not None:
            results[name] = "failed"
        else:
            results[name] = "passed"
    return results


@pytest.mark.slow
def test_ansible_test_sanity_passes_on_the_built_collection(built: tuple[Path, Path], tmp_path: Path) -> None:
    """Every sanity test ansible-test has for a collection, on the tarball's contents with the
    checkout's ignore file (tests/ is the Python suite, left out of the tarball). 16-28 s on two busy
    cores, pylint about half of it (the 14 tests without requirements alone took 1.3 s)."""
    _, root = built
    work = tmp_path / "sanity" / "ansible_collections" / "fleetops"
    shutil.copytree(root / "ansible_collections" / "fleetops" / "gpu", work / "gpu")
    ignore = Path("tests") / "sanity" / f"ignore-{_ansible_core_minor()}.txt"
    assert (REPO / ignore).is_file(), f"no {ignore} for this ansible-core"
    (work / "gpu" / ignore).parent.mkdir(parents=True)
    shutil.copy(REPO / ignore, work / "gpu" / ignore)
    env = _env(tmp_path / "home")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = [_tool("ansible-test"), "sanity", "--color", "no", "--junit", "--python", version]
    argv += ["--python-interpreter", sys.executable]

    venvs = sanity_venvs.prepare(argv, work / "gpu", env)
    assert {p.parents[1].name for p in venvs} == SANITY_VENVS
    done = subprocess.run(
        argv,
        cwd=work / "gpu",
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    # every environment was there already: ansible-test made none and installed nothing
    assert sanity_venvs.INSTALLING not in output, output[-3000:]
    ran = re.findall(r'Running sanity test "([^"]+)"', output)
    assert sorted(ran) == sorted([*SANITY_PASSED, *SANITY_NOTHING_TO_CHECK]), output[-3000:]
    expected = dict.fromkeys(SANITY_PASSED, "passed")
    expected |= dict.fromkeys(SANITY_NOTHING_TO_CHECK, "skipped: No tests applicable.")
    assert _junit_results(work / "gpu" / "tests" / "output" / "junit") == expected


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
