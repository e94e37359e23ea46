"""The simulated node's sysfs tree, read by the agent's own reader: eight NDR rails and the
Ethernet management port at the magnitudes of months of traffic, each ``ib-*`` fault changing
exactly what it should, ``clear`` putting it back, and the driver's link lines in the kernel log."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest

from fleetops import model
from fleetops.fabric import sysfs
from fleetops.sim import gpu as sim
from fleetops.sim.gpu import fabric as simfabric


@pytest.fixture
def node(tmp_path: Path) -> str:
    path = tmp_path / "n1.json"
    sim.init_state(str(path), "n1")
    return str(path)


T = 1_800_000_000.0  # the clock the reads record (read_at), one for every read of a test


def read(path: str) -> dict[str, Any]:
    state = sim.read_state(path)
    doc: dict[str, Any] = model.to_dict(sysfs.read(sim.fabric_sys_root(path), [g["bus_id"] for g in state["gpus"]], T))
    return doc


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in doc["hcas"]}


def test_a_simulated_node_has_eight_ndr_rails_and_an_ethernet_management_port(node: str) -> None:
    doc = read(node)
    hcas = by_name(doc)
    assert sorted(hcas) == [f"mlx5_{i}" for i in range(9)] and doc["note"] is None
    state = sim.read_state(node)
    for i, gpu in enumerate(state["gpus"]):
        hca = hcas[f"mlx5_{i}"]
        (port,) = hca["ports"]
        assert (port["state"], port["phys_state"], port["rate"], port["link_layer"]) == (
            "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
        assert (port["rate_gbps"], port["width"]) == (400.0, "4X")
        assert hca["gpus"] == [gpu["bus_id"]]  # on the PCIe switch of the GPU with its number
        assert (hca["fw_ver"], hca["board_id"]) == ("28.39.1002", "MT_0000000838")
        assert port["netdev"] == f"ibp{int(hca['pci_address'].split(':')[1], 16)}s0"
        c = port["counters"]
        assert 10**14 <= c["port_xmit_data"] < 10**15 and 10**14 <= c["port_rcv_data"] < 10**15
        assert 0 <= c["symbol_error"] <= 5 and 0 <= c["link_downed"] <= 2
        assert "rnr_nak_retry_err" in port["hw_counters"]
        assert port["unavailable"] == {} and hca["unavailable"] == {}
    mgmt = hcas["mlx5_8"]
    assert mgmt["gpus"] == [] and mgmt["ports"][0]["link_layer"] == "Ethernet"
    assert mgmt["ports"][0]["rate"] == "200 Gb/sec (4X HDR)" and mgmt["ports"][0]["netdev"] == "enp193s0f0np0"


def test_the_tree_reads_as_the_in_memory_snapshot_says(node: str) -> None:
    """The snapshots taken without a state file (scenarios, the TUI's feed) show what the agent reads."""
    for fault in ("ib-degraded", "ib-fw-drift", "ib-missing-hca", "ib-port-down"):
        sim.inject(node, fault, 2)
    state = sim.read_state(node)
    assert read(node) == sim.snapshot(state, now=T)["fabric"]


# fault -> what it changes on mlx5_3's port (or the HCA), everything else the same
CHANGES: dict[str, Any] = {
    "ib-port-down": {"state": "1: DOWN", "phys_state": "2: Polling", "rate": "10 Gb/sec (4X SDR)",
                     "rate_gbps": 10.0, "counters.link_downed": +1},
    "ib-degraded": {"rate": "200 Gb/sec (2X NDR)", "rate_gbps": 200.0, "width": "2X"},
    "ib-link-downed": {"counters.link_downed": +1, "counters.link_error_recovery": +1},
    "ib-fw-drift": {"hca.fw_ver": "28.37.1014"},
}


def _apply(before: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    want = copy.deepcopy(before)
    hca = by_name(want)["mlx5_3"]
    port = hca["ports"][0]
    for key, value in changes.items():
        if key.startswith("hca."):
            hca[key[4:]] = value
        elif key.startswith("counters."):
            port["counters"][key[9:]] += value
        else:
            port[key] = value
    return want


@pytest.mark.parametrize("fault", sorted(CHANGES))
def test_each_fault_changes_exactly_its_port_and_clear_restores_it(node: str, fault: str) -> None:
    before = read(node)
    assert sim.inject(node, fault, 3)
    assert read(node) == _apply(before, CHANGES[fault])
    assert sim.clear(node, fault, 3) == 1
    assert read(node) == before


def test_an_ib_fault_past_the_gpus_takes_the_management_port_and_no_index_past_the_hcas(node: str) -> None:
    """``--gpu 8`` on an 8-GPU node names mlx5_8, the Ethernet management port (ib-* faults
    only); an index past the HCAs, or a GPU fault at 8, is refused as before."""
    before = read(node)
    assert sim.inject(node, "ib-port-down", 8)
    after = by_name(read(node))
    assert after["mlx5_8"]["ports"][0]["state"] == "1: DOWN"
    assert after["mlx5_8"]["ports"][0]["link_layer"] == "Ethernet"
    assert all(after[f"mlx5_{i}"]["ports"][0]["state"] == "4: ACTIVE" for i in range(8))
    with pytest.raises(sim.SimError, match="does not exist"):
        sim.inject(node, "ib-port-down", 9)
    with pytest.raises(sim.SimError, match="does not exist"):
        sim.inject(node, "ecc-dbe", 8)
    assert sim.clear(node, "ib-port-down", 8) == 1
    assert read(node) == before


def test_the_nodes_of_one_folder_share_one_tree_until_a_fault_sets_one_apart(tmp_path: Path) -> None:
    """A fleet's healthy nodes are symlinks to one shared tree (a thousand nodes would otherwise
    cost half a million files): each reads as its own state says; a fault points its node at
    the tree of its new view, or (a fault that moves with time) gives it a tree of its own; the
    other node and the shared tree stay as they were, and clear brings the node back."""
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    sim.init_state(a, "a")
    sim.init_state(b, "b")
    roots = [Path(simfabric.sys_root(p)) for p in (a, b)]
    shared = roots[1].resolve()
    assert roots[0].is_symlink() and roots[0].resolve() == shared and shared.parent.name == ".sys-templates"
    for path in (a, b):
        assert read(path) == sim.snapshot(sim.read_state(path), now=T)["fabric"]
    before = read(b)
    files_before = sorted((str(f.relative_to(shared)), f.read_text()) for f in shared.rglob("*") if f.is_file())
    assert sim.inject(a, "ib-fw-drift", 0)
    assert roots[0].resolve() != shared and read(a) == sim.snapshot(sim.read_state(a), now=T)["fabric"]
    assert by_name(read(a))["mlx5_0"]["fw_ver"] == "28.37.1014" and read(b) == before
    assert sim.inject(a, "ib-symbol-errors", 1)  # moves with time: a tree of a's own
    assert roots[0].resolve() == Path(str(roots[0]) + "-own").resolve()
    time.sleep(1.1)  # a second of errors: the next collect's sync writes them
    simfabric.sync_tree(a, sim.read_state(a), time.time(), only_timed=True)
    grown, was = by_name(read(a)), by_name(before)
    assert grown["mlx5_1"]["ports"][0]["counters"]["symbol_error"] > was["mlx5_1"]["ports"][0]["counters"]["symbol_error"]
    assert grown["mlx5_0"]["fw_ver"] == "28.37.1014" and grown["mlx5_2"] == was["mlx5_2"]
    assert read(b) == before
    files_after = sorted((str(f.relative_to(shared)), f.read_text()) for f in shared.rglob("*") if f.is_file())
    assert files_after == files_before  # nothing was written into the shared tree
    assert sim.clear(a, "all", None) >= 2
    assert roots[0].resolve() == shared and read(a) == before


def test_a_missing_hca_leaves_the_bus_and_its_gpu_without_a_rail(node: str) -> None:
    before = read(node)
    sim.inject(node, "ib-missing-hca", 5)
    after = read(node)
    want = copy.deepcopy(before)
    want["hcas"] = [h for h in want["hcas"] if h["name"] != "mlx5_5"]
    assert after == want
    sim.clear(node, "ib-missing-hca", 5)
    assert read(node) == before


def test_symbol_errors_grow_with_time_and_the_tree_follows_at_each_collect(node: str) -> None:
    from fleetops.sim.access import snapshot_dict

    base = by_name(read(node))["mlx5_1"]["ports"][0]["counters"]["symbol_error"]
    sim.inject(node, "ib-symbol-errors", 1)
    state = sim.read_state(node)
    since = state["faults"][0]["since"]
    doc = snapshot_dict(node, since + 100)
    port = by_name(doc["fabric"])["mlx5_1"]["ports"][0]
    assert port["counters"]["symbol_error"] == base + 100 * simfabric.SYMBOL_ERRORS_PER_S
    assert not sim.steady(state)  # the daemon does not keep this node's snapshot


def test_a_flapping_port_cycles_and_counts_each_fall(node: str) -> None:
    from fleetops.sim.access import snapshot_dict

    base = by_name(read(node))["mlx5_4"]["ports"][0]["counters"]["link_downed"]
    sim.inject(node, "ib-flap", 4)
    since = sim.read_state(node)["faults"][0]["since"]
    seen = []
    for offset in (5.0, 40.0, 65.0, 100.0, 125.0):
        port = by_name(snapshot_dict(node, since + offset)["fabric"])["mlx5_4"]["ports"][0]
        seen.append((port["state"], port["counters"]["link_downed"] - base))
    assert seen == [("1: DOWN", 1), ("4: ACTIVE", 1), ("1: DOWN", 2), ("4: ACTIVE", 2), ("1: DOWN", 3)]


def test_a_port_going_down_and_up_writes_the_mlx5_link_lines_to_kmsg(node: str) -> None:
    sim.inject(node, "ib-port-down", 0)
    state = sim.read_state(node)
    lines = [e["line"] for e in state["kernel_log"]]
    assert len(lines) == 1 and lines[0].endswith("] mlx5_core 0000:19:00.0 ibp25s0: Link down")
    sim.clear(node, "ib-port-down", 0)
    kmsg = Path(sim.kmsg_path(node)).read_text().splitlines()
    assert [line.split(";", 1)[1] for line in kmsg] == ["mlx5_core 0000:19:00.0 ibp25s0: Link down",
                                                        "mlx5_core 0000:19:00.0 ibp25s0: Link up"]
    assert sim.read_state(node)["kernel_log"] == []  # the cold collect's log shows no standing fault
    assert sim.steady(sim.read_state(node), time.time())


def test_fabric_faults_are_listed_and_checked_by_name() -> None:
    assert set(sim.FABRIC_FAULTS) <= set(sim.FAULT_NAMES)
    with pytest.raises(sim.SimError, match="ib-port-down"):
        sim.check_fault_name("ib-port-dwn")


def test_only_the_faults_that_move_with_time_keep_a_node_from_being_steady() -> None:
    """A steady node's snapshot is kept by the daemon (one process serves a thousand nodes)."""
    assert sim.steady(sim.build_state("n1"))
    assert sim.steady(sim.build_state("n1", {"faults": ["ib-degraded@2", "ib-fw-drift@3", "ib-missing-hca@4"]}))
    assert not sim.steady(sim.build_state("n1", {"faults": ["ib-symbol-errors@2"]}))
    assert not sim.steady(sim.build_state("n1", {"faults": ["ib-flap@2"]}))
