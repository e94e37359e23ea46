import json

import pytest

from fleetops import model
from fleetops.gpu import sim


def _node(faults=None):
    data = sim.snapshot(sim.build_state("node001", {"faults": faults or []}), now=1_800_000_000.0)
    data.pop("_kernel_log")
    data["collected_at"] = 1_800_000_000.0
    return model.node_from_dict(data)


def test_snapshot_round_trips_through_json_unchanged():
    node = _node(["ecc-dbe@3", "nvlink-down@1", "stray-process@2"])
    text = model.node_to_json(node)
    again = model.node_from_json(text)
    assert again == node
    assert model.node_to_json(again) == text


def test_round_trip_keeps_unavailable_reasons_and_nulls():
    node = _node()
    node.gpus[0].nvlinks = None
    node.gpus[0].unavailable["nvlinks"] = "NotSupported"
    node.gpus[0].numa_node = None
    again = model.node_from_json(model.node_to_json(node))
    assert again.gpus[0].nvlinks is None
    assert again.gpus[0].unavailable["nvlinks"] == "NotSupported"
    assert again.gpus[0].numa_node is None


def test_wrong_schema_version_is_rejected_naming_the_field():
    data = json.loads(model.node_to_json(_node()))
    data["schema"] = "fleetops.snapshot/v0"
    with pytest.raises(model.SchemaError, match="snapshot.schema"):
        model.node_from_dict(data)


def test_wrong_type_names_the_field_path():
    data = json.loads(model.node_to_json(_node()))
    data["gpus"][2]["power_limit_w"] = "lots"
    with pytest.raises(model.SchemaError, match=r"snapshot.gpus\[2\].power_limit_w"):
        model.node_from_dict(data)


def test_garbage_is_a_schema_error_not_a_crash():
    for text in ("", "garbage", "[1,2]", '{"schema": 1}', "{"):
        with pytest.raises(model.SchemaError):
            model.node_from_json(text)


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:9A:00.0", "0000:9a:00.0"),
        ("PCI:0000:db:00", "0000:db:00.0"),
        ("18:00.0", "0000:18:00.0"),
    ],
)
def test_bus_ids_are_normalised(raw, expected):
    assert model.normalize_bus_id(raw) == expected


def test_not_a_bus_id_is_an_error():
    with pytest.raises(ValueError):
        model.normalize_bus_id("GPU-1234")


def test_worst_orders_crit_over_warn_over_unknown():
    assert model.worst(["ok", "unknown", "warn"]) == "warn"
    assert model.worst(["unknown", "info"]) == "unknown"
    assert model.worst([]) == "ok"
