"""The agent as a process: output contract, errors, import hygiene."""

import json
import os
import subprocess
import sys

import pytest

from fleetops import model
from fleetops.sim import gpu as sim

AGENT = [sys.executable, "-m", "fleetops.agent.main"]


def run_agent(args, state=None, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != sim.STATE_ENV}
    if state:
        env[sim.STATE_ENV] = str(state)
    env.update(env_extra or {})
    return subprocess.run(AGENT + args, capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "node.json"
    sim.init_state(str(path), "node007", {"faults": ["ecc-dbe@3", "xid:79@5"]})
    return path


def test_collect_prints_one_snapshot_with_xids_attributed_to_gpus(state):
    proc = run_agent(["collect"], state)
    assert proc.returncode == 0, proc.stderr
    node = model.node_from_json(proc.stdout)
    assert node.hostname == "node007" and node.backend == "sim"
    assert node.gpu_count == 8  # nvmlDeviceGetCount still counts the GPU that fell off the bus
    dbe = [g for g in node.gpus if g.ecc_uncorrected_volatile]
    assert [g.bus_id for g in dbe] == ["0000:5d:00.0"]
    codes = {(x.code, x.bus_id) for x in node.xids}
    assert (79, "0000:ab:00.0") in codes and (48, "0000:5d:00.0") in codes
    lost = next(x for x in node.xids if x.code == 79)
    # the GPU fell off the bus: it keeps its index and UUID, answering GpuIsLost
    assert (lost.gpu_uuid, lost.gpu_index) == (node.gpus[5].uuid, 5) and model.gpu_lost(node.gpus[5])
    dbe_event = next(x for x in node.xids if x.code == 48)
    assert dbe_event.gpu_uuid == dbe[0].uuid
    assert node.collect_ms is not None and node.collected_at > 0


def test_unknown_backend_is_a_one_line_json_error(state):
    proc = run_agent(["collect", "--backend", "cuda"], state)
    assert proc.returncode != 0 and proc.stdout == ""
    err = json.loads(proc.stderr.strip())
    assert "unknown backend 'cuda'" in err["error"]


def test_corrupt_state_file_is_named_and_not_overwritten(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    proc = run_agent(["collect"], path)
    assert proc.returncode == 1
    err = json.loads(proc.stderr.strip())
    assert str(path) in err["error"] and "corrupt" in err["error"]
    assert path.read_text() == "{not json"


def test_missing_state_file_is_named(tmp_path):
    proc = run_agent(["collect", "--backend", "sim", "--state", str(tmp_path / "nope.json")])
    assert proc.returncode == 1
    assert "nope.json" in json.loads(proc.stderr)["error"]


def test_set_on_a_node_with_a_lost_gpu_is_refused_naming_it_and_changes_nothing(state):
    before = state.read_bytes()
    for args in (["set", "power", "700"], ["set", "power", "700", "--dry-run"]):
        proc = run_agent(args, state)
        assert proc.returncode == 1 and "GPU 5 (0000:ab:00.0" in json.loads(proc.stderr)["error"]
        assert "GpuIsLost" in json.loads(proc.stderr)["error"]
    assert state.read_bytes() == before
    uuid = sim.read_state(str(state))["gpus"][4]["uuid"]  # the others can still be named one by one
    assert json.loads(run_agent(["set", "power", "650", "--gpu", uuid], state).stdout)["changed"] is True


def test_set_power_is_idempotent_and_dry_run_changes_nothing(state):
    sim.clear(str(state), "xid:79", 5)  # every GPU answers (a lost one refuses every setter)
    sim.inject(str(state), "power-cap-drift", 2)
    before = state.read_bytes()
    dry = json.loads(run_agent(["set", "power", "700", "--dry-run"], state).stdout)
    assert dry["changed"] is True and [g["index"] for g in dry["gpus"] if g["changed"]] == [2]
    assert state.read_bytes() == before
    real = json.loads(run_agent(["set", "power", "700"], state).stdout)
    assert real["changed"] is True
    again = json.loads(run_agent(["set", "power", "700"], state).stdout)
    assert again["changed"] is False
    assert sim.read_state(str(state))["faults"] == [f for f in sim.read_state(str(state))["faults"] if f["name"] != "power-cap-drift"]


def test_set_power_from_a_baseline_caps_each_gpu_at_its_own_models_limit(tmp_path):
    path = tmp_path / "mixed.json"
    sim.init_state(str(path), "node009")
    with sim.locked_state(str(path)) as doc:
        for gpu in doc["gpus"][4:]:
            gpu["name"] = "NVIDIA H100 80GB HBM3"
    baseline = tmp_path / "baseline.json"
    # the first model listed is not every GPU's: each GPU matches its own name
    baseline.write_text(json.dumps({"gpu_models": {"NVIDIA H200": {"power_limit_w": 650},
                                                   "NVIDIA H100 80GB HBM3": {"power_limit_w": 600}}}))
    real = json.loads(run_agent(["set", "power", "700", "--baseline", str(baseline)], path).stdout)
    assert [g["after"] for g in real["gpus"]] == [650.0] * 4 + [600.0] * 4 and real["value"] is None
    assert [g["power_limit_w"] for g in sim.read_state(str(path))["gpus"]] == [650.0] * 4 + [600.0] * 4
    # a model the baseline has no limit for takes VALUE; an explicit VALUE alone caps every GPU
    baseline.write_text(json.dumps({"gpu_models": {"NVIDIA H100 80GB HBM3": {"power_limit_w": 600}}}))
    again = json.loads(run_agent(["set", "power", "690", "--baseline", str(baseline)], path).stdout)
    assert [g["index"] for g in again["gpus"] if g["changed"]] == [0, 1, 2, 3]
    assert [g["after"] for g in again["gpus"]] == [690.0] * 4 + [600.0] * 4
    flat = json.loads(run_agent(["set", "power", "550"], path).stdout)
    assert flat["value"] == 550.0 and {g["after"] for g in flat["gpus"]} == {550.0}
    proc = run_agent(["set", "persistence", "on", "--baseline", str(baseline)], path)
    assert proc.returncode == 1 and "power caps only" in json.loads(proc.stderr)["error"]


def test_set_refuses_out_of_range_power_and_unknown_gpu(state):
    before = state.read_bytes()
    first = sim.read_state(str(state))["gpus"][0]["uuid"]  # "all" would be refused for the lost GPU 5
    proc = run_agent(["set", "power", "900", "--gpu", first], state)
    assert proc.returncode == 1 and "outside" in json.loads(proc.stderr)["error"]
    proc = run_agent(["set", "persistence", "off", "--gpu", "GPU-00000000-dead-beef-0000-000000000000"], state)
    assert proc.returncode == 1 and "no such GPU" in json.loads(proc.stderr)["error"]
    proc = run_agent(["set", "power", "600", "--gpu", "12"], state)
    assert proc.returncode == 1 and "'12'" in json.loads(proc.stderr)["error"]
    assert state.read_bytes() == before


def test_topology_check_against_expected_file(state, tmp_path):
    good = tmp_path / "topo.json"
    good.write_text(json.dumps({"gpu_count": 8, "link": "NV18"}))
    proc = run_agent(["topology", "--expected", str(good)], state)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1  # xid:79 took a GPU away: still counted by the driver, but lost
    assert doc["ok"] is False and any("gpu_count: 7" in m for m in doc["mismatches"])
    assert doc["topology"]["gpus"][5] == "0000:ab:00.0" and doc["topology"]["links"][5][0] is None
    sim.clear(str(state), "xid:79", 5)
    proc = run_agent(["topology", "--expected", str(good)], state)
    assert proc.returncode == 0, proc.stdout


def test_agent_import_path_pulls_in_nothing_heavy(state):
    code = (
        "import sys, runpy\n"
        "sys.argv = ['fleetops-agent', 'collect']\n"
        "from fleetops.agent import main\n"
        "import io, contextlib\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main.main()\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'ansible', 'paramiko', 'yaml', 'ansible_runner')]\n"
        "print(heavy)\n"
    )
    env = dict(os.environ, **{sim.STATE_ENV: str(state)})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
