import json

import pytest

from fleetops import codec, model
from fleetops.sim import gpu as sim


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


def _leaves(value, path=()):
    """Every (path, value) of a JSON document's scalars and nulls."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def _with(doc, path, new):
    out = json.loads(json.dumps(doc))
    at = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = new
    return out


def _slow(doc):
    """The path-keeping conversion alone (what words a refusal)."""
    return codec.converter(model.Node)(doc, "snapshot")


def test_the_fast_conversion_takes_exactly_what_the_path_keeping_one_takes():
    """Each scalar of a snapshot replaced by a value of each other JSON type: the fast converter
    refuses exactly where the path-keeping one raises, and where both take it they build the
    same node; a refusal reaches the caller as the path-keeping one's SchemaError."""
    node = _node(["ecc-dbe@3", "nvlink-down@1", "stray-process@2", "xid:79@4"])
    doc = json.loads(model.node_to_json(node))
    assert codec.fast(model.Node)(doc) == _slow(doc) == node
    replacements = [None, True, 7, 7.5, "x", [], {}]
    seen = {"refused": 0, "taken": 0}
    for path, value in _leaves(doc):
        if path[0] == "schema" or any(isinstance(k, int) and k > 1 for k in path):
            continue  # every field once: the first two items of each list stand for the rest
        for new in replacements:
            if type(new) is type(value) and new == value:
                continue
            bad = _with(doc, path, new)
            try:
                want = _slow(bad)
            except model.SchemaError as exc:
                with pytest.raises(codec.Refused):
                    codec.fast(model.Node)(bad)
                with pytest.raises(model.SchemaError) as got:
                    model.node_from_dict(bad)
                assert str(got.value) == str(exc)
                seen["refused"] += 1
            else:
                assert codec.fast(model.Node)(bad) == want, path
                seen["taken"] += 1
    assert seen["refused"] > 500 and seen["taken"] > 100, seen


@pytest.mark.parametrize("hook", ["_scalar_of", "converter"])
def test_a_snapshot_parsed_while_another_thread_is_making_the_converters_is_whole(
    monkeypatch: pytest.MonkeyPatch, hook: str
) -> None:
    """The daemon's nodes, an audit's pool and the TUI's readers parse at once, from the first
    snapshot a process sees. One thread is held while it makes the converters' plan for a
    snapshot, right at its ``gpus`` field; another parses the same snapshot meanwhile. Both get
    the whole node (a plan read half made gave the second one a node without GPUs)."""
    import threading
    import typing

    node = _node(["ecc-dbe@3"])
    doc = json.loads(model.node_to_json(node))
    monkeypatch.setattr(codec, "_FAST", {})  # this process has converted nothing yet
    monkeypatch.setattr(codec, "_CONVERTERS", {})
    gpus_type = typing.get_type_hints(model.Node)["gpus"]
    held, release = threading.Event(), threading.Event()
    first: list[threading.Thread] = []
    real = getattr(codec, hook)

    def holding(tp, *args):  # type: ignore[no-untyped-def]
        if tp == gpus_type and threading.current_thread() in first and not held.is_set():
            held.set()
            release.wait(30)
        return real(tp, *args)

    monkeypatch.setattr(codec, hook, holding)
    if hook == "converter":  # the path-keeping conversion alone, as when the fast one refuses
        parse = lambda: codec.converter(model.Node)(doc, "snapshot")  # noqa: E731
    else:
        parse = lambda: model.node_from_dict(doc)  # noqa: E731
    got: dict[str, object] = {}

    def attempt(key: str) -> None:
        try:
            got[key] = parse()
        except Exception as exc:  # noqa: BLE001 - compared below
            got[key] = exc

    thread = threading.Thread(target=attempt, args=("first",))
    first.append(thread)
    thread.start()
    assert held.wait(30), "the first parse never reached the gpus field"
    try:
        attempt("second")
    finally:
        release.set()
        thread.join(30)
    assert got["second"] == node, got["second"]
    assert got["first"] == node, got["first"]
    assert len(node.gpus) == 8 and node.gpus[3].ecc_uncorrected_volatile


def test_a_process_user_is_optional_in_the_v1_schema():
    """``GpuProcess.user`` came in as an optional key: a v1 document without it reads None (an
    older agent's, or a process whose /proc entry was gone), one with it keeps it."""
    node = _node(["stray-process@2"])
    doc = json.loads(model.node_to_json(node))
    procs = doc["gpus"][2]["processes"]
    assert procs == [{"pid": sim.STRAY_PID, "name": "python3 train.py", "used_memory_mib": 20480,
                      "gpu_instance_id": None, "compute_instance_id": None, "user": sim.STRAY_USER}]
    assert model.node_from_dict(doc).gpus[2].processes[0].user == sim.STRAY_USER
    del procs[0]["user"]
    assert model.node_from_dict(doc).gpus[2].processes[0].user is None
    procs[0]["user"] = 1000
    with pytest.raises(model.SchemaError, match=r"processes\[0\]\.user"):
        model.node_from_dict(doc)
