"""The playbooks through ansible-runner against a loopback simulated fleet (real sshd, real Ansible).

For each drift (power cap, persistence, MIG): check mode reports exactly the drifted nodes and
leaves their state files byte for byte; a real run fixes them; a second run changes nothing; the
agent then reads the wanted value on every GPU; and the audit is clean.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from fleetops.rollout import cli
from fleetops.rollout.runner import RunResult, run_playbook

pytestmark = [pytest.mark.root, pytest.mark.slow]

DRIFTED = {"node001": 0, "node003": 5}  # node -> GPU index the fault goes on
EXPECT = {"power_limit_w": 700, "persistence_mode": True, "mig_mode": False}


def run(fleet, playbook: str, check: bool = False, **extravars: Any) -> tuple[RunResult, list[str]]:
    lines: list[str] = []
    result = run_playbook(
        playbook,
        [fleet.inventory],
        extravars={"fleetops_audit_history": False, **extravars},
        check=check,
        emit=lambda kind, line: lines.append(line),
        private_data_dir=str(fleet.artifacts),
        keep=5,
    )
    assert not result.errors, result.errors
    return result, lines


@pytest.fixture(scope="module")
def converged(sim_fleet):
    """A fleet whose power-cap units exist: drift is then the only thing a run changes."""
    for book in ("power_caps.yml", "mig.yml"):
        result, lines = run(sim_fleet, book)
        assert result.ok, "\n".join(lines)
    return sim_fleet


CASES = [
    ("power-cap-drift", "power_caps.yml", "power_limit_w", 700.0, ": 500 W"),
    ("persistence-off", "power_caps.yml", "persistence_mode", True, ": off"),
    ("mig-drift", "mig.yml", "mig_mode_current", False, ": on"),
]


@pytest.mark.parametrize(("fault", "playbook", "field", "want", "shown"), CASES, ids=[c[0] for c in CASES])
def test_drift_is_reported_in_check_mode_fixed_then_stable(
    converged, fault, playbook, field, want, shown
) -> None:
    fleet = converged
    for node, gpu in DRIFTED.items():
        fleet.inject(node, fault, gpu)
    before = fleet.state_bytes()

    check, lines = run(fleet, playbook, check=True)
    assert check.ok, "\n".join(lines)
    assert check.changed_hosts() == sorted(DRIFTED)
    for node, gpu in DRIFTED.items():
        assert any(node in line and "WOULD CHANGE" in line and f"({gpu}{shown}" in line for line in lines), lines
    assert fleet.state_bytes() == before, "check mode changed a node's state"

    fixed, lines = run(fleet, playbook)
    assert fixed.ok and fixed.changed_hosts() == sorted(DRIFTED), "\n".join(lines)

    again, lines = run(fleet, playbook)
    assert again.ok and sum(r["changed"] for r in again.rows) == 0, "\n".join(lines)

    for node in fleet.nodes:
        values = [g[field] for g in fleet.collect(node)["gpus"]]
        assert values == [want] * 8, (node, values)

    audit, lines = run(fleet, "audit.yml", fleetops_audit_mode="agent", fleetops_audit_expect=EXPECT)
    assert audit.ok, "\n".join(lines)
    fleetops = os.path.join(os.path.dirname(sys.executable), "fleetops")
    fleetops = fleetops if os.access(fleetops, os.X_OK) else shutil.which("fleetops")
    if (
        fleetops
        and subprocess.run([fleetops, "audit", "--help"], check=False, capture_output=True).returncode == 0
    ):
        done = subprocess.run(
            [fleetops, "audit", "-i", fleet.inventory, "--format", "json", "--no-history"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report = json.loads(done.stdout)
        bad = [f for f in report["findings"] if f["severity"] in ("warn", "crit")]
        assert done.returncode == 0 and not bad, bad
        gate, lines = run(fleet, "audit.yml", fleetops_audit_mode="controller")
        assert gate.ok, "\n".join(lines)


def test_power_unit_for_a_simulated_node_is_written_beside_its_state(converged) -> None:
    unit = converged.state_path("node002").with_suffix(".systemd") / "fleetops-gpu-power.service"
    # caps at the GPUs' default limit (700 W) come back by themselves after a reboot: no unit
    assert not unit.exists()
    result, lines = run(converged, "power_caps.yml", gpu_power_limit_w=650)
    assert result.ok, "\n".join(lines)
    text = unit.read_text()
    assert "set persistence on --gpu all" in text and "set power 650 --gpu all" in text
    assert f"--state {converged.state_path('node002')}" in text
    # back at the default: the installed unit is kept, and re-applies the default
    result, lines = run(converged, "power_caps.yml")
    assert result.ok, "\n".join(lines)
    assert "set power 700 --gpu all" in unit.read_text()


def test_apply_exits_non_zero_and_names_the_host_that_is_down(converged, capsys) -> None:
    fleet = converged
    fleet.inject("node002", "host-down")
    try:
        parser = cli.argparse.ArgumentParser(prog="fleetops")
        cli.register(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(
            ["apply", "power", "-i", fleet.inventory, "--check", "--artifacts", str(fleet.artifacts)]
        )
        code = args.func(args)
    finally:
        from fleetops.sim import fleet as simfleet

        simfleet.clear(str(fleet.directory), "node002", "host-down")
    out = capsys.readouterr().out
    assert code == cli.EXIT_HOSTS_FAILED
    assert "FAILED: node002" in out
    assert "UNREACHABLE" in out and "node002" in out.split("UNREACHABLE")[0].splitlines()[-1]
    summary = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("node00")}
    assert summary == {"node001": "ok", "node002": "unreachable", "node003": "ok"}


def test_driver_rollout_refuses_loopback_nodes_and_the_failed_canary_stops_it(converged, capsys) -> None:
    """Loopback nodes share the controller's file system: the package roles refuse them. The
    canary fails, so no other node is touched and all are named."""
    parser = cli.argparse.ArgumentParser(prog="fleetops")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "rollout",
            "driver",
            "--version",
            "580.159.04",
            "-i",
            converged.inventory,
            "--yes",
            "--artifacts",
            str(converged.artifacts),
        ]
    )
    code = args.func(args)
    out = capsys.readouterr().out
    assert code == cli.EXIT_HOSTS_FAILED
    assert "FAILED: node001" in out and "NOT REACHED (run stopped): node002, node003" in out
    assert "node001 is a loopback simulated node" in out


def test_a_check_run_that_fails_says_nothing_was_drained(converged, capsys) -> None:
    """A rollout to another version, in check mode: the package step refuses the loopback node,
    and the failure says that check mode changed and drained nothing (not "stays drained"),
    with one full stop after the task's own message."""
    parser = cli.argparse.ArgumentParser(prog="fleetops")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rollout", "driver", "--version", "580.163.01", "-i", converged.inventory, "--check",
                              "--artifacts", str(converged.artifacts)])
    code = args.func(args)
    out = capsys.readouterr().out
    assert code == cli.EXIT_HOSTS_FAILED, out
    assert "FAILED: node001" in out, out
    # the progress line is cut at the terminal's width, after these words
    assert "or a real node. Check mode: nothing was changed" in out, out
    assert "stays drained" not in out and "a real node.." not in out, out


def test_firmware_audit_names_the_node_whose_vbios_drifted(converged, capsys) -> None:
    """firmware.yml has the agent's checks judge VBIOS/InfoROM per GPU model against the baseline;
    with gpu_firmware_fail_on_drift the drifted node fails and is named, the others pass."""
    fleet = converged
    fleet.inject("node002", "vbios-drift", 6)
    expected = {"NVIDIA H200": {"vbios_version": "96.00.A5.00.1A", "inforom_image": "G520.0282.02.02"}}
    try:
        report, lines = run(fleet, "firmware.yml", gpu_firmware_expected=expected)
        assert report.ok and report.changed_hosts() == [], "\n".join(lines)
        strict, lines = run(
            fleet, "firmware.yml", gpu_firmware_expected=expected, gpu_firmware_fail_on_drift=True
        )
        assert strict.failed_hosts == ["node002"], "\n".join(lines)
        failure = next(line for line in lines if "FAILED" in line)
        # the agent's check (versions.vbios) words the difference, per GPU model
        assert "GPU 6 (0000:ba:00.0) VBIOS 96.00.99.00.01 is not the baseline's 96.00.A5.00.1A for NVIDIA H200" in failure
    finally:
        from fleetops.sim import fleet as simfleet

        simfleet.clear(str(fleet.directory), "node002", "vbios-drift")
