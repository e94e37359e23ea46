"""Packaging hook: the wheel carries the Ansible collection fleetops.gpu, installed.

The repository root is the collection (galaxy.yml). A wheel has no checkout beside it, so
``build_py`` builds the collection with ``ansible-galaxy collection build`` (galaxy.yml's
build_ignore decides what belongs to it) and unpacks the tarball as an installed collection under
``fleetops/collections/ansible_collections/fleetops/gpu``, where ``fleetops rollout`` and
``fleetops apply`` look first (fleetops.rollout.runner). An editable install runs from the checkout,
which is the collection already, and gets no copy.

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
INSTALLED = Path("fleetops", "collections", "ansible_collections", "fleetops", "gpu")


class BuildPyWithCollection(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / INSTALLED
        with tempfile.TemporaryDirectory() as out:
            # ansible-galaxy reads the ansible.cfg of its working folder or $HOME: give it an empty one.
            config = Path(out, "ansible.cfg")
            config.write_text("[defaults]\n")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ansible.cli.galaxy",
                    "collection",
                    "build",
                    "--force",
                    "--output-path",
                    out,
                    str(HERE),
                ],
                cwd=out,
                env={**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_NOCOLOR": "1"},
                capture_output=True,
                text=True,
                check=False,
            )
            tarballs = sorted(Path(out).glob("fleetops-gpu-*.tar.gz"))
            if done.returncode != 0 or len(tarballs) != 1:
                raise SystemExit(
                    "building the Ansible collection fleetops.gpu for the wheel failed "
                    f"(ansible-galaxy exit {done.returncode}; ansible-core must be installed where the "
                    f"wheel is built):\n{done.stdout}{done.stderr}"
                )
            shutil.rmtree(target, ignore_errors=True)  # nothing left over from an earlier build
            target.mkdir(parents=True)
            with tarfile.open(tarballs[0]) as tar:
                if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links out, odd modes
                    tar.extractall(target, filter="data")
                else:
                    tar.extractall(target)  # our own tarball, just built


setup(cmdclass={"build_py": BuildPyWithCollection})
