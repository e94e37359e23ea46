"""The simulated node's RDMA devices: a sysfs tree in its state folder (``<state>.sys``, the
node's ``/sys``) that ``fabric.sysfs.read`` reads as it reads a real node's.

An HGX H100/H200 training node: eight ConnectX-7 HCAs ``mlx5_0`` .. ``mlx5_7``, one InfiniBand
NDR port each (``400 Gb/sec (4X NDR)``), each behind the same PCIe switch as one GPU (GPU N and
``mlx5_N``: root port, switch upstream port, one downstream port to the GPU and one to the HCA),
and one ConnectX-6 Dx Ethernet management port ``mlx5_8`` on a root port of its own. Counters
start where months of traffic leave them.

The devices are kept in the state (``state["fabric"]``, made with the node: identity, firmware,
rate and a seed from which ``counters_of`` makes the counters again at every view, plus what a
scenario adds to them under ``counters`` / ``hw_counters``); the ``ib-*`` faults are overlaid on
them (``view``) and the tree is written from the view
(``sync_tree``) when a fault is injected or cleared, and before each snapshot while a fault
changes with time (``ib-flap`` cycles the port, ``ib-symbol-errors`` grows its counter)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from fleetops.sim.gpu.base import FABRIC_FAULTS, digest

COMPUTE_FW, COMPUTE_BOARD, COMPUTE_TYPE = "28.39.1002", "MT_0000000838", "MT4129"
MGMT_FW, MGMT_BOARD, MGMT_TYPE = "22.39.1002", "MT_0000000359", "MT4125"
DRIFT_FW = "28.37.1014"
NDR_RATE = "400 Gb/sec (4X NDR)"
DEGRADED_RATE = "200 Gb/sec (2X NDR)"
DOWN_RATE = "10 Gb/sec (4X SDR)"
MGMT_RATE = "200 Gb/sec (4X HDR)"
MGMT_BUS = 0xC1
ACTIVE, LINK_UP = "4: ACTIVE", "5: LinkUp"
DOWN, POLLING = "1: DOWN", "2: Polling"
# ib-flap: each cycle the port is down FLAP_DOWN_S (gpud counts a flap from 25 s down) and back
# up for the rest of FLAP_PERIOD_S; link_downed counts each fall.
FLAP_PERIOD_S, FLAP_DOWN_S = 60.0, 30.0
# ib-symbol-errors: symbol errors per second while injected (NVSentinel: above 10/s degraded).
SYMBOL_ERRORS_PER_S = 50
TIME_FAULTS = ("ib-flap", "ib-symbol-errors")

COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
    "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
    "unicast_rcv_packets", "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
    "req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
    "resp_remote_access_errors", "rnr_nak_retry_err", "rx_atomic_requests", "rx_read_requests",
    "rx_write_requests",
)
ROCE_HW_COUNTERS = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
                    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart")


def sys_root(state_path: str) -> str:
    """The simulated node's ``/sys``: beside its state file, ``<state>.sys``."""
    base = state_path[:-5] if state_path.endswith(".json") else state_path
    return base + ".sys"


_MASK = (1 << 64) - 1


def _mix(seed: int, salt: int) -> int:
    """A well-spread 64-bit number from a device's seed (splitmix64's finaliser): the counters are
    made again at every view from the seed alone, so the state file keeps no counter."""
    z = (seed + salt * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def counters_of(seed: int, roce: bool) -> tuple[dict[str, int], dict[str, int]]:
    """Months of traffic: data counters (4-octet words) near 1e14-1e15, packets from them, a few
    errors, link_downed 0-2; the same for a seed every time."""
    def h(salt: int) -> int:
        return _mix(seed, salt)

    c = {n: 0 for n in COUNTERS}
    data_x = 100_000_000_000_000 + h(1) % 900_000_000_000_000
    data_r = 100_000_000_000_000 + h(2) % 900_000_000_000_000
    c.update(port_xmit_data=data_x, port_rcv_data=data_r,
             port_xmit_packets=data_x // 1031, port_rcv_packets=data_r // 1029,
             unicast_xmit_packets=data_x // 1031 - 40_311, unicast_rcv_packets=data_r // 1029 - 40_297,
             multicast_xmit_packets=40_311, multicast_rcv_packets=40_297,
             port_xmit_wait=1_000_000_000 + h(3) % 9_000_000_000,
             symbol_error=h(4) % 6, link_downed=h(5) % 3, link_error_recovery=h(6) % 4,
             port_rcv_errors=h(7) % 11, port_xmit_discards=h(8) % 50)
    hw = {n: 0 for n in HW_COUNTERS + (ROCE_HW_COUNTERS if roce else ())}
    hw.update(lifespan=10, out_of_buffer=h(9) % 100, local_ack_timeout_err=h(10) % 20, out_of_sequence=h(11) % 1000,
              packet_seq_err=h(12) % 20, implied_nak_seq_err=h(13) % 10, duplicate_request=h(14) % 200,
              rx_write_requests=10_000_000_000 + h(15) % 90_000_000_000,
              rx_read_requests=1_000_000_000 + h(16) % 9_000_000_000)
    return c, hw


def _seed(name: str) -> int:
    """A device's counter seed: by its name, the same on every node, so that the nodes of one
    shape share their counter files (``sync_tree``'s template); the node GUIDs stay the node's."""
    return int(digest("ib", name)[:16], 16)


def _guid(name: str) -> str:
    """A device's node GUID: by its name, the same on every simulated node (their trees are one
    shared tree until a fault tells them apart: ``sync_tree``)."""
    h = digest("guid", name)
    return f"a088:c203:00{h[0:2]}:{h[2:6]}"


def build_devices(hostname: str, gpu_buses: list[str]) -> list[dict[str, Any]]:
    """The node's HCAs, healthy: one per GPU on that GPU's PCIe switch, and the management port."""
    devices: list[dict[str, Any]] = []
    for index, bus_id in enumerate(gpu_buses):
        bus = int(bus_id.split(":")[1], 16)
        top = bus - 3  # the root port's bus: root port, switch up, switch down, then the GPU
        name = f"mlx5_{index}"
        devices.append({
            "name": name, "root": f"pci0000:{top:02x}",
            "path": [f"0000:{top:02x}:01.0", f"0000:{top + 1:02x}:00.0", f"0000:{top + 2:02x}:01.0",
                     f"0000:{bus + 1:02x}:00.0"],
            "numa_node": 0 if index < len(gpu_buses) / 2 else 1,
            "fw_ver": COMPUTE_FW, "board_id": COMPUTE_BOARD, "hca_type": COMPUTE_TYPE,
            "node_guid": _guid(name), "link_layer": "InfiniBand", "rate": NDR_RATE,
            "netdev": f"ibp{bus + 1}s0", "seed": _seed(name), "counters": {}, "hw_counters": {},
        })
    name = f"mlx5_{len(gpu_buses)}"
    devices.append({
        "name": name, "root": "pci0000:c0", "path": ["0000:c0:01.1", f"0000:{MGMT_BUS:02x}:00.0"],
        "numa_node": 1, "fw_ver": MGMT_FW, "board_id": MGMT_BOARD, "hca_type": MGMT_TYPE,
        "node_guid": _guid(name), "link_layer": "Ethernet", "rate": MGMT_RATE,
        "netdev": f"enp{MGMT_BUS}s0f0np0", "seed": _seed(name), "counters": {}, "hw_counters": {},
    })
    return devices


def gpu_path(bus_id: str) -> tuple[str, list[str]]:
    """(root complex, PCI path) of a simulated GPU: the switch's first downstream port."""
    bus = int(bus_id.split(":")[1], 16)
    top = bus - 3
    return f"pci0000:{top:02x}", [f"0000:{top:02x}:01.0", f"0000:{top + 1:02x}:00.0",
                                  f"0000:{top + 2:02x}:00.0", bus_id]


def view(state: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """The devices as the node shows them at ``now``: the stored ones with the ``ib-*`` faults
    overlaid (``present`` False for a missing HCA)."""
    devices = []
    for stored in state.get("fabric") or []:
        counters, hw = counters_of(int(stored["seed"]), stored["link_layer"] == "Ethernet")
        for name, add in (stored.get("counters") or {}).items():  # what a test or scenario adds
            counters[name] = counters.get(name, 0) + int(add)
        for name, add in (stored.get("hw_counters") or {}).items():
            hw[name] = hw.get(name, 0) + int(add)
        devices.append({**stored, "counters": counters, "hw_counters": hw, "present": True, "state": ACTIVE,
                        "phys_state": LINK_UP})
    for fault in state["faults"]:
        name = fault["name"]
        if name not in FABRIC_FAULTS or fault.get("gpu") is None or fault["gpu"] >= len(devices):
            continue
        dev = devices[fault["gpu"]]
        elapsed = max(0.0, now - float(fault["since"]))
        if name == "ib-port-down":
            dev["state"], dev["phys_state"], dev["rate"] = DOWN, POLLING, DOWN_RATE
            dev["counters"]["link_downed"] += 1
        elif name == "ib-degraded":
            dev["rate"] = DEGRADED_RATE
        elif name == "ib-flap":
            falls = int(elapsed // FLAP_PERIOD_S) + 1
            dev["counters"]["link_downed"] += falls
            if elapsed % FLAP_PERIOD_S < FLAP_DOWN_S:
                dev["state"], dev["phys_state"], dev["rate"] = DOWN, POLLING, DOWN_RATE
        elif name == "ib-symbol-errors":
            grown = SYMBOL_ERRORS_PER_S * int(elapsed)
            dev["counters"]["symbol_error"] += grown
            dev["counters"]["port_rcv_errors"] += grown // 10
        elif name == "ib-link-downed":
            dev["counters"]["link_downed"] += 1
            dev["counters"]["link_error_recovery"] += 1
        elif name == "ib-fw-drift":
            dev["fw_ver"] = DRIFT_FW
        elif name == "ib-missing-hca":
            dev["present"] = False
    return devices


_FRESH: set[str] = set()  # trees being made: their files are written without a look first


def _write(path: str, text: str) -> None:
    if _FRESH and any(path.startswith(root) for root in _FRESH):
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="ascii") as fh:
            fh.write(text)
        return
    try:
        with open(path, encoding="ascii") as fh:
            if fh.read() == text:
                return
    except FileNotFoundError:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"  # a collect and an inject may write at once
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(text)
    os.replace(tmp, path)  # a reader sees the old value or the new one, never an empty file


def _link(path: str, target: str) -> None:
    if os.path.islink(path):
        if os.readlink(path) == target:
            return
        os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def _function_dir(root: str, top: str, path: list[str]) -> str:
    return os.path.join(root, "devices", top, *path)


def _unlink(path: str) -> None:
    if os.path.islink(path):
        os.unlink(path)


def write_gpus(root: str, gpu_buses: list[str], numa: list[int]) -> None:
    for bus_id, node in zip(gpu_buses, numa, strict=True):
        top, path = gpu_path(bus_id)
        folder = _function_dir(root, top, path)
        _write(os.path.join(folder, "numa_node"), f"{node}\n")
        _write(os.path.join(folder, "class"), "0x030200\n")
        _link(os.path.join(root, "bus", "pci", "devices", bus_id), os.path.relpath(folder, os.path.join(root, "bus", "pci", "devices")))


def write_device(root: str, dev: dict[str, Any]) -> None:
    """One HCA in the real layout, or its absence (a missing HCA is not on the bus)."""
    function = _function_dir(root, dev["root"], dev["path"])
    ib = os.path.join(function, "infiniband", dev["name"])
    class_link = os.path.join(root, "class", "infiniband", dev["name"])
    bus_link = os.path.join(root, "bus", "pci", "devices", dev["path"][-1])
    if not dev.get("present", True):
        _unlink(class_link)
        _unlink(bus_link)
        shutil.rmtree(function, ignore_errors=True)
        return
    _write(os.path.join(function, "numa_node"), f"{dev['numa_node']}\n")
    _write(os.path.join(function, "class"), "0x020700\n" if dev["link_layer"] == "InfiniBand" else "0x020000\n")
    _write(os.path.join(function, "net", dev["netdev"], "dev_port"), "0\n")
    for attr in ("fw_ver", "board_id", "node_guid", "hca_type"):
        _write(os.path.join(ib, attr), f"{dev[attr]}\n")
    _link(os.path.join(ib, "device"), "../../../" + dev["path"][-1])
    port = os.path.join(ib, "ports", "1")
    _write(os.path.join(port, "state"), f"{dev['state']}\n")
    _write(os.path.join(port, "phys_state"), f"{dev['phys_state']}\n")
    _write(os.path.join(port, "rate"), f"{dev['rate']}\n")
    _write(os.path.join(port, "link_layer"), f"{dev['link_layer']}\n")
    if dev["link_layer"] == "Ethernet":
        _write(os.path.join(port, "gid_attrs", "ndevs", "0"), f"{dev['netdev']}\n")
    for group in ("counters", "hw_counters"):
        for name, value in dev[group].items():
            _write(os.path.join(port, group, name), f"{value}\n")
    _link(class_link, os.path.relpath(ib, os.path.dirname(class_link)))
    _link(bus_link, os.path.relpath(function, os.path.dirname(bus_link)))


def _write_all(root: str, state: dict[str, Any], devices: list[dict[str, Any]], only: set[int] | None) -> None:
    gpus = state["gpus"]
    if only is None:
        write_gpus(root, [g["bus_id"] for g in gpus], [int(g.get("numa_node") or 0) for g in gpus])
    for index, dev in enumerate(devices):
        if only is None or index in only:
            write_device(root, dev)


def _template(state_path: str, state: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """The tree of every node that shows exactly ``devices`` on these GPUs, made once in
    ``.sys-templates/`` beside the state files: a fleet of a thousand healthy nodes has one tree
    (half a million files and 2.6 GB otherwise), and each fault combination one more."""
    buses = [(g["bus_id"], int(g.get("numa_node") or 0)) for g in state["gpus"]]
    key = digest("fabric-tree", json.dumps([devices, buses], sort_keys=True))[:20]
    pool = os.path.join(os.path.dirname(os.path.abspath(state_path)), ".sys-templates")
    template = os.path.join(pool, key)
    if not os.path.isdir(template):
        building = f"{template}.{os.getpid()}.tmp"
        shutil.rmtree(building, ignore_errors=True)
        _FRESH.add(building + os.sep)
        try:
            _write_all(building, state, devices, None)
        finally:
            _FRESH.discard(building + os.sep)
        try:
            os.rename(building, template)
        except OSError:  # another process made it first: the same tree
            shutil.rmtree(building, ignore_errors=True)
    return template


def _point(root: str, target: str) -> None:
    """``root`` (a symlink) to ``target``, in one step: a reader sees the old tree or the new."""
    link = os.path.relpath(target, os.path.dirname(root))
    if os.path.islink(root) and os.readlink(root) == link:
        return
    tmp = f"{root}.{os.getpid()}.link"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(link, tmp)
    os.replace(tmp, root)


def sync_tree(state_path: str, state: dict[str, Any], now: float, only_timed: bool = False) -> None:
    """Make the node's ``/sys`` show ``view``. A node whose devices do not change with time is a
    symlink to the shared tree of its view (``_template``); one with a fault that moves with
    time (``ib-flap``, ``ib-symbol-errors``) gets a tree of its own (``<state>.sys-own``, hard
    links to the shared one at first), in which only the files whose text changed are rewritten,
    each by a rename (a shared file is never written). ``only_timed``: the call before a read,
    which rewrites only the devices a time fault moves."""
    if "fabric" not in state:
        return  # a state made before the simulator had HCAs: its node has none
    root = sys_root(state_path)
    devices = view(state, now)
    moving = {f["gpu"] for f in state["faults"] if f["name"] in TIME_FAULTS}
    if os.path.isdir(root) and not os.path.islink(root):  # a tree of its own from an older simulator
        _write_all(root, state, devices, moving if only_timed else None)
        return
    if not moving:
        if not only_timed or not os.path.lexists(root):
            _point(root, _template(state_path, state, devices))
        return
    own = root + "-own"
    if not (os.path.islink(root) and os.path.realpath(root) == os.path.realpath(own)):
        shutil.rmtree(own, ignore_errors=True)
        base = os.path.realpath(root) if os.path.lexists(root) else _template(state_path, state, devices)
        shutil.copytree(base, own, symlinks=True, copy_function=os.link)
        _point(root, own)
    _write_all(root, state, devices, moving if only_timed else None)


def link_line(dev: dict[str, Any], up: bool) -> str:
    """The line mlx5's Ethernet netdev code logs when its carrier changes (``netdev_info``:
    driver, PCI function, netdev, "Link up"/"Link down"). Used for the IPoIB netdev of an
    InfiniBand port too; that the real IPoIB path logs the same line is not verified on hardware
    (the lent H200 has no RDMA device)."""
    return f"mlx5_core {dev['path'][-1]} {dev['netdev']}: Link {'up' if up else 'down'}"


def section(state: dict[str, Any], now: float) -> dict[str, Any]:
    """The snapshot's ``fabric`` as ``fabric.sysfs.read`` reads it from the tree ``sync_tree``
    writes (the tests hold the two equal): for the snapshots taken without a state file (a
    scenario being built, the TUI's simulated feed, the docs' examples)."""
    from fleetops.fabric.sysfs import CLASS_DIR, NO_DEVICE, parse_rate, switch_of

    if "fabric" not in state:
        return {"hcas": [], "note": NO_DEVICE.format(path=f"/sys/{CLASS_DIR}"), "gpu_switches": {},
                "read_at": now, "unavailable": {}}
    gpus = {g["bus_id"]: switch_of(gpu_path(g["bus_id"])[1]) for g in state["gpus"]}
    hcas = []
    for dev in sorted(view(state, now), key=lambda d: d["name"]):
        if not dev["present"]:
            continue
        gbps, width = parse_rate(dev["rate"])
        mine = switch_of(dev["path"])
        hcas.append({
            "name": dev["name"], "pci_address": dev["path"][-1], "numa_node": dev["numa_node"],
            "fw_ver": dev["fw_ver"], "board_id": dev["board_id"], "node_guid": dev["node_guid"],
            "hca_type": dev["hca_type"], "pci_path": list(dev["path"]),
            "gpus": sorted(bus for bus, sw in gpus.items() if mine is not None and sw == mine),
            "ports": [{
                "port": 1, "state": dev["state"], "phys_state": dev["phys_state"], "rate": dev["rate"],
                "rate_gbps": gbps, "width": width, "link_layer": dev["link_layer"], "netdev": dev["netdev"],
                "counters": dict(sorted(dev["counters"].items())),
                "hw_counters": dict(sorted(dev["hw_counters"].items())), "unavailable": {},
            }],
            "unavailable": {},
        })
    return {"hcas": hcas, "note": None if hcas else f"no RDMA device: /sys/{CLASS_DIR} is empty",
            "gpu_switches": gpus, "read_at": now, "unavailable": {}}
