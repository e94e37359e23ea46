"""Which backend the agent uses: ``auto`` is never the simulator on a node with an NVIDIA driver,
an explicit ``--backend sim`` there is refused without ``--sim-on-gpu-node``, and every answer
names its backend.

The node's driver is stood for by a temporary file named in ``$FLEETOPS_AGENT_GPU_MARKERS`` (the
test hook of ``agent.backend_choice``), so the real agent processes below run as on a GPU node
with a stray ``$FLEETOPS_SIM_STATE``. No NVML library is on this machine: where the agent picks
NVML, the answer is NVML's own error, never a simulated snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.agent import collect
from fleetops.agent.reset import backends as reset_backends
from fleetops.agent.serve import client
from fleetops.gpu import backend_choice
from fleetops.sim import gpu as sim

AGENT = os.path.join(os.path.dirname(sys.executable), "fleetops-agent")


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    path = tmp_path / "n1.json"
    sim.init_state(str(path), "n1")
    return path


@pytest.fixture()
def gpu_node(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as a node with a driver and a stray simulator variable."""
    marker = tmp_path / "dev" / "nvidiactl"
    marker.parent.mkdir()
    marker.write_text("")
    monkeypatch.setenv(backend_choice.MARKERS_ENV, str(marker))
    monkeypatch.setenv(backend_choice.SIM_STATE_ENV, str(state))
    monkeypatch.delenv(backend_choice.CONSENT_ENV, raising=False)
    return marker


def _env(marker: Path | None, state: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(backend_choice.CONSENT_ENV, None)
    env.pop(backend_choice.SIM_STATE_ENV, None)
    env[backend_choice.MARKERS_ENV] = str(marker) if marker is not None else "/nonexistent/nvidiactl"
    if state is not None:
        env[backend_choice.SIM_STATE_ENV] = str(state)
    return env


def _agent(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENT, *args], check=False, env=env, capture_output=True, text=True, timeout=120,
                          cwd="/")


def _error(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(proc.stderr.strip().splitlines()[-1])
    return doc


def _uuid(state: Path) -> str:
    return str(sim.read_state(str(state))["gpus"][0]["uuid"])


# --- the one decision -------------------------------------------------------------------


def test_auto_with_a_driver_present_and_sim_state_set_is_never_the_simulator(gpu_node: Path, state: Path) -> None:
    assert backend_choice.choose("auto") == "nvml"
    assert backend_choice.choose("auto", sim_state=True) == "nvml"
    assert collect.choose_backend("auto") == "nvml"
    assert reset_backends.make_backend("auto", str(state), True).name == "nvml"
    # the daemon asked is the real one, not the simulator's beside the state file
    assert client.socket_for("auto", str(state), None) == client.DEFAULT_SOCKET
    os.environ[backend_choice.CONSENT_ENV] = "1"  # consent never makes auto the simulator
    try:
        assert backend_choice.choose("auto") == "nvml"
    finally:
        del os.environ[backend_choice.CONSENT_ENV]


def test_explicit_sim_with_a_driver_present_is_refused_without_the_flag(gpu_node: Path, state: Path) -> None:
    with pytest.raises(backend_choice.BackendRefused, match="--sim-on-gpu-node") as refused:
        backend_choice.choose("sim")
    assert str(gpu_node) in str(refused.value)
    with pytest.raises(collect.CollectError, match="--sim-on-gpu-node"):
        collect.choose_backend("sim")
    with pytest.raises(reset_backends.ResetError, match="--sim-on-gpu-node"):
        reset_backends.make_backend("sim", str(state), False)
    with pytest.raises(backend_choice.BackendRefused):
        client.socket_for("sim", str(state), None)


def test_without_a_driver_auto_follows_the_sim_state_as_the_simulated_fleet_needs(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(backend_choice.MARKERS_ENV, "/nonexistent/nvidiactl")
    monkeypatch.setenv(backend_choice.SIM_STATE_ENV, str(state))
    assert backend_choice.choose("auto") == "sim" and backend_choice.choose("sim") == "sim"
    assert client.socket_for("auto", None, None).endswith("n1.agent/agent.sock")
    monkeypatch.delenv(backend_choice.SIM_STATE_ENV)
    assert backend_choice.choose("auto") == "nvml"


def test_the_real_device_paths_are_the_default_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend_choice.MARKERS_ENV, raising=False)
    assert backend_choice.markers() == ("/dev/nvidiactl", "/proc/driver/nvidia/version")


# --- the agent's commands on such a node ------------------------------------------------------


def test_collect_auto_on_a_driver_node_answers_from_nvml_not_from_the_state_file(tmp_path: Path, state: Path) -> None:
    marker = tmp_path / "nvidiactl"
    marker.write_text("")
    for args in (["collect"], ["collect", "--fresh"], ["topology"]):
        proc = _agent(args, _env(marker, state))
        assert proc.returncode != 0 and not proc.stdout.strip(), (args, proc.stdout[:200])
        assert "NVML" in _error(proc)["error"], proc.stderr


def test_a_running_sim_daemon_never_answers_an_auto_collect_on_a_driver_node(tmp_path: Path, state: Path) -> None:
    marker = tmp_path / "nvidiactl"
    marker.write_text("")
    daemon = subprocess.Popen([AGENT, "serve", "--backend", "sim", "--interval", "0.5", "--states", str(state)],
                              env=_env(None, None), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sock = str(state.with_suffix("")) + ".agent/agent.sock"
        end = time.monotonic() + 60
        while client.fetch_snapshot(sock, 60.0) is None:
            assert time.monotonic() < end, "the simulated daemon never answered"
            time.sleep(0.1)
        proc = _agent(["collect"], _env(marker, state))
        assert proc.returncode != 0 and "NVML" in _error(proc)["error"], proc.stdout[:200]
        proc = _agent(["collect", "--backend", "sim", "--state", str(state)], _env(marker, state))
        assert proc.returncode == 2 and "--sim-on-gpu-node" in _error(proc)["error"]
        proc = _agent(["collect", "--backend", "sim", "--state", str(state), "--sim-on-gpu-node"], _env(marker, state))
        assert proc.returncode == 0 and json.loads(proc.stdout)["backend"] == "sim"
        assert json.loads(proc.stdout)["daemon"]["pid"] == daemon.pid
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


@pytest.mark.parametrize("args", [
    ["collect", "--fresh"],
    ["check", "--json"],
    ["topology"],
    ["set", "power", "600", "--gpu", "all"],
    ["mig", "apply", "--layout", "off"],
    ["serve", "--states", "{state}"],
    ["validate", "--level", "quick"],
], ids=lambda a: a[0])
def test_every_command_refuses_an_explicit_sim_on_a_driver_node_without_the_flag(
    tmp_path: Path, state: Path, args: list[str]
) -> None:
    marker = tmp_path / "nvidiactl"
    marker.write_text("")
    before = state.read_bytes()
    argv = [a.replace("{state}", str(state)) for a in args] + ["--backend", "sim", "--state", str(state)]
    proc = _agent(argv, _env(marker, state))
    err = _error(proc)
    assert proc.returncode == (4 if args[0] == "check" else 2), proc.stderr
    assert err["kind"] == "usage" and "--sim-on-gpu-node" in err["error"] and str(marker) in err["error"]
    assert not proc.stdout.strip()
    assert state.read_bytes() == before  # nothing written to the state file


def test_reset_is_refused_and_with_the_flag_runs_on_the_simulator_naming_it(tmp_path: Path, state: Path) -> None:
    marker = tmp_path / "nvidiactl"
    marker.write_text("")
    base = ["reset", "--gpu", _uuid(state), "--dry-run", "--json", "--backend", "sim", "--state", str(state),
            "--no-syslog", "--clients", ""]
    proc = _agent(base, _env(marker, state))
    assert proc.returncode == 2 and "--sim-on-gpu-node" in _error(proc)["error"] and not proc.stdout.strip()
    proc = _agent([*base, "--sim-on-gpu-node"], _env(marker, state))
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "fleetops.reset/v1" and doc["backend"] == "sim", doc


def test_set_with_the_flag_changes_the_simulator_and_names_it(tmp_path: Path, state: Path) -> None:
    marker = tmp_path / "nvidiactl"
    marker.write_text("")
    proc = _agent(["set", "power", "600", "--gpu", "all", "--backend", "sim", "--state", str(state),
                   "--sim-on-gpu-node"], _env(marker, state))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "fleetops.set/v1" and doc["backend"] == "sim" and doc["changed"] is True
    assert {g["power_limit_w"] for g in sim.read_state(str(state))["gpus"]} == {600.0}


# --- every answer names its backend (the simulated fleet's machine: no driver) ---------------


@pytest.fixture()
def no_driver(state: Path) -> Iterator[dict[str, str]]:
    yield _env(None, state)


def test_every_answer_names_its_backend(state: Path, no_driver: dict[str, str]) -> None:
    snap = json.loads(_agent(["collect", "--fresh"], no_driver).stdout)
    assert snap["schema"] == "fleetops.snapshot/v1" and snap["backend"] == "sim"
    check = json.loads(_agent(["check", "--json", "--fresh", "--exit-zero"], no_driver).stdout)
    assert check["kind"] == "fleetops.check/v1" and check["backend"] == "sim"
    reset = json.loads(_agent(["reset", "--gpu", _uuid(state), "--dry-run", "--json", "--no-syslog",
                               "--clients", ""], no_driver).stdout)
    assert reset["kind"] == "fleetops.reset/v1" and reset["backend"] == "sim"
    setting = json.loads(_agent(["set", "power", "700", "--dry-run"], no_driver).stdout)
    assert setting["kind"] == "fleetops.set/v1" and setting["backend"] == "sim"
    mig = json.loads(_agent(["mig", "apply", "--layout", "off", "--dry-run"], no_driver).stdout)
    assert mig["kind"] == "fleetops.mig/v1" and mig["backend"] == "sim"
