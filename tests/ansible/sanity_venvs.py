"""ansible-test sanity's requirement-backed tests on this environment's packages, nothing fetched.

ansible-test runs each sanity test in a virtual environment of its own, kept in a cache under the
home folder (a throwaway one in the tests). For a test with requirements (pylint, pep8, yamllint, validate-modules,
runtime-metadata, ansible-doc, import's helper) it makes that environment by downloading a pip
bootstrap script from a host outside the package index and pip-installing the pins it ships for
that test; neither CI nor this machine reaches that host, and tests install nothing. fleetops'
test extras carry the same pins (pyproject.toml), so ``scripts/setup.sh`` installs them from PyPI
into .venv; here every environment ansible-test would make is made in advance: an empty venv
(no pip) as ansible-test makes it, plus, for a test with requirements, a .pth file that puts this
environment's site-packages on its path. The import test's environment for modules stays empty,
as ansible-test keeps it, so a module that imports a package outside the standard library still
fails there.

This leans on ansible-test's internals (tested on ansible-core 2.19, the minor pyproject.toml's
range ends at): ``sanity --prime-venvs --explain -v`` prints, without making them, the
environments a run needs (``Created Python X.Y virtual environment using "venv": PATH``); the
label in PATH (``.../venv/sanity.pylint/3.11/HASH``) names the requirements (plain ``sanity``:
none); a folder holding ``marker.txt`` is an environment it made earlier and reuses as it is, and
``meta.yaml.json`` records whether its PyYAML has libyaml (yamllint is skipped without it). Should
any of that change, ansible-test goes back to making the environments itself: the download fails
and the run says so, and the sanity test asserts that ansible-test installed nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

# ansible-test's line for each environment it would make (with -v; --explain makes none).
_CREATED = re.compile(r'^Created Python (\d+\.\d+) virtual environment using "venv": (\S+)$', re.M)
# Printed whenever ansible-test runs pip into an environment, even one with nothing to install.
INSTALLING = "Installing requirements for Python"


def planned(argv: list[str], cwd: Path, env: dict[str, str]) -> list[Path]:
    """The environments ``argv`` (an ``ansible-test sanity`` command line) would make, in order of
    first use, as ``--prime-venvs --explain -v`` lists them."""
    done = subprocess.run(
        [*argv, "--prime-venvs", "--explain", "-v"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"ansible-test could not list its environments:\n{output[-4000:]}")
    return list(dict.fromkeys(Path(path) for _, path in _CREATED.findall(output)))


def needs_requirements(path: Path) -> bool:
    """Whether the environment at ``.../venv/LABEL/X.Y/HASH`` installs requirements: LABEL is
    ``sanity.TEST`` for a test with requirements, plain ``sanity`` for one without."""
    return path.parents[1].name != "sanity"


def make(path: Path) -> None:
    """An environment as ansible-test leaves it after installing ``path``'s requirements: for one
    with requirements, this environment's packages, which hold the same pins."""
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(path)
    if needs_requirements(path):
        base = {"base": str(path), "platbase": str(path)}
        site = Path(sysconfig.get_path("purelib", vars=base))
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (site / "fleetops_sanity_requirements.pth").write_text("".join(f"{p}\n" for p in ours))
    python = path / "bin" / "python"
    libyaml = subprocess.run(
        [str(python), "-c", "import yaml; print(yaml.__with_libyaml__)"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    # as ansible-test records it: null without PyYAML, else whether it has libyaml
    with_libyaml = None if libyaml.returncode != 0 else libyaml.stdout.strip() == "True"
    (path / "meta.yaml.json").write_text(json.dumps(with_libyaml))
    (path / "marker.txt").touch()


def prepare(argv: list[str], cwd: Path, env: dict[str, str]) -> list[Path]:
    """Makes every environment ``argv`` needs; returns them."""
    paths = planned(argv, cwd, env)
    for path in paths:
        make(path)
    return paths
