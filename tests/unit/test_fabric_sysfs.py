"""``fabric.sysfs.read`` on sysfs trees built in the real layout (class links into
``devices/pci.../infiniband``, the ``device`` link to the PCI function, ``bus/pci/devices``
links for the GPUs): exact values, and every field that cannot be read named with its reason,
never an exception and never a zero."""

from __future__ import annotations

import os
from pathlib import Path

from fleetops import model
from fleetops.fabric import sysfs

GPU_BUS = "0000:18:00.0"
HCA_PATH = ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0"]
GPU_PATH = ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", GPU_BUS]


def _file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _function(root: Path, path: list[str]) -> Path:
    return root / "devices" / "pci0000:15" / Path(*path)


def _hca(root: Path, name: str, path: list[str], *, link_layer: str = "InfiniBand", rate: str = "400 Gb/sec (4X NDR)",
         netdev: str | None = "ibp25s0", hw: bool = True) -> Path:
    function = _function(root, path)
    ib = function / "infiniband" / name
    _file(function / "numa_node", "0\n")
    if netdev:
        _file(function / "net" / netdev / "dev_port", "0\n")
    _file(ib / "fw_ver", "28.39.1002\n")
    _file(ib / "board_id", "MT_0000000838\n")
    _file(ib / "node_guid", "a088:c203:0012:3456\n")
    _file(ib / "hca_type", "MT4129\n")
    os.symlink("../../../" + path[-1], ib / "device")
    port = ib / "ports" / "1"
    _file(port / "state", "4: ACTIVE\n")
    _file(port / "phys_state", "5: LinkUp\n")
    _file(port / "rate", rate + "\n")
    _file(port / "link_layer", link_layer + "\n")
    _file(port / "counters" / "port_xmit_data", "987654321012345\n")  # past 2**32: kept exact
    _file(port / "counters" / "symbol_error", "3\n")
    _file(port / "counters" / "link_downed", "1\n")
    if hw:
        _file(port / "hw_counters" / "rnr_nak_retry_err", "0\n")
        _file(port / "hw_counters" / "out_of_buffer", "17\n")
    (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(ib, root / "class" / "infiniband"), root / "class" / "infiniband" / name)
    return ib


def _gpu(root: Path) -> None:
    function = _function(root, GPU_PATH)
    _file(function / "numa_node", "0\n")
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(function, root / "bus" / "pci" / "devices"), root / "bus" / "pci" / "devices" / GPU_BUS)


def test_a_connectx7_port_reads_exactly_with_its_netdev_pci_function_and_gpu(tmp_path: Path) -> None:
    _hca(tmp_path, "mlx5_0", HCA_PATH)
    _gpu(tmp_path)
    fabric = sysfs.read(str(tmp_path), [GPU_BUS])
    assert fabric.note is None and fabric.unavailable == {}
    assert fabric.gpu_switches == {GPU_BUS: "0000:16:00.0"}
    (hca,) = fabric.hcas or []
    assert (hca.name, hca.pci_address, hca.numa_node, hca.fw_ver, hca.board_id, hca.node_guid, hca.hca_type) == (
        "mlx5_0", "0000:19:00.0", 0, "28.39.1002", "MT_0000000838", "a088:c203:0012:3456", "MT4129")
    assert hca.pci_path == HCA_PATH and hca.gpus == [GPU_BUS] and hca.unavailable == {}
    (port,) = hca.ports
    assert port == model.HcaPort(
        port=1, state="4: ACTIVE", phys_state="5: LinkUp", rate="400 Gb/sec (4X NDR)", rate_gbps=400.0, width="4X",
        link_layer="InfiniBand", netdev="ibp25s0",
        counters={"link_downed": 1, "port_xmit_data": 987654321012345, "symbol_error": 3},
        hw_counters={"out_of_buffer": 17, "rnr_nak_retry_err": 0}, unavailable={},
    )
    assert port.active


def test_unreadable_files_are_named_per_field_and_never_read_as_zero(tmp_path: Path) -> None:
    ib = _hca(tmp_path, "mlx5_0", HCA_PATH, hw=False)
    (ib / "fw_ver").unlink()
    os.symlink("fw_ver.gone", ib / "fw_ver")  # a dangling link: open fails even as root
    (ib / "ports" / "1" / "rate").unlink()
    (ib / "ports" / "1" / "rate").mkdir()  # a directory where the file belongs
    os.symlink("nowhere", ib / "ports" / "1" / "counters" / "port_rcv_errors")
    _file(ib / "ports" / "1" / "counters" / "port_xmit_wait", "N/A\n")
    fabric = sysfs.read(str(tmp_path), [])
    (hca,) = fabric.hcas or []
    assert hca.fw_ver is None and hca.unavailable == {"fw_ver": "missing"}
    (port,) = hca.ports
    assert port.rate is None and port.rate_gbps is None and port.width is None
    assert port.unavailable["rate"] == "unreadable: a directory where a file belongs"
    assert port.unavailable["rate_gbps"] == port.unavailable["width"] == port.unavailable["rate"]
    assert port.hw_counters is None and port.unavailable["hw_counters"] == "missing"  # no hw_counters folder
    assert "port_rcv_errors" not in (port.counters or {}) and "port_xmit_wait" not in (port.counters or {})
    assert port.unavailable["counters.port_rcv_errors"] == "missing"
    assert port.unavailable["counters.port_xmit_wait"] == "not a count: 'N/A'"
    assert port.counters == {"link_downed": 1, "port_xmit_data": 987654321012345, "symbol_error": 3}
    assert port.state == "4: ACTIVE"  # the rest of the port still reads


def test_a_roce_port_takes_its_netdev_from_the_gid_table_and_a_dangling_device_link_is_stated(tmp_path: Path) -> None:
    ib = _hca(tmp_path, "mlx5_8", ["0000:c0:01.1", "0000:c1:00.0"], link_layer="Ethernet",
              rate="200 Gb/sec (4X HDR)", netdev=None)
    _file(ib / "ports" / "1" / "gid_attrs" / "ndevs" / "0", "enp193s0f0np0\n")
    (ib / "device").unlink()
    os.symlink("../../../0000:ff:00.0", ib / "device")  # dangles
    (hca,) = sysfs.read(str(tmp_path), []).hcas or []
    assert hca.pci_address is None and hca.numa_node is None and hca.gpus is None
    assert hca.unavailable["pci_address"] == hca.unavailable["numa_node"] == "device link dangles"
    assert hca.unavailable["gpus"] == "the HCA's PCI path is not known"
    (port,) = hca.ports
    assert (port.link_layer, port.rate_gbps, port.width, port.netdev) == ("Ethernet", 200.0, "4X", "enp193s0f0np0")


def test_an_hca_on_a_root_port_shares_no_switch_with_the_gpu(tmp_path: Path) -> None:
    _hca(tmp_path, "mlx5_8", ["0000:15:01.1", "0000:1a:00.0"], link_layer="Ethernet", netdev="enp26s0f0np0")
    _gpu(tmp_path)
    (hca,) = sysfs.read(str(tmp_path), [GPU_BUS]).hcas or []
    assert hca.pci_path == ["0000:15:01.1", "0000:1a:00.0"] and hca.gpus == []


def test_a_gpu_whose_pci_link_is_missing_leaves_the_pairing_unknown(tmp_path: Path) -> None:
    _hca(tmp_path, "mlx5_0", HCA_PATH)
    fabric = sysfs.read(str(tmp_path), [GPU_BUS])
    (hca,) = fabric.hcas or []
    assert hca.gpus is None and hca.unavailable["gpus"] == "no GPU's PCI path could be read"
    assert fabric.gpu_switches == {}


def test_a_node_without_the_infiniband_class_has_an_empty_fabric_stated(tmp_path: Path) -> None:
    fabric = sysfs.read(str(tmp_path), [GPU_BUS])
    assert fabric.hcas == [] and fabric.note == "no RDMA device: /sys/class/infiniband does not exist"
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    fabric = sysfs.read(str(tmp_path), [GPU_BUS])
    assert fabric.hcas == [] and fabric.note == "no RDMA device: /sys/class/infiniband is empty"


def test_a_class_that_is_not_a_folder_is_unavailable_not_empty(tmp_path: Path) -> None:
    _file(tmp_path / "class" / "infiniband", "")
    fabric = sysfs.read(str(tmp_path), [])
    assert fabric.hcas is None and fabric.note is None
    assert fabric.unavailable["hcas"].endswith("class/infiniband: unreadable: Not a directory")


def test_rate_text_parses_rate_and_width() -> None:
    assert sysfs.parse_rate("400 Gb/sec (4X NDR)") == (400.0, "4X")
    assert sysfs.parse_rate("200 Gb/sec (2X NDR)") == (200.0, "2X")
    assert sysfs.parse_rate("2.5 Gb/sec (1X SDR)") == (2.5, "1X")
    assert sysfs.parse_rate("100 Gb/sec") == (100.0, None)
    assert sysfs.parse_rate("unknown") == (None, None)


def test_the_fabric_survives_the_snapshot_json_round_trip(tmp_path: Path) -> None:
    _hca(tmp_path, "mlx5_0", HCA_PATH)
    _gpu(tmp_path)
    node = model.Node(hostname="n1", fabric=sysfs.read(str(tmp_path), [GPU_BUS]))
    back = model.node_from_json(model.node_to_json(node))
    assert back.fabric == node.fabric
    assert back.fabric is not None and back.fabric.hcas is not None
    assert back.fabric.hcas[0].ports[0].counters == {"link_downed": 1, "port_xmit_data": 987654321012345,
                                                     "symbol_error": 3}
    older = model.to_dict(node)
    del older["fabric"]  # a snapshot written before the fabric existed still validates
    assert model.node_from_dict(older).fabric is None
