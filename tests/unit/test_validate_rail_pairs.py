"""The node-pair RDMA bandwidth test's pure parts: perftest's output, the ib_write_bw command
line, GPUDirect, which rails a node has, the pairing, and the judgement."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleetops import model
from fleetops.sim import gpu as sim
from fleetops.sim.gpu import fabric as simfabric
from fleetops.validation import rails
from fleetops.validation.node import ibbw

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "perftest"
ROOT = Path(__file__).resolve().parents[2]


def test_parse_reads_the_gpudirect_client_average_in_gbits() -> None:
    doc = ibbw.parse((FIXTURES / "ib_write_bw_gdr_client.txt").read_text())
    assert doc == {"cuda": 3, "device": "mlx5_3", "transport": "IB", "link_type": "IB", "bytes": 65536,
                   "iterations": 7473755, "peak_gbps": 0.0, "average_gbps": 391.84, "msg_rate_mpps": 0.747376}


def test_parse_reads_a_roce_host_memory_run() -> None:
    doc = ibbw.parse((FIXTURES / "ib_write_bw_roce_host_client.txt").read_text())
    assert (doc["device"], doc["link_type"], doc["cuda"], doc["average_gbps"]) == ("mlx5_1", "Ethernet", None, 196.52)


def test_parse_refuses_megabytes_and_a_missing_result() -> None:
    text = (FIXTURES / "ib_write_bw_gdr_client.txt").read_text().replace("[Gb/sec]", "[MB/sec]")
    with pytest.raises(ibbw.IbBwError, match="MB/sec, not Gb/sec"):
        ibbw.parse(text)
    with pytest.raises(ibbw.IbBwError, match="no result line"):
        ibbw.parse(" Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor for socket connection")


def _state(host: str = "node001") -> dict[str, Any]:
    return sim.build_state(host)


def _fabric(state: dict[str, Any]) -> model.Fabric:
    from fleetops import codec

    return codec.build(model.Fabric, simfabric.section(state, time.time()), "fabric")


def _gpus(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"index": i, "bus_id": g["bus_id"]} for i, g in enumerate(state["gpus"])]


def test_setup_takes_the_gpu_behind_the_hca_switch_with_gpudirect() -> None:
    state = _state()
    rail = ibbw.setup(_fabric(state), "mlx5_3", _gpus(state), ("nvidia_peermem", "nvidia_peermem loaded"))
    assert (rail["active"], rail["gpu"], rail["memory"], rail["gpudirect"]) == (True, 3, "cuda", "nvidia_peermem")
    assert ibbw.perftest_argv(rail, 18518, 10, "10.0.0.2") == [
        "ib_write_bw", "-d", "mlx5_3", "-i", "1", "-p", "18518", "-F", "--report_gbits", "-D", "10",
        "--use_cuda=3", "10.0.0.2"]


def test_setup_without_gpudirect_uses_host_memory_and_says_why() -> None:
    state = _state()
    rail = ibbw.setup(_fabric(state), "mlx5_2", _gpus(state), (None, "nvidia_peermem not loaded"))
    assert (rail["gpu"], rail["memory"]) == (2, "host")
    assert rail["memory_note"] == "host memory: GPUDirect off (nvidia_peermem not loaded)"
    assert ibbw.perftest_argv(rail, 18515, 5) == [
        "ib_write_bw", "-d", "mlx5_2", "-i", "1", "-p", "18515", "-F", "--report_gbits", "-D", "5"]


def test_roce_and_dmabuf_flags() -> None:
    rail = {"device": "mlx5_1", "port": 1, "gid_index": 3, "memory": "cuda", "gpu": 1, "gpudirect": "dma-buf"}
    assert ibbw.perftest_argv(rail, 18516, 10, "h2") == [
        "ib_write_bw", "-d", "mlx5_1", "-i", "1", "-p", "18516", "-F", "--report_gbits", "-D", "10", "-x", "3",
        "--use_cuda=1", "--use_cuda_dmabuf", "h2"]


def test_roce_gid_index_is_the_first_ipv4_mapped_roce_v2(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    gids = {0: ("IB/RoCE v1", "fe80:0000:0000:0000:0a88:66ff:fe00:0001"),
            1: ("RoCE v2", "fe80:0000:0000:0000:0a88:66ff:fe00:0001"),
            2: ("IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:0a0c:0107"),
            3: ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a0c:0107")}
    for n, (kind, gid) in gids.items():
        for folder, text in (("gid_attrs/types", kind), ("gids", gid)):
            (port / folder).mkdir(parents=True, exist_ok=True)
            (port / folder / str(n)).write_text(text + "\n")
    assert ibbw.roce_gid_index(str(tmp_path), "mlx5_1") == 3
    assert ibbw.roce_gid_index(str(tmp_path), "mlx5_9") is None


def test_gpudirect_by_nvidia_peermem_else_host(tmp_path: Path) -> None:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    (proc_root / "driver" / "nvidia").mkdir(parents=True)
    (proc_root / "driver" / "nvidia" / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    (sys_root / "module").mkdir(parents=True)
    mode, why = ibbw.gpudirect(str(sys_root), str(proc_root))
    assert mode is None
    assert why.endswith("host memory")
    (sys_root / "module" / "nvidia_peermem").mkdir()
    assert ibbw.gpudirect(str(sys_root), str(proc_root)) == ("nvidia_peermem", "nvidia_peermem loaded")


def test_describe_without_rdma_device_or_perftest_is_not_applicable() -> None:
    none = model.Fabric(hcas=[], note="no RDMA device: /sys/class/infiniband does not exist")
    doc = ibbw.describe(none, [], "/usr/bin/ib_write_bw", (None, "x"))
    assert doc["not_applicable"] == "no RDMA device: /sys/class/infiniband does not exist"
    state = _state()
    doc = ibbw.describe(_fabric(state), _gpus(state), None, (None, "x"))
    assert doc["not_applicable"] == "perftest not installed (no ib_write_bw on PATH)"
    assert rails.node_rails("n1", {"rdma": doc}, None).not_applicable == "perftest not installed (no ib_write_bw on PATH)"


def _doc(state: dict[str, Any]) -> dict[str, Any]:
    rdma = ibbw.describe(_fabric(state), _gpus(state), "ib_write_bw", ("nvidia_peermem", "loaded"))
    return {"gpus": [{"name": g["name"]} for g in state["gpus"]], "rdma": rdma}


def test_node_rails_are_the_compute_ports_not_the_management_port() -> None:
    nr = rails.node_rails("node001", _doc(_state()), None)
    assert sorted(nr.rails) == [f"mlx5_{i}" for i in range(8)]
    assert (nr.not_applicable, nr.model) == (None, "NVIDIA H200")


def test_node_without_compute_port_takes_no_part() -> None:
    state = _state()
    state["fabric"] = [d for d in state["fabric"] if d["link_layer"] == "Ethernet"]
    doc = _doc(state)
    assert rails.node_rails("node001", doc, None).not_applicable == "no compute port (its RDMA ports are management ports)"
    assert rails.node_rails("node001", {"gpus": []}, None).not_applicable.startswith("the agent sent no rdma section")


def test_plan_pairs_in_name_order_and_the_odd_one_with_the_first() -> None:
    assert rails.plan(["node4", "node10", "node2", "node1"]) == [
        rails.Pair("node1", "node2"), rails.Pair("node4", "node10")]
    assert rails.plan(["c", "a", "b"]) == [rails.Pair("a", "b"), rails.Pair("c", "a", again=True)]
    assert rails.plan(["a"]) == []


def test_pair_rails_fail_a_down_port_without_a_run() -> None:
    a = rails.node_rails("node001", _doc(_state("node001")), None)
    down = _state("node002")
    sim.inject_into(down, "ib-port-down", 5)
    b = rails.node_rails("node002", _doc(down), None)
    run, failed, notes = rails.pair_rails(a, b)
    assert run == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_6", "mlx5_7"]
    assert failed == {"mlx5_5": "port mlx5_5/1 on node002 is 1: DOWN: not measured"}
    assert notes == []


def _result(client: str, server: str, figures: dict[str, Any], rate: float | None = 400.0,
            memory: str = "cuda") -> dict[str, Any]:
    rails_doc = {r: (v if isinstance(v, dict) else {"gbps": v, "memory": memory, "memory_note": "host memory: x"})
                 for r, v in figures.items()}
    return {"client": client, "server": server, "model": "NVIDIA H200", "rate_gbps": rate, "rails": rails_doc}


def test_judge_below_the_floor_is_crit_naming_both_nodes_rail_and_cable() -> None:
    healthy = {f"mlx5_{i}": 392.0 + i * 0.3 for i in range(8)}
    results = [_result("n1", "n2", {**healthy, "mlx5_3": 196.0}), _result("n3", "n4", healthy)]
    [first, second] = rails.judge_pairs(results, None)
    assert (first.status, second.status) == ("crit", "ok")
    [bad] = first.to_dict()["findings"]
    assert (bad["client"], bad["server"], bad["rail"], bad["status"], bad["value"], bad["floor"]) == (
        "n1", "n2", "mlx5_3", "crit", 196.0, 360.0)
    assert bad["reason"] == "196.0 below the H200 SXM 400 Gb/s rail floor 360.0 (GPUDirect memory)"
    assert bad["action"].startswith("inspect rail mlx5_3 between n1 and n2: its cables and transceivers")


def test_judge_a_straggler_above_the_floor_is_warn_and_host_memory_points_at_placement() -> None:
    healthy = {f"mlx5_{i}": 392.0 for i in range(8)}
    results = [_result("n1", "n2", {**healthy, "mlx5_6": 365.0}, memory="host"), _result("n3", "n4", healthy,
                                                                                          memory="host")]
    [first, second] = rails.judge_pairs(results, None)
    [bad] = first.to_dict()["findings"]
    assert (bad["rail"], bad["status"]) == ("mlx5_6", "warn")
    assert bad["reason"] == "straggler: 365.0 < fleet median 392.0 - 19.6 (host memory)"
    assert bad["action"].startswith("GPUDirect RDMA was off on rail mlx5_6 (host memory: x)")
    assert second.status == "ok"


def test_judge_scales_the_floor_to_the_rail_rate_and_takes_the_baseline_override() -> None:
    [hdr] = rails.judge_pairs([_result("n1", "n2", {"mlx5_0": 175.0}, rate=200.0)], None)
    assert [(v.status, v.floor) for v in hdr.rails] == [("crit", 180.0)]
    [ok] = rails.judge_pairs([_result("n1", "n2", {"mlx5_0": 185.0}, rate=200.0)], None)
    assert [(v.status, v.floor) for v in ok.rails] == [("ok", 180.0)]
    over = {"H200 SXM": {"ib_write_bw_gbps": 380.0}}
    [strict] = rails.judge_pairs([_result("n1", "n2", {"mlx5_0": 375.0})], over)
    assert [(v.status, v.floor) for v in strict.rails] == [("crit", 380.0)]


def test_judge_a_failed_rail_is_crit_and_one_that_did_not_run_unknown() -> None:
    results = [_result("n1", "n2", {"mlx5_0": {"failed": "port mlx5_0/1 on n2 is 1: DOWN: not measured"},
                                    "mlx5_1": {"error": "Couldn't connect to n2:18516"}, "mlx5_2": 392.0})]
    [pv] = rails.judge_pairs(results, None)
    assert pv.status == "crit"
    assert [(v.rail, v.status, v.reason) for v in pv.rails] == [
        ("mlx5_0", "crit", "port mlx5_0/1 on n2 is 1: DOWN: not measured"),
        ("mlx5_1", "unknown", "did not run: Couldn't connect to n2:18516"),
        ("mlx5_2", "ok", ""),
    ]


def test_client_retries_until_the_server_listens_then_parses() -> None:
    calls: list[list[str]] = []
    good = (FIXTURES / "ib_write_bw_gdr_client.txt").read_text()

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert kw["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # --use_cuda's index is NVML's
        calls.append(argv)
        if len(calls) < 3:
            return subprocess.CompletedProcess(argv, 1, "", " Couldn't connect to 10.0.0.2:18515\n")
        return subprocess.CompletedProcess(argv, 0, good, "")

    rail = {"device": "mlx5_3", "port": 1, "active": True, "memory": "cuda", "gpu": 3, "gpudirect": "nvidia_peermem"}
    doc = ibbw.client([rail], "10.0.0.2", 18515, 10, connect_s=30.0, run=run)
    assert len(calls) == 3
    assert doc["rails"]["mlx5_3"]["gbps"] == 391.84
    assert doc["rails"]["mlx5_3"]["memory_note"] is None  # perftest picked GPU 3, as asked
    rail["gpu"] = 2
    calls.clear()
    doc = ibbw.client([rail], "10.0.0.2", 18515, 10, connect_s=30.0, run=run)
    assert doc["rails"]["mlx5_3"]["memory_note"] == "perftest picked GPU 3, not GPU 2"


def test_client_reports_a_port_perftest_finds_down_as_failed() -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", " Port number 1 state is Down\n Couldn't set up context\n")

    rail = {"device": "mlx5_0", "port": 1, "active": True, "memory": "host"}
    doc = ibbw.client([rail], "h2", 18515, 10, connect_s=0.0, run=run)
    assert doc["rails"]["mlx5_0"]["failed"] == "ib_write_bw: port mlx5_0 state is Down"


def test_server_is_ended_by_stop_with_its_ib_write_bw(tmp_path: Path) -> None:
    """A server whose client never comes: ``ib-bw stop`` ends it, and it ends its ib_write_bw."""
    fake = tmp_path / "bin" / "ib_write_bw"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/child.pid\nexec sleep 600\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    run_dir = tmp_path / "run"
    code = (
        "import json, sys\n"
        "from fleetops.validation.node import ibbw\n"
        "rail = {'device': 'mlx5_0', 'port': 1, 'active': True, 'memory': 'host'}\n"
        f"print(json.dumps(ibbw.serve([rail], 18515, 10, 120.0, 'tok-1', {str(run_dir)!r})))\n"
    )
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code, "ib-bw", "tok-1"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 20
        while not ((tmp_path / "child.pid").exists() and (run_dir / "ib-bw-tok-1.pid").exists()):
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        child = int((tmp_path / "child.pid").read_text())
        assert ibbw.stop("tok-1", str(run_dir))["stopped"] is True
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    import json

    doc = json.loads(out)
    assert doc["rails"]["mlx5_0"]["error"] == "stopped before its client finished"
    assert not (run_dir / "ib-bw-tok-1.pid").exists()
    assert not os.path.exists(f"/proc/{child}")  # ended and reaped by the server
    assert ibbw.stop("tok-1", str(run_dir)) == {"kind": "ib-bw", "role": "stop", "stopped": False,
                                                "note": "no server of this token runs"}


def _lent_gpu_doc() -> dict[str, Any]:
    """The ``rdma`` section as the agent writes it on the lent GPU machine (captured fabric)."""
    import json

    from fleetops import codec

    facts = json.loads((FIXTURES.parent / "rdma" / "lent_gpu_no_rdma.json").read_text())
    fabric = codec.build(model.Fabric, facts["fabric"], "fabric")
    gpus = [{"index": i, "bus_id": b} for i, b in enumerate(facts["gpu_bus_ids"])]
    rdma = ibbw.describe(fabric, gpus, facts["ib_write_bw"], (None, "nvidia_peermem not loaded"))
    return {"gpus": [{"name": facts["gpu_name"]}], "rdma": rdma}


def test_the_lent_gpu_machine_without_rdma_device_is_not_applicable() -> None:
    doc = _lent_gpu_doc()
    assert doc["rdma"]["not_applicable"] == "no RDMA device: /sys/class/infiniband is empty"
    nr = rails.node_rails("gpu1", doc, None)
    assert (nr.not_applicable, nr.error, nr.rails) == ("no RDMA device: /sys/class/infiniband is empty", None, {})


def test_controller_without_rdma_nodes_says_not_applicable_and_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes like the lent machine: no pair, no SSH command, the reason per node."""
    import argparse

    from fleetops.fleet import transport
    from fleetops.fleet.inventory import Host
    from fleetops.validation import cli

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("no SSH command may run")

    monkeypatch.setattr(transport, "run_all", refuse)
    hosts = [Host("gpu1", "127.0.0.1"), Host("gpu2", "127.0.0.2")]
    docs = {h.name: _lent_gpu_doc() for h in hosts}
    args = argparse.Namespace(forks=4, connect_timeout=5.0, known_hosts=None, accept_new_hostkeys=False)
    out = cli.pair_tests(args, hosts, docs, {})
    assert out == {"not_applicable": "no node has an RDMA compute rail and perftest",
                   "skipped": {"gpu1": "no RDMA device: /sys/class/infiniband is empty",
                               "gpu2": "no RDMA device: /sys/class/infiniband is empty"},
                   "verdicts": []}
    table = cli._table([], {}, [], [], False, out)
    assert table.splitlines()[-1] == ("0 GPUs: 0 ok, 0 warn, 0 crit, 0 unknown; RDMA pair test not applicable: no node "
                                      "has an RDMA compute rail and perftest; 0 nodes without a result")


class _FakeSsh:
    """``transport.run_all`` for one pair: the server blocks until ``ib-bw stop`` with its token
    arrives (as a server whose client never came); the client answers ``client``."""

    def __init__(self, client: Any) -> None:
        import threading

        self.client = client
        self.stopped = threading.Event()
        self.calls: list[list[str]] = []

    def run_all(self, hosts: list[Any], argv: list[str], **_: Any) -> dict[str, Any]:
        import json

        from fleetops.fleet.transport.common import Result

        self.calls.append(list(argv))
        host = hosts[0].name
        role = argv[argv.index("ib-bw") + 1]
        if role == "server":
            assert self.stopped.wait(30), "the server was never stopped"
            doc = {"kind": "ib-bw", "role": "server", "rails": {"mlx5_0": {"error": "stopped before its client finished"}}}
            return {host: Result(host, True, 0, json.dumps(doc), "", None, None, 0.1)}
        if role == "stop":
            token = argv[argv.index("--token") + 1]
            server_argv = next(c for c in self.calls if "server" in c)
            assert server_argv[server_argv.index("--token") + 1] == token
            self.stopped.set()
            return {host: Result(host, True, 0, json.dumps({"kind": "ib-bw", "role": "stop", "stopped": True}), "",
                                 None, None, 0.1)}
        if isinstance(self.client, BaseException):
            raise self.client
        return {host: self.client}


def _pair_args() -> Any:
    import argparse

    return argparse.Namespace(forks=4, connect_timeout=5.0, known_hosts=None, accept_new_hostkeys=False)


def test_a_client_that_fails_still_stops_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetops.fleet.inventory import Host
    from fleetops.fleet.transport.common import Result
    from fleetops.validation import cli

    monkeypatch.setattr(cli, "PAIR_WAIT_AFTER_CLIENT_S", 0.2)
    failed = Result("n1", False, 255, "", "", "unreachable", "connection refused", 0.1)
    ssh = _FakeSsh(failed)
    out = cli._measure_pair(Host("n1", "10.0.0.1"), Host("n2", "10.0.0.2"), ["mlx5_0"], _pair_args(), ssh)
    assert ssh.stopped.is_set()
    assert [c[c.index("ib-bw") + 1] for c in ssh.calls] == ["server", "client", "stop"]
    assert out["mlx5_0"]["error"].startswith("the client on n1 gave no answer: ")
    assert out["mlx5_0"]["error"].endswith("; server on n2: stopped before its client finished")


def test_a_controller_error_mid_pair_still_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetops.fleet.inventory import Host
    from fleetops.validation import cli

    monkeypatch.setattr(cli, "PAIR_WAIT_AFTER_CLIENT_S", 0.2)
    ssh = _FakeSsh(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        cli._measure_pair(Host("n1", "10.0.0.1"), Host("n2", "10.0.0.2"), ["mlx5_0"], _pair_args(), ssh)
    assert ssh.stopped.is_set()
    assert [c[c.index("ib-bw") + 1] for c in ssh.calls] == ["server", "client", "stop"]


def test_the_baseline_overrides_the_rail_floor_and_refuses_one_over_the_rate(tmp_path: Path) -> None:
    from fleetops import baseline
    from fleetops.validation import cli

    base = baseline.from_mapping({"validation": {"floors": {"NVIDIA H200": {"ib_write_bw_gbps": 380}}}}, "b.yml")
    result = {**_result("n1", "n2", {"mlx5_0": 375.0}), "floors": cli.floor_overrides(base)}
    [pv] = rails.judge_pairs([result], None)
    assert [(v.status, v.floor) for v in pv.rails] == [("crit", 380.0)]
    bad = tmp_path / "b.yml"
    bad.write_text("validation:\n  floors:\n    NVIDIA H200:\n      ib_write_bw_gbps: 450\n")
    with pytest.raises(baseline.BaselineError, match=r"b.yml:4: .*ib_write_bw_gbps: must be between 0 and 400 Gb/s, got 450"):
        baseline.load_file(str(bad))


def test_the_pid_folder_falls_back_where_run_is_not_writable(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be: it cannot be made
    import tempfile

    assert ibbw.run_dir_for(str(blocked / "run")) == os.path.join(tempfile.gettempdir(), f"fleetops-{os.getuid()}")
    assert ibbw.run_dir_for(str(tmp_path / "run")) == str(tmp_path / "run")
    with pytest.raises(ibbw.IbBwError, match="letters, digits"):
        ibbw.pid_file("../../etc/x", str(tmp_path))
