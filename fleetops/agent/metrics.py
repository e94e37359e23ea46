"""The node agent's Prometheus exposition: one text page rendered from one immutable input.

The resident daemon builds a ``MetricsInput`` from its latest snapshot, the findings of the
shared checks and its XID counters, and serves ``render(...)`` over ``start_server`` (or writes
it as a node_exporter textfile with ``write_textfile``). Nothing here keeps state: the same input
always renders the same page, and the HTTP server only reads.

Naming follows what ``promtool check metrics`` enforces: counters end in ``_total``, gauges do
not, values are in base units (seconds, bytes, hertz, watts, celsius, ratios). Label values are
bounded: GPU identity, check ids, severities, XID codes, link numbers, clocks-event reason names.
No process, job or message text ever becomes a label, so the series count stays fixed per node.

Standard library only, and little of it: the daemon imports this and must stay small, so the
endpoint is written over ``socketserver`` (``http.server`` and ``importlib.metadata`` would
add about 6 MiB of modules to the daemon's resident size for what it needs). It is built to be
held by nobody: a deadline for the whole request, idle and slow clients read by one thread
without a thread each, caps on both, and TLS and basic auth from the exporters' web-config file
(``fleetops.agent.webconfig``, imported with ``ssl`` and ``bcrypt`` only when configured).
"""

from __future__ import annotations

import errno
import os
import re
import selectors
import socket
import socketserver
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetops import model
from fleetops.catalog import throttle

if TYPE_CHECKING:
    from fleetops.agent import webconfig

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "findings", tuple(self.findings))
        for name in ("xid_counts", "pcie_bytes", "nvlink_bytes"):
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))


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
    return page.text()


# --- serving -----------------------------------------------------------------------------

_INDEX = (
    "<html><head><title>fleetops-agent</title></head><body>"
    '<h1>fleetops-agent</h1><p><a href="/metrics">/metrics</a></p></body></html>\n'
)


_STATUS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}
_MAX_HEADER_LINES = 100
_MAX_HEAD = 16384  # request line and headers together
_MAX_BODY = 65536
_TEXT = "text/plain; charset=utf-8"

# How long a client may take, in all, to send its request (TLS handshake, request line, headers,
# body), and then to take the answer. Counted from the accept, not per byte: a client trickling
# one byte a second is dropped when its time is up. A scrape sends its request in milliseconds.
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
# Requests answered at once, each on a thread of its own (node_exporter's --web.max-requests is
# 40); a request past it is answered 503. Prometheus keeps one scrape per target in flight.
MAX_CONNECTIONS = 40
# Connections still sending their request, read together by one thread without a thread each;
# past it, a new connection is answered 503 (closed, under TLS) at once by the accepting thread.
MAX_PENDING = 256
# Accepted-but-not-yet-served connections the kernel queues (it caps this at net.core.somaxconn).
LISTEN_BACKLOG = 1024

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nServer: fleetops-agent\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 24\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many connections now\n")


class _Timeout(Exception):
    """The client's time is up (or it went away): no answer."""


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        sock.settimeout(left)
        try:
            sent = sock.send(view)
        except TimeoutError:
            raise _Timeout from None
        view = view[sent:]


@dataclass
class _Request:
    method: str
    target: str
    headers: dict[str, str]


def _parse_head(head: bytes) -> _Request | int:
    """The request, or the status that refuses it."""
    lines = head.decode("latin-1").split("\n")
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        return 400
    if len(lines) > _MAX_HEADER_LINES + 1:
        return 431
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    return _Request(words[0], words[1], headers)


class _Pending:
    """One connection still sending its request: read without blocking by the reader thread."""

    __slots__ = ("server", "sock", "guard", "deadline", "handshaking", "buf", "head", "body_left", "events")

    def __init__(self, server: MetricsServer, sock: Any, guard: webconfig.Guard | None, deadline: float,
                 handshaking: bool) -> None:
        self.server = server
        self.sock = sock
        self.guard = guard
        self.deadline = deadline
        self.handshaking = handshaking
        self.buf = b""
        self.head: bytes | None = None
        self.body_left = 0
        self.events = selectors.EVENT_READ

    def step(self) -> bool | None:
        """Read what is there. True: the request is whole; False: wait for more; None: drop it."""
        if self.handshaking:
            import ssl

            try:
                self.sock.do_handshake()
            except ssl.SSLWantReadError:
                self.events = selectors.EVENT_READ
                return False
            except ssl.SSLWantWriteError:
                self.events = selectors.EVENT_WRITE
                return False
            except OSError:
                return None
            self.handshaking = False
            self.events = selectors.EVENT_READ
        while True:
            try:
                chunk = self.sock.recv(16384)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:  # ssl's want-read/want-write are OSErrors too
                name = type(exc).__name__
                if name == "SSLWantReadError":
                    self.events = selectors.EVENT_READ
                    return False
                if name == "SSLWantWriteError":
                    self.events = selectors.EVENT_WRITE
                    return False
                return None
            if not chunk:  # closed, or half-closed after a request line
                if self.head is None and b"\n" in self.buf.lstrip():
                    self.head, self.buf = self.buf, b""
                return True if self.head is not None else None
            if self.head is None:
                self.buf += chunk
                if not self._head_found():
                    if len(self.buf) > _MAX_HEAD:
                        self.head = b""  # refused as too long
                        return True
                    continue
                if self.body_left <= 0:
                    return True
            else:
                self.body_left -= len(chunk)
                if self.body_left <= 0:
                    return True

    def _head_found(self) -> bool:
        for end in (b"\r\n\r\n", b"\n\n"):
            at = self.buf.find(end)
            if at >= 0:
                self.head, rest = self.buf[:at], self.buf[at + len(end):]
                self.buf = b""
                length = ""
                for line in self.head.split(b"\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = value.strip().decode("latin-1")
                        break
                # read (and drop) what the client sends, so closing does not reset the answer away
                self.body_left = min(int(length), _MAX_BODY) - len(rest) if length.isdigit() else 0
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Reader:
    """The one thread that reads every pending request of every endpoint of the process, each
    connection under its own deadline, so a slow or idle client costs a socket and a buffer,
    never a thread. A whole request is handed to its server (``MetricsServer._dispatch``)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._new: list[_Pending] = []
        self._drop: list[MetricsServer] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: dict[int, _Pending] = {}
        self._thread: threading.Thread | None = None

    def add(self, conn: _Pending) -> None:
        with self._lock:
            self._new.append(conn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleetops-metrics-read", daemon=True)
                self._thread.start()
        self._wake()

    def drop(self, server: MetricsServer) -> None:
        """Close the pending connections of a server that closes."""
        with self._lock:
            self._drop.append(server)
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # already awake with bytes waiting
            pass

    def _forget(self, conn: _Pending) -> None:
        self._pending.pop(id(conn), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        conn.server._pending_done()

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception as exc:  # noqa: BLE001  (the reader must outlive any one surprise)
                sys.stderr.write(f"fleetops-agent serve: metrics endpoint reader: {type(exc).__name__}: {exc}\n")
                time.sleep(0.1)

    def _turn(self) -> None:
        """One wait: take the new connections, drop the expired ones, read what is ready."""
        with self._lock:
            new, self._new = self._new, []
            drop, self._drop = self._drop, []
        for conn in new:
            self._pending[id(conn)] = conn
            try:
                self._selector.register(conn.sock, conn.events, conn)
            except (ValueError, OSError):  # closed meanwhile
                self._forget(conn)
                conn.close()
                continue
            self._advance(conn)
        for conn in [c for c in self._pending.values() if c.server in drop]:
            self._forget(conn)
            conn.close()
        now = time.monotonic()
        for conn in [c for c in self._pending.values() if c.deadline <= now]:
            self._forget(conn)  # its time is up: closed unanswered
            conn.close()
        wait = min((c.deadline for c in self._pending.values()), default=now + 60.0) - now
        for key, _ in self._selector.select(max(wait, 0.0) + 0.001):
            if key.data is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
                continue
            self._advance(key.data)

    def _advance(self, conn: _Pending) -> None:
        if id(conn) not in self._pending:
            return
        events = conn.events
        try:
            done = conn.step()
        except Exception as exc:  # noqa: BLE001  (one connection's surprise must not stop the reader)
            sys.stderr.write(f"fleetops-agent serve: metrics endpoint: reading a request: {type(exc).__name__}: {exc}\n")
            done = None
        if done is None:
            self._forget(conn)
            conn.close()
        elif done:
            self._forget(conn)
            conn.server._dispatch(conn)
        elif conn.events != events:
            try:
                self._selector.modify(conn.sock, conn.events, conn)
            except (KeyError, ValueError, OSError):
                self._forget(conn)
                conn.close()


_READERS: list[_Reader] = []
_READERS_LOCK = threading.Lock()


def _reader() -> _Reader:
    """The process's reader, made when the first connection comes (a process that only renders
    pages, or writes the textfile, opens nothing)."""
    with _READERS_LOCK:
        if not _READERS:
            _READERS.append(_Reader())
        return _READERS[0]


class MetricsServer(socketserver.TCPServer):
    """``server_address``, ``shutdown()`` and ``server_close()`` as ``http.server``'s have them.

    Read-only by construction: GET of two paths, nothing else is routed anywhere; one request per
    connection (HTTP/1.0, ``Connection: close``), which is what a scraper needs. The accepting
    thread hands each connection to the process's one reader thread (at most ``max_pending``
    waiting; past it, a 503 sent without waiting, or a close under TLS), which reads the TLS
    handshake and the request in ``read_timeout_s`` in all, or closes it. A whole request is
    answered on a thread of its own, at most ``max_connections`` at once (past it, 503), within
    ``write_timeout_s``. The sampler shares nothing with these threads but the immutable state
    they render, so no client can stall it."""

    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], get_text: Callable[[], str], *,
                 web: webconfig.Source | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_pending: int = MAX_PENDING, read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.get_text = get_text
        self.web = web
        self.max_connections = max_connections
        self.max_pending = max_pending
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.active = 0  # requests being answered now, each on its thread
        self.pending = 0  # connections still sending their request
        self.refused = 0  # connections and requests answered 503 since the start
        self._count_lock = threading.Lock()
        super().__init__(address, socketserver.BaseRequestHandler)

    # the accepting thread: never blocks on a client

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # out of descriptors: the connection stays queued, and the listening socket stays
                # readable; a pause keeps the accepting loop from spinning a core until one frees
                time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._count_lock:
            full = self.pending >= self.max_pending
            if full:
                self.refused += 1
            else:
                self.pending += 1
        guard = self.web.guard() if self.web is not None else None
        if full:
            self._turn_away(request, tls=guard is not None and guard.tls_context is not None)
            return
        try:
            request.setblocking(False)
            sock = request
            if guard is not None and guard.tls_context is not None:
                sock = guard.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            conn = _Pending(self, sock, guard, time.monotonic() + self.read_timeout_s, sock is not request)
        except BaseException:
            self._pending_done()
            request.close()
            raise
        _reader().add(conn)

    def shutdown_request(self, request: Any) -> None:
        """The socket now belongs to the reader, then to the answering thread."""

    def _pending_done(self) -> None:
        with self._count_lock:
            self.pending -= 1

    def _turn_away(self, request: socket.socket, tls: bool) -> None:
        try:
            request.setblocking(False)
            if not tls:
                request.send(_BUSY)  # a fresh socket's send buffer takes it whole, or it is dropped
            try:
                request.recv(65536)  # what already came, so the close is a FIN, not a reset
            except OSError:
                pass
        except OSError:
            pass
        try:
            request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        request.close()

    # the reader thread: a whole request

    def _dispatch(self, conn: _Pending) -> None:
        with self._count_lock:
            full = self.active >= self.max_connections
            if full:
                self.refused += 1
            else:
                self.active += 1
        if full:
            self._busy(conn)
            return
        try:
            threading.Thread(target=self._answer, args=(conn,), name="fleetops-metrics-answer", daemon=True).start()
        except RuntimeError:  # no thread to be had: turned away as busy
            with self._count_lock:
                self.active -= 1
            self._busy(conn)

    def _busy(self, conn: _Pending) -> None:
        try:
            conn.sock.send(_BUSY)  # non-blocking still: taken whole by a fresh send buffer, or dropped
        except OSError:
            pass
        conn.close()

    # an answering thread

    def _answer(self, conn: _Pending) -> None:
        try:
            conn.sock.setblocking(True)
            self._respond(conn.sock, conn.head or b"", conn.guard, conn.deadline)
        except (OSError, _Timeout):  # gone, or too slow to take the answer: nothing more to do
            pass
        except Exception:  # noqa: BLE001  (a bug must not kill the endpoint: said, and the connection closed)
            self.handle_error(conn.sock, None)
        finally:
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            conn.close()
            with self._count_lock:
                self.active -= 1

    def _send(self, sock: socket.socket, status: int, body: str, content_type: str,
              extra: Iterable[tuple[str, str]] = ()) -> None:
        data = body.encode("utf-8")
        head = [f"HTTP/1.0 {status} {_STATUS[status]}", "Server: fleetops-agent", f"Content-Type: {content_type}",
                f"Content-Length: {len(data)}", "Connection: close"]
        head += [f"{key}: {value}" for key, value in extra]
        _send_all(sock, ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data,
                  time.monotonic() + self.write_timeout_s)

    def _respond(self, sock: socket.socket, head: bytes, guard: webconfig.Guard | None, deadline: float) -> None:
        extra: list[tuple[str, str]] = list(guard.headers) if guard is not None else []
        if not head:
            self._send(sock, 431, "request head too long\n", _TEXT, extra)
            return
        request = _parse_head(head)
        if isinstance(request, int):
            self._send(sock, request, "bad request\n" if request == 400 else "too many header lines\n", _TEXT, extra)
            return
        if guard is not None:
            # the credentials are checked within the read deadline (bcrypt checks queue one at a time)
            verdict = guard.check(request.headers.get("authorization"), max(deadline, time.monotonic() + 1.0))
            if verdict == "busy":
                self._send(sock, 503, "busy checking credentials\n", _TEXT, [*extra, ("Retry-After", "1")])
                return
            if verdict != "ok":
                self._send(sock, 401, "unauthorized\n", _TEXT,
                           [*extra, ("WWW-Authenticate", 'Basic realm="fleetops-agent", charset="UTF-8"')])
                return
        if request.method != "GET":
            self._send(sock, 405, "method not allowed: only GET\n", _TEXT, [*extra, ("Allow", "GET")])
            return
        path = request.target.split("?", 1)[0]
        if path == "/metrics":
            try:
                text = self.get_text()
            except Exception as exc:  # a failed render answers 500, the server stays up  # noqa: BLE001
                self._send(sock, 500, f"render failed: {type(exc).__name__}\n", _TEXT, extra)
                return
            self._send(sock, 200, text, CONTENT_TYPE, extra)
        elif path == "/":
            self._send(sock, 200, _INDEX, "text/html; charset=utf-8", extra)
        else:
            self._send(sock, 404, "not found: only /metrics\n", _TEXT, extra)

    def server_close(self) -> None:
        super().server_close()
        if _READERS:
            _READERS[0].drop(self)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        sys.stderr.write(f"fleetops-agent serve: metrics endpoint: {client_address}: {type(exc).__name__}: {exc}\n")


def start_server(address: str, port: int, get_text: Callable[[], str], poll_s: float = 0.5, *,
                 web: webconfig.Source | None = None, max_connections: int = MAX_CONNECTIONS,
                 max_pending: int = MAX_PENDING, read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> tuple[threading.Thread, MetricsServer]:
    """Serves ``get_text()`` at ``GET /metrics`` from a daemon thread. ``port`` 0 takes a free
    one (``server.server_address[1]`` says which). Stop with ``server.shutdown()`` then
    ``server.server_close()``; ``shutdown`` waits up to ``poll_s``, which is also how often the
    idle server wakes (a resident daemon that never shuts it down asks for seldom). ``web``
    (``fleetops.agent.webconfig.Source``) adds TLS and basic authentication."""
    server = MetricsServer((address, port), get_text, web=web, max_connections=max_connections,
                           max_pending=max_pending, read_timeout_s=read_timeout_s, write_timeout_s=write_timeout_s)
    thread = threading.Thread(target=server.serve_forever, args=(poll_s,), name="fleetops-metrics", daemon=True)
    thread.start()
    return thread, server


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
