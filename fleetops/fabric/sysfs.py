"""Reading the RDMA devices from a sysfs tree (``read``).

The layout (Linux's ``drivers/infiniband/core/sysfs.c`` and the PCI core), relative to the root:

- ``class/infiniband/<dev>``: a link to ``devices/pci<dom>:<bus>/<root port>/.../<function>/infiniband/<dev>``;
  in it ``fw_ver``, ``board_id``, ``node_guid``, ``hca_type`` and ``device`` (a link to the PCI
  function, whose ``numa_node`` and ``net/<netdev>`` are read).
- ``class/infiniband/<dev>/ports/<n>/``: ``state`` ("4: ACTIVE"), ``phys_state`` ("5: LinkUp"),
  ``rate`` ("400 Gb/sec (4X NDR)"), ``link_layer``, ``counters/*``, ``hw_counters/*`` and
  ``gid_attrs/ndevs/0`` (the netdev of a RoCE port's first GID).
- ``bus/pci/devices/<bus id>``: a link to the GPU's PCI function, for the switch it sits behind.

Every value that cannot be read is None with its reason in the owner's ``unavailable``; nothing
raises and nothing reads as zero.
"""

from __future__ import annotations

import os
import re
import sys

from fleetops import model

SYSFS_ROOT = "/sys"
CLASS_DIR = "class/infiniband"
NO_DEVICE = "no RDMA device: {path} does not exist"

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec\s*(?:\(\s*([0-9]+X)\b[^)]*\))?", re.I)
# Files of a device read as text (field name = file name).
DEVICE_TEXT = ("fw_ver", "board_id", "node_guid", "hca_type")
PORT_TEXT = ("state", "phys_state", "rate", "link_layer")


def _why(exc: OSError) -> str:
    if isinstance(exc, IsADirectoryError):
        return "unreadable: a directory where a file belongs"
    if isinstance(exc, FileNotFoundError):
        return "missing"
    return f"unreadable: {exc.strerror or type(exc).__name__}"


def _text(path: str) -> tuple[str | None, str | None]:
    """(the file's stripped text, None) or (None, why not)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip(), None
    except OSError as exc:
        return None, _why(exc)


def parse_rate(text: str) -> tuple[float | None, str | None]:
    """("400 Gb/sec (4X NDR)") -> (400.0, "4X"); what does not match is (None, None)."""
    m = _RATE.match(text)
    if m is None:
        return None, None
    return float(m.group(1)), (m.group(2).upper() if m.group(2) else None)


def _counters(folder: str) -> tuple[dict[str, int] | None, dict[str, str], str | None]:
    """(name -> value, name -> why unreadable, why the folder is not there)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return None, {}, _why(exc)
    values: dict[str, int] = {}
    missing: dict[str, str] = {}
    for name in map(sys.intern, names):  # the same few dozen names on every port: one copy each
        text, why = _text(os.path.join(folder, name))
        if text is None:
            missing[name] = why or "unreadable"
            continue
        try:
            values[name] = int(text, 10)
        except ValueError:
            missing[name] = f"not a count: {text[:40]!r}"
    return values, missing, None


def _pci_path(target: str) -> list[str] | None:
    """The PCI functions of a resolved sysfs device path, root port first."""
    parts = [p for p in target.split(os.sep) if _BDF.match(p)]
    return parts or None


def _netdevs(function: str) -> dict[int | None, str]:
    """The PCI function's netdevs by port (``dev_port`` + 1; None where it does not say)."""
    try:
        names = sorted(os.listdir(os.path.join(function, "net")))
    except OSError:
        return {}
    out: dict[int | None, str] = {}
    for name in names:
        text, _ = _text(os.path.join(function, "net", name, "dev_port"))
        port = int(text) + 1 if text is not None and text.isdigit() else None
        out.setdefault(port, name)
    return out


def _port(folder: str, number: int, netdevs: dict[int | None, str], single: bool) -> model.HcaPort:
    port = model.HcaPort(port=number)
    for name in PORT_TEXT:
        text, why = _text(os.path.join(folder, name))
        if text is None or not text:
            port.unavailable[name] = why or "empty"
            continue
        setattr(port, name, text)
    if port.rate is not None:
        port.rate_gbps, port.width = parse_rate(port.rate)
        if port.rate_gbps is None:
            port.unavailable["rate_gbps"] = f"rate not understood: {port.rate!r}"
        if port.width is None:
            port.unavailable["width"] = f"no width in rate {port.rate!r}"
    else:
        port.unavailable["rate_gbps"] = port.unavailable["width"] = port.unavailable["rate"]
    for group in ("counters", "hw_counters"):
        values, missing, why = _counters(os.path.join(folder, group))
        setattr(port, group, values)
        if why is not None:
            port.unavailable[group] = why
        for name, reason in missing.items():
            port.unavailable[f"{group}.{name}"] = reason
    port.netdev = netdevs.get(number) or (netdevs.get(None) if single and len(netdevs) == 1 else None)
    if port.netdev is None:
        text, _ = _text(os.path.join(folder, "gid_attrs", "ndevs", "0"))
        if text:
            port.netdev = text
        else:
            port.unavailable["netdev"] = "no netdev: none under the PCI function's net/, no GID netdev"
    return port


def _hca(root: str, name: str) -> model.Hca:
    folder = os.path.join(root, CLASS_DIR, name)
    hca = model.Hca(name=name)
    for attr in DEVICE_TEXT:
        text, why = _text(os.path.join(folder, attr))
        if text is None or not text:
            hca.unavailable[attr] = why or "empty"
        else:
            setattr(hca, attr, text)
    function = os.path.join(folder, "device")
    netdevs: dict[int | None, str] = {}
    if os.path.islink(function) and os.path.isdir(function):
        hca.pci_path = _pci_path(os.path.realpath(function))
        if hca.pci_path is None:
            hca.unavailable["pci_address"] = hca.unavailable["pci_path"] = "device link names no PCI function"
        else:
            hca.pci_address = hca.pci_path[-1]
        text, why = _text(os.path.join(function, "numa_node"))
        if text is not None and text.lstrip("-").isdigit() and int(text) >= 0:
            hca.numa_node = int(text)
        else:
            hca.unavailable["numa_node"] = why or ("no NUMA node" if text == "-1" else f"not a node: {text!r}")
        netdevs = _netdevs(function)
    else:
        why = "device link dangles" if os.path.islink(function) else "no device link"
        for attr in ("pci_address", "pci_path", "numa_node"):
            hca.unavailable[attr] = why
    ports_dir = os.path.join(folder, "ports")
    try:
        numbers = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
    except OSError as exc:
        hca.unavailable["ports"] = _why(exc)
        return hca
    for number in numbers:
        hca.ports.append(_port(os.path.join(ports_dir, str(number)), number, netdevs, len(numbers) == 1))
    return hca


def gpu_paths(root: str, bus_ids: list[str]) -> dict[str, list[str] | None]:
    """Each GPU's PCI path (root port first) from ``bus/pci/devices``; None where not linked."""
    out: dict[str, list[str] | None] = {}
    for bus in bus_ids:
        link = os.path.join(root, "bus", "pci", "devices", bus)
        out[bus] = _pci_path(os.path.realpath(link)) if os.path.exists(link) else None
    return out


def switch_of(path: list[str] | None) -> str | None:
    """The PCIe switch a function sits behind, named by the switch's upstream port: the second
    function of its path (the first is the root port). None: directly on a root port, or unknown."""
    if path is None or len(path) < 3:
        return None
    return path[1]


def attach_gpus(fabric: model.Fabric, paths: dict[str, list[str] | None]) -> None:
    """Fill each HCA's ``gpus``: the GPUs behind the same PCIe switch."""
    known = {bus: switch_of(p) for bus, p in paths.items() if p is not None}
    fabric.gpu_switches = dict(known)
    for hca in fabric.hcas or []:
        if hca.pci_path is None:
            hca.unavailable.setdefault("gpus", "the HCA's PCI path is not known")
            continue
        if paths and not known:
            hca.unavailable["gpus"] = "no GPU's PCI path could be read"
            continue
        mine = switch_of(hca.pci_path)
        hca.gpus = sorted(bus for bus, sw in known.items() if mine is not None and sw == mine)


def read(root: str = SYSFS_ROOT, gpu_bus_ids: list[str] | None = None, now: float | None = None) -> model.Fabric:
    """The node's RDMA devices under ``root`` (see the module docstring); ``now``: the time to
    record as ``read_at`` (the caller's clock), else the time of the read."""
    import time

    read_at = time.time() if now is None else now
    folder = os.path.join(root, CLASS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return model.Fabric(hcas=[], note=NO_DEVICE.format(path=os.path.join("/sys", CLASS_DIR)), read_at=read_at)
    except OSError as exc:
        return model.Fabric(hcas=None, unavailable={"hcas": f"{folder}: {_why(exc)}"}, read_at=read_at)
    fabric = model.Fabric(hcas=[_hca(root, name) for name in names], read_at=read_at)
    if not names:
        fabric.note = f"no RDMA device: {os.path.join('/sys', CLASS_DIR)} is empty"
    attach_gpus(fabric, gpu_paths(root, list(gpu_bus_ids or [])))
    return fabric


# (active, link_downed) of one port at one read: what the daemon samples every tick.
PortSample = tuple[bool | None, int | None]


def read_ports(root: str = SYSFS_ROOT) -> dict[str, PortSample]:
    """``"<dev>/<port>"`` -> (ACTIVE or not, link_downed) for every port: two small files each,
    cheap enough for every tick of the daemon. A value that cannot be read is None; a node
    without the class has no ports."""
    folder = os.path.join(root, CLASS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    out: dict[str, PortSample] = {}
    for name in names:
        ports_dir = os.path.join(folder, name, "ports")
        try:
            numbers = sorted(p for p in os.listdir(ports_dir) if p.isdigit())
        except OSError:
            continue
        for number in numbers:
            state, _ = _text(os.path.join(ports_dir, number, "state"))
            downed, _ = _text(os.path.join(ports_dir, number, "counters", "link_downed"))
            active = None if not state else state.split(":")[0].strip() == "4"
            out[f"{name}/{number}"] = (active, int(downed) if downed is not None and downed.isdigit() else None)
    return out
