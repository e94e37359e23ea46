"""``fleetops.fleet.answers``: reading the agent's answers by their JSON, with real agent
subprocesses (the simulator backend) and the transport's result type, never hand-made wording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops import model
from fleetops.fleet import answers, audit
from fleetops.fleet.transport import Result
from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]


def agent(*argv: str, state: str | None = None) -> Result:
    """Run the real agent as a subprocess; its answer as the transport would hand it over."""
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "fleetops.agent.main", *argv]
    if state is not None:
        cmd += ["--backend", "sim", "--state", state]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=60)
    ok = proc.returncode == 0
    return Result("node001", ok, proc.returncode, proc.stdout, proc.stderr, None if ok else "command",
                  None if ok else f"exit status {proc.returncode}", 0.1)


@pytest.fixture
def state(tmp_path: Path) -> str:
    path = tmp_path / "node001.json"
    sim.init_state(str(path), "node001", {"faults": ["stray-process@2"]})
    return str(path)


def test_a_collect_is_read_as_a_snapshot(state: str) -> None:
    answer = answers.read(agent("collect", state=state))
    assert answer.what == answers.SNAPSHOT
    assert model.node_from_dict(answer.doc).hostname == "node001"


def test_a_refused_reset_is_a_reset_report_even_on_exit_1(state: str) -> None:
    gpu = sim.read_state(state)["gpus"][2]["uuid"]
    result = agent("reset", "--gpu", gpu, "--json", "--dry-run", state=state)
    assert result.exit_status == 1
    answer = answers.read(result)
    assert (answer.what, answer.action) == (answers.REPORT, "reset")
    assert answer.doc is not None and answer.doc["result"] == "refused"


def test_a_missing_state_file_is_the_agents_error_not_a_missing_agent(tmp_path: Path) -> None:
    result = agent("collect", state=str(tmp_path / "nowhere.json"))
    answer = answers.read(result)
    assert answer.what == answers.AGENT_ERROR
    assert answer.kind == "collect" and "nowhere.json" in (answer.error or "")
    # and the audit reports it as the agent's error, not as "install the agent"
    node, finding = audit.node_from_result("node001", result)
    assert node.snapshot is None and finding is not None
    assert finding.check == "transport.output" and "playbooks/agent.yml" not in (finding.action or "")
    assert "nowhere.json" in finding.message


def test_an_agent_usage_error_carries_its_kind(state: str) -> None:
    answer = answers.read(agent("reset", "--gpu", "3", "--json", state=state))
    assert (answer.what, answer.kind) == (answers.AGENT_ERROR, "usage")
    assert "never an index" in (answer.error or "")


def test_exit_127_without_an_agent_error_line_is_a_missing_agent() -> None:
    proc = subprocess.run(["sh", "-c", "exec fleetops-agent-not-installed collect"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 127
    result = Result("node001", False, 127, proc.stdout, proc.stderr, "command", "exit status 127", 0.1)
    assert answers.read(result).what == answers.MISSING
    _, finding = audit.node_from_result("node001", result)
    assert finding is not None and finding.check == "transport.agent"


def test_exit_127_with_an_agent_error_line_is_the_agents_error() -> None:
    line = json.dumps({"error": "nvidia-smi: not found", "kind": "reset"})
    result = Result("node001", False, 127, "", "warning: x\n" + line + "\n", "command", "exit status 127", 0.1)
    answer = answers.read(result)
    assert (answer.what, answer.kind, answer.error) == (answers.AGENT_ERROR, "reset", "nvidia-smi: not found")
    _, finding = audit.node_from_result("node001", result)
    assert finding is not None and finding.check == "transport.output"


def test_a_transport_failure_keeps_its_kind() -> None:
    result = Result("node001", False, None, "", "", "outcome-unknown", "connection lost after the command was sent", 9.0)
    answer = answers.read(result)
    assert (answer.what, answer.kind) == (answers.TRANSPORT, "outcome-unknown")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"kind": "fleetops.reset/v1", "result": "reset"}, (answers.REPORT, "reset")),
        ({"kind": "fleetops.mig/v1", "gpus": []}, (answers.REPORT, "mig")),
        ({"kind": "fleetops.set/v1", "gpus": []}, (answers.REPORT, "set")),
        ({"kind": "fleetops.unheard-of/v9"}, (answers.UNREADABLE, None)),
        ({"schema": "fleetops.snapshot/v2"}, (answers.UNREADABLE, None)),
    ],
)
def test_reports_are_told_apart_by_kind(doc: dict, expected: tuple) -> None:
    answer = answers.read(Result("n", True, 0, json.dumps(doc), "", None, None, 0.1))
    assert (answer.what, answer.action) == expected


def test_garbage_on_stdout_is_unreadable_and_says_so() -> None:
    answer = answers.read(Result("n", True, 0, "Traceback (most recent call last):\n", "", None, None, 0.1))
    assert answer.what == answers.UNREADABLE and "not a JSON document" in (answer.error or "")
