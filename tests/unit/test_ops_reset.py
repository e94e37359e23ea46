"""The reset action in ``fleetops.ops.reset``: the agent's argv, the timeout it is given, and how
each answer maps to an outcome. The agent runs for real (a subprocess on simulator state); the
transport failures are the transport's own result type."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.catalog import actions
from fleetops.common import selectors
from fleetops.fleet import inventory
from fleetops.fleet.transport import Result
from fleetops.ops import reset, results
from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]


class LocalRunner:
    """The runner a front end passes, here running the agent locally; records argv and timeout."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: list[str], timeout: float) -> Result:
        self.calls.append((list(argv), timeout))
        extra = ["--no-syslog"] if argv[1] == "reset" else []
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop(sim.STATE_ENV, None)
        proc = subprocess.run([sys.executable, "-m", "fleetops.agent.main", *argv[1:], *extra], capture_output=True,
                              text=True, check=False, env=env, timeout=timeout)
        ok = proc.returncode == 0
        return Result("node001", ok, proc.returncode, proc.stdout, proc.stderr, None if ok else "command",
                      None if ok else f"exit status {proc.returncode}", 0.1)


@pytest.fixture
def host(tmp_path: Path) -> Any:
    path = tmp_path / "node001.json"
    sim.init_state(str(path), "node001", {"faults": ["ecc-dbe@1", "stray-process@2"]})
    (h,) = inventory.load("node001,")
    h.vars["fleetops_sim_state"] = str(path)
    return h


def test_preview_resolves_an_index_and_lists_the_gpus_processes(host: Any) -> None:
    view = reset.preview(host, "2", LocalRunner())
    state = sim.read_state(host.vars["fleetops_sim_state"])
    assert (view.gpu.uuid, view.gpu.bus_id) == (state["gpus"][2]["uuid"], state["gpus"][2]["bus_id"])
    assert view.pids == (sim.STRAY_PID,)
    assert any("python3 train.py" in line for line in view.process_lines())


@pytest.mark.parametrize("text", ["GPU-00000000-0000-0000-0000-000000000000", "0000:ee:00.0", "9"])
def test_a_gpu_the_node_does_not_list_is_a_usage_error_before_any_reset_is_sent(host: Any, text: str) -> None:
    runner = LocalRunner()
    with pytest.raises(selectors.SelectorError) as info:
        reset.preview(host, text, runner)
    assert info.value.exit_code == 4
    assert "node001 has no GPU with" in info.value.message and text in info.value.message
    state = sim.read_state(host.vars["fleetops_sim_state"])
    assert f"1={state['gpus'][1]['uuid']}@{state['gpus'][1]['bus_id']}" in info.value.message
    assert [argv[1] for argv, _ in runner.calls] == ["collect"]  # the snapshot, and nothing sent after it


def test_no_listed_processes_means_no_kill_flag_and_listed_ones_travel_exactly(host: Any) -> None:
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-x"), "GPU-x", "0000:18:00.0")
    idle = reset.command(host, gpu, kill_pids=[])
    assert "--kill-processes" not in idle and "--expect-pids" not in idle
    busy = reset.command(host, gpu, kill_pids=[31, 7, 31])
    at = busy.index("--kill-processes")
    assert busy[at : at + 3] == ["--kill-processes", "--expect-pids", "7,31"]
    assert busy[busy.index("--bus-id") + 1] == "0000:18:00.0"


def test_the_reset_waits_for_the_resets_own_budget_not_a_collect_timeout(host: Any) -> None:
    runner = LocalRunner()
    view = reset.preview(host, "1", runner, collect_timeout_s=7.0)
    result = reset.run(host, view.gpu, runner)
    assert [t for _, t in runner.calls] == [7.0, actions.reset_command_timeout_s()]
    assert result.outcome == results.DONE, result.message
    assert result.detail["report"]["verified"] is True


def test_a_busy_gpu_without_listed_pids_is_refused_and_a_dry_run_is_a_dry_run(host: Any) -> None:
    runner = LocalRunner()
    busy = reset.preview(host, "2", runner).gpu
    refused = reset.run(host, busy, runner)
    assert refused.outcome == results.REFUSED and f"pid {sim.STRAY_PID}" in refused.message
    idle = reset.preview(host, "1", runner).gpu
    assert reset.run(host, idle, runner, dry_run=True).outcome == results.DRY_RUN


@pytest.mark.parametrize("kind", ["outcome-unknown", "timeout"])
def test_a_command_sent_without_an_answer_is_unknown_with_the_command_to_check(host: Any, kind: str) -> None:
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-abc"), "GPU-abc", "0000:18:00.0")
    lost = Result("node001", False, None, "", "", kind, "connection lost after the command was sent", 3.0)
    result = reset.run(host, gpu, lambda argv, timeout: lost)
    assert result.outcome == results.UNKNOWN and not result.ok
    journal = os.path.splitext(host.vars["fleetops_sim_state"])[0] + ".reset.jsonl"
    assert result.check == (f"fleetops reset node001 GPU-abc -i INVENTORY --dry-run; then read the agent's journal "
                            f"{journal} on node001")
    known = reset.run(host, gpu, lambda argv, timeout: lost, inventory="/srv/my fleet/hosts.yml")
    assert known.check == (f"fleetops reset node001 GPU-abc -i '/srv/my fleet/hosts.yml' --dry-run; then read the "
                           f"agent's journal {journal} on node001")


def test_fleetops_reset_prints_a_pasteable_check_with_the_inventory_it_was_given(
    host: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetops import cli
    from fleetops.ops import frontend

    state = host.vars["fleetops_sim_state"]
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    node001:\n      ansible_host: 127.0.0.1\n      fleetops_sim_state: {state}\n")
    lost = Result("node001", False, None, "", "", "timeout", "no answer within 3 s", 3.0)
    local = LocalRunner()
    monkeypatch.setattr(frontend, "runner", lambda args, h: lambda argv, t: local(argv, t) if argv[1] == "collect"
                        else lost)
    uuid = sim.read_state(state)["gpus"][1]["uuid"]
    assert cli.main(["reset", "node001", "1", "-i", str(inv), "--yes"]) == 1
    err = capsys.readouterr().err.splitlines()
    journal = os.path.splitext(state)[0] + ".reset.jsonl"
    assert err[-1] == (f"fleetops: check with: fleetops reset node001 {uuid} -i {inv} --dry-run; then read the "
                       f"agent's journal {journal} on node001")


@pytest.mark.parametrize("kind", ["unreachable", "auth", "hostkey"])
def test_a_command_that_never_ran_is_failed_not_unknown(host: Any, kind: str) -> None:
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-abc"), "GPU-abc", "0000:18:00.0")
    never = Result("node001", False, None, "", "", kind, "connection refused", 0.1)
    result = reset.run(host, gpu, lambda argv, timeout: never)
    assert result.outcome == results.FAILED and result.check is None


def test_an_interrupted_agent_is_unknown_with_the_command_to_check(host: Any) -> None:
    """The agent answered that a signal stopped it: whether the GPU was reset first is for its
    report to say; the outcome is not 'failed', which would invite a second reset."""
    gpu = selectors.ResolvedGpu(selectors.parse("GPU-abc"), "GPU-abc", "0000:18:00.0")
    report = '{"kind": "fleetops.reset/v1", "result": "interrupted", "message": "SIGTERM during verify"}'
    answered = Result("node001", False, 143, report, "", "command", "exit status 143", 2.0)
    result = reset.run(host, gpu, lambda argv, timeout: answered)
    assert result.outcome == results.UNKNOWN
    assert result.check is not None and result.check.startswith("fleetops reset node001 GPU-abc -i INVENTORY --dry-run")
    assert "SIGTERM during verify" in result.message
