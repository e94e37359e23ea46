"""The exposition page: ``render`` turns one immutable ``MetricsInput`` into the text page,
the same input always the same page; ``write_textfile`` writes it for node_exporter."""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetops import model
from fleetops.catalog import throttle

DEFAULT_PORT = 9401
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Health values, shared with the audit's textfile so one alert expression reads both.
SEVERITY_VALUE = {"ok": 0, "info": 0, "unknown": 1, "warn": 2, "crit": 3}

# (uuid, bus_id, index, code) -> how many times that XID was seen on that GPU. uuid, bus_id and
# index are None when the kernel line named no GPU the node knows.
XidKey = tuple[str | None, str | None, int | None, int]

# XID codes exported at 0 for every GPU before they first happen, so that ``increase()`` in the
# shipped alert rules sees the first event too (a series that appears at 1 has no increase):
# the fatal ones (79 fell off the bus, 119/120 GSP), 48 (DBE), 63/64 (row remap), 74 (NVLink),
# 94/95 (contained/uncontained), 31 (MMU fault, alerted on repeats) and 13.
PRESET_XIDS = (13, 31, 48, 63, 64, 74, 79, 94, 95, 119, 120)

_TOKEN = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_CHECK_ID = re.compile(r"^[a-z][a-z0-9_.]{0,79}$")


_VERSION: list[str] = []


def _fleetops_version() -> str:
    """The installed distribution's version, found as ``importlib.metadata`` finds it (the first
    ``fleetops-*.dist-info`` or ``fleetops.egg-info`` on ``sys.path``) without importing it;
    looked up once per process."""
    if not _VERSION:
        _VERSION.append(_find_version())
    return _VERSION[0]


def _find_version() -> str:
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in sorted(names):
            if name.startswith("fleetops-") and name.endswith(".dist-info"):
                meta = os.path.join(entry, name, "METADATA")
            elif name == "fleetops.egg-info":
                meta = os.path.join(entry, name, "PKG-INFO")
            else:
                continue
            try:
                with open(meta, encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip() or "unknown"
                        if not line.strip():
                            break  # the headers end at the first blank line
            except OSError:
                continue
    return "unknown"


@dataclass(frozen=True)
class AgentInfo:
    """The daemon's own state. ``reason`` should be a short token (``nvml_hang``,
    ``driver_unloaded``); anything else is exported as ``other`` so no free text becomes a
    label value."""

    started_at: float  # epoch seconds
    interval_s: float
    degraded: bool = False
    reason: str | None = None
    sample_age_s: float | None = None  # None before the first sample


@dataclass(frozen=True)
class MetricsInput:
    """Everything one page is rendered from. Mappings and lists given to the constructor are
    copied, so a page cannot change under a scrape when the daemon updates its own state."""

    node: model.Node
    agent: AgentInfo
    findings: tuple[model.Finding, ...] = ()
    xid_counts: Mapping[XidKey, int] = field(default_factory=dict)
    # (uuid, "tx"|"rx") -> bytes since driver load, and (uuid, link, "tx"|"rx") -> bytes, where
    # the daemon reads the throughput counters the snapshot does not carry.
    pcie_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    nvlink_bytes: Mapping[tuple[str, int, str], int] = field(default_factory=dict)
    version: str = field(default_factory=_fleetops_version)
    # The node's compute RDMA ports ("<dev>/<port>"), as the checks judged them under the daemon's
    # baseline (fleetops.checks.fabric.ports); None: by the checks' default rule (no baseline).
    compute_ports: frozenset[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", tuple(self.findings))
        for name in ("xid_counts", "pcie_bytes", "nvlink_bytes"):
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))
        if self.compute_ports is not None:
            object.__setattr__(self, "compute_ports", frozenset(self.compute_ports))


def xid_counts_from_events(events: Iterable[model.XidEvent]) -> dict[XidKey, int]:
    """Counts per GPU and code, every event counted (repeats too): for a backfill from the
    kernel log, and for a daemon that adds one event at a time with ``count_xid``."""
    counts: dict[XidKey, int] = {}
    for event in events:
        count_xid(counts, event)
    return counts


def count_xid(counts: dict[XidKey, int], event: model.XidEvent) -> None:
    key: XidKey = (event.gpu_uuid, event.bus_id, event.gpu_index, int(event.code))
    counts[key] = counts.get(key, 0) + 1


# --- text format -------------------------------------------------------------------------


def escape_label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, object]]) -> str:
    body = ",".join(f'{k}="{escape_label(v)}"' for k, v in pairs)
    return "{" + body + "}" if body else ""


def _number(value: float | int) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    return repr(float(value))


class _Page:
    """Families in a fixed order; a family with no sample is left out entirely."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def family(self, name: str, kind: str, help_text: str) -> list[str]:
        if name not in self._families:
            self._families[name] = (kind, help_text, [])
        return self._families[name][2]

    def add(self, name: str, kind: str, help_text: str, labels: Iterable[tuple[str, object]],
            value: float | int | bool | None) -> None:
        samples = self.family(name, kind, help_text)
        if value is None:
            return
        samples.append(f"{name}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        out: list[str] = []
        for name, (kind, help_text, samples) in self._families.items():
            if not samples:
                continue
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


def _gpu_labels(gpu: model.Gpu) -> list[tuple[str, object]]:
    return [("gpu", gpu.index), ("uuid", gpu.uuid), ("bus_id", gpu.bus_id)]


def _scaled(value: float | int | None, factor: float) -> float | None:
    return None if value is None else float(value) * factor


MIB = 1024 * 1024
MHZ = 1_000_000

# Per-GPU gauges read straight from the snapshot: (metric, field, scale, help).
_GPU_GAUGES: tuple[tuple[str, str, float, str], ...] = (
    ("fleetops_gpu_temperature_celsius", "temp_gpu_c", 1.0, "GPU core temperature."),
    ("fleetops_gpu_memory_temperature_celsius", "temp_memory_c", 1.0, "HBM temperature."),
    ("fleetops_gpu_slowdown_temperature_celsius", "temp_slowdown_c", 1.0,
     "Temperature at which the GPU slows its clocks."),
    ("fleetops_gpu_power_draw_watts", "power_draw_w", 1.0, "Power draw."),
    ("fleetops_gpu_power_limit_watts", "power_limit_w", 1.0, "Configured power limit."),
    ("fleetops_gpu_power_default_limit_watts", "power_default_limit_w", 1.0, "Default power limit."),
    ("fleetops_gpu_sm_clock_hertz", "clock_sm_mhz", MHZ, "Current SM clock."),
    ("fleetops_gpu_sm_clock_max_hertz", "clock_sm_max_mhz", MHZ, "Maximum SM clock."),
    ("fleetops_gpu_memory_clock_hertz", "clock_mem_mhz", MHZ, "Current memory clock."),
    ("fleetops_gpu_utilization_ratio", "utilization_gpu_pct", 0.01,
     "Fraction of the last sample period a kernel ran (0-1)."),
    ("fleetops_gpu_memory_utilization_ratio", "utilization_mem_pct", 0.01,
     "Fraction of the last sample period memory was read or written (0-1)."),
    ("fleetops_gpu_memory_used_bytes", "memory_used_mib", MIB, "Framebuffer memory in use."),
    ("fleetops_gpu_memory_total_bytes", "memory_total_mib", MIB, "Framebuffer memory in all."),
    ("fleetops_gpu_remapped_rows_corrected", "remapped_rows_corrected", 1.0,
     "Rows remapped for correctable errors."),
    ("fleetops_gpu_remapped_rows_uncorrected", "remapped_rows_uncorrected", 1.0,
     "Rows remapped for uncorrectable errors."),
    ("fleetops_gpu_remapped_rows_pending", "remapped_rows_pending", 1.0,
     "1 when a row remap waits for a GPU reset."),
    ("fleetops_gpu_remapped_rows_failure", "remapped_rows_failure", 1.0, "1 when a row remap failed."),
    ("fleetops_gpu_retired_pages_pending", "retired_pages_pending", 1.0,
     "1 when a retired page waits for a GPU reset."),
    ("fleetops_gpu_pcie_link_gen", "pcie_gen_current", 1.0, "Current PCIe link generation."),
    ("fleetops_gpu_pcie_link_gen_max", "pcie_gen_max", 1.0, "Maximum PCIe link generation."),
    ("fleetops_gpu_pcie_link_width", "pcie_width_current", 1.0, "Current PCIe link width in lanes."),
    ("fleetops_gpu_pcie_link_width_max", "pcie_width_max", 1.0, "Maximum PCIe link width in lanes."),
)

# Per-GPU counters from the snapshot (monotonic since driver load or, aggregate, for life).
_GPU_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("fleetops_gpu_ecc_corrected_volatile_errors_total", "ecc_corrected_volatile",
     "Correctable (single-bit) ECC errors since the driver loaded."),
    ("fleetops_gpu_ecc_uncorrected_volatile_errors_total", "ecc_uncorrected_volatile",
     "Uncorrectable (double-bit) ECC errors since the driver loaded."),
    ("fleetops_gpu_ecc_corrected_aggregate_errors_total", "ecc_corrected_aggregate",
     "Correctable ECC errors over the GPU's life."),
    ("fleetops_gpu_ecc_uncorrected_aggregate_errors_total", "ecc_uncorrected_aggregate",
     "Uncorrectable ECC errors over the GPU's life."),
    ("fleetops_gpu_retired_pages_sbe_total", "retired_pages_sbe", "Pages retired for single-bit errors."),
    ("fleetops_gpu_retired_pages_dbe_total", "retired_pages_dbe", "Pages retired for double-bit errors."),
    ("fleetops_gpu_pcie_replays_total", "pcie_replay_counter", "PCIe replays since the driver loaded."),
)

_NVLINK_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("fleetops_gpu_nvlink_crc_errors_total", "crc_errors", "NVLink data-link CRC (flit) errors."),
    ("fleetops_gpu_nvlink_replay_errors_total", "replay_errors", "NVLink replays."),
    ("fleetops_gpu_nvlink_recovery_errors_total", "recovery_errors", "NVLink recoveries."),
)


# Per RDMA port (labels device, port and role only: bounded by the node's HCAs), from the
# snapshot's fabric: (metric, counters folder, counter, scale, help). port_*_data counts 4-octet
# words. ``role`` is ``compute`` for a compute port and ``excluded`` for any other (management,
# storage), by the checks' own rule (``fleetops.checks.fabric.ports``), so that an alert rule can
# leave out the ports the checks never drain a node for.
_RDMA_COUNTERS: tuple[tuple[str, str, str, int, str], ...] = (
    ("fleetops_rdma_port_transmit_bytes_total", "counters", "port_xmit_data", 4, "Data sent by the port."),
    ("fleetops_rdma_port_receive_bytes_total", "counters", "port_rcv_data", 4, "Data received by the port."),
    ("fleetops_rdma_port_link_downed_total", "counters", "link_downed", 1,
     "Times the port's link went down (link_downed)."),
    ("fleetops_rdma_port_link_error_recovery_total", "counters", "link_error_recovery", 1,
     "Link error recoveries (link_error_recovery)."),
    ("fleetops_rdma_port_symbol_errors_total", "counters", "symbol_error", 1, "Symbol errors (symbol_error)."),
    ("fleetops_rdma_port_receive_errors_total", "counters", "port_rcv_errors", 1, "Received packets with errors."),
    ("fleetops_rdma_port_transmit_discards_total", "counters", "port_xmit_discards", 1, "Packets discarded on send."),
    ("fleetops_rdma_port_excessive_buffer_overrun_errors_total", "counters", "excessive_buffer_overrun_errors", 1,
     "Excessive buffer overruns."),
    ("fleetops_rdma_port_local_link_integrity_errors_total", "counters", "local_link_integrity_errors", 1,
     "Local link integrity errors."),
    ("fleetops_rdma_port_rnr_nak_retry_errors_total", "hw_counters", "rnr_nak_retry_err", 1,
     "RNR NAK retries exceeded (hw_counters/rnr_nak_retry_err)."),
)


ROLE_COMPUTE, ROLE_EXCLUDED = "compute", "excluded"


def _compute_ports(node: model.Node) -> frozenset[str]:
    """The compute ports by the checks' rule without a baseline (the daemon passes its own)."""
    from fleetops.checks import fabric as fabric_checks  # only for a page with RDMA ports

    compute, _ = fabric_checks.port_labels(node, None)
    return frozenset(compute)


def _rdma(page: _Page, node: model.Node, compute_ports: frozenset[str] | None) -> None:
    """The node's RDMA ports: up, rate, counters; each HCA's firmware as an info series."""
    fabric = node.fabric
    hcas = (fabric.hcas if fabric is not None else None) or []
    if hcas and compute_ports is None:
        compute_ports = _compute_ports(node)
    compute = compute_ports or frozenset()

    def port_labels(hca: model.Hca, port: model.HcaPort) -> tuple[tuple[str, object], ...]:
        role = ROLE_COMPUTE if f"{hca.name}/{port.port}" in compute else ROLE_EXCLUDED
        return (("device", hca.name), ("port", port.port), ("role", role))

    page.family("fleetops_rdma_hca_info", "gauge", "1 per RDMA device, with its firmware and board.")
    page.family("fleetops_rdma_port_up", "gauge",
                "1 when the RDMA port is ACTIVE (role: compute, or excluded from the checks' drains).")
    page.family("fleetops_rdma_port_rate_bytes_per_second", "gauge", "The rate the port trained to.")
    for hca in hcas:
        page.add("fleetops_rdma_hca_info", "gauge", "", (("device", hca.name), ("fw_ver", hca.fw_ver or ""),
                                                          ("board_id", hca.board_id or "")), 1)
        for port in hca.ports:
            labels = port_labels(hca, port)
            page.add("fleetops_rdma_port_up", "gauge", "", labels, None if port.state is None else port.active)
            page.add("fleetops_rdma_port_rate_bytes_per_second", "gauge", "", labels,
                     None if port.rate_gbps is None else port.rate_gbps * 1e9 / 8)
    for metric, group, name, scale, help_text in _RDMA_COUNTERS:
        page.family(metric, "counter", help_text)
        for hca in hcas:
            for port in hca.ports:
                value = (getattr(port, group) or {}).get(name)
                page.add(metric, "counter", help_text, port_labels(hca, port),
                         None if value is None else int(value) * scale)


def _label_value(value: str, pattern: re.Pattern[str]) -> str:
    return value if pattern.match(value) else "other"


def render(state: MetricsInput) -> str:
    """The exposition page for one node: agent, build, health, findings, XIDs, telemetry."""
    page = _Page()
    node, agent = state.node, state.agent
    page.add("fleetops_agent_up", "gauge", "1 while the agent answers.", (), 1)
    page.add("fleetops_agent_build_info", "gauge", "fleetops version and NVIDIA driver of this node.",
             (("version", state.version), ("driver", node.driver_version or "")), 1)
    page.add("fleetops_agent_start_time_seconds", "gauge", "When the agent started (epoch seconds).",
             (), agent.started_at)
    page.add("fleetops_agent_sample_interval_seconds", "gauge", "Configured sampling interval.",
             (), agent.interval_s)
    page.add("fleetops_agent_degraded", "gauge",
             "1 when the agent cannot sample everything (reason in fleetops_agent_degraded_reason).",
             (), agent.degraded)
    if agent.degraded:
        page.add("fleetops_agent_degraded_reason", "gauge", "Why the agent is degraded (1 for the reason).",
                 (("reason", _label_value(agent.reason or "unknown", _TOKEN)),), 1)
    page.add("fleetops_agent_last_sample_age_seconds", "gauge", "Age of the snapshot served.",
             (), agent.sample_age_s)
    page.add("fleetops_node_collected_timestamp_seconds", "gauge", "When the snapshot was taken (epoch seconds).",
             (), node.collected_at)
    # the GPUs that answer: a lost GPU stays listed at its index (NVML counts it) and one NVML
    # could not name is counted but not listed; neither is counted here, so FleetopsGpuMissing
    # sees the drop
    page.add("fleetops_node_gpus", "gauge", "GPUs the driver enumerates.", (),
             sum(1 for g in node.gpus if not model.gpu_lost(g)))

    gpu_sev: dict[str, list[str]] = {g.uuid: [] for g in node.gpus}
    node_findings: set[tuple[str, str]] = set()
    gpu_findings: set[tuple[str, str, int, str, str]] = set()
    for finding in state.findings:
        if finding.severity not in SEVERITY_VALUE or finding.severity == "ok":
            continue
        check = _label_value(finding.check, _CHECK_ID)
        ref = finding.gpu or {}
        uuid = ref.get("uuid")
        if not uuid:
            node_findings.add((check, finding.severity))
            continue
        # a GPU the snapshot no longer lists (lost, missing) keeps the identity the finding gives it
        gpu_findings.add((check, finding.severity, int(ref.get("index") or 0), str(uuid),
                          str(ref.get("bus_id") or "")))
        if uuid in gpu_sev:
            gpu_sev[uuid].append(finding.severity)
    all_sev = [f.severity for f in state.findings if f.severity in SEVERITY_VALUE]
    page.add("fleetops_node_health", "gauge", "Worst finding on the node: 0 ok, 1 unknown, 2 warn, 3 crit.",
             (), SEVERITY_VALUE[model.worst(all_sev)])
    for gpu in node.gpus:
        page.add("fleetops_gpu_health", "gauge", "Worst finding on the GPU: 0 ok, 1 unknown, 2 warn, 3 crit.",
                 _gpu_labels(gpu), SEVERITY_VALUE[model.worst(gpu_sev[gpu.uuid])])
    page.family("fleetops_node_finding", "gauge", "1 for each node-level finding, by check and severity.")
    for check, sev in sorted(node_findings):
        page.add("fleetops_node_finding", "gauge", "", (("check", check), ("severity", sev)), 1)
    page.family("fleetops_gpu_finding", "gauge", "1 for each GPU finding, by check and severity.")
    for check, sev, index, uuid, bus_id in sorted(gpu_findings):
        page.add("fleetops_gpu_finding", "gauge", "",
                 (("check", check), ("severity", sev), ("gpu", index), ("uuid", uuid), ("bus_id", bus_id)), 1)

    page.family("fleetops_gpu_xid_total", "counter", "XID events seen, every one counted, repeats too.")
    xid_counts = dict(state.xid_counts)
    seen = {(key[0], key[3]) for key in xid_counts}
    for gpu in node.gpus:
        for preset in PRESET_XIDS:
            if (gpu.uuid, preset) not in seen:
                xid_counts[(gpu.uuid, gpu.bus_id, gpu.index, preset)] = 0
    for (x_uuid, x_bus_id, x_index, code), count in sorted(
        xid_counts.items(), key=lambda kv: (kv[0][2] if kv[0][2] is not None else -1, str(kv[0][1]), kv[0][3])
    ):
        labels = (("gpu", "" if x_index is None else x_index), ("uuid", x_uuid or ""), ("bus_id", x_bus_id or ""),
                  ("code", int(code)))
        page.add("fleetops_gpu_xid_total", "counter", "", labels, int(count))

    for metric, attr, scale, help_text in _GPU_GAUGES:
        page.family(metric, "gauge", help_text)
        for gpu in node.gpus:
            page.add(metric, "gauge", help_text, _gpu_labels(gpu), _scaled(getattr(gpu, attr), scale))
    for metric, attr, help_text in _GPU_COUNTERS:
        page.family(metric, "counter", help_text)
        for gpu in node.gpus:
            page.add(metric, "counter", help_text, _gpu_labels(gpu), getattr(gpu, attr))
    reason_help = "1 while the clocks-event (throttle) reason is active, by NVML's reason name."
    page.family("fleetops_gpu_clocks_event_active", "gauge", reason_help)
    for gpu in node.gpus:
        if gpu.clocks_event_mask is None:
            continue
        for bit, name in throttle.REASON_BITS.items():
            page.add("fleetops_gpu_clocks_event_active", "gauge", reason_help,
                     [*_gpu_labels(gpu), ("reason", name)], bool(gpu.clocks_event_mask & bit))

    by_uuid = {g.uuid: g for g in node.gpus}
    page.family("fleetops_gpu_nvlink_up", "gauge", "1 when the NVLink is up; absent while the GPU is in MIG mode.")
    for gpu in node.gpus:
        if gpu.mig_mode_current:
            continue  # NVML reports every link down under MIG, by design: no series, so no NvlinkDown alert
        for link in gpu.nvlinks or []:
            up = None if link.state is None else link.state == "up"
            page.add("fleetops_gpu_nvlink_up", "gauge", "", [*_gpu_labels(gpu), ("link", link.link)], up)
    for metric, attr, help_text in _NVLINK_COUNTERS:
        page.family(metric, "counter", help_text)
        for gpu in node.gpus:
            for link in gpu.nvlinks or []:
                page.add(metric, "counter", help_text, [*_gpu_labels(gpu), ("link", link.link)],
                         getattr(link, attr))
    page.family("fleetops_gpu_pcie_bytes_total", "counter", "Bytes over PCIe, by direction (tx, rx).")
    for (uuid, direction), value in sorted(state.pcie_bytes.items()):
        if uuid in by_uuid and direction in ("tx", "rx"):
            page.add("fleetops_gpu_pcie_bytes_total", "counter", "",
                     [*_gpu_labels(by_uuid[uuid]), ("direction", direction)], int(value))
    page.family("fleetops_gpu_nvlink_bytes_total", "counter", "Bytes over an NVLink, by direction (tx, rx).")
    for (uuid, link_no, direction), value in sorted(state.nvlink_bytes.items()):
        if uuid in by_uuid and direction in ("tx", "rx"):
            page.add("fleetops_gpu_nvlink_bytes_total", "counter", "",
                     [*_gpu_labels(by_uuid[uuid]), ("link", int(link_no)), ("direction", direction)], int(value))
    _jobs(page, node)
    _rdma(page, node, state.compute_ports)
    return page.text()


def _jobs(page: _Page, node: model.Node) -> None:
    """``fleetops_gpu_job_info``: 1 per (GPU, job) for the jobs running now; a series goes when
    its job ends, so the count is bounded by the jobs a node can run at once. No per-GPU series
    carries a job label (that multiplies every series by the jobs: join on ``uuid`` instead). A MIG
    job is on its GPU's series (``uuid`` is the GPU's)."""
    help_text = "1 for each job running on the GPU now (a MIG job on its GPU), by Slurm job id and user."
    page.family("fleetops_gpu_job_info", "gauge", help_text)
    owner: dict[str, model.Gpu] = {}
    for gpu in node.gpus:
        owner[gpu.uuid] = gpu
        for inst in gpu.mig_instances or []:
            if inst.uuid:
                owner[inst.uuid] = gpu
    rows: set[tuple[int, str, str, str]] = set()
    for job in node.jobs or []:
        if job.ended_at is not None:
            continue
        for device in job.gpus:
            held = owner.get(device)
            if held is not None:
                rows.add((held.index, held.uuid, job.job_id, job.user or ""))
    for index, uuid, job_id, user in sorted(rows, key=lambda r: (r[0], int(r[2]) if r[2].isdigit() else 0, r[2])):
        page.add("fleetops_gpu_job_info", "gauge", help_text,
                 (("uuid", uuid), ("gpu", index), ("job", job_id), ("user", user)), 1)


def write_textfile(path: str, text: str) -> None:
    """node_exporter's textfile collector reads every ``*.prom`` of its folder at each scrape:
    write ``NAME.prom.tmp`` beside it and rename, so it never reads half a file."""
    import tempfile  # only here: the daemon without a textfile does not pay for it

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
