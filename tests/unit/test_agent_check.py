"""``fleetops-agent check`` as a process on simulated nodes: the audit's node checks, its exit
codes, per-model desired state, and baseline errors that name FILE:LINE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.common.errors import EXIT_CRIT, EXIT_OK, EXIT_UNKNOWN, EXIT_USAGE, EXIT_WARN
from fleetops.sim import gpu as sim

AGENT = [sys.executable, "-m", "fleetops.agent.main"]
H100 = "NVIDIA H100 80GB HBM3"


def check(state: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    return subprocess.run(
        [*AGENT, "check", "--backend", "sim", "--state", str(state), *args],
        input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def findings(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "fleetops.check/v1" and doc["scope"] == "node"
    out: list[dict[str, Any]] = doc["findings"]
    return out


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node011")
    return path


@pytest.fixture
def baseline(tmp_path: Path) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"driver_version": "580.159.04", "gpu_count": 8, "power_limit_w": 700,
                                "persistence_mode": True, "mig": {"mode": False}}))  # fmt: skip
    return path


def test_a_clean_node_exits_0_and_says_which_scope_ran(state: Path, baseline: Path) -> None:
    proc = check(state, "--baseline", str(baseline), "--json")
    assert proc.returncode == EXIT_OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["findings"] == [] and doc["node"] == "node011" and doc["source"] == "collect"
    assert "thermal_power.power_limit" in doc["checks_run"] and "config.persistence_mode" in doc["checks_run"]
    # the majority comparisons are named as not run, and none of them is among the checks run
    assert "topology.numa" in doc["fleet_checks_not_run"] and "topology.numa" not in doc["checks_run"]
    assert doc["baseline"] == {"source": str(baseline)}
    text = check(state, "--baseline", str(baseline))
    assert text.returncode == EXIT_OK
    assert text.stdout.startswith("node011: 0 finding(s)") and "node-scope checks only" in text.stdout


def test_warn_exits_1_and_crit_exits_2(state: Path, baseline: Path) -> None:
    sim.inject(str(state), "persistence-off", 6)
    warn = check(state, "--baseline", str(baseline), "--json")
    assert warn.returncode == EXIT_WARN, warn.stderr
    assert [(f["check"], f["severity"], f["gpu"]["index"]) for f in findings(warn)] == [
        ("config.persistence_mode", "warn", 6)
    ]
    assert check(state, "--baseline", str(baseline), "--fail-on", "crit").returncode == EXIT_OK
    sim.inject(str(state), "ecc-dbe", 1)
    crit = check(state, "--baseline", str(baseline), "--json")
    assert crit.returncode == EXIT_CRIT
    got = {(f["check"], f["severity"], f["gpu"]["index"]) for f in findings(crit)}
    assert ("memory.ecc_dbe_volatile", "crit", 1) in got and ("config.persistence_mode", "warn", 6) in got
    first = findings(crit)[0]
    assert first["severity"] == "crit" and first["gpu"]["uuid"].startswith("GPU-") and first["gpu"]["bus_id"]
    assert "CRIT" in check(state, "--baseline", str(baseline)).stdout


def test_mixed_models_are_judged_by_each_gpus_own_model_limit(state: Path, tmp_path: Path) -> None:
    """GPUs 4-7 are H100s capped at 600 W; GPU 5 holds 700 W, the H200s' limit, which is wrong for
    an H100. Only GPU 5 is found, against 600 W."""
    with sim.locked_state(str(state)) as st:
        for gpu in st["gpus"][4:]:
            gpu.update(name=H100, power_limit_w=600.0, power_enforced_limit_w=600.0)
        st["gpus"][5].update(power_limit_w=700.0, power_enforced_limit_w=700.0)
    path = tmp_path / "mixed.json"
    path.write_text(
        json.dumps({"gpu_models": {"NVIDIA H200": {"power_limit_w": 700}, H100: {"power_limit_w": 600}}})
    )
    proc = check(state, "--baseline", str(path), "--json")
    assert proc.returncode == EXIT_WARN, proc.stderr
    found = findings(proc)
    assert [(f["check"], f["gpu"]["index"], f["observed"], f["expected"]) for f in found] == [
        ("thermal_power.power_limit", 5, 700.0, 600.0)
    ]
    assert H100 in found[0]["message"]


def test_baseline_from_stdin_json_and_yaml(state: Path) -> None:
    sim.inject(str(state), "power-cap-drift", 3)
    as_json = check(state, "--baseline", "-", "--json", stdin=json.dumps({"power_limit_w": 700}))
    as_yaml = check(state, "--baseline", "-", "--json", stdin="fleetops_baseline:\n  power_limit_w: 700\n")
    for proc in (as_json, as_yaml):
        assert proc.returncode == EXIT_WARN, proc.stderr
        assert [(f["check"], f["gpu"]["index"]) for f in findings(proc)] == [("thermal_power.power_limit", 3)]
        assert json.loads(proc.stdout)["baseline"] == {"source": "<stdin>"}


def test_a_json_baseline_needs_no_pyyaml(state: Path) -> None:
    """Nodes have no PyYAML: with it made unimportable, a JSON baseline on stdin still works."""
    code = (
        "import sys\n"
        "sys.modules['yaml'] = None\n"
        "from fleetops.agent import main\n"
        f"code = main.main(['check', '--backend', 'sim', '--state', {str(state)!r}, '--baseline', '-', '--json'])\n"
        "heavy = [m for m, mod in sys.modules.items() if mod is not None\n"
        "         and m.split('.')[0] in ('textual', 'rich', 'ansible', 'paramiko', 'yaml', 'ansible_runner')]\n"
        "sys.stderr.write('heavy=' + ','.join(heavy) + '\\n')\n"
        "sys.exit(code)\n"
    )
    sim.inject(str(state), "mig-drift", 2)
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps({"mig": {"mode": False}}),
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == EXIT_WARN, proc.stderr
    assert [(f["check"], f["gpu"]["index"]) for f in findings(proc)] == [("config.mig_mode", 2)]
    assert proc.stderr.strip().splitlines()[-1] == "heavy="  # nothing heavy on the node's check either
    yaml_text = subprocess.run([sys.executable, "-c", code], input="power_limit_w: 700\n",
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert yaml_text.returncode == EXIT_USAGE and "PyYAML is not installed" in yaml_text.stderr


def test_a_bad_baseline_is_a_usage_error_naming_file_and_line(state: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("driver_version: '580.159.04'\npower_limit_w: 700\ngpu_cuont: 8\n")
    proc = check(state, "--baseline", str(path))
    assert proc.returncode == EXIT_USAGE and proc.stdout == ""
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["kind"] == "usage" and err["error"].startswith(f"{path}:3: gpu_cuont")
    assert "did you mean 'gpu_count'" in err["error"]
    piped = check(state, "--baseline", "-", stdin="power_limit_w: 700\npersistence_mode: maybe\n")
    assert piped.returncode == EXIT_USAGE
    assert json.loads(piped.stderr)["error"].startswith("<stdin>:2: persistence_mode")
    broken = check(state, "--baseline", "-", stdin='{"power_limit_w": 700,\n "gpu_count": }\n')
    assert broken.returncode == EXIT_USAGE and json.loads(broken.stderr)["error"].startswith("<stdin>:2: ")
    missing = check(state, "--baseline", str(tmp_path / "nope.yml"))
    assert missing.returncode == EXIT_USAGE and "nope.yml" in json.loads(missing.stderr)["error"]
    flag = check(state, "--fail-on", "info")
    assert flag.returncode == EXIT_USAGE and json.loads(flag.stderr)["kind"] == "usage"


def test_no_snapshot_is_exit_3_with_the_error_line(tmp_path: Path) -> None:
    proc = check(tmp_path / "absent.json")
    assert proc.returncode == EXIT_UNKNOWN and proc.stdout == ""
    err = json.loads(proc.stderr)
    assert err["kind"] == "collect" and "absent.json" in err["error"]
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    proc = check(corrupt)
    assert proc.returncode == EXIT_UNKNOWN and proc.stdout == ""
    assert "corrupt.json" in json.loads(proc.stderr)["error"]


def test_without_a_baseline_only_baseline_free_checks_run(state: Path) -> None:
    sim.inject(str(state), "power-cap-drift", 0)
    sim.inject(str(state), "ecc-dbe", 4)
    proc = check(state, "--json")
    assert proc.returncode == EXIT_CRIT
    doc = json.loads(proc.stdout)
    assert doc["baseline"] is None and "thermal_power.power_limit" not in doc["checks_run"]
    checks = {f["check"] for f in doc["findings"]}
    assert "memory.ecc_dbe_volatile" in checks and "thermal_power.power_limit" not in checks


def test_snapshot_flag_includes_what_was_judged(state: Path) -> None:
    proc = check(state, "--json", "--snapshot")
    doc = json.loads(proc.stdout)
    assert doc["snapshot"]["hostname"] == "node011" and len(doc["snapshot"]["gpus"]) == 8
    assert "daemon" not in doc["snapshot"]  # a cold collect's snapshot, as collect prints it
    assert "snapshot" not in json.loads(check(state, "--json").stdout)


def test_takes_the_daemons_snapshot_when_fresh_and_collects_with_fresh(state: Path, baseline: Path) -> None:
    import signal
    import time

    daemon = subprocess.Popen(
        [*AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--full-interval", "600", "--states", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        end = time.monotonic() + 60
        while True:  # until the daemon has its full snapshot and answers
            served = check(state, "--baseline", str(baseline), "--json")
            if json.loads(served.stdout)["source"] == "daemon":
                break
            assert time.monotonic() < end, served.stdout
            time.sleep(0.2)
        assert served.returncode == EXIT_OK and findings(served) == []
        sim.inject(str(state), "persistence-off", 2)  # after the daemon's only full snapshot
        stale = check(state, "--baseline", str(baseline), "--json")
        assert json.loads(stale.stdout)["source"] == "daemon" and stale.returncode == EXIT_OK
        fresh = check(state, "--baseline", str(baseline), "--json", "--fresh")
        assert json.loads(fresh.stdout)["source"] == "collect" and fresh.returncode == EXIT_WARN
        assert [(f["check"], f["gpu"]["index"]) for f in findings(fresh)] == [("config.persistence_mode", 2)]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=30)
