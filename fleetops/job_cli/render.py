"""A job's diagnosis for the operator: the table (the job, a row per GPU, the CPU per node, the
verdicts with their evidence and confidence, the notes), the JSON document (``fleetops.job/v1``)
and the utilisation plot (one line per GPU, unicode blocks, a UTC time axis). Pure: from the
gathered facts and the ``Diagnosis``, nothing read here."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleetops.jobs import diagnose as dg

SCHEMA = "fleetops.job/v1"
BLOCKS = " ▁▂▃▄▅▆▇█"  # 0 % .. 100 % in eight steps; no sample in a column: NO_DATA
NO_DATA = "·"
PLOT_WIDTH = 60
TOP_REASONS = 2


def utc(t: float | None, seconds: bool = True) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%H:%M", time.gmtime(t)) + " UTC"


def duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f} %"


def _gbs(kib_s: float | None) -> str:
    """NVLink's KiB/s as GB/s (10^9 bytes, as link rates are quoted)."""
    return "-" if kib_s is None else f"{kib_s * 1024 / 1e9:.1f}"


def _throttle(g: dg.GpuSummary) -> str:
    top = sorted(g.throttle_share.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    return ", ".join(f"{r} {v * 100:.0f} %" for r, v in top) or "-"


def _nvlink(g: dg.GpuSummary) -> str:
    if not g.nvlink:
        return "-"
    span = [(row.tx_kib_s, row.rx_kib_s) for row in g.nvlink]
    tx = sum(t for t, _ in span if t is not None) if any(t is not None for t, _ in span) else None
    rx = sum(r for _, r in span if r is not None) if any(r is not None for _, r in span) else None
    return f"{_gbs(tx)}/{_gbs(rx)} GB/s"


def _link(g: dg.GpuSummary) -> str:
    return f"Gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen and g.pcie_width else "link ?"


def common_link(d: dg.Diagnosis) -> str | None:
    """The PCIe link most of the job's GPUs have (named once, under the table), or None; between
    links as common, the fastest, so that the one that trained lower is the one named in its row."""
    if not d.gpus:
        return None
    links = [_link(g) for g in d.gpus]
    best = max(d.gpus, key=lambda g: (links.count(_link(g)), g.pcie_gen or 0, g.pcie_width or 0))
    return _link(best)


def gpu_rows(d: dg.Diagnosis) -> list[list[str]]:
    """The table's rows: a GPU's PCIe cell names its link only where it is not the common one."""
    head = ["NODE", "GPU", "UTIL mean/p5/p95", "SM CLK", "THROTTLE", "POWER / CAP", "PCIE TX/RX", "NVLINK TX/RX",
            "ECC c/u", "XID"]
    rows = [head]
    common = common_link(d)
    for g in sorted(d.gpus, key=lambda g: (g.node, g.index)):
        u = g.utilization_pct
        util = "-" if u.mean is None else f"{u.mean:.0f}/{_num(u.p5)}/{_num(u.p95)} %"
        power = "-" if g.power_w.mean is None else f"{g.power_w.mean:.0f} W ({_pct(g.power_share)})"
        pcie = f"{_pct(g.pcie_tx_share)}/{_pct(g.pcie_rx_share)}" + ("" if _link(g) == common else f" {_link(g)}")
        ecc = f"{_num(g.ecc_corrected)}/{_num(g.ecc_uncorrected)}"
        xids = ", ".join(str(c) for _, c in g.xids) or "-"
        rows.append([g.node, str(g.index), util, _pct(g.clock_sm_share), _throttle(g), power, pcie, _nvlink(g),
                     ecc, xids])
    return rows


def legend(d: dg.Diagnosis) -> str:
    """What the shares in the table are of: THROTTLE of the job's time, PCIE of the link's rate."""
    common = common_link(d)
    link = f", {common}" + (" unless named" if any(_link(g) != common for g in d.gpus) else "") if common else ""
    return f"THROTTLE: share of the job's time per reason; PCIE TX/RX: share of the link's raw rate{link}"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 1e4 else str(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {_value(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return ",".join(_value(x) for x in v)
    return str(v)


def evidence_lines(ev: Mapping[str, Any]) -> list[str]:
    """A verdict's evidence as operator text: a per-GPU part (``gpus``: index -> figures) one line
    per GPU, the rest on one line."""
    lines = []
    flat = {k: v for k, v in ev.items() if k != "gpus"}
    if flat:
        lines.append(_value(flat))
    for index, figures in (ev.get("gpus") or {}).items():
        lines.append(f"GPU {index}: {_value(figures)}")
    return lines


def _finding_line(e: Mapping[str, Any]) -> str:
    gpu = e.get("gpu") or {}
    where = e["node"] + (f" GPU {gpu.get('index', '?')} {gpu.get('uuid') or ''}".rstrip() if gpu else "")
    where += f" {e['port']}" if e.get("port") else ""
    seen = (f"audit #{e['first_audit']} {utc(e['first_seen'])}" if e["audits"] == 1 else
            f"{e['audits']} audits, #{e['first_audit']} {utc(e['first_seen'])} .. #{e['last_audit']} "
            f"{utc(e['last_seen'])}")
    named = ", names the job" if e.get("names_job") else ""
    return f"  [{e['severity']}] {where} {e['check']}: {e['message']} ({seen}{named})"


def history_lines(h: Mapping[str, Any]) -> list[str]:
    """The history store's section (``stored.section``): the faults the audits found on the job's
    GPUs and nodes, and the actions taken there, in the job's span."""
    if h.get("error"):
        return [f"HISTORY  not read: {h['error']}"]
    if h.get("span") is None:
        return [f"HISTORY  {h.get('note') or 'nothing'}"]
    start, end = h["span"]
    found, acts = h["findings"], h["actions"]
    lines = [f"HISTORY  {h['db']}, audits {utc(start)} .. {utc(end)}: {len(found)} finding"
             f"{'s' if len(found) != 1 else ''}, {len(acts)} action{'s' if len(acts) != 1 else ''}"]
    lines += [_finding_line(e) for e in found]
    for a in acts:
        gpu = f" GPU {a['gpu']}" if a.get("gpu") else ""
        lines.append(f"  {utc(a['at'])}  {a['node']}{gpu} {a['action']} {a['outcome']} by {a['source']}: {a['why']}")
    if h.get("note"):
        lines.append(f"  note: {h['note']}")
    return lines


def table(facts: Mapping[str, Any], d: dg.Diagnosis, nodes: Mapping[str, Any],
          history: Mapping[str, Any] | None = None) -> str:
    """The operator's report. ``nodes``: ``absent`` (list) and ``unreachable`` (name -> why);
    ``history``: the history store's section (``stored.section``), after the verdicts."""
    end = "running" if facts["running"] else f"ended {utc(facts['ended_at'])}"
    lines = [
        f"job {facts['job_id']}  user {facts['user'] or '-'}  nodes {', '.join(facts['nodes'])}  "
        f"GPUs {facts['gpus']}",
        f"started {utc(facts['started_at'])}  {end}  duration {duration(facts['duration_s'])}",
        "",
        *_columns(gpu_rows(d)),
        legend(d),
        "",
    ]
    for c in d.cpu:
        if c.share is None:
            lines.append(f"CPU  {c.node}: {c.cpus} CPUs, {c.samples} samples of cpu.stat: no usage")
        else:
            lines.append(f"CPU  {c.node}: {c.cores:.1f} of {c.cpus} CPUs busy ({_pct(c.share)}), "
                         f"saturated {_pct(c.saturated_share)} of the time, {c.samples} samples")
    if not d.cpu:
        lines.append("CPU  no cgroup CPU time from any node")
    lines.append("")
    if d.verdicts:
        lines.append("VERDICTS")
        for v in d.verdicts:
            gpus = ",".join(str(g["index"]) for g in v.gpus)
            lines.append(f"  {v.code}  {v.node} GPU {gpus}  confidence {v.confidence:.2f}")
            lines.append(f"    {v.message}")
            lines += [f"    evidence: {line}" for line in evidence_lines(v.evidence)]
    else:
        lines.append("VERDICTS  none: nothing found wrong with this job")
    if history is not None:
        lines += ["", *history_lines(history)]
    notes = list(d.notes)
    notes += [f"{n}: not asked ({why}); the job may have run there" for n, why in sorted(nodes["unreachable"].items())]
    notes += [f"{n}: {note}" for n, doc_notes in sorted(nodes.get("notes", {}).items()) for note in doc_notes]
    if notes:
        lines += ["", "NOTES", *(f"  - {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def document(facts: Mapping[str, Any], d: dg.Diagnosis, nodes: Mapping[str, Any],
             util: Mapping[str, Sequence[tuple[float, Any]]], code: int,
             history: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything, versioned: the job, which nodes had it, the diagnosis (summaries, CPU, verdicts,
    notes), the thresholds it judged by, each GPU's utilisation series (``node:index``), what the
    history store knows (``history``, when read) and the exit code."""
    return {
        "schema": SCHEMA,
        "job": dict(facts),
        "nodes": {"with_job": list(facts["nodes"]), "absent": sorted(nodes["absent"]),
                  "unreachable": dict(sorted(nodes["unreachable"].items())),
                  "notes": {n: list(v) for n, v in sorted(nodes.get("notes", {}).items())}},
        "diagnosis": d.to_dict(),
        "thresholds": {k: {"value": t.value, "unit": t.unit} for k, t in dg.THRESHOLDS.items()},
        "utilization": {k: [[t, v] for t, v in pts] for k, pts in util.items()},
        **({"history": dict(history)} if history is not None else {}),
        "exit_code": code,
    }


def plot(util: Mapping[str, Sequence[tuple[float, Any]]], start: float, end: float, width: int = PLOT_WIDTH) -> str:
    """One line per GPU (``node:index`` -> its utilisation samples), each column the mean of the
    samples in its slice of [start, end], as a block of eight heights; a UTC time axis beneath."""
    if not util or end <= start:
        return "no utilisation samples to plot\n"
    step = (end - start) / width
    label_w = max(len(k) for k in util) + 1
    lines = [f"{'GPU util':<{label_w}} 0 % ' ' .. 100 % '█', '{NO_DATA}' no sample"]
    for key, pts in util.items():
        sums, counts = [0.0] * width, [0] * width
        for t, v in pts:
            if v is None or not start <= t <= end:
                continue
            col = min(width - 1, int((t - start) / step))
            sums[col] += float(v)
            counts[col] += 1
        cells = [NO_DATA if n == 0 else BLOCKS[max(0, min(8, round(s / n / 100 * 8)))] for s, n in zip(sums, counts,
                                                                                                   strict=True)]
        vals = [float(v) for t, v in pts if v is not None and start <= t <= end]
        mean = f"{sum(vals) / len(vals):3.0f} %" if vals else "  - %"
        lines.append(f"{key:<{label_w}}│{''.join(cells)}│ {mean}")
    left, mid, right = (time.strftime("%H:%M:%S", time.gmtime(t)) for t in (start, (start + end) / 2, end))
    axis = [" "] * (width + 2)
    for pos, text in ((0, left), ((width + 2) // 2 - len(mid) // 2, mid), (width + 2 - len(right), right)):
        axis[pos:pos + len(text)] = list(text)
    lines.append(" " * label_w + "".join(axis)[:width + 2] + " UTC")
    return "\n".join(lines) + "\n"
