"""The agent's Prometheus exposition (``fleetops/agent/metrics.py``): promtool on real pages of
simulated nodes, the XID counter semantics, and the read-only HTTP endpoint over loopback."""

from __future__ import annotations

import http.client
import os
import re
import time
from collections.abc import Callable, Iterator

import pytest
from promtool_util import assert_clean

from fleetops import baseline, checks, model
from fleetops.agent import metrics
from fleetops.sim import gpu as sim
from fleetops.xid import kernlog as xid

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = {k: v for k, v in _LABEL.findall(m.group(3) or "")}
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def value(text: str, name: str, **labels: object) -> float:
    want = {k: str(v) for k, v in labels.items()}
    hits = [v for n, lbl, v in samples(text) if n == name and all(lbl.get(k) == x for k, x in want.items())]
    assert len(hits) == 1, f"{name}{want}: {len(hits)} samples"
    return hits[0]


def page(node: model.Node, base: baseline.Baseline | None, **extra: object) -> tuple[str, list[model.Finding]]:
    findings = checks.run_node_checks(node, base)
    state = metrics.MetricsInput(
        node=node,
        agent=metrics.AgentInfo(started_at=node.collected_at - 60, interval_s=2.0, sample_age_s=0.4),
        findings=tuple(findings),
        xid_counts=metrics.xid_counts_from_events(node.xids),
        **extra,  # type: ignore[arg-type]
    )
    return metrics.render(state), findings


@pytest.mark.promtool
def test_healthy_node_page_passes_promtool_and_says_healthy(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline
) -> None:
    node = sim_node()
    text, findings = page(node, sim_baseline)
    assert_clean(text)
    assert [f for f in findings if f.severity in ("warn", "crit")] == []
    assert value(text, "fleetops_node_health") == 0
    assert value(text, "fleetops_agent_up") == 1
    assert value(text, "fleetops_agent_degraded") == 0
    assert value(text, "fleetops_agent_build_info", driver="580.159.04") == 1
    assert value(text, "fleetops_node_gpus") == 8
    for gpu in node.gpus:
        assert value(text, "fleetops_gpu_health", uuid=gpu.uuid, bus_id=gpu.bus_id, gpu=gpu.index) == 0
    assert not [s for s in samples(text) if s[0] == "fleetops_gpu_finding"]
    # XID counters start at 0 for the codes the alert rules watch, so their first event is an increase
    xids = [(lbl["uuid"], lbl["code"], v) for n, lbl, v in samples(text) if n == "fleetops_gpu_xid_total"]
    assert sorted(xids) == sorted((g.uuid, str(c), 0.0) for g in node.gpus for c in metrics.PRESET_XIDS)
    gpu0 = node.gpus[0]
    # base units: MHz, MiB and percent of the snapshot become hertz, bytes and ratios
    assert value(text, "fleetops_gpu_sm_clock_hertz", uuid=gpu0.uuid) == gpu0.clock_sm_mhz * 1_000_000  # type: ignore[operator]
    assert value(text, "fleetops_gpu_memory_total_bytes", uuid=gpu0.uuid) == gpu0.memory_total_mib * 1024 * 1024  # type: ignore[operator]
    assert value(text, "fleetops_gpu_clocks_event_active", uuid=gpu0.uuid, reason="gpu_idle") == 1
    assert value(text, "fleetops_gpu_clocks_event_active", uuid=gpu0.uuid, reason="hw_slowdown") == 0
    # every family has HELP and TYPE, and counters (only they) end in _total
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    assert {n for n, _, _ in samples(text)} == set(types) == helps
    assert all((kind == "counter") == name.endswith("_total") for name, kind in types.items())


@pytest.mark.promtool
def test_faulty_node_page_passes_promtool_and_names_each_fault(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline
) -> None:
    faults = ["ecc-dbe@1", "xid:31@2", "nvlink-down@3", "thermal-slowdown@4", "pcie-replay-storm@5",
              "power-cap-drift@6", "driver-drift"]
    node = sim_node(faults=faults)
    text, findings = page(node, sim_baseline,
                          pcie_bytes={(node.gpus[0].uuid, "tx"): 123, (node.gpus[0].uuid, "rx"): 456},
                          nvlink_bytes={(node.gpus[0].uuid, 0, "tx"): 789})
    assert_clean(text)
    by_index = {g.index: g for g in node.gpus}
    crit_gpu1 = {f.check for f in findings if f.severity == "crit" and (f.gpu or {}).get("index") == 1}
    assert "memory.ecc_dbe_volatile" in crit_gpu1
    for check in crit_gpu1:
        assert value(text, "fleetops_gpu_finding", check=check, severity="crit", uuid=by_index[1].uuid) == 1
    assert value(text, "fleetops_gpu_health", uuid=by_index[1].uuid) == 3
    assert value(text, "fleetops_gpu_health", uuid=by_index[7].uuid) == 0
    assert value(text, "fleetops_node_health") == 3
    assert value(text, "fleetops_gpu_xid_total", uuid=by_index[1].uuid, code=48) == 1
    assert value(text, "fleetops_gpu_xid_total", uuid=by_index[2].uuid, bus_id=by_index[2].bus_id, gpu=2,
                 code=31) == 1
    down = [link.link for link in by_index[3].nvlinks or [] if link.state != "up"]
    assert down, "the nvlink-down fault left every link up"
    assert value(text, "fleetops_gpu_nvlink_up", uuid=by_index[3].uuid, link=down[0]) == 0
    assert value(text, "fleetops_gpu_ecc_uncorrected_volatile_errors_total", uuid=by_index[1].uuid) == \
        by_index[1].ecc_uncorrected_volatile
    assert value(text, "fleetops_gpu_power_limit_watts", uuid=by_index[6].uuid) == 500.0
    assert value(text, "fleetops_gpu_pcie_bytes_total", uuid=node.gpus[0].uuid, direction="rx") == 456
    assert value(text, "fleetops_gpu_nvlink_bytes_total", uuid=node.gpus[0].uuid, link=0, direction="tx") == 789
    node_checks = {f.check for f in findings if f.gpu is None and f.severity in ("warn", "crit")}
    assert node_checks, "driver-drift gave no node-level finding"
    for check in node_checks:
        assert [s for s in samples(text) if s[0] == "fleetops_node_finding" and s[1]["check"] == check]
    # findings carry check ids and severities only: no message text reaches a label
    finding_labels = {k for n, lbl, _ in samples(text) if n.endswith("_finding") for k in lbl}
    assert finding_labels <= {"check", "severity", "gpu", "uuid", "bus_id"}


@pytest.mark.promtool
def test_repeated_xid_counts_every_event(sim_node: Callable[..., model.Node]) -> None:
    """dcgm-exporter exports the last XID as a value, so a repeat is invisible; here each counts."""
    state = sim.build_state("n1", {"faults": ["xid:31@2"]})
    line = sim.snapshot(state)["_kernel_log"][0]
    node = sim_node(state=state)
    node.xids = xid.parse_lines([line, line], source="sim")
    gpu2 = node.gpus[2]
    for event in node.xids:
        event.gpu_uuid, event.gpu_index = gpu2.uuid, gpu2.index
    counts = metrics.xid_counts_from_events(node.xids)
    text = metrics.render(metrics.MetricsInput(node=node, agent=metrics.AgentInfo(time.time(), 2.0),
                                               xid_counts=counts))
    assert_clean(text)
    assert value(text, "fleetops_gpu_xid_total", uuid=gpu2.uuid, bus_id=gpu2.bus_id, gpu=2, code=31) == 2
    metrics.count_xid(counts, node.xids[0])
    text = metrics.render(metrics.MetricsInput(node=node, agent=metrics.AgentInfo(time.time(), 2.0),
                                               xid_counts=counts))
    assert value(text, "fleetops_gpu_xid_total", uuid=gpu2.uuid, code=31) == 3


@pytest.mark.promtool
def test_label_values_are_escaped_and_free_text_never_becomes_a_label(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node()
    node.driver_version = 'odd "driver"\\ line\nbreak'
    agent = metrics.AgentInfo(time.time(), 2.0, degraded=True, reason="NVML call hung for 10 s: nvmlDeviceGetPowerUsage")
    findings = (model.Finding(check="Free text check!", severity="warn", node="n1", message="x"),)
    text = metrics.render(metrics.MetricsInput(node=node, agent=agent, findings=findings, version="1.0"))
    assert_clean(text)
    assert 'fleetops_agent_build_info{version="1.0",driver="odd \\"driver\\"\\\\ line\\nbreak"} 1' in text
    assert value(text, "fleetops_agent_degraded") == 1
    assert value(text, "fleetops_agent_degraded_reason", reason="other") == 1
    assert value(text, "fleetops_node_finding", check="other", severity="warn") == 1
    token = metrics.AgentInfo(time.time(), 2.0, degraded=True, reason="nvml_hang")
    assert value(metrics.render(metrics.MetricsInput(node=node, agent=token)), "fleetops_agent_degraded_reason",
                 reason="nvml_hang") == 1


def test_input_is_a_copy_the_daemon_cannot_change_under_a_scrape(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node()
    counts: dict[metrics.XidKey, int] = {(node.gpus[0].uuid, node.gpus[0].bus_id, 0, 13): 1}
    state = metrics.MetricsInput(node=node, agent=metrics.AgentInfo(time.time(), 2.0), xid_counts=counts)
    before = metrics.render(state)
    counts[(node.gpus[0].uuid, node.gpus[0].bus_id, 0, 13)] = 5
    assert metrics.render(state) == before
    with pytest.raises(AttributeError):
        state.agent = metrics.AgentInfo(0.0, 1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        state.xid_counts[("x", "y", 1, 2)] = 1  # type: ignore[index]


# --- the HTTP endpoint -------------------------------------------------------------------


@pytest.fixture
def served(sim_node: Callable[..., model.Node]) -> Iterator[tuple[int, str, list[int]]]:
    node = sim_node()
    text = metrics.render(metrics.MetricsInput(node=node, agent=metrics.AgentInfo(time.time(), 2.0)))
    calls: list[int] = []

    def get_text() -> str:
        calls.append(1)
        return text

    thread, server = metrics.start_server("127.0.0.1", 0, get_text)
    try:
        yield server.server_address[1], text, calls
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert not thread.is_alive()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_get_metrics_serves_the_page_with_the_exposition_content_type(served: tuple[int, str, list[int]]) -> None:
    port, text, calls = served
    status, headers, body = request(port, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert body.decode() == text
    assert int(headers["content-length"]) == len(body)
    assert calls == [1]
    status, headers, body = request(port, "GET", "/")
    assert status == 200 and b'href="/metrics"' in body
    assert calls == [1]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_anything_but_get_is_refused_with_405(served: tuple[int, str, list[int]], method: str) -> None:
    port, _, calls = served
    status, headers, _ = request(port, method, "/metrics", body=b"x=1")
    assert status == 405
    assert headers["allow"] == "GET"
    assert calls == []


def test_unknown_paths_are_404(served: tuple[int, str, list[int]]) -> None:
    port, _, calls = served
    for path in ("/metrics/x", "/reset", "/api/v1/query"):
        status, _, _ = request(port, "GET", path)
        assert status == 404, path
    assert calls == []


def test_a_failing_render_answers_500_and_the_server_keeps_serving() -> None:
    answers = iter([RuntimeError("boom"), "ok_metric 1\n"])

    def get_text() -> str:
        item = next(answers)
        if isinstance(item, Exception):
            raise item
        return item

    thread, server = metrics.start_server("127.0.0.1", 0, get_text)
    try:
        port = server.server_address[1]
        assert request(port, "GET", "/metrics")[0] == 500
        status, _, body = request(port, "GET", "/metrics")
        assert (status, body) == (200, b"ok_metric 1\n")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_default_port_is_9401() -> None:
    assert metrics.DEFAULT_PORT == 9401


def test_textfile_is_replaced_whole_and_leaves_no_temporary(tmp_path: os.PathLike[str],
                                                           sim_node: Callable[..., model.Node]) -> None:
    path = os.path.join(tmp_path, "fleetops.prom")
    with open(path, "w") as handle:
        handle.write("old 1\n")
    text = metrics.render(metrics.MetricsInput(node=sim_node(), agent=metrics.AgentInfo(time.time(), 2.0)))
    metrics.write_textfile(path, text)
    with open(path) as handle:
        assert handle.read() == text
    assert os.listdir(tmp_path) == ["fleetops.prom"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


@pytest.mark.promtool
def test_a_passthrough_h200_with_unreadable_fields_leaves_them_out(passthrough_node: Callable[..., model.Node]) -> None:
    """The real H200 VM's shape: NVLink, remapped rows, retired pages unreadable. A value that
    could not be read is no sample at all (not 0, not NaN), so no alert reads it as healthy."""
    node = passthrough_node()
    text, findings = page(node, None)
    assert_clean(text)
    assert [f for f in findings if f.severity in ("warn", "crit")] == []
    names = {n for n, _, _ in samples(text)}
    for absent in ("fleetops_gpu_nvlink_up", "fleetops_gpu_nvlink_crc_errors_total",
                   "fleetops_gpu_remapped_rows_pending", "fleetops_gpu_retired_pages_dbe_total"):
        assert absent not in names, absent
    assert "NaN" not in text
    gpu = node.gpus[0]
    assert value(text, "fleetops_gpu_temperature_celsius", uuid=gpu.uuid, bus_id="0000:00:06.0", gpu=0) == 36.0
    assert value(text, "fleetops_gpu_ecc_corrected_aggregate_errors_total", uuid=gpu.uuid) == 289
    assert value(text, "fleetops_gpu_health", uuid=gpu.uuid) <= 1


def test_every_registered_check_id_is_kept_as_its_label(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node()
    ids = [d["id"] for d in checks.registry_dicts()]
    findings = tuple(model.Finding(check=i, severity="warn", node="n1", message="m") for i in ids)
    text = metrics.render(metrics.MetricsInput(node=node, agent=metrics.AgentInfo(time.time(), 2.0), findings=findings))
    labelled = {lbl["check"] for n, lbl, _ in samples(text) if n == "fleetops_node_finding"}
    assert ids and labelled == set(ids)


@pytest.mark.promtool
def test_a_gpu_that_fell_off_the_bus_keeps_its_finding_and_its_xid(
    sim_node: Callable[..., model.Node], sim_baseline: baseline.Baseline
) -> None:
    before = sim_node()
    lost = before.gpus[3]
    node = sim_node(faults=["xid:79@3"])
    # NVML keeps the lost GPU at its index, answering GpuIsLost
    assert model.gpu_lost(node.gpus[3]) and node.gpus[3].uuid == lost.uuid, "the lost GPU left its index"
    findings = checks.run_node_checks(node, sim_baseline, previous=before)
    text = metrics.render(metrics.MetricsInput(
        node=node, agent=metrics.AgentInfo(time.time(), 2.0), findings=tuple(findings),
        xid_counts=metrics.xid_counts_from_events(node.xids)))
    assert_clean(text)
    assert value(text, "fleetops_gpu_finding", check="config.gpu_missing", severity="crit", uuid=lost.uuid,
                 bus_id=lost.bus_id, gpu=3) == 1
    assert value(text, "fleetops_node_health") == 3
    assert value(text, "fleetops_gpu_health", uuid=lost.uuid, gpu=3) == 3
    assert not [s for s in samples(text) if s[0] == "fleetops_gpu_temperature_celsius" and s[1]["uuid"] == lost.uuid]
    # counted on the lost GPU's own series (its index, UUID and the bus id the kernel line named)
    assert value(text, "fleetops_gpu_xid_total", bus_id=lost.bus_id, uuid=lost.uuid, gpu=3, code=79) == 1
    assert value(text, "fleetops_node_gpus") == 7  # FleetopsGpuMissing: the lost GPU answers nothing
