"""The MIG profile tables on a real GPU, read-only: NVML's GPU-instance profiles and placements
(``fleetops.gpu.nvml.MigControl``, what ``mig apply`` plans with) against the catalog's table
for the model, field by field, and a dry run of ``mig apply`` through the agent that plans on
them. Neither enables MIG nor creates an instance: NVML answers these queries with MIG off,
and a dry run's changing calls refuse before they reach NVML.

Skipped (tests/conftest.py) where NVML does not start or sees no GPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.catalog import mig as catalog
from fleetops.gpu import nvml

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def test_nvml_profile_table_equals_the_catalog_field_by_field() -> None:
    ctl = nvml.MigControl()
    gpus = ctl.read()
    assert gpus
    for gpu in gpus:
        table = catalog.table_for(gpu["name"])
        if table is None:
            pytest.skip(f"no catalog table for {gpu['name']}")
        real = gpu["table"]
        assert real is not None, gpu["why"]
        print(f"GPU {gpu['index']} {gpu['name']} MIG mode {gpu['mode_current']}/{gpu['mode_pending']}")
        for prof in real.profiles:
            print("  " + json.dumps(dataclasses.asdict(prof)))
        assert [p.name for p in real.profiles] == [p.name for p in table.profiles]
        for got, want in zip(real.profiles, table.profiles, strict=True):
            for f in dataclasses.fields(catalog.GiProfile):
                assert getattr(got, f.name) == getattr(want, f.name), (gpu["index"], got.name, f.name)


def test_a_dry_run_of_mig_apply_plans_on_the_real_table_and_changes_nothing() -> None:
    before = nvml.MigControl().read()
    table = catalog.table_for(before[0]["name"])
    if table is None:
        pytest.skip(f"no catalog table for {before[0]['name']}")
    # two halves of this model (3g.71gb on an H200, 3g.40gb on an H100 80GB), by the catalog
    half = next(p.name for p in table.profiles if p.name.startswith("3g."))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop("FLEETOPS_SIM_STATE", None)
    proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", "mig", "apply", "--backend", "nvml",
                           "--layout", f"{half},{half}", "--dry-run"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120, check=False)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    print(json.dumps(doc, indent=1))
    assert doc["dry_run"] is True and doc["changed"] is False
    after = nvml.MigControl().read()
    assert [(g["mode_current"], g["mode_pending"], g["instances"]) for g in after] == [
        (g["mode_current"], g["mode_pending"], g["instances"]) for g in before]
    for gpu in doc["gpus"]:
        if catalog.table_for(gpu["name"]) is table and not gpu["mode"]["current"]:
            assert gpu["status"] == "mode-change"
            assert gpu["create"] == [{"profile": half, "placement_start": 0},
                                     {"profile": half, "placement_start": 4}]
