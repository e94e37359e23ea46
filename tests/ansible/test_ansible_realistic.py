"""The realistic-host tier: driver_rollout.yml end to end on three Debian hosts booted with
systemd-nspawn -b, from a local apt repository of stand-in NVIDIA packages, with a real slurmctld
on the machine and slurmd in every host (see nspawn_hosts.py for how they are built).

The tests run in file order and build on each other (one cluster per module):
agent install -> the installed wheel's `fleetops` checks power caps and the driver rollout (check
mode, nothing changes) -> power caps -> a rollout whose inventory names a node Slurm does not know
stops before any drain -> a rollout that a failing host stops -> the fixed rerun, with a node the
health program drained held through it -> the rerun that finishes -> a rerun that changes nothing. The first run on a machine spends 1.5-2.5 minutes on debootstrap
(cached in /var/tmp/fleetops-nspawn afterwards); the rest takes about 5 minutes on two cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nspawn_hosts
import pytest
from wheel_venv import WheelVenv

from fleetops.rollout import cli

pytestmark = [pytest.mark.root, pytest.mark.slow]

OLD, NEW = "580.159.04", "580.163.01"
NODES = ["node101", "node102", "node103"]
# A cap below the GPUs' 700 W default: a reboot resets the limit to the default, so finding
# 650 W after one proves the boot-time unit re-applied it.
CAP_W = 650
REPO = Path(__file__).resolve().parents[2]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_TEST_ADDRESS", "127.0.48.1")
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    reason = nspawn_hosts.skip_reason()
    if reason:
        pytest.skip(reason)
    slurm = nspawn_hosts.slurm_skip_reason() is None
    directory = tmp_path_factory.mktemp("nspawn")
    try:
        c = nspawn_hosts.up(directory, NODES, OLD, NEW, first=FIRST_ADDRESS, slurm=slurm)
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        wheelhouse = directory / "wheelhouse"
        nspawn_hosts.build_wheel(REPO, wheelhouse)
        nspawn_hosts.write_inventory(
            c,
            wheelhouse,
            {
                "fleetops_baseline": {
                    "gpu_count": 8,
                    "persistence_mode": True,
                    "power_limit_w": CAP_W,
                    "mig": {"mode": False},
                },
                "fleetops_audit_history": False,
                # No resident daemon here: with it on, test_power_caps_set_the_cap_and_enable_the_boot_unit
                # failed once in three whole-suite runs (passing alone and as a file), cause not found
                # yet; test_agent_service_realistic.py covers the daemon's unit, baseline and fresh reads.
                # Turned on, it needs "fleetops_agent_metrics_address": "{{ ansible_host }}:9401" too:
                # the hosts share the machine's network, and the default 0.0.0.0:9401 binds once.
                "fleetops_agent_service": False,
                "nvidia_driver_verify_retries": 2,
                "nvidia_driver_verify_delay": 3,
            },
        )
        TIMINGS.update(c.timings)
        yield c
    finally:
        nspawn_hosts.down(c)
        print("\nrealistic tier timings (s):", json.dumps({k: round(v, 1) for k, v in TIMINGS.items()}))


def _cli(c, *argv: str, inventory: Path | None = None) -> tuple[int, str]:
    import contextlib
    import io

    parser = cli.argparse.ArgumentParser(prog="fleetops")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [*argv, "-i", str(inventory or c.inventory), "--artifacts", str(c.directory / "runner"),
         "--db", str(c.directory / "history.db")]  # fmt: skip
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = args.func(args)
    return code, out.getvalue()


def _playbook(c, book: str) -> tuple[int, str, object]:
    from fleetops.rollout.progress import summary_text
    from fleetops.rollout.runner import run_playbook

    lines: list[str] = []
    result = run_playbook(
        book,
        [str(c.inventory)],
        emit=lambda k, line: lines.append(line),
        private_data_dir=str(c.directory / "runner"),
    )
    text = "\n".join(lines) + "\n" + summary_text(result.rows) + "\n" + "\n".join(result.errors)
    return (0 if result.ok else 1), text, result


def _loaded(c, node: str) -> str:
    return c.state(node)["node"]["driver_version"]


def _caps(c, node: str) -> set[float]:
    return {g["power_limit_w"] for g in c.state(node)["gpus"]}


def _timed(name: str):
    class Timer:
        def __enter__(self):
            self.t = time.monotonic()

        def __exit__(self, *exc):
            TIMINGS[name] = time.monotonic() - self.t

    return Timer()


def test_hosts_boot_with_systemd_sshd_own_hostname_and_the_old_stack(cluster) -> None:
    for host in cluster.hosts:
        out = cluster.ssh(host, "hostname; systemctl is-system-running; apt-mark showhold").stdout.split()
        assert out[0] == host.name
        assert out[1] in ("running", "degraded")
        assert {"nvidia-driver-580-server", "nvidia-fabricmanager-580", "cuda-toolkit-13-0"} <= set(out[2:])
        assert _loaded(cluster, host.name) == OLD
    if cluster.slurm:
        assert all(cluster.slurm.show(n)[0] == "IDLE" for n in NODES)


def test_agent_role_installs_from_the_pushed_wheelhouse_and_is_idempotent(cluster) -> None:
    with _timed("agent_install_s"):
        code, text, result = _playbook(cluster, "agent.yml")
    assert code == 0, text
    code, text, result = _playbook(cluster, "agent.yml")
    assert code == 0 and result.changed_hosts() == [], text
    out = cluster.ssh(
        cluster.hosts[0], "readlink /usr/local/bin/fleetops-agent; fleetops-agent collect"
    ).stdout
    link, snapshot = out.split("\n", 1)
    assert link == "/opt/fleetops/venv/bin/fleetops-agent"
    assert json.loads(snapshot)["driver_version"] == OLD


def _untouched(c) -> dict[str, Any]:
    """What a check run must leave as it is: per host the simulator state (loaded driver, GPU
    settings), the installed NVIDIA/CUDA packages and their holds, the boot-time power unit and
    the container's boot (no reboot); Slurm's state and reason of every node."""
    seen: dict[str, Any] = {}
    for host in c.hosts:
        out = c.ssh(
            host,
            "dpkg-query -W -f '${Package}=${Version}\\n' 'nvidia-*' 'cuda-*'; echo --; apt-mark showhold; "
            f"echo --; {nspawn_hosts.BOOT_TIME_COMMAND}; "
            "test -e /etc/systemd/system/fleetops-gpu-power.service && echo unit || echo no-unit",
        ).stdout
        packages, holds, tail = out.split("--\n")
        seen[host.name] = {
            "state": c.state(host.name),
            "packages": sorted(packages.split()),
            "holds": sorted(holds.split()),
            "boot_and_unit": tail.split(),
        }
    if c.slurm:
        seen["slurm"] = {n: c.slurm.show(n) for n in NODES}
    return seen


def _sections(out: str, what: str) -> list[tuple[str, list[str]]]:
    """A check run's plays in order, each with the nodes whose WOULD CHANGE line for ``what`` it
    printed (a check run changes nothing: its lines say what would change)."""
    sections: list[tuple[str, list[str]]] = []
    for line in out.splitlines():
        if line.startswith("PLAY "):
            sections.append((line[5:], []))
        elif f" WOULD CHANGE {what}" in line:
            sections[-1][1].append(line.split()[2])
    return sections


def test_the_installed_wheel_checks_power_and_the_driver_rollout_and_changes_nothing(
    cluster, wheel_venv: WheelVenv
) -> None:
    """The wheel's own `fleetops` (a fresh venv, no checkout on its path, the collection inside the
    installed package) runs `apply power --check` and `rollout driver --check` on these hosts:
    every node reported with what would change, the canary before the batches, nothing changed."""
    before = _untouched(cluster)
    artifacts = wheel_venv.base / "realistic-artifacts"
    inventory = str(cluster.inventory)
    with _timed("wheel_checks_s"):
        power = wheel_venv.fleetops(
            "apply", "power", "-i", inventory, "--check", "--artifacts", str(artifacts / "power")
        )
        rollout = wheel_venv.fleetops(
            "rollout", "driver", "--version", NEW, "--batch", "1", "--check",
            "-i", inventory, "--artifacts", str(artifacts / "rollout"),
        )  # fmt: skip
    out = power.stdout
    assert power.returncode == 0, out[-4000:] + power.stderr[-2000:]
    assert out.startswith("CHECK (nothing is changed): enforce and persist GPU power caps"), out[:500]
    every_gpu = ", ".join(f"{i}: 700 W" for i in range(8))
    caps = {
        line.split()[2]: line.split("Set the GPU power cap: ", 1)[1]
        for line in out.splitlines()
        if " WOULD CHANGE gpu_power : Set the GPU power cap: " in line
    }
    assert caps == {n: f"power {CAP_W} W: would change 8 of 8 GPUs ({every_gpu})" for n in NODES}, out
    units = _sections(out, "gpu_power : Install the boot-time power cap unit")
    assert [(play, sorted(nodes)) for play, nodes in units] == [("Enforce GPU power caps", NODES)], out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("node1")]
    assert rows == [[n, "would", "change"] for n in NODES], out

    out = rollout.stdout
    assert rollout.returncode == 0, out[-6000:] + rollout.stderr[-2000:]
    assert out.startswith(f"CHECK (nothing is changed): roll out NVIDIA driver {NEW} "), out[:500]
    plan = "Name the driver and packages the node moves to: "
    planned = {line.split()[2]: line.split(plan, 1)[1] for line in out.splitlines() if plan in line}
    assert planned == {
        n: f"would install driver {NEW} (loaded: {OLD}); package nvidia-driver-580-server is {OLD}-0ubuntu1, "
        f"expected {NEW}; package nvidia-fabricmanager-580 is {OLD}-1, expected {NEW}"
        for n in NODES
    }, out
    # the canary alone first, then the rest one node per batch (--batch 1), in name order
    assert _sections(out, "Name the driver") == [
        ("Pick the canary batch", []),
        ("Upgrade the canary batch", ["node101"]),
        ("Upgrade the rest in batches", ["node102"]),
        ("Upgrade the rest in batches", ["node103"]),
    ], out
    if cluster.slurm:
        drain = "slurm_drain : Set the node's Slurm drain state: "
        drains = [line.split(drain, 1)[1] for line in out.splitlines() if drain in line]
        assert drains == [f"{n} would be drained (is IDLE)" for n in NODES], out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("node1")]
    assert rows == [[n, "would", "change"] for n in NODES], out
    assert "FAILED" not in out and "NOT REACHED" not in out, out

    assert _untouched(cluster) == before

    # every task ran from the collection inside the venv's installed fleetops
    root = wheel_venv.python("from fleetops.rollout import runner; print(runner.ansible_dir())").strip()
    assert wheel_venv.under_venv(root)
    assert root.endswith("/fleetops/collections/ansible_collections/fleetops/gpu"), root
    events = WheelVenv.events(artifacts / "power") + WheelVenv.events(artifacts / "rollout")
    # events that are only output (verbose lines, warnings) carry no event_data
    paths = {
        e["event_data"]["task_path"].rsplit(":", 1)[0]
        for e in events
        if e.get("event_data", {}).get("task_path")
    }
    assert paths and [p for p in paths if not p.startswith(root + "/")] == [], sorted(paths)
    actions = ("fleetops.gpu.fleetops_gpu_set", "fleetops.gpu.fleetops_gpu_facts", "ansible.builtin.apt")
    ran = {
        action: sorted(
            {
                e["event_data"]["host"]
                for e in events
                if e["event"] == "runner_on_ok" and e["event_data"].get("resolved_action") == action
            }
        )
        for action in actions
    }
    assert ran == dict.fromkeys(ran, NODES), ran


def _units_log(c, units: tuple[str, ...]) -> str:
    """Each host's journal of ``units`` this boot and its state's caps: what a failure needs
    to be told apart (the cap never set, set then undone, or the unit failing)."""
    out = []
    for host in c.hosts:
        args = " ".join(f"-u {u}" for u in units)
        log = c.ssh(host, f"journalctl -b --no-pager -o short-precise {args} | tail -40", check=False)
        out.append(f"--- {host.name}: caps {sorted(_caps(c, host.name))}\n{log.stdout}{log.stderr}")
    return "\n".join(out)


def test_power_caps_set_the_cap_and_enable_the_boot_unit(cluster) -> None:
    # check mode first, on nodes that never had the unit: systemd cannot enable a unit that check
    # mode did not install, so the role must not ask it to
    code, out = _cli(cluster, "apply", "power", "--check")
    assert code == 0 and all(f"{host.name}  would change" in out for host in cluster.hosts), out
    for host in cluster.hosts:
        assert _caps(cluster, host.name) == {700}, out
        assert (
            cluster.ssh(
                host, "test -e /etc/systemd/system/fleetops-gpu-power.service", check=False
            ).returncode
            == 1
        )
    with _timed("power_caps_s"):
        code, out = _cli(cluster, "apply", "power", "--yes")
    units = ("fleetops-gpu-power", "fleetops-agent")
    assert code == 0, out + "\n" + _units_log(cluster, units)
    for host in cluster.hosts:
        assert _caps(cluster, host.name) == {CAP_W}, _units_log(cluster, units)
        assert (
            cluster.ssh(host, "systemctl is-enabled fleetops-gpu-power.service").stdout.strip() == "enabled"
        )


def test_a_host_slurm_does_not_know_stops_the_rollout_before_any_drain(cluster) -> None:
    """node103's inventory maps it to a Slurm name the cluster does not have: the run asks Slurm
    about every host first and stops there, naming the host and the name; nothing is drained."""
    if not cluster.slurm:
        pytest.skip(f"no Slurm on this machine: {nspawn_hosts.slurm_skip_reason()}")
    import yaml

    doc = yaml.safe_load(cluster.inventory.read_text())
    doc["all"]["children"]["gpu"]["hosts"]["node103"]["fleetops_slurm_node_name"] = "ghost211"
    ghost = cluster.directory / "ghost-inventory.yml"
    ghost.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = _untouched(cluster)
    code, out = _cli(cluster, "rollout", "driver", "--version", NEW, "--batch", "1", "--yes", inventory=ghost)
    assert code == cli.EXIT_HOSTS_FAILED, out
    assert "node103 (Slurm node name ghost211): Slurm does not know a node named ghost211" in out, out
    assert "Drain the node" not in out and "Name the driver" not in out, out
    assert _untouched(cluster) == before
    assert all(cluster.slurm.show(n)[0] == "IDLE" for n in NODES)


def test_rollout_stops_at_a_host_whose_driver_fails_to_load_and_leaves_it_drained(cluster) -> None:
    # node102's new driver will not load after its reboot (as a DKMS build failure would).
    fail = cluster.host("node102").root / "etc/nvidia-sim/fail-load"
    fail.parent.mkdir(parents=True, exist_ok=True)
    fail.write_text("test: the driver does not load\n")
    # a GPU client the rollout stops before the upgrade: its rescue must start it again
    n2 = cluster.host("node102")
    (n2.root / "etc/systemd/system/dcgm-exporter.service").write_text(
        "[Unit]\nDescription=stand-in DCGM exporter\n[Service]\nExecStart=/bin/sleep infinity\n"
    )
    cluster.ssh(n2, "systemctl daemon-reload && systemctl start dcgm-exporter.service")
    with _timed("rollout_with_failure_s"):
        code, out = _cli(cluster, "rollout", "driver", "--version", NEW, "--batch", "1", "--yes")
    assert code == cli.EXIT_HOSTS_FAILED, out
    assert "FAILED: node102" in out and "NOT REACHED (run stopped): node103" in out, out
    assert "ROLLOUT FAILED on node102" in out and "stays drained" in out
    # the whole failure message is in the run's events (the progress line is cut at 300 characters)
    artifacts = Path(out.rsplit("artifacts in ", 1)[1].split()[0])
    events = "".join(p.read_text() for p in (artifacts / "job_events").glob("*.json"))
    assert "Started again: dcgm-exporter.service." in events, out
    assert (
        cluster.ssh(n2, "systemctl is-active dcgm-exporter.service", check=False).stdout.strip() == "active"
    )
    run = next(line.split()[2].rstrip(";") for line in out.splitlines() if line.startswith("run id "))

    # The canary is done: new driver loaded, fabric manager equal to it, both held, services on.
    n1 = cluster.host("node101")
    assert _loaded(cluster, "node101") == NEW
    versions = cluster.ssh(n1, "dpkg-query -W -f '${Package}=${Version}\\n' 'nvidia-*'").stdout.split()
    assert sorted(versions) == [
        f"nvidia-driver-580-server={NEW}-0ubuntu1",
        f"nvidia-fabricmanager-580={NEW}-1",
    ]
    holds = set(cluster.ssh(n1, "apt-mark showhold").stdout.split())
    assert {"nvidia-driver-580-server", "nvidia-fabricmanager-580", "cuda-toolkit-13-0"} <= holds
    services = cluster.ssh(
        n1,
        "systemctl is-enabled nvidia-persistenced nvidia-fabricmanager; systemctl is-active nvidia-persistenced nvidia-fabricmanager",
    ).stdout.split()
    assert services == ["enabled", "enabled", "active", "active"]
    # The reboot reset the cap to 700 W; the boot-time unit put it back.
    assert _caps(cluster, "node101") == {CAP_W}
    journal = cluster.ssh(n1, "journalctl -b -u fleetops-gpu-power.service -o cat").stdout
    assert '"setting":"power"' in journal and '"changed":true' in journal

    # The failed node: new packages, old driver still loaded, fabric manager refusing it.
    assert _loaded(cluster, "node102") == OLD
    assert (
        cluster.ssh(
            cluster.host("node102"), "systemctl is-active nvidia-fabricmanager", check=False
        ).stdout.strip()
        == "failed"
    )
    # node103 was never touched.
    assert _loaded(cluster, "node103") == OLD
    assert cluster.state("node103")["node"]["packages"]["nvidia-driver-580-server"] == f"{OLD}-0ubuntu1"
    if cluster.slurm:
        assert cluster.slurm.show("node101")[0] == "IDLE"
        state, reason = cluster.slurm.show("node102")
        assert "DRAIN" in state and reason == f"[fleetops] rollout/{run}: driver rollout {NEW}"
        assert cluster.slurm.show("node103")[0] == "IDLE"


HEALTH_DBE = (
    "[fleetops] health/20261206T031207Z-node103: memory.ecc_dbe_volatile on GPU "
    "GPU-5d3e0000-0000-0000-0000-000000000003 0000:18:00.0"
)


def test_a_node_the_health_program_drained_is_held_through_the_rollout(cluster) -> None:
    """The health program drained node103 for a DBE. The rerun after node102's fix upgrades
    node102 (taking over the failed run's drain) and leaves node103 alone: still drained with the
    health program's Reason, not upgraded, named as held, not failed; exit 0."""
    if not cluster.slurm:
        pytest.skip(f"no Slurm on this machine: {nspawn_hosts.slurm_skip_reason()}")
    import subprocess

    scontrol = str(cluster.slurm.scontrol)
    (cluster.host("node102").root / "etc/nvidia-sim/fail-load").unlink()
    subprocess.run(
        [scontrol, "update", "NodeName=node103", "State=DRAIN", f"Reason={HEALTH_DBE}"], check=True
    )
    try:
        with _timed("rollout_held_s"):
            code, out = _cli(cluster, "rollout", "driver", "--version", NEW, "--batch", "1", "--yes")
        assert code == 0, out
        assert _loaded(cluster, "node102") == NEW and _loaded(cluster, "node103") == OLD
        state, reason = cluster.slurm.show("node103")
        assert "DRAIN" in state and reason == HEALTH_DBE
        held = [line for line in out.splitlines() if " HELD " in line and "node103" in line]
        assert (
            held and "held: node103 drained by the health program (run 20261206T031207Z-node103)" in held[0]
        ), out
        assert (
            "HELD (left drained, not changed, not failed): node103: held: node103 drained by the health"
            in out
        )
        assert "node103  held" in out and "FAILED" not in out, out
        assert "taken over from a driver rollout" in out, out  # node102's drain from the failed run
        deadline = time.monotonic() + 120
        while "NOT_RESPONDING" in cluster.slurm.show("node102")[0] and time.monotonic() < deadline:
            time.sleep(2)
        assert cluster.slurm.show("node102")[0] == "IDLE"
    finally:
        # the fault is "fixed": an operator lifts the health drain for the next test
        subprocess.run([scontrol, "update", "NodeName=node103", "State=RESUME"], check=False)


def test_rerun_after_the_fix_finishes_the_rollout_and_resumes_the_node(cluster) -> None:
    (cluster.host("node102").root / "etc/nvidia-sim/fail-load").unlink(missing_ok=True)
    with _timed("rollout_rerun_s"):
        code, out = _cli(cluster, "rollout", "driver", "--version", NEW, "--batch", "1", "--yes")
    assert code == 0, out
    for node in NODES:
        assert _loaded(cluster, node) == NEW
        assert _caps(cluster, node) == {CAP_W}
        packages = cluster.state(node)["node"]["packages"]
        assert (
            packages["nvidia-fabricmanager-580"].split("-")[0]
            == packages["nvidia-driver-580-server"].split("-")[0]
            == NEW
        )
    assert "node101  ok" in out  # already done: not drained, not rebooted
    if cluster.slurm:
        # a node resumed right after its reboot is IDLE+NOT_RESPONDING until its slurmd registers
        # again; on a loaded machine that takes a while: wait for the flag, never for the state
        deadline = time.monotonic() + 120
        states = [cluster.slurm.show(n)[0] for n in NODES]
        while any(s.endswith("+NOT_RESPONDING") for s in states) and time.monotonic() < deadline:
            time.sleep(2)
            states = [cluster.slurm.show(n)[0] for n in NODES]
        assert states == ["IDLE"] * 3


def test_a_second_rerun_changes_nothing(cluster) -> None:
    with _timed("rollout_noop_s"):
        code, out = _cli(cluster, "rollout", "driver", "--version", NEW, "--batch", "1", "--yes")
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith("node1")]
    assert [(r[0], r[1], r[3]) for r in rows] == [(n, "ok", "0") for n in NODES], out


# --- the TUI's drain and resume against this slurmctld ---------------------------------------
# They run after the rollout (file order) but need none of it: scontrol runs on the controller
# (SLURM_CONF points it at this cluster) or over SSH on a Slurm host, never on the GPU node.


def _tui(c, hosts: list[Any] | None = None) -> Any:
    from fleetops.fleet import inventory
    from fleetops.tui.app import FleetApp
    from fleetops.tui.source import SshSource

    hosts = hosts if hosts is not None else inventory.load(str(c.inventory))
    source = SshSource(hosts, {}, interval=0.5, connect_timeout=3.0, command_timeout=3.0)
    return FleetApp(source, interval=0.5)


def _drive(app: Any, body: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            await body(pilot)

    asyncio.run(main())


async def _until(pilot: Any, condition: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await pilot.pause(0.1)


async def _act(pilot: Any, app: Any, node: str, key: str) -> Any:
    """Select ``node`` in the fleet table, press ``key`` (d or u), confirm; the action's result."""
    from fleetops.tui.screens.confirm import ConfirmScreen
    from fleetops.tui.screens.drain import DrainScreen

    app.last_action = None
    app.screen.table().select_key(node)
    await pilot.press(key)
    # a resume reads the node's drain first (a worker asking scontrol), then opens the dialog
    dialog = DrainScreen if key == "d" else ConfirmScreen
    await _until(pilot, lambda: isinstance(app.screen, dialog), f"the dialog of {key} on {node}")
    if key == "d":
        await pilot.press("enter")  # the reason prompt: its reason as prefilled
    else:
        await pilot.press("tab", "enter")  # from Cancel (focused first) to the confirm button
    await _until(pilot, lambda: app.last_action is not None, f"{key} on {node} to finish")
    return app.last_action


def _hang_agent(c, node: str) -> Callable[[], None]:
    """Make the node's fleetops-agent hang (a collect never answers); returns the undo."""
    path = c.host(node).root / "usr/local/bin/fleetops-agent"
    link = os.readlink(path) if path.is_symlink() else None
    saved = None if link is not None or not path.exists() else path.read_bytes()
    path.unlink(missing_ok=True)
    path.write_text("#!/bin/sh\nexec sleep 120\n")
    path.chmod(0o755)

    def undo() -> None:
        path.unlink(missing_ok=True)
        if link is not None:
            path.symlink_to(link)
        elif saved is not None:
            path.write_bytes(saved)
            path.chmod(0o755)

    return undo


def test_tui_drains_a_hung_node_and_resumes_it_through_the_real_slurmctld(cluster, monkeypatch) -> None:
    if not cluster.slurm:
        pytest.skip(f"no Slurm on this machine: {nspawn_hosts.slurm_skip_reason()}")

    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm.conf))
    assert cluster.slurm.show("node103")[0] == "IDLE"
    undo = _hang_agent(cluster, "node103")
    app = _tui(cluster)

    async def body(pilot: Any) -> None:
        # the agent does not answer: the TUI marks it hung; the drain does not need it
        await _until(pilot, lambda: app.state.entries["node103"].status == "timeout", "node103 hung")
        drained = await _act(pilot, app, "node103", "d")
        assert drained.ok and drained.detail["outcome"] == "done", drained
        assert drained.detail["where"] == "the controller"
        state, reason = cluster.slurm.show("node103")
        assert "DRAIN" in state and reason is not None and reason.startswith("[fleetops] operator/"), (
            state,
            reason,
        )
        resumed = await _act(pilot, app, "node103", "u")
        assert resumed.ok and "resumed" in resumed.message, resumed
        state, reason = cluster.slurm.show("node103")
        assert "DRAIN" not in state and reason is None, (state, reason)

    try:
        _drive(app, body)
    finally:
        undo()


def test_tui_resume_leaves_a_drain_someone_else_set(cluster, monkeypatch) -> None:
    if not cluster.slurm:
        pytest.skip(f"no Slurm on this machine: {nspawn_hosts.slurm_skip_reason()}")
    import subprocess

    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm.conf))
    scontrol = str(cluster.slurm.scontrol)
    subprocess.run(
        [scontrol, "update", "NodeName=node102", "State=DRAIN", "Reason=maintenance by alice"], check=True
    )
    app = _tui(cluster)

    async def body(pilot: Any) -> None:
        await _until(pilot, lambda: "node102" in app.state.entries, "node102 listed")
        from fleetops.tui.screens.confirm import ConfirmScreen

        # refused before any dialog: the drain read through the real slurmctld names its owner
        before = len(app.action_log.rows)
        app.screen.table().select_key("node102")
        await pilot.press("u")
        await _until(pilot, lambda: len(app.action_log.rows) > before, "the resume's refusal")
        row = app.action_log.rows[0]
        assert (row.node, row.action, row.outcome) == ("node102", "resume", "refused"), row
        assert "maintenance by alice" in row.why and "someone outside fleetops" in row.why, row
        assert "set by root at " in row.why  # who and when, as slurmctld stamped it
        assert not isinstance(app.screen, ConfirmScreen)
        # a drain from the TUI does not overwrite alice's reason either
        again = await _act(pilot, app, "node102", "d")
        assert not again.ok and "someone outside fleetops" in again.message, again

    try:
        _drive(app, body)
        state, reason = cluster.slurm.show("node102")
        assert "DRAIN" in state and reason == "maintenance by alice", (state, reason)
    finally:
        subprocess.run([scontrol, "update", "NodeName=node102", "State=RESUME"], check=False)


def test_tui_drains_through_a_slurm_host_over_ssh(cluster, monkeypatch) -> None:
    """fleetops_slurm_host: scontrol runs on that host over SSH (here node101, which reaches
    slurmctld with its own slurm.conf and munge), not on the controller and not on the node."""
    if not cluster.slurm:
        pytest.skip(f"no Slurm on this machine: {nspawn_hosts.slurm_skip_reason()}")
    import shutil

    from fleetops.fleet import inventory

    monkeypatch.delenv("SLURM_CONF", raising=False)  # the controller itself could not reach Slurm
    hosts = [
        dataclasses.replace(h, vars={**h.vars, "fleetops_slurm_host": "node101"})
        if h.name == "node103"
        else h
        for h in inventory.load(str(cluster.inventory))
    ]
    in_host = cluster.host("node101").root / "usr/local/bin/scontrol"
    in_host.unlink(missing_ok=True)
    app = _tui(cluster, hosts)

    async def body(pilot: Any) -> None:
        await _until(pilot, lambda: "node103" in app.state.entries, "node103 listed")
        missing = await _act(pilot, app, "node103", "d")
        assert not missing.ok and missing.message.endswith("scontrol not found on Slurm host node101"), (
            missing
        )
        # the same Slurm client the controller has (same Debian release as the hosts' slurmd)
        shutil.copy2(shutil.which("scontrol") or "/usr/bin/scontrol", in_host)
        drained = await _act(pilot, app, "node103", "d")
        assert drained.ok and drained.detail["where"] == "Slurm host node101", drained
        state, reason = cluster.slurm.show("node103")
        assert "DRAIN" in state and reason is not None and reason.startswith("[fleetops] ")
        resumed = await _act(pilot, app, "node103", "u")
        assert resumed.ok, resumed
        assert "DRAIN" not in cluster.slurm.show("node103")[0]

    try:
        _drive(app, body)
    finally:
        in_host.unlink(missing_ok=True)
        import subprocess

        subprocess.run(
            [str(cluster.slurm.scontrol), "update", "NodeName=node103", "State=RESUME"],
            check=False,
            capture_output=True,  # "Invalid node state" when the test already resumed it
        )
