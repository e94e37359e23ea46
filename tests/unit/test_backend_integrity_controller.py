"""The controller takes an action's answer only from the backend its plan's snapshot came from.

``fleetops.ops.reset`` plans on a snapshot that names its backend (``Preview.backend``, the
TUI's snapshot): the command pins that backend, and a report from another backend is refused
(the simulator answered a plan made on NVML: no GPU touched) or unknown (NVML answered a plan
made on the simulator: a real GPU may have changed). The agent runs for real on simulator
state; the answers from NVML are the agent's report shape, as the transport returns them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops import cli
from fleetops.common import selectors
from fleetops.fleet import inventory
from fleetops.fleet.transport import Result
from fleetops.ops import frontend, reset, results
from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]


class LocalRunner:
    """The runner a front end passes, running the agent locally on the node's simulator state
    (``state``: set in the agent's environment, as on a node where it is set for everyone)."""

    def __init__(self, state: Path | None = None) -> None:
        self.state = state
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> Result:
        self.calls.append(list(argv))
        extra = ["--no-syslog"] if argv[1] == "reset" else []
        env = dict(os.environ, PYTHONPATH=str(REPO), FLEETOPS_AGENT_GPU_MARKERS="/nonexistent/nvidiactl")
        env.pop(sim.STATE_ENV, None)
        if self.state is not None:
            env[sim.STATE_ENV] = str(self.state)
        proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", *argv[1:], *extra], capture_output=True,
                              text=True, check=False, env=env, timeout=timeout)
        ok = proc.returncode == 0
        return Result("node001", ok, proc.returncode, proc.stdout, proc.stderr, None if ok else "command",
                      None if ok else f"exit status {proc.returncode}", 0.1)


def _reply(doc: dict[str, Any]) -> Result:
    return Result("node001", True, 0, json.dumps(doc), "", None, None, 0.1)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "node001.json"
    sim.init_state(str(path), "node001")
    return path


@pytest.fixture
def sim_host(state: Path) -> Any:
    (h,) = inventory.load("node001,")
    h.vars["fleetops_sim_state"] = str(state)
    return h


@pytest.fixture
def plain_host() -> Any:
    (h,) = inventory.load("node001,")
    return h


def _gpu(state: Path, index: int = 1) -> selectors.ResolvedGpu:
    g = sim.read_state(str(state))["gpus"][index]
    return selectors.ResolvedGpu(selectors.parse(g["uuid"]), g["uuid"], g["bus_id"])


def test_a_reset_planned_on_nvml_and_answered_by_the_simulator_is_refused(sim_host: Any, state: Path) -> None:
    result = reset.run(sim_host, _gpu(state), LocalRunner(), dry_run=True, planned_backend="nvml")
    assert result.detail["report"]["backend"] == "sim"  # the agent did answer, from its simulator
    assert result.outcome == results.REFUSED and not result.ok
    assert result.detail["backend_mismatch"] == {"planned": "nvml", "answered": "sim"}
    assert "from the sim backend" in result.message and "snapshot from the nvml backend" in result.message
    assert "no GPU was touched" in result.message


def test_a_reset_planned_on_the_simulator_and_answered_by_nvml_is_unknown_with_a_check(
    plain_host: Any, state: Path
) -> None:
    report = {"kind": "fleetops.reset/v1", "backend": "nvml", "result": "reset", "verified": True,
              "gpu": {"uuid": "GPU-x", "bus_id": "0000:18:00.0"}, "preconditions": [], "message": "reset"}
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-x"), "GPU-x", "0000:18:00.0")
    result = reset.run(plain_host, gpu, lambda argv, timeout: _reply(report), planned_backend="sim")
    assert result.outcome == results.UNKNOWN and not result.ok
    assert result.check is not None and "--dry-run" in result.check
    assert "a real GPU may have been reset" in result.message


def test_an_answer_that_names_no_backend_is_not_taken_for_a_plan(plain_host: Any) -> None:
    report = {"kind": "fleetops.reset/v1", "result": "reset", "gpu": {"uuid": "GPU-x"}, "preconditions": []}
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-x"), "GPU-x", None)
    result = reset.run(plain_host, gpu, lambda argv, timeout: _reply(report), planned_backend="nvml")
    assert result.outcome == results.REFUSED and "no backend" in result.message


def test_the_plans_backend_is_pinned_in_the_command(plain_host: Any, sim_host: Any, state: Path) -> None:
    gpu = _gpu(state)
    assert reset.command(plain_host, gpu, backend="nvml")[-2:] == ["--backend", "nvml"]
    assert "--backend" not in reset.command(plain_host, gpu)  # no plan known: the agent decides
    on_sim = reset.command(sim_host, gpu, backend="sim")
    assert on_sim.count("--backend") == 1 and on_sim[on_sim.index("--backend") + 1] == "sim"


def test_a_stray_sim_state_cannot_answer_a_reset_pinned_to_nvml(plain_host: Any, state: Path) -> None:
    """The node's environment says FLEETOPS_SIM_STATE; the plan was made on NVML: the agent is
    told so and never edits the state file (no NVML here: its own error, the reset not done)."""
    before = state.read_bytes()
    result = reset.run(plain_host, _gpu(state), LocalRunner(state), planned_backend="nvml")
    assert result.outcome == results.FAILED and "NVML" in result.message, result.message
    assert state.read_bytes() == before


def test_matching_backends_are_taken_as_before(sim_host: Any, state: Path) -> None:
    runner = LocalRunner()
    view = reset.preview(sim_host, "1", runner)
    assert view.backend == "sim"
    result = reset.run(sim_host, view.gpu, runner, dry_run=True, planned_backend=view.backend)
    assert result.outcome == results.DRY_RUN and "backend_mismatch" not in result.detail


def test_fleetops_reset_refuses_a_report_from_another_backend_than_its_preview(
    state: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The preview's snapshot came from NVML; the reset's answer from the simulator (the node's
    agent changed backend between the two): the CLI prints the refusal, not the report."""
    snapshot = sim.snapshot(sim.read_state(str(state)))
    snapshot.pop("_kernel_log", None)
    snapshot.update(backend="nvml", collected_at=1.0, xids=[])
    calls: list[list[str]] = []

    def agent(args: Any, host: Any, argv: list[str], timeout: float) -> Result:
        calls.append(list(argv))
        if argv[1] == "collect":
            return _reply(snapshot)
        assert argv[-2:] == ["--backend", "nvml"]  # pinned to the preview's backend
        answer = LocalRunner()([*argv[:-2], "--backend", "sim", "--state", str(state)], timeout)
        return answer

    monkeypatch.setattr(frontend, "run_once", agent)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = cli.main(["reset", "node001", "1", "-i", "node001,", "--yes", "--dry-run"])
    err = capsys.readouterr()
    assert code == 1, err
    assert [c[1] for c in calls] == ["collect", "reset"]
    assert "planned on a snapshot from the nvml backend" in err.err and "from the sim backend" in err.err
    assert "would-reset" not in err.out
