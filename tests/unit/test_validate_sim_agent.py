"""``fleetops-agent validate --backend sim`` as a real subprocess, and the judgement over a
simulated 32-node fleet's results collected through it, 20 seeded runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetops.sim import gpu as sim
from fleetops.validation.judge import judge, steady

ROOT = Path(__file__).resolve().parents[2]


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("FLEETOPS_SIM_STATE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "fleetops.agent.main", "validate", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def test_agent_sim_subprocess(tmp_path: Path) -> None:
    state = sim.build_state("n01")
    sim.inject_validation_fault(state, "slow-hbm", 2)
    path = tmp_path / "s.json"
    sim.write_state(str(path), state)
    proc = _agent("--backend", "sim", "--state", str(path), "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["provenance"]["backend"] == "sim" and doc["level"] == "quick"
    assert doc["expires"] > doc["started"]
    triad = [g["tests"]["hbm_triad_gbps"]["median"] for g in doc["gpus"]]
    assert len(triad) == 8
    assert triad[2] < 0.9 * min(t for i, t in enumerate(triad) if i != 2)
    one = json.loads(_agent("--backend", "sim", "--state", str(path), "--gpu", state["gpus"][5]["uuid"]).stdout)
    assert [g["index"] for g in one["gpus"]] == [5]


def test_agent_sim_telemetry_has_the_cuda_backends_shape(tmp_path: Path) -> None:
    """Per GPU, what it went through during each test (telemetry.during) and one reading after,
    as the torch and CuPy backends give them, so the history and the reports read one shape."""
    path = tmp_path / "s.json"
    sim.write_state(str(path), sim.build_state("n01"))
    proc = _agent("--backend", "sim", "--state", str(path), "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    for g in json.loads(proc.stdout)["gpus"]:
        tel = g["telemetry"]
        assert set(tel) == {"during", "after"}
        assert set(tel["during"]) == set(g["tests"])
        for seen in tel["during"].values():
            assert seen == {
                "readings": 2, "seconds": 0.0, "clocks_event_reasons": [], "clocks_event_readings": {},
                "temperature_c_max": 35, "power_w_max": 120.0, "sm_clock_mhz_min": 1980, "sm_clock_mhz_max": 1980,
            }  # fmt: skip
        assert tel["after"] == {"clocks_event_reasons": [], "temperature_c": 35, "power_w": 120.0, "sm_clock_mhz": 1980}


def test_agent_sim_refuses_bad_gpu_and_missing_state(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    sim.write_state(str(path), sim.build_state("n01"))
    bad = _agent("--backend", "sim", "--state", str(path), "--gpu", "GPU-nope")
    assert bad.returncode != 0 and "GPU-nope" in json.loads(bad.stderr)["error"]
    missing = _agent("--backend", "sim", "--state", str(tmp_path / "none.json"))
    assert missing.returncode != 0 and "not found" in json.loads(missing.stderr)["error"]


def test_state_names_the_noise_and_seed_the_controller_cannot_pass(tmp_path: Path) -> None:
    """``fleetops validate`` runs the agent with no simulator options: the state's
    validation_noise setting gives a fleet's runs their noise level and a reproducible seed; the
    command line still wins over it."""
    state = sim.build_state("n01")
    path = tmp_path / "s.json"
    sim.write_state(str(path), state)
    unset = json.loads(_agent("--backend", "sim", "--state", str(path)).stdout)["provenance"]
    assert (unset["noise"], unset["seed"]) == (0.02, None)

    sim.set_validation_noise(state, 0.05, 1234)
    sim.write_state(str(path), state)
    first = json.loads(_agent("--backend", "sim", "--state", str(path)).stdout)
    again = json.loads(_agent("--backend", "sim", "--state", str(path)).stdout)
    assert (first["provenance"]["noise"], first["provenance"]["seed"]) == (0.05, 1234)
    assert first["gpus"] == again["gpus"] and first["node"] == again["node"]
    explicit = json.loads(_agent("--backend", "sim", "--state", str(path), "--seed", "1234", "--noise", "0.05").stdout)
    assert explicit["gpus"] == first["gpus"]

    cli = json.loads(_agent("--backend", "sim", "--state", str(path), "--seed", "9", "--noise", "0.01").stdout)
    assert (cli["provenance"]["noise"], cli["provenance"]["seed"]) == (0.01, 9)
    assert cli["gpus"] != first["gpus"]

    sim.set_validation_noise(state, None, None)
    assert "validation_noise" not in state
    with pytest.raises(sim.SimError, match="expected a fraction"):
        sim.set_validation_noise(state, 1.5)


def test_a_noisy_gpu_shows_no_steady_state_at_any_fleet_noise() -> None:
    """A noisy GPU's repeats used to spread at ten times the fleet's noise: 10 % at 1 % noise
    (always inside the judge's 15 % limit: never seen as noisy) and at the limit at 2 % (one test
    in four looked steady). Every test of it, and every node test it takes part in, is unsteady
    now, whatever the fleet's noise."""
    from fleetops.validation.node.run import _summaries, _summarize_node
    from fleetops.validation.node.simbackend import run, run_node

    st = sim.build_state("n01")
    sim.inject_validation_fault(st, "noisy", 4)
    noisy = st["gpus"][4]["uuid"]
    for noise in (0.0, 0.01, 0.02):
        for seed in range(10):
            tests = _summaries(run(st, noise, seed, [4])[0]["samples"])
            assert [m for m, stat in tests.items() if steady(stat)] == [], (noise, seed)
            node = _summarize_node(run_node(st, noise, seed, "quick"))
            with_it = [p["p2p_gbps"] for p in node["p2p"]["pairs"] if noisy in (p["src_uuid"], p["dst_uuid"])]
            with_it += [p["p2p_bidir_gbps"] for p in node["p2p"]["bidirectional"] if noisy in (p["a_uuid"], p["b_uuid"])]
            with_it.append(node["allreduce"]["allreduce_busbw_gbps"])
            assert len(with_it) == 14 + 7 + 1
            assert [stat for stat in with_it if steady(stat)] == [], (noise, seed)


DEGRADED = {(3, 1): "slow-hbm", (11, 6): "slow-gemm", (20, 0): "slow-pcie", (29, 4): "noisy"}


def test_fleet_of_32_flags_exactly_the_degraded(tmp_path: Path) -> None:
    """20 runs x 32 nodes through the agent would be 640 interpreter starts on a 2-core box, so
    the agent subprocess is checked for layout on two nodes and the 20 seeded result sets come
    from the backend function the agent calls."""
    paths = []
    for n in range(32):
        st = sim.build_state(f"n{n:02d}")
        for (node, gpu), fault in DEGRADED.items():
            if node == n:
                sim.inject_validation_fault(st, fault, gpu)
        p = tmp_path / f"n{n:02d}.json"
        sim.write_state(str(p), st)
        paths.append(p)
    expected = {f"n{node:02d}/{gpu}" for node, gpu in DEGRADED}
    # One real agent call per node gives the result layout; the 20 seeded sets then come from
    # the same backend function the agent calls, keeping the test inside this machine's budget.
    first = [json.loads(_agent("--backend", "sim", "--state", str(p), "--seed", "0").stdout) for p in paths[:2]]
    assert all(len(d["gpus"]) == 8 for d in first)
    from fleetops.validation.node.run import _summaries
    from fleetops.validation.node.simbackend import run

    for seed in range(20):
        results: list[dict[str, Any]] = []
        for n, p in enumerate(paths):
            st = sim.read_state(str(p))
            for r in run(st, 0.02, seed * 1000 + n, list(range(8))):
                results.append({"host": f"n{n:02d}", "uuid": f"n{n:02d}/{r['index']}", "name": r["name"],
                                "tests": _summaries(r["samples"])})
        verdicts = judge(results)
        flagged = {v.gpu for v in verdicts if v.status != "ok"}
        assert flagged == expected, (seed, flagged ^ expected)
        # a noisy GPU never reached steady state: unknown, not failed
        status = {DEGRADED[(int(v.gpu[1:3]), int(v.gpu[4:]))]: v.status for v in verdicts if v.gpu in expected}
        assert status == {"slow-hbm": "warn", "slow-gemm": "warn", "slow-pcie": "crit", "noisy": "unknown"}, seed


@pytest.mark.parametrize("fault", ["xid:79", "gpu-missing"])
def test_validate_on_a_node_with_a_lost_gpu_does_not_pass_it(tmp_path: Path, fault: str) -> None:
    """A GPU that fell off the bus runs no workload (CUDA cannot make a context on it): every
    test of it errors, the node tests that need it too, and no verdict on it is ok."""
    from fleetops.validation import gate
    from fleetops.validation.judge import judge_nodes

    path = tmp_path / "node005.json"
    sim.init_state(str(path), "node005", {"faults": [f"{fault}@6"]})
    proc = _agent("--backend", "sim", "--state", str(path), "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    six = doc["gpus"][6]
    assert six["index"] == 6 and six["uuid"] == sim.read_state(str(path))["gpus"][6]["uuid"]
    assert all("is lost" in str(stat.get("error")) for stat in six["tests"].values()), six["tests"]
    assert all("median" in stat for g in doc["gpus"] if g["index"] != 6 for stat in g["tests"].values())
    [v6] = judge([{**six, "host": "node005"}])
    assert v6.status != "ok" and all(v.status != "ok" for v in v6.verdicts)
    gated = gate.judge_node(doc, None)["gate"]  # the rollout's gate: the node does not pass
    assert gated["passed"] is False and [line.split()[:2] for line in gated["failed"]] == [["GPU", "6"]]
    assert "is lost" in doc["node"]["p2p"]["error"] and "is lost" in doc["node"]["allreduce"]["error"]
    [node] = judge_nodes([{**doc, "host": "node005"}])
    assert node.status != "ok"
    one = _agent("--backend", "sim", "--state", str(path), "--gpu", six["uuid"])
    assert all("error" in stat for stat in json.loads(one.stdout)["gpus"][0]["tests"].values())
