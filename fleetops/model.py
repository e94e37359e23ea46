"""The node snapshot and finding types: one versioned JSON schema for NVML and the simulator.

Conventions, relied on by every check:
- A value the backend could not read is ``None`` and its field name is a key of the owning
  object's ``unavailable`` map, whose value says why (``"NotSupported"``, ``"NoPermission"``,
  ``"GpuIsLost"``, ``"not collected: MIG enabled"`` ...). Checks turn ``None`` into *unknown*,
  never into a fault.
- GPUs are identified by ``uuid`` and ``bus_id`` (``0000:18:00.0`` form, lower case, 4-digit
  domain); ``index`` is informational.
- This module imports only the standard library: it is on the agent's hot path.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any

# SchemaError is what node_from_dict / node_from_json raise: part of this module's interface.
from fleetops.codec import SchemaError as SchemaError
from fleetops.codec import build
from fleetops.schema import SCHEMA_ID, SCHEMA_VERSION  # noqa: F401  (re-exported)

# v2: summary.worst and nodes[].health follow HEALTH_ORDER (``unreachable`` is new); nodes[]
# carry health and worst_finding, findings action_code.
FINDINGS_SCHEMA_ID = "fleetops.audit/v2"

SEVERITIES = ("ok", "info", "unknown", "warn", "crit")
# Order used to pick the "worst" of several severities. unknown ranks below warn: an
# unreadable value must not outrank a real fault, but it does outrank ok.
SEVERITY_RANK = {"ok": 0, "info": 1, "unknown": 2, "warn": 3, "crit": 4}

# A node's health, best to worst: the ONE order behind the audit's exit code
# (``checks.verdict.exit_code`` through ``common.errors.AUDIT_EXIT``), the Prometheus
# ``fleetops_node_health`` value (the level's index here: 0 ok, 1 unknown, 2 warn, 3 crit,
# 4 unreachable) and the audit JSON's ``summary.worst`` and ``nodes[].health``. The finding
# severities keep SEVERITY_RANK's order (``info`` counts as ``ok`` here); ``unreachable`` is the
# node no snapshot came from (a ``transport.*`` finding: down, hung, no agent, refused
# credentials, unusable output). It ranks worst: nothing is known of that node, so no warning or
# critical finding elsewhere may hide it, and the Prometheus values of the other levels stay.
UNREACHABLE = "unreachable"
HEALTH_ORDER = ("ok", "unknown", "warn", "crit", UNREACHABLE)
HEALTH_RANK = {level: i for i, level in enumerate(HEALTH_ORDER)}


@dataclass
class NvLink:
    link: int
    state: str | None = None  # "up" | "down" | None when unreadable
    remote_bus_id: str | None = None
    remote_type: str | None = None  # "gpu" | "switch" | "ibmnpu" | None
    crc_errors: int | None = None  # DL CRC flit errors
    replay_errors: int | None = None
    recovery_errors: int | None = None
    # Data payload moved over the link since the driver loaded (NVML's THROUGHPUT_DATA counters,
    # KiB, cumulative): only differences between two snapshots mean anything. Optional in
    # fleetops.snapshot/v1: snapshots written before these keys existed read as None.
    tx_kib: int | None = None
    rx_kib: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class GpuProcess:
    pid: int
    name: str | None = None
    used_memory_mib: int | None = None
    # The MIG instance the process runs in (NVML's process info, GPU instance and compute
    # instance ids); None outside MIG mode or when the driver does not say. Optional in
    # fleetops.snapshot/v1.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    # Who runs it: the name of the process's real uid (/proc/PID/status), the uid where it has
    # no name; None when it could not be read (the process ended between NVML's list and the
    # read, or an older agent). Optional in fleetops.snapshot/v1.
    user: str | None = None


@dataclass
class MigInstance:
    gpu_instance_id: int
    compute_instance_id: int | None = None
    profile: str | None = None  # e.g. "1g.18gb"
    uuid: str | None = None
    in_use: bool = False


@dataclass
class XidEvent:
    code: int
    bus_id: str | None = None  # normalised 0000:bb:dd.f, None when the line did not say
    gpu_uuid: str | None = None  # filled by the collector when the bus id maps to a GPU
    gpu_index: int | None = None
    pid: int | None = None
    process_name: str | None = None
    message: str = ""
    timestamp: float | None = None  # epoch seconds when known
    uptime_s: float | None = None  # dmesg "[  123.456]" form
    source: str = "kernel"  # "dmesg" | "journal" | "sim" | "kernel"
    raw: str = ""
    # The ids of the jobs on this GPU (or one of its MIG instances) at the XID's time, from the
    # node's job records (``fleetops.jobs``); set only by the daemon, None when not attributed
    # (a cold collect, an XID without a wall-clock time). Optional in fleetops.snapshot/v1.
    jobs: list[str] | None = None


@dataclass
class Gpu:
    index: int
    uuid: str
    bus_id: str
    name: str | None = None
    serial: str | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    inforom_image: str | None = None
    inforom_oem: str | None = None
    gsp_firmware: str | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None  # "Default" | "Exclusive_Process" | "Prohibited"
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_min_limit_w: float | None = None
    power_max_limit_w: float | None = None
    power_enforced_limit_w: float | None = None
    temp_gpu_c: float | None = None
    temp_memory_c: float | None = None
    temp_slowdown_c: float | None = None
    temp_shutdown_c: float | None = None
    temp_memory_max_c: float | None = None
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    clocks_event_mask: int | None = None
    clocks_event_reasons: list[str] | None = None  # decoded names, see catalog.throttle
    utilization_gpu_pct: int | None = None
    utilization_mem_pct: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    ecc_mode_current: bool | None = None
    ecc_mode_pending: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_counter: int | None = None
    nvlinks: list[NvLink] | None = None
    mig_mode_current: bool | None = None
    mig_mode_pending: bool | None = None
    mig_instances: list[MigInstance] | None = None
    processes: list[GpuProcess] | None = None
    fabric_state: str | None = None  # "completed" | "in_progress" | "not_started" | "not_supported"
    fabric_status: str | None = None  # "success" or the NVML error name
    cpu_affinity: str | None = None  # "0-55,112-167" list form
    numa_node: int | None = None
    recovery_action: str | None = None  # "none" | "gpu_reset" | "node_reboot" | "drain_p2p" | "drain_and_reset"
    # Epoch seconds of the last successful reset of this GPU that fleetops recorded (the agent's
    # reset journal; the simulator's resets): what ends an XID that holds until a reset. None:
    # none recorded, which proves nothing (a reset made outside fleetops is not seen). Optional
    # in fleetops.snapshot/v1.
    last_reset_at: float | None = None
    # The device file's minor number (``/dev/nvidia<minor>``, NVML's nvmlDeviceGetMinorNumber):
    # what Slurm's gres.conf names a GPU by. It can differ from ``index``; job attribution
    # (``fleetops.jobs``) resolves by it, never by index. Optional in fleetops.snapshot/v1.
    minor_number: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def nvlinks_up(self) -> int | None:
        if self.nvlinks is None:
            return None
        return sum(1 for link in self.nvlinks if link.state == "up")


@dataclass
class Topology:
    """GPU-to-GPU link matrix in ``nvidia-smi topo -m`` vocabulary ("X", "NV18", "SYS", "NODE",
    "PHB", "PXB", "PIX") indexed like ``gpus`` (bus ids), NVLink counts, and GPU-to-NUMA."""

    gpus: list[str] = field(default_factory=list)
    links: list[list[str | None]] = field(default_factory=list)
    nvlink_counts: list[list[int | None]] = field(default_factory=list)
    numa: dict[str, int | None] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class HcaPort:
    """One port of an RDMA device, as sysfs writes it (``/sys/class/infiniband/<dev>/ports/<n>``).
    ``state``, ``phys_state`` and ``rate`` are kept as written ("4: ACTIVE", "5: LinkUp",
    "400 Gb/sec (4X NDR)"); ``rate_gbps`` and ``width`` ("4X") are read from ``rate``. Counters are
    exact integers by their sysfs file name; a counter that could not be read is absent from the
    mapping and named in ``unavailable`` as ``counters.<name>`` (or ``hw_counters.<name>``)."""

    port: int
    state: str | None = None
    phys_state: str | None = None
    rate: str | None = None
    rate_gbps: float | None = None
    width: str | None = None
    link_layer: str | None = None  # "InfiniBand" | "Ethernet"
    netdev: str | None = None  # "ibp25s0", "enp1s0f0np0"
    counters: dict[str, int] | None = None
    hw_counters: dict[str, int] | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return (self.state or "").split(":")[0].strip() == "4"


@dataclass
class Hca:
    """One RDMA device (``mlx5_0``): its PCI function, firmware and ports, and the GPUs that sit
    behind the same PCIe switch (bus ids; ``[]`` none, None not known)."""

    name: str
    pci_address: str | None = None
    numa_node: int | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    node_guid: str | None = None
    hca_type: str | None = None
    # The PCI functions from the root port down to this device (bus ids), from the ``device``
    # link's target: what places it under a PCIe switch.
    pci_path: list[str] | None = None
    gpus: list[str] | None = None
    ports: list[HcaPort] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class Fabric:
    """The node's RDMA devices (InfiniBand and RoCE), read from sysfs only. ``hcas`` None: the
    device class could not be listed (the reason in ``unavailable``); ``[]`` with ``note``: the
    node has none."""

    hcas: list[Hca] | None = field(default_factory=list)
    note: str | None = None
    # GPU bus id -> the PCIe switch it sits behind (its upstream port's bus id), None on a root
    # port; a GPU whose PCI path could not be read is absent. What "no HCA on its switch" is
    # judged by.
    gpu_switches: dict[str, str | None] = field(default_factory=dict)
    # Epoch seconds the ports were read: what counter rates are taken over (the daemon's rate base
    # is an older full snapshot whose fabric was read at its own time, not at the ring sample's).
    read_at: float | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass
class NodeJob:
    """A job on the node as its record (``fleetops.jobs.record``) gives it: the daemon lists the
    jobs running now and those that ended within its window (``ended_at`` set). ``gpus`` are the
    job's devices by UUID: the GPU's, or the MIG device's for a MIG instance."""

    job_id: str
    uid: int | None = None
    user: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    gpus: list[str] = field(default_factory=list)
    cgroup: str | None = None
    cpus: int | None = None


@dataclass
class Node:
    hostname: str
    schema: str = SCHEMA_ID
    backend: str = "unknown"  # "nvml" | "sim"
    collected_at: float = 0.0  # epoch seconds
    collect_ms: float | None = None
    kernel: str | None = None
    os: str | None = None
    uptime_s: float | None = None
    driver_version: str | None = None
    # The build branch NVML names (nvmlSystemGetDriverBranch, "r582_49" for 580.159.04 on the real
    # H200); None where the driver or nvidia-ml-py lacks the call (the reason is in unavailable).
    # Shown, not compared: the branch checks take driver_version's major number.
    driver_branch: str | None = None
    cuda_driver_version: str | None = None  # "13.0"
    nvml_version: str | None = None
    services: dict[str, str | None] = field(default_factory=dict)  # unit -> "active" | "inactive" | ...
    packages: dict[str, str] = field(default_factory=dict)  # installed NVIDIA packages -> version
    # driver packages -> who built them: dpkg's Maintainer, rpm's Vendor (the driver's flavour)
    package_origins: dict[str, str] = field(default_factory=dict)
    # nvmlDeviceGetCount: every GPU the driver attached, a lost one included (it keeps its index
    # until the driver reloads; see ``gpu_lost``)
    gpu_count: int | None = None
    gpus: list[Gpu] = field(default_factory=list)
    topology: Topology | None = None
    xids: list[XidEvent] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # Set only in snapshots served by ``fleetops-agent serve``: age_s, interval_s, started_at,
    # rate_since (the rate base's time), degraded, reason, lost, findings, xid_counts,
    # xid_events; absent from a cold collect.
    daemon: dict[str, Any] | None = None
    # The RDMA devices beside the GPUs (``fabric/``). Optional in fleetops.snapshot/v1: None in a
    # snapshot written before it existed.
    fabric: Fabric | None = None
    # The jobs on the node (``NodeJob``), set only by the daemon from the job records; None in a
    # cold collect and in a snapshot written before it existed. Optional in fleetops.snapshot/v1.
    jobs: list[NodeJob] | None = None

    def gpu_by_bus_id(self, bus_id: str) -> Gpu | None:
        key = normalize_bus_id(bus_id)
        return next((g for g in self.gpus if g.bus_id == key), None)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


@dataclass
class Finding:
    check: str
    severity: str
    node: str
    message: str
    gpu: dict[str, Any] | None = None  # {"index", "uuid", "bus_id"} or None for node-level
    observed: Any = None
    expected: Any = None
    action: str | None = None
    # The HCA port a fabric finding is about ("mlx5_3/1"), or the HCA alone ("mlx5_3") for one
    # about the whole card (its firmware): a node's ports have no GPU to tell them apart.
    port: str | None = None
    # The ids of the Slurm jobs this finding hits, from the daemon's job records: for a fault seen
    # now, the jobs running on its GPU (or the GPU's MIG instances); for an XID, the jobs its
    # events carry (on the GPU at the XID's time, named also after they ended). None where the
    # snapshot has no job records (a cold collect) or the finding is on no GPU; [] where it has
    # them and no job was there.
    jobs: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "check": self.check,
            "severity": self.severity,
            "node": self.node,
            "gpu": self.gpu,
            "observed": self.observed,
            "expected": self.expected,
            "message": self.message,
            "action": self.action,
        }
        if self.port is not None:
            out["port"] = self.port  # only where set: every other finding's JSON stays as it was
        if self.jobs is not None:
            out["jobs"] = list(self.jobs)  # likewise: only where the node's job records were read
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check=data["check"],
            severity=data["severity"],
            node=data["node"],
            message=data.get("message", ""),
            gpu=data.get("gpu"),
            observed=data.get("observed"),
            expected=data.get("expected"),
            action=data.get("action"),
            port=data["port"] if "port" in data else cls._stored_port(data),
            jobs=_job_ids(data.get("jobs")),
        )

    @property
    def key(self) -> str:
        """Identity of a finding across audits (for new/resolved/persisting): node, check, GPU
        UUID and, for a fabric finding, its port, so two ports of one node are two findings."""
        gpu = (self.gpu or {}).get("uuid") or ""
        base = f"{self.node}|{self.check}|{gpu}"
        return f"{base}|{self.port}" if self.port is not None else base

    @staticmethod
    def _stored_port(data: dict[str, Any]) -> str | None:
        """The port of a fabric finding stored before findings carried one (its ``observed`` names
        the device and port), so an audit of the new version does not see it as resolved and new."""
        observed = data.get("observed")
        if not str(data.get("check", "")).startswith("fabric.") or not isinstance(observed, dict):
            return None
        device, port = observed.get("device"), observed.get("port")
        if not isinstance(device, str):
            return None
        return f"{device}/{port}" if isinstance(port, int) and not isinstance(port, bool) else device


def _job_ids(value: Any) -> list[str] | None:
    """A stored finding's ``jobs``: a list of job ids, None when absent or not a list."""
    if not isinstance(value, list):
        return None
    return [str(v) for v in value]


def running_jobs(node: Node) -> list[NodeJob] | None:
    """The jobs running on the node now (no ``ended_at``); None when the snapshot has no job
    records (a cold collect): unknown, never "none"."""
    if node.jobs is None:
        return None
    return [j for j in node.jobs if j.ended_at is None]


def gpu_jobs(node: Node, gpu_uuid: str | None) -> list[NodeJob] | None:
    """The jobs running now on the GPU ``gpu_uuid``, whole or on one of its MIG instances (a job
    names a MIG instance by its MIG device's UUID); None when the snapshot has no job records."""
    running = running_jobs(node)
    if running is None:
        return None
    if not gpu_uuid:
        return []
    devices = {gpu_uuid}
    gpu = node.gpu_by_uuid(gpu_uuid)
    if gpu is not None:
        devices.update(m.uuid for m in gpu.mig_instances or () if m.uuid)
    return [j for j in running if devices.intersection(j.gpus)]


def job_text(jobs: typing.Iterable[NodeJob]) -> str:
    """``1234 (alice), 1240`` for a person: each job id with its user where known."""
    return ", ".join(f"{j.job_id} ({j.user})" if j.user else j.job_id for j in jobs)


def gpu_ref(gpu: Gpu) -> dict[str, Any]:
    return {"index": gpu.index, "uuid": gpu.uuid, "bus_id": gpu.bus_id}


# The reason NVML gives for every query of a GPU that fell off the bus (NVML_ERROR_GPU_IS_LOST).
GPU_IS_LOST = "GpuIsLost"
FAULT_SEVERITIES = ("warn", "crit")


def gpu_lost(gpu: Gpu) -> bool:
    """Whether NVML answered GpuIsLost for this GPU: it stays in ``Node.gpus`` at its index, with
    what was read before the loss and every other value unavailable for that reason."""
    return GPU_IS_LOST in gpu.unavailable.values()


def gpu_tally(node: Node, findings: typing.Iterable[Finding]) -> tuple[int, int]:
    """(GPUs fit for work, GPUs the driver attached): the "n/m GPUs" every front end shows, from
    the snapshot and its findings alone, so the audit and the TUI agree. A lost GPU counts in m
    and never in n; so does a GPU with a warn or crit finding, and one the driver counted that
    could not be read at all (``gpu_count`` above the GPUs listed)."""
    bad = {f.gpu.get("uuid") for f in findings if f.gpu and f.severity in FAULT_SEVERITIES and f.gpu.get("uuid")}
    listed = len(node.gpus)
    ok = sum(1 for g in node.gpus if not gpu_lost(g) and g.uuid not in bad)
    return ok, max(listed, node.gpu_count or 0)


def worst(severities: typing.Iterable[str]) -> str:
    best = "ok"
    for sev in severities:
        if SEVERITY_RANK.get(sev, 0) > SEVERITY_RANK[best]:
            best = sev
    return best


def finding_health(finding: Finding) -> str:
    """The health level (HEALTH_ORDER) one finding gives its node."""
    if finding.check.startswith("transport."):
        return UNREACHABLE
    return "ok" if finding.severity == "info" else finding.severity


def worst_health(levels: typing.Iterable[str]) -> str:
    """The worst of several health levels (HEALTH_ORDER); ``ok`` for none."""
    out = "ok"
    for level in levels:
        if HEALTH_RANK.get(level, 0) > HEALTH_RANK[out]:
            out = level
    return out


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:18:00.0`` (NVML), ``0000:18:00.0`` (sysfs), ``18:00.0`` (kernel log) and
    ``PCI:0000:18:00`` (XID lines, no function) all become ``0000:18:00.0``."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, devfn = parts
    if "." not in devfn:
        devfn = f"{devfn}.0"
    dev, fn = devfn.split(".", 1)
    try:
        return f"{int(domain, 16) & 0xFFFF:04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError as exc:
        raise ValueError(f"not a PCI bus id: {bus_id!r}") from exc


# --- JSON (de)serialisation -------------------------------------------------------------


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_dict(obj: Any) -> Any:
    kind = type(obj)
    if kind is list:
        return [to_dict(x) for x in obj]
    if kind is dict:
        return {k: to_dict(v) for k, v in obj.items()}
    names = _FIELD_NAMES.get(kind)
    if names is None:
        if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
            return obj
        names = tuple(f.name for f in dataclasses.fields(obj))
        _FIELD_NAMES[kind] = names
    return {name: to_dict(getattr(obj, name)) for name in names}


def node_to_json(node: Node, pretty: bool = False) -> str:
    if pretty:
        return json.dumps(to_dict(node), indent=2, sort_keys=False)
    return json.dumps(to_dict(node), separators=(",", ":"))


def node_from_dict(data: Any) -> Node:
    if not isinstance(data, dict):
        raise SchemaError("snapshot: expected a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA_ID:
        raise SchemaError(f"snapshot.schema: expected {SCHEMA_ID!r}, got {schema!r}")
    node = build(Node, data, "snapshot")
    assert isinstance(node, Node)
    return node


def node_from_json(text: str) -> Node:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"snapshot: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    return node_from_dict(data)
