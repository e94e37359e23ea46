"""NVLinks (per-link state, counters and traffic), the NVLink fabric, each GPU's CPU and NUMA
affinity, and the node's GPU-to-GPU topology, for the snapshot."""

from __future__ import annotations

import os
from typing import Any

from fleetops import model
from fleetops.gpu.nvml.core import LOST, GpuReader, Nvml, as_text, field_value

SYSFS_PCI = "/sys/bus/pci/devices"  # tests point this elsewhere

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}
# nvmlDeviceGetTopologyCommonAncestor level -> nvidia-smi topo -m vocabulary
TOPO_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# NvLink field -> (field-values total key, nvmlNvLinkErrorCounter constant name)
LINK_COUNTERS = (
    ("crc_errors", "_nvlink_crc_total", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("replay_errors", "_nvlink_replay_total", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "_nvlink_recovery_total", "NVML_NVLINK_ERROR_DL_RECOVERY"),
)
# NvLink field -> NVML field id read per link (scopeId = link id); KiB since the driver loaded.
LINK_TRAFFIC = (
    ("tx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
    ("rx_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
)
# The same per-link error counters as field ids, in the same call: where they answer, the
# snapshot and the daemon's ring (which samples these fields every tick) count alike; where
# they do not, LINK_COUNTERS' getter is used.
LINK_ERROR_FIELDS = (
    ("crc_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"),
    ("replay_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY"),
    ("recovery_errors", "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY"),
)


def read_nvlinks(r: GpuReader, N: Any, fields: dict[str, tuple[Any, str | None]]) -> None:
    gpu = r.gpu
    count, count_reason = fields["_nvlink_count"]
    if count_reason is None and int(count) == 0:
        gpu.nvlinks = []  # the driver says this GPU has no NVLink
        return
    known = count_reason is None
    limit = int(count) if known else int(getattr(N, "NVML_NVLINK_MAX_LINKS", 18))
    links: list[model.NvLink] = []
    for index in range(limit):
        state, reason = r.call("nvmlDeviceGetNvLinkState", index)
        if reason is not None:
            if index == 0:
                r.miss("nvlinks", reason)  # NotSupported on link 0: none of the others is asked
                return
            if reason == LOST:
                break
            if not known and reason in ("NotSupported", "InvalidArgument"):
                break  # past the last link this GPU has
            links.append(model.NvLink(link=index, unavailable={"state": reason}))
            continue
        link = model.NvLink(link=index, state="up" if state else "down")
        if state:
            pci, reason = r.call("nvmlDeviceGetNvLinkRemotePciInfo", index)
            if reason is None:
                try:
                    link.remote_bus_id = model.normalize_bus_id(as_text(pci.busId))
                except (ValueError, AttributeError) as exc:
                    link.unavailable["remote_bus_id"] = f"bad bus id: {exc}"
            else:
                link.unavailable["remote_bus_id"] = reason
            kind, reason = r.call("nvmlDeviceGetNvLinkRemoteDeviceType", index)
            if reason is None:
                link.remote_type = REMOTE_TYPES.get(int(kind))
                if link.remote_type is None:
                    link.unavailable["remote_type"] = f"unknown device type {int(kind)}"
            else:
                link.unavailable["remote_type"] = reason
        else:
            link.unavailable["remote_bus_id"] = link.unavailable["remote_type"] = "link down"
        links.append(link)
    if r.lost:
        r.miss("nvlinks", LOST)
        return
    _read_link_fields(r, links)
    if r.lost:
        r.miss("nvlinks", LOST)
        return
    for attr, total_key, const in LINK_COUNTERS:
        pending = [link for link in links if link.state is not None and getattr(link, attr) is None]
        total, reason = fields[total_key]
        if reason is None and int(total) == 0:
            for link in pending:
                setattr(link, attr, 0)  # a zero total: every link's counter is zero
            continue
        counter = getattr(N, const)
        for link in pending:
            value, reason = r.call("nvmlDeviceGetNvLinkErrorCounter", link.link, counter)
            if reason is None:
                setattr(link, attr, int(value))
            else:
                link.unavailable[attr] = reason
    for link in links:
        if link.state is None:
            for attr in [a for a, _, _ in LINK_COUNTERS] + [a for a, _ in LINK_TRAFFIC]:
                link.unavailable.setdefault(attr, link.unavailable["state"])
            link.unavailable.setdefault("remote_bus_id", link.unavailable["state"])
            link.unavailable.setdefault("remote_type", link.unavailable["state"])
    gpu.nvlinks = links


def _read_link_fields(r: GpuReader, links: list[model.NvLink]) -> None:
    """TX/RX data counters and the error counters of every readable link in ONE field-values
    call (scopeId = link): 18 links cost one driver round trip, not 90. An error counter whose
    field does not answer stays None without a reason, for LINK_COUNTERS' getter to read."""
    readable = [link for link in links if link.state is not None]
    if not readable:
        return
    ids: list[tuple[int, int]] = []
    attr_of: dict[int, str] = {}
    for attr, const in LINK_TRAFFIC + LINK_ERROR_FIELDS:
        fid = r.nv.const(const)
        if fid is None:
            if (attr, const) in LINK_TRAFFIC:
                for link in readable:
                    link.unavailable[attr] = f"{const} not in this nvidia-ml-py"
            continue
        attr_of[fid] = attr
        ids.extend((fid, link.link) for link in readable)
    if not ids:
        return
    traffic = {attr for attr, _ in LINK_TRAFFIC}
    by_link = {link.link: link for link in readable}
    values, reason = r.call("nvmlDeviceGetFieldValues", ids)
    if reason is not None:
        for fid, link_no in ids:
            if attr_of[fid] in traffic:
                by_link[link_no].unavailable[attr_of[fid]] = reason
        return
    lost_code = r.nv.const("NVML_ERROR_GPU_IS_LOST", 15)
    for (fid, link_no), fv in zip(ids, values, strict=False):
        link, attr = by_link[link_no], attr_of[fid]
        if fv.nvmlReturn == 0:
            setattr(link, attr, int(field_value(fv)))
            continue
        if attr in traffic:
            link.unavailable[attr] = r.nv.reason_code(fv.nvmlReturn)
        if fv.nvmlReturn == lost_code:
            r.lost = True


def read_fabric(r: GpuReader, N: Any) -> None:
    struct_cls = getattr(N, "c_nvmlGpuFabricInfoV_t", None)
    getter = "nvmlDeviceGetGpuFabricInfoV"
    if struct_cls is None:
        struct_cls, getter = getattr(N, "c_nvmlGpuFabricInfo_t", None), "nvmlDeviceGetGpuFabricInfo"
    if struct_cls is None:
        r.miss("fabric_state", "no fabric info in this nvidia-ml-py")
        r.miss("fabric_status", "no fabric info in this nvidia-ml-py")
        return
    import ctypes

    info = struct_cls()
    _, reason = r.call(getter, ctypes.byref(info))
    if reason is not None:
        r.miss("fabric_state", reason)
        r.miss("fabric_status", reason)
        return
    state = int(info.state)
    r.gpu.fabric_state = FABRIC_STATES.get(state, f"unknown_{state}")
    if state == 0:
        # A GPU with no fabric (the H200 passthrough VM answers so, with status success):
        # there is no registration whose status could be reported; nvidia-smi shows N/A.
        r.miss("fabric_status", "NotSupported")
        return
    status = int(info.status)
    r.gpu.fabric_status = "success" if status == 0 else r.nv.reason_code(status)


def _read_sysfs(bus_id: str, name: str) -> str | None:
    try:
        with open(f"{SYSFS_PCI}/{bus_id}/{name}", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return None


def cpu_list(words: Any, word_bits: int = 64) -> str:
    """A CPU bit mask (NVML's array of unsigned longs) as a list string: "0-15,32-47"."""
    cpus = [w * word_bits + b for w, word in enumerate(words) for b in range(word_bits) if int(word) >> b & 1]
    parts = []
    start: int | None = None
    prev = -2
    for cpu in cpus:
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def read_affinity(r: GpuReader, N: Any) -> None:
    gpu = r.gpu
    # CPU affinity: sysfs local_cpulist is the list NVML derives its mask from, for a file read
    # instead of nvmlDeviceGetCpuAffinity's slow first call (bench/RESULTS.md).
    cpus = _read_sysfs(gpu.bus_id, "local_cpulist")
    if cpus:
        gpu.cpu_affinity = cpus
    else:
        words = max(1, ((os.cpu_count() or 64) + 63) // 64)
        value, reason = r.call("nvmlDeviceGetCpuAffinity", words)
        if reason is None:
            gpu.cpu_affinity = cpu_list(list(value)) or None
            if gpu.cpu_affinity is None:
                gpu.unavailable["cpu_affinity"] = "empty CPU mask"
        else:
            r.miss("cpu_affinity", reason)
    # NUMA node: NVML's answer (GPU memory's node on coherent platforms); where NVML does not
    # support it, the PCI device's node from sysfs; -1 there means none known.
    value, reason = r.call("nvmlDeviceGetNumaNodeId")
    if reason is None and int(value) >= 0:
        gpu.numa_node = int(value)
        return
    if reason != LOST:
        text = _read_sysfs(gpu.bus_id, "numa_node")
        if text is not None and text.lstrip("-").isdigit() and int(text) >= 0:
            gpu.numa_node = int(text)
            return
    r.miss("numa_node", reason or "no NUMA node")


# --- topology ------------------------------------------------------------------------------


def _nvlink_pair_count(a: model.Gpu, b: model.Gpu) -> int | None:
    """NVLinks joining two GPUs: direct links to the peer, else through NVSwitch the smaller
    of the two GPUs' up links to switches. None when either GPU's links are unknown."""
    if a.nvlinks is None or b.nvlinks is None:
        return None
    direct = sum(1 for link in a.nvlinks if link.state == "up" and link.remote_bus_id == b.bus_id)
    if not direct:
        direct = sum(1 for link in b.nvlinks if link.state == "up" and link.remote_bus_id == a.bus_id)
    if direct:
        return direct
    sa = sum(1 for link in a.nvlinks if link.state == "up" and link.remote_type == "switch")
    sb = sum(1 for link in b.nvlinks if link.state == "up" and link.remote_type == "switch")
    return min(sa, sb)


def node_topology(nv: Nvml, readers: list[GpuReader]) -> model.Topology:
    topo = model.Topology(gpus=[r.gpu.bus_id for r in readers])
    n = len(readers)
    links: list[list[str | None]] = [[None] * n for _ in range(n)]
    counts: list[list[int | None]] = [[None] * n for _ in range(n)]
    for i in range(n):
        links[i][i], counts[i][i] = "X", 0
        for j in range(i + 1, n):
            a, b = readers[i], readers[j]
            count = _nvlink_pair_count(a.gpu, b.gpu)
            counts[i][j] = counts[j][i] = count
            if count:
                links[i][j] = links[j][i] = f"NV{count}"
                continue
            reason: str | None
            level: Any
            if a.lost or b.lost:
                level, reason = None, LOST
            else:
                level, reason = nv.call("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
            if reason is None:
                links[i][j] = links[j][i] = TOPO_LEVELS.get(int(level), f"LEVEL{int(level)}")
            else:
                topo.unavailable[f"{a.gpu.bus_id}|{b.gpu.bus_id}"] = reason
    topo.links = links
    topo.nvlink_counts = counts
    topo.numa = {r.gpu.bus_id: r.gpu.numa_node for r in readers}
    return topo
