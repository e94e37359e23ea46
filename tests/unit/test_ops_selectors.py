"""The one GPU selector rule: parsing, resolution against a real simulator snapshot, the errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.agent.collect import collect
from fleetops.common import selectors
from fleetops.sim import gpu as sim

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path):
    path = tmp_path / "node007.json"
    sim.init_state(str(path), "node007", {"faults": ["stray-process@4", "xid:79@6"]})
    return collect("sim", str(path)), sim.read_state(str(path))


@pytest.mark.parametrize(
    ("text", "form", "uuid", "bus_id", "index"),
    [
        ("GPU-1234", selectors.UUID, "GPU-1234", None, None),
        ("gpu-abcd", selectors.UUID, "gpu-abcd", None, None),
        ("00000000:18:00.0", selectors.BUS_ID, None, "0000:18:00.0", None),
        ("18:00.0", selectors.BUS_ID, None, "0000:18:00.0", None),
        (" 0000:3A:00.0 ", selectors.BUS_ID, None, "0000:3a:00.0", None),
        ("5", selectors.INDEX, None, None, 5),
    ],
)
def test_parse_takes_a_uuid_a_bus_id_or_an_index(text, form, uuid, bus_id, index) -> None:
    sel = selectors.parse(text)
    assert (sel.form, sel.uuid, sel.bus_id, sel.index) == (form, uuid, bus_id, index)


@pytest.mark.parametrize("text", ["", "  ", "gpu three", "MIG-1234", "0000:zz:00.0"])
def test_parse_refuses_anything_else_with_a_usage_error(text) -> None:
    with pytest.raises(selectors.SelectorError) as info:
        selectors.parse(text)
    assert info.value.exit_code == 4


def test_an_index_resolves_to_uuid_bus_id_and_its_processes(node) -> None:
    snap, state = node
    gpu = selectors.resolve("4", snap, "node007")
    assert (gpu.uuid, gpu.bus_id, gpu.index) == (state["gpus"][4]["uuid"], state["gpus"][4]["bus_id"], 4)
    assert gpu.pids == (sim.STRAY_PID,)
    assert gpu.label().startswith(f"{gpu.uuid} at {gpu.bus_id} (GPU 4, ")


def test_a_bus_id_in_any_spelling_resolves_to_the_same_gpu(node) -> None:
    snap, state = node
    bus = state["gpus"][2]["bus_id"]
    short = bus.split(":", 1)[1]  # without the domain, as the kernel log writes it
    assert selectors.resolve(short, snap, "node007").uuid == state["gpus"][2]["uuid"]


def test_an_index_that_names_no_gpu_is_an_error_naming_the_host_and_the_gpus(node) -> None:
    snap, state = node
    # GPU 6 fell off the bus: NVML keeps its index (GpuIsLost) and nobody shifts, so index 7 is
    # still GPU 7 and index 6 the lost GPU, never another one
    assert selectors.resolve("7", snap, "node007").uuid == state["gpus"][7]["uuid"]
    six = selectors.resolve("6", snap, "node007")
    assert (six.uuid, six.enumerated) == (state["gpus"][6]["uuid"], False)
    with pytest.raises(selectors.SelectorError) as info:
        selectors.resolve("8", snap, "node007")
    text = info.value.message
    assert "node007 has no GPU with index 8" in text
    assert f"0={state['gpus'][0]['uuid']}@{state['gpus'][0]['bus_id']}" in text


def test_a_lost_gpu_resolves_at_its_index_marked_unenumerated_so_the_agent_can_say_why(node) -> None:
    snap, state = node
    lost = state["gpus"][6]["uuid"]
    gpu = selectors.resolve(lost, snap, "node007")
    assert (gpu.uuid, gpu.bus_id, gpu.enumerated, gpu.index) == (lost, state["gpus"][6]["bus_id"], False, 6)
    assert selectors.resolve(lost, snap, "node007", allow_absent=False).enumerated is False


@pytest.mark.parametrize(
    ("text", "what"),
    [("GPU-00000000-0000-0000-0000-000000000000", "UUID"), ("0000:ee:00.0", "bus id"), ("8", "index")],
)
def test_a_gpu_the_node_does_not_list_is_one_usage_error_in_every_form(node, text, what) -> None:
    snap, state = node
    with pytest.raises(selectors.SelectorError) as info:
        selectors.resolve(text, snap, "node007")
    assert info.value.exit_code == 4
    message = info.value.message
    assert message.startswith(f"node007 has no GPU with {what} {text} (present: ")
    for i, g in enumerate(state["gpus"]):  # every GPU listed, lost one included: index, UUID and bus id
        assert f"{i}={g['uuid']}@{g['bus_id']}" in message


def test_a_bus_id_logged_as_fallen_off_and_no_longer_listed_still_goes_to_the_agent(node) -> None:
    snap, state = node
    gone = state["gpus"][6]
    unlisted = dataclasses.replace(snap, gpus=[g for g in snap.gpus if g.index != 6])
    assert selectors.fallen_off(unlisted) == [gone["bus_id"]]
    gpu = selectors.resolve(gone["bus_id"], unlisted, "node007")
    assert (gpu.uuid, gpu.bus_id, gpu.enumerated) == (None, gone["bus_id"], False)
    with pytest.raises(selectors.SelectorError, match=f"Xid 79 .* logged for {gone['bus_id']}: name it by that bus id"):
        selectors.resolve(gone["uuid"], unlisted, "node007")
    with pytest.raises(selectors.SelectorError, match="node007 has no GPU with bus id"):
        selectors.resolve(gone["bus_id"], unlisted, "node007", allow_absent=False)


def test_the_selector_module_imports_nothing_heavy() -> None:
    code = (
        "import sys; import fleetops.common.selectors, fleetops.fleet.answers; "
        "bad = [m for m in ('paramiko', 'textual', 'rich', 'ansible', 'yaml') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""
