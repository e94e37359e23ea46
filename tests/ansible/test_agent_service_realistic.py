"""The resident agent on realistic hosts: the fleetops_agent role's systemd unit in Debian booted
with systemd-nspawn -b (hosts from nspawn_hosts.py), and ``fleetops-agent slurm-healthcheck``
against the real slurmctld of that tier.

The tests run in file order on one two-host cluster: install and start -> idempotent -> check
mode changes nothing -> kill -9 is restarted by systemd -> reload keeps it running -> the health
check drains, resumes, and leaves an operator's drain -> the service is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nspawn_hosts
import pytest

from fleetops.catalog import slurm as rule
from fleetops.sim import gpu as sim

pytestmark = [pytest.mark.root, pytest.mark.slow]

OLD, NEW = "580.159.04", "580.163.01"
NODES = ["node201", "node202"]
REPO = Path(__file__).resolve().parents[2]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_SERVICE_TEST_ADDRESS", "127.0.49.1")
UNIT = "fleetops-agent.service"
SCONTROL_IN_HOST = "/usr/local/bin/scontrol"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = nspawn_hosts.skip_reason() or nspawn_hosts.slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("nspawn-agent")
    try:
        c = nspawn_hosts.up(directory, NODES, OLD, NEW, first=FIRST_ADDRESS, slurm=True)
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        wheelhouse = directory / "wheelhouse"
        nspawn_hosts.build_wheel(REPO, wheelhouse)
        # the hosts share the machine's network: each endpoint on its own loopback address
        nspawn_hosts.write_inventory(c, wheelhouse, {"fleetops_agent_metrics_address": "{{ ansible_host }}:9401"})
        yield c
    finally:
        nspawn_hosts.down(c)


def _playbook(c: Any, check: bool = False, **extravars: Any) -> tuple[bool, str, Any]:
    from fleetops.rollout.progress import summary_text
    from fleetops.rollout.runner import run_playbook

    lines: list[str] = []
    result = run_playbook(
        "agent.yml",
        [str(c.inventory)],
        extravars=extravars or None,
        check=check,
        emit=lambda k, line: lines.append(line),
        private_data_dir=str(c.directory / "runner"),
    )
    return result.ok, "\n".join(lines) + "\n" + summary_text(result.rows) + "\n" + "\n".join(result.errors), result


def _show(c: Any, host: Any, *props: str) -> dict[str, str]:
    out = c.ssh(host, f"systemctl show -p {','.join(props)} {UNIT}").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _daemon(c: Any, host: Any) -> dict[str, Any]:
    doc = json.loads(c.ssh(host, "fleetops-agent collect").stdout)
    assert "daemon" in doc, f"{host.name}: collect answered cold, not from the daemon"
    return dict(doc["daemon"])


def _until(what: str, condition: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(1)


def test_role_installs_enables_starts_and_verifies_the_unit(cluster: Any) -> None:
    ok, text, result = _playbook(cluster)
    assert ok, text
    assert sorted(result.changed_hosts()) == NODES, text
    for host in cluster.hosts:
        assert cluster.ssh(host, f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}").stdout.split() == [
            "active",
            "enabled",
        ]
        props = _show(cluster, host, "Type", "WatchdogUSec", "Restart", "ProtectSystem", "NoNewPrivileges")
        assert props == {
            "Type": "notify",
            "WatchdogUSec": "1min",
            "Restart": "on-failure",
            "ProtectSystem": "strict",
            "NoNewPrivileges": "yes",
        }
        daemon = _daemon(cluster, host)
        assert daemon["age_s"] is not None and daemon["age_s"] < 15 and daemon["interval_s"] == 2.0
        page = urllib.request.urlopen(f"http://{host.address}:9401/metrics", timeout=10).read().decode()
        uuid = json.loads(host.state.read_text())["gpus"][0]["uuid"]
        assert "fleetops_agent_up 1" in page and f'uuid="{uuid}"' in page


def test_a_second_run_changes_nothing(cluster: Any) -> None:
    pids = {h.name: _show(cluster, h, "MainPID")["MainPID"] for h in cluster.hosts}
    ok, text, result = _playbook(cluster)
    assert ok and result.changed_hosts() == [], text
    assert {h.name: _show(cluster, h, "MainPID")["MainPID"] for h in cluster.hosts} == pids


def test_check_mode_reports_the_change_and_changes_nothing(cluster: Any) -> None:
    host = cluster.hosts[0]
    before = cluster.ssh(host, "cat /etc/fleetops/agent.json").stdout
    pid = _show(cluster, host, "MainPID")["MainPID"]
    ok, text, result = _playbook(cluster, check=True, fleetops_agent_interval=5)
    assert ok, text
    assert sorted(result.changed_hosts()) == NODES, text
    assert cluster.ssh(host, "cat /etc/fleetops/agent.json").stdout == before
    assert json.loads(before)["interval_s"] == 2.0
    assert _show(cluster, host, "MainPID")["MainPID"] == pid
    assert _daemon(cluster, host)["interval_s"] == 2.0


def test_kill_9_of_the_daemon_is_restarted_by_systemd(cluster: Any) -> None:
    host = cluster.hosts[0]
    before = _show(cluster, host, "MainPID", "NRestarts")
    cluster.ssh(host, f"kill -9 {before['MainPID']}")

    def restarted() -> bool:
        now = _show(cluster, host, "MainPID", "NRestarts", "ActiveState")
        return (
            now["ActiveState"] == "active"
            and now["MainPID"] not in ("0", before["MainPID"])
            and int(now["NRestarts"]) == int(before["NRestarts"]) + 1
        )

    _until("systemd to restart the killed daemon", restarted)
    _until("the restarted daemon to answer", lambda: _daemon(cluster, host)["age_s"] is not None)


def test_reload_rereads_the_config_and_keeps_the_daemon_running(cluster: Any) -> None:
    host = cluster.hosts[1]
    pid = _show(cluster, host, "MainPID")["MainPID"]
    assert _daemon(cluster, host)["reloaded_at"] is None
    ok, text, result = _playbook(cluster, fleetops_agent_interval=3)
    assert ok, text
    assert _show(cluster, host, "MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}
    daemon = _until("the reloaded interval", lambda: (d := _daemon(cluster, host))["interval_s"] == 3.0 and d)
    assert daemon["reloaded_at"] is not None and daemon["reload_error"] is None


def _power_findings(c: Any, host: Any) -> list[dict[str, Any]]:
    return [f for f in _daemon(c, host)["findings"] if f["check"] == "thermal_power.power_limit"]


def test_a_baseline_from_the_inventory_judges_the_daemons_findings(cluster: Any) -> None:
    """``fleetops_agent_baseline_path``: the role writes the host's ``fleetops_baseline`` there and
    the unit passes ``--baseline``; a later change of the baseline alone is a reload, not a restart."""
    host = cluster.hosts[1]
    path = "/etc/fleetops/baseline.yml"
    ok, text, _ = _playbook(cluster, fleetops_agent_baseline_path=path, fleetops_baseline={"power_limit_w": 600})
    assert ok, text + cluster.ssh(host, f"journalctl -u {UNIT} -n 20 --no-pager").stdout
    found = _until("findings judged by the baseline", lambda: _power_findings(cluster, host))
    assert {f["expected"] for f in found} == {600}
    assert _daemon(cluster, host)["baseline"]["source"] == path
    assert "--baseline" in cluster.ssh(host, f"systemctl cat {UNIT}").stdout
    pid = _show(cluster, host, "MainPID")["MainPID"]
    ok, text, _ = _playbook(cluster, fleetops_agent_baseline_path=path, fleetops_baseline={"power_limit_w": 650})
    assert ok, text
    found = _until("the reloaded baseline", lambda: (f := _power_findings(cluster, host)) and
                   {x["expected"] for x in f} == {650} and f)
    assert _show(cluster, host, "MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}
    assert _daemon(cluster, host)["reload_error"] is None


def _healthcheck(c: Any, host: Any) -> dict[str, Any]:
    done = c.ssh(host, f"fleetops-agent slurm-healthcheck --scontrol {SCONTROL_IN_HOST}")
    return dict(json.loads(done.stdout))


@pytest.fixture
def scontrol_in_hosts(cluster: Any) -> Iterator[None]:
    """The machine's Slurm client in each host (the same Debian release as their slurmd)."""
    for host in cluster.hosts:
        shutil.copy2(shutil.which("scontrol") or "/usr/bin/scontrol", host.root / SCONTROL_IN_HOST.lstrip("/"))
    yield
    for host in cluster.hosts:
        (host.root / SCONTROL_IN_HOST.lstrip("/")).unlink(missing_ok=True)


def test_healthcheck_drains_a_dbe_resumes_after_it_and_leaves_an_operators_drain(
    cluster: Any, scontrol_in_hosts: None
) -> None:
    import subprocess

    assert cluster.slurm is not None
    n1, n2 = cluster.hosts
    _until("both nodes idle", lambda: all(cluster.slurm.show(n)[0] == "IDLE" for n in NODES), 120)
    clean = _healthcheck(cluster, n1)
    assert clean["source"] == "daemon" and clean["action"] == "none" and clean["crit"] == []

    sim.inject(str(n1.state), "ecc-dbe", 3)
    gpu = json.loads(n1.state.read_text())["gpus"][3]
    _until("the daemon to see the DBE", lambda: any(f["severity"] == "crit" for f in _daemon(cluster, n1)["findings"]))
    drained = _healthcheck(cluster, n1)
    assert drained["action"] == "drain" and drained["outcome"] == "done", drained
    state, reason = cluster.slurm.show("node201")
    assert "DRAIN" in state, state
    assert reason is not None and reason.startswith("[fleetops] health/"), reason
    assert rule.owner_of(reason).kind == "health" and rule.owner_of(reason).run == drained["run"], reason
    assert gpu["uuid"] in reason and gpu["bus_id"] in reason, reason

    sim.clear(str(n1.state), "ecc-dbe", 3)
    _until("the daemon to clear the DBE", lambda: not any(f["severity"] == "crit" for f in _daemon(cluster, n1)["findings"]))
    resumed = _healthcheck(cluster, n1)
    assert resumed["action"] == "resume" and resumed["outcome"] == "done", resumed
    state, reason = cluster.slurm.show("node201")
    assert "DRAIN" not in state and reason is None, (state, reason)

    scontrol = str(cluster.slurm.scontrol)
    subprocess.run([scontrol, "update", "NodeName=node202", "State=DRAIN", "Reason=maintenance by alice"], check=True)
    try:
        left = _healthcheck(cluster, n2)
        assert left["action"] == "none" and left["owner"]["kind"] == "other", left
        assert "someone outside fleetops (reason 'maintenance by alice')" in left["why"], left
        state, reason = cluster.slurm.show("node202")
        assert "DRAIN" in state and reason == "maintenance by alice", (state, reason)
    finally:
        subprocess.run([scontrol, "update", "NodeName=node202", "State=RESUME"], check=False)


def test_service_false_stops_disables_and_removes_the_unit(cluster: Any) -> None:
    ok, text, result = _playbook(cluster, fleetops_agent_service=False)
    assert ok, text
    assert sorted(result.changed_hosts()) == NODES, text
    for host in cluster.hosts:
        out = cluster.ssh(host, f"systemctl is-active {UNIT}; test -e /etc/systemd/system/{UNIT}; echo $?", check=False)
        assert out.stdout.split() == ["inactive", "1"], out.stdout
        assert "daemon" not in json.loads(cluster.ssh(host, "fleetops-agent collect").stdout)
