"""Prometheus node-exporter textfile: per-node and per-GPU gauges plus finding counts.

Write it to the textfile collector's folder atomically (``-o DIR/fleetops.prom``; the CLI
writes a temporary file and renames it).
"""

from __future__ import annotations

from typing import Any

from fleetops import model

# fleetops_node_health: a node's health level as its index in model.HEALTH_ORDER (the order of
# the exit code and the JSON too): 0 ok, 1 unknown, 2 warn, 3 crit, 4 unreachable.
SEV_VALUE = dict(model.HEALTH_RANK)


def _esc(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kw: object) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kw.items()) + "}"


# Names this file used before it passed ``promtool check metrics`` (a gauge must not end in
# ``_total``): old -> new, listed in the docs so dashboards and alerts can be moved over. They
# stay gauges: an audit is a sample taken now and then, not a scraped counter.
RENAMED = {
    "fleetops_gpu_ecc_uncorrected_volatile_total": "fleetops_gpu_ecc_uncorrected_volatile_errors",
    "fleetops_gpu_ecc_corrected_volatile_total": "fleetops_gpu_ecc_corrected_volatile_errors",
    "fleetops_gpu_pcie_replay_total": "fleetops_gpu_pcie_replays",
}

GPU_GAUGES = (
    ("fleetops_gpu_temperature_celsius", "temp_gpu_c", "GPU core temperature"),
    ("fleetops_gpu_memory_temperature_celsius", "temp_memory_c", "HBM temperature"),
    ("fleetops_gpu_power_draw_watts", "power_draw_w", "Power draw"),
    ("fleetops_gpu_power_limit_watts", "power_limit_w", "Configured power limit"),
    ("fleetops_gpu_ecc_uncorrected_volatile_errors", "ecc_uncorrected_volatile", "Uncorrectable ECC errors since driver load"),
    ("fleetops_gpu_ecc_corrected_volatile_errors", "ecc_corrected_volatile", "Correctable ECC errors since driver load"),
    ("fleetops_gpu_remapped_rows_uncorrected", "remapped_rows_uncorrected", "Rows remapped for uncorrectable errors"),
    ("fleetops_gpu_pcie_replays", "pcie_replay_counter", "PCIe replays since driver load"),
    ("fleetops_gpu_pcie_link_width", "pcie_width_current", "Current PCIe link width"),
    ("fleetops_gpu_pcie_link_gen", "pcie_gen_current", "Current PCIe link generation"),
    ("fleetops_gpu_nvlinks_up", "nvlinks_up", "NVLinks in state up"),
)


def _value(value: float | int | bool) -> str:
    """A sample's value: a count as every digit of it (a counter past 2**53 included; ``:g``
    kept six), a bool as 1 / 0, a measurement in the shortest form."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return f"{float(value):g}"


def render(result: Any, exit_code: int) -> str:
    out: list[str] = []
    summary = result.summary()
    out += [
        "# HELP fleetops_audit_timestamp_seconds When the audit started.",
        "# TYPE fleetops_audit_timestamp_seconds gauge",
        f"fleetops_audit_timestamp_seconds {summary['started_at']:.3f}",
        "# HELP fleetops_audit_duration_seconds How long the audit took.",
        "# TYPE fleetops_audit_duration_seconds gauge",
        f"fleetops_audit_duration_seconds {summary['duration_s']:.3f}",
        "# HELP fleetops_audit_exit_code The audit's exit code (0 ok, 1 warn, 2 crit, 3 unreachable or only unknown).",
        "# TYPE fleetops_audit_exit_code gauge",
        f"fleetops_audit_exit_code {exit_code}",
    ]
    health = result.node_health()
    out += [
        "# HELP fleetops_node_up 1 when the node answered with a snapshot.",
        "# TYPE fleetops_node_up gauge",
    ]
    out += [f"fleetops_node_up{_labels(node=n.name)} {1 if n.snapshot else 0}" for n in result.nodes]
    out += [
        "# HELP fleetops_node_health Worst finding on the node: 0 ok, 1 unknown, 2 warn, 3 crit, 4 unreachable (no snapshot).",
        "# TYPE fleetops_node_health gauge",
    ]
    out += [f"fleetops_node_health{_labels(node=n.name)} {SEV_VALUE[health[n.name]]}" for n in result.nodes]
    out += [
        "# HELP fleetops_node_gpus GPUs the driver enumerates on the node.",
        "# TYPE fleetops_node_gpus gauge",
    ]
    # as the agent's page counts them: a lost GPU (listed at its index, answering GpuIsLost) is out
    out += [f"fleetops_node_gpus{_labels(node=n.name)} {sum(1 for g in n.snapshot.gpus if not model.gpu_lost(g))}"
            for n in result.nodes if n.snapshot]
    aged = [n for n in result.nodes if n.snapshot is not None and n.source is not None and n.age_s is not None]
    if aged:
        out += [
            "# HELP fleetops_audit_snapshot_age_seconds Age of the node's snapshot when the audit read it; "
            "source is daemon (the resident agent's) or collect (taken now, age 0).",
            "# TYPE fleetops_audit_snapshot_age_seconds gauge",
        ]
        out += [f"fleetops_audit_snapshot_age_seconds{_labels(node=n.name, source=n.source)} {float(n.age_s):g}"
                for n in aged]
    counts: dict[tuple[str, str, str], int] = {}
    for f in result.findings:
        k = (f.node, f.check, f.severity)
        counts[k] = counts.get(k, 0) + 1
    out += [
        "# HELP fleetops_findings Findings by node, check and severity.",
        "# TYPE fleetops_findings gauge",
    ]
    out += [f"fleetops_findings{_labels(node=n, check=c, severity=s)} {v}" for (n, c, s), v in sorted(counts.items())]
    for metric, attr, help_text in GPU_GAUGES:
        rows = []
        for n in result.nodes:
            if not n.snapshot:
                continue
            for g in n.snapshot.gpus:
                value = getattr(g, attr)
                if value is None:
                    continue
                rows.append(f"{metric}{_labels(node=n.name, gpu=g.index, uuid=g.uuid, bus_id=g.bus_id)} {_value(value)}")
        if rows:
            out += [f"# HELP {metric} {help_text}.", f"# TYPE {metric} gauge", *rows]
    return "\n".join(out) + "\n"


def severity_value(level: str) -> int:
    """The gauge value of a health level or finding severity (``info`` counts as ok)."""
    return SEV_VALUE.get(level, 0)


__all__ = ["RENAMED", "render", "severity_value", "model"]
