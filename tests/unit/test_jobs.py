"""Job records, gres.conf, GPU resolution by device minor, cgroups, the daemon's job book and the
shipped prolog's exit rule (fleetops/jobs, fleetops/agent/serve/jobs.py, roles/fleetops_jobs)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from fleetops import model
from fleetops.agent import metrics
from fleetops.agent.serve.jobs import JobBook
from fleetops.jobs import cgroup, gres, record, resolve

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "roles" / "fleetops_jobs" / "files" / "fleetops-prolog.sh"
EPILOG = REPO / "roles" / "fleetops_jobs" / "files" / "fleetops-epilog.sh"


def gpu(index: int, minor: int | None, mig: list[model.MigInstance] | None = None) -> model.Gpu:
    return model.Gpu(index=index, uuid=f"GPU-{index}", bus_id=f"0000:{index + 0x18:02x}:00.0", minor_number=minor,
                     mig_mode_current=mig is not None, mig_instances=mig)


def a_record(job_id: str = "1234", ended_at: float | None = None, gpus: tuple[record.JobGpu, ...] = ()) -> record.JobRecord:
    return record.JobRecord(job_id=job_id, uid=1000, user="alice", started_at=100.0, ended_at=ended_at,
                            cgroup=None, cpus=8, gpus=gpus or (record.JobGpu("GPU-7", None, 7, 0),), source="test")


# --- record -------------------------------------------------------------------------------


@pytest.mark.parametrize(("job_id", "why"), [
    ("1234_7", "an array task's display name"),
    ("1234.0", "a job step"),
    ("1234.batch", "a job step"),
    ("../etc/passwd", "not a Slurm job number"),
    ("", "not a Slurm job number"),
])
def test_job_ids_other_than_a_plain_number_are_refused_with_the_reason(job_id: str, why: str) -> None:
    with pytest.raises(record.JobRecordError, match=why):
        record.check_job_id(job_id)


def test_record_round_trips_in_the_documented_format(tmp_path: Path) -> None:
    path = record.write(str(tmp_path), a_record())
    assert path == str(tmp_path / "1234.json")
    assert json.loads(Path(path).read_text()) == {
        "version": 1, "job_id": "1234", "uid": 1000, "user": "alice", "started_at": 100.0, "ended_at": None,
        "cgroup": None, "cpus": 8, "gpus": [{"uuid": "GPU-7", "mig_uuid": None, "index": 7, "minor": 0}],
        "source": "test"}
    assert record.read(path) == a_record()
    assert os.listdir(tmp_path) == ["1234.json"]  # the temporary file was renamed, none left
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


@pytest.mark.parametrize(("text", "error"), [
    ("{not json", "not JSON"),
    ('{"version": 2}', "version: expected 1, got 2"),
    ('{"version": 1, "job_id": "1234", "uid": "alice"}', "uid: expected int or null, got 'alice'"),
    ('{"version": 1, "job_id": "99", "uid": 1, "cpus": 1, "started_at": 1, "ended_at": null, "gpus": [], '
     '"user": null, "cgroup": null, "source": ""}', "job_id: '99' does not match the file's name '1234.json'"),
    ('{"version": 1, "job_id": "1234", "uid": 1, "cpus": 1, "started_at": 1, "ended_at": null, '
     '"gpus": [{"uuid": 5}], "user": null, "cgroup": null, "source": ""}', "gpus[0]: uuid: expected str, got 5"),
])
def test_a_malformed_record_is_refused_naming_the_file_and_field(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "1234.json"
    path.write_text(text)
    with pytest.raises(record.JobRecordError) as exc:
        record.read(str(path))
    assert str(exc.value).startswith(f"{path}: ")
    assert error in str(exc.value)


def test_end_sets_ended_at_once_and_prune_removes_only_records_ended_a_day_ago(tmp_path: Path) -> None:
    record.write(str(tmp_path), a_record("1"))
    record.write(str(tmp_path), a_record("2"))
    done = record.end(str(tmp_path), "1", at=1000.0)
    assert done.ended_at == 1000.0
    assert record.end(str(tmp_path), "1", at=2000.0).ended_at == 1000.0  # an epilog run twice does not move it
    old = 1000.0 + record.KEEP_ENDED_S + 1
    for name in ("1.json", "2.json"):
        os.utime(tmp_path / name, (1000.0, 1000.0))
    assert record.prune(str(tmp_path), now=old) == ["1"]
    assert os.listdir(tmp_path) == ["2.json"]


# --- gres.conf and minors -----------------------------------------------------------------


def test_gres_conf_ranges_multiple_files_and_other_nodes_lines(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(
        "# site gres.conf\n"
        "NodeName=gpu[01-02] Name=gpu Type=h200 File=/dev/nvidia[0-1,3]\n"
        "NodeName=other Name=gpu File=/dev/nvidia9\n"
        "NodeName=gpu01 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21\n"
        "Name=mps Count=100\n")
    parsed = gres.parse(str(conf), "gpu01")
    assert [(d.gres_id, d.files, d.line) for d in parsed.devices] == [
        (0, ("/dev/nvidia0",), 2), (1, ("/dev/nvidia1",), 2), (2, ("/dev/nvidia3",), 2),
        (3, ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap21"), 4)]
    assert parsed.autodetect is None


def test_missing_gres_conf_and_bad_lines_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(gres.GresError, match=f"^{tmp_path}/none: no such file"):
        gres.parse(str(tmp_path / "none"))
    bad = tmp_path / "gres.conf"
    bad.write_text("Name=gpu File=/dev/nvidia0\nName=gpu oops\n")
    with pytest.raises(gres.GresError, match=f"^{bad}:2: expected KEY=VALUE, got 'oops'"):
        gres.parse(str(bad))


def test_device_minor_from_stat_for_a_character_device_else_from_the_name(tmp_path: Path) -> None:
    assert gres.device_minor("/dev/null") == (3, "stat")  # character device 1,3
    plain = tmp_path / "nvidia5"
    plain.write_text("")
    assert gres.device_minor(str(plain)) == (5, "name")
    assert gres.device_minor(str(tmp_path / "nvidia-caps" / "nvidia-cap12")) == (12, "name")


def test_mig_minors_table_reads_gpu_instance_and_compute_instance_lines(tmp_path: Path) -> None:
    table = tmp_path / "mig-minors"
    table.write_text("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    assert gres.parse_mig_minors(str(table)) == {3: (0, 0, None), 12: (0, 1, None), 13: (0, 1, 0)}


# --- resolution ---------------------------------------------------------------------------


def conf_of(tmp_path: Path, text: str) -> gres.GresConf:
    path = tmp_path / "gres.conf"
    path.write_text(text)
    return gres.parse(str(path))


def no_mig() -> dict[int, tuple[int, int, int | None]]:
    raise AssertionError("a whole GPU needs no MIG minors table")


def test_gres_ids_resolve_by_minor_not_by_index(tmp_path: Path) -> None:
    gpus = [gpu(i, 7 - i) for i in range(8)]  # the driver numbered the device files in reverse
    found, source = resolve.resolve_gres(["0", "3"], conf_of(tmp_path, "Name=gpu File=/dev/nvidia[0-7]\n"), gpus,
                                         no_mig)
    assert [(g.uuid, g.index, g.minor) for g in found] == [("GPU-7", 7, 0), ("GPU-4", 4, 3)]
    assert "device minor from the numbers in the device files' names" in source


def test_autodetect_nvml_orders_as_nvml_enumerates_and_says_so(tmp_path: Path) -> None:
    gpus = [gpu(i, 7 - i) for i in range(8)]
    found, source = resolve.resolve_gres(["1"], conf_of(tmp_path, "AutoDetect=nvml\nName=gpu Count=8\n"), gpus,
                                         no_mig)
    assert [g.uuid for g in found] == ["GPU-1"]
    assert "Slurm orders the GPUs as NVML enumerates them" in source


def test_a_mig_device_resolves_through_the_caps_minor_to_its_mig_uuid(tmp_path: Path) -> None:
    mig = [model.MigInstance(1, 0, "3g.71gb", "MIG-a"), model.MigInstance(2, 0, "3g.71gb", "MIG-b")]
    gpus = [gpu(0, 1), gpu(1, 0, mig)]
    conf = conf_of(tmp_path, "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n")
    table = {21: (0, 2, None)}  # gpu0/gi2/access: GPU minor 0 (NVML's GPU 1), GPU instance 2
    found, _ = resolve.resolve_gres(["0"], conf, gpus, lambda: table)
    assert found == [record.JobGpu("GPU-1", "MIG-b", 1, 0)]


@pytest.mark.parametrize(("ids", "error"), [
    (["8"], "GPU id '8': {conf} declares 3 GPU device(s) (ids 0..2)"),
    (["0", "0"], "GPU id '0': names a device another id of this job already named (GPU-0)"),
    (["x"], "GPU id 'x': not a gres index"),
])
def test_unresolvable_ids_are_named_with_the_reason(tmp_path: Path, ids: list[str], error: str) -> None:
    conf = conf_of(tmp_path, "Name=gpu File=/dev/nvidia[0-1]\nName=gpu File=/dev/nvidia7\n")
    gpus = [gpu(0, 0), gpu(1, 1)]
    with pytest.raises(resolve.ResolveError) as exc:
        resolve.resolve_gres(ids, conf, gpus, no_mig)
    assert str(exc.value).startswith(error.format(conf=conf.path))


def test_a_device_minor_no_gpu_reports_is_named(tmp_path: Path) -> None:
    conf = conf_of(tmp_path, "Name=gpu File=/dev/nvidia[0-1]\nName=gpu File=/dev/nvidia7\n")
    with pytest.raises(resolve.ResolveError, match=r"GPU id '2' .*: device minor 7: no such GPU on this node "
                       r"\(minors: 0 \(index 0\), 1 \(index 1\)\)"):
        resolve.resolve_gres(["2"], conf, [gpu(0, 0), gpu(1, 1)], no_mig)


# --- cgroups ------------------------------------------------------------------------------


def test_cgroup_v2_and_v1_are_found_and_their_cpu_time_read_in_usec(tmp_path: Path) -> None:
    v2 = tmp_path / "v2" / "system.slice" / "slurmstepd.scope" / "job_42"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 9007199254740993\nuser_usec 1\n")
    (v2 / "cpuset.cpus.effective").write_text("0-3,8-9\n")
    assert cgroup.find(str(tmp_path / "v2"), "42", 1000) == str(v2)
    assert cgroup.cpu_usage_usec(str(v2)) == 9007199254740993  # past 2**53: exact
    assert cgroup.cpu_count(str(v2)) == 6
    v1 = tmp_path / "v1" / "cpu,cpuacct" / "slurm" / "uid_1000" / "job_42"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("5000000\n")
    assert cgroup.find(str(tmp_path / "v1"), "42", 1000) == str(v1)
    assert cgroup.cpu_usage_usec(str(v1)) == 5000
    assert cgroup.find(str(tmp_path / "v1"), "43", 1000) is None


# --- the daemon's book ----------------------------------------------------------------------


def test_job_book_reparses_only_changed_files_and_tags_xids_by_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real_read = record.read
    monkeypatch.setattr(record, "read", lambda path: reads.append(os.path.basename(path)) or real_read(path))
    record.write(str(tmp_path), a_record("1", ended_at=200.0))
    record.write(str(tmp_path), a_record("2"))
    book = JobBook(str(tmp_path), 3600.0, 2.0)
    assert book.scan(300.0) is True
    assert sorted(reads) == ["1.json", "2.json"]
    assert book.scan(302.0) is False
    assert sorted(reads) == ["1.json", "2.json"]  # nothing changed: nothing parsed again
    record.end(str(tmp_path), "2", at=400.0)
    assert book.scan(402.0) is True
    assert sorted(reads) == ["1.json", "2.json", "2.json", "2.json"]  # end read it, the book read it once
    node = model.Node(hostname="n", gpus=[gpu(7, 0)], xids=[
        model.XidEvent(code=31, bus_id="0000:1f:00.0", gpu_uuid="GPU-7", timestamp=150.0),
        model.XidEvent(code=13, bus_id="0000:1f:00.0", gpu_uuid="GPU-7", timestamp=350.0),
        model.XidEvent(code=48, bus_id="0000:1f:00.0", gpu_uuid="GPU-7", timestamp=450.0),
        model.XidEvent(code=79, bus_id="0000:1f:00.0", gpu_uuid="GPU-7", timestamp=None)])
    tagged = book.tag(node)
    assert [x.jobs for x in tagged.xids] == [["1", "2"], ["2"], [], None]
    assert [x.jobs for x in node.xids] == [None, None, None, None]  # the backend's snapshot untouched
    assert [(j.job_id, j.ended_at) for j in tagged.jobs or []] == [("1", 200.0), ("2", 400.0)]
    assert book.scan(200.0 + 3600.0 + 1) is True  # job 1 ended more than the window ago
    assert sorted(book.records) == ["2"]


def test_job_info_metric_lists_running_jobs_only_on_the_gpu_of_a_mig_device() -> None:
    mig = [model.MigInstance(1, 0, "3g.71gb", "MIG-b")]
    node = model.Node(hostname="n", gpus=[gpu(0, 0), gpu(1, 1, mig)], jobs=[
        model.NodeJob(job_id="5", user="bob", gpus=["GPU-0", "MIG-b"]),
        model.NodeJob(job_id="6", user="eve", gpus=["GPU-0"], ended_at=10.0)])
    page = metrics.render(metrics.MetricsInput(node=node, agent=metrics.AgentInfo(started_at=0.0, interval_s=2.0)))
    assert [line for line in page.splitlines() if line.startswith("fleetops_gpu_job_info")] == [
        'fleetops_gpu_job_info{uuid="GPU-0",gpu="0",job="5",user="bob"} 1',
        'fleetops_gpu_job_info{uuid="GPU-1",gpu="1",job="5",user="bob"} 1']
    assert "job=" not in "".join(line for line in page.splitlines() if not line.startswith("fleetops_gpu_job_info"))


def test_snapshot_v1_without_jobs_or_minor_numbers_still_reads() -> None:
    node = model.node_from_dict({"schema": "fleetops.snapshot/v1", "hostname": "n",
                                 "gpus": [{"index": 0, "uuid": "GPU-0", "bus_id": "0000:18:00.0"}],
                                 "xids": [{"code": 31}]})
    assert node.jobs is None
    assert node.gpus[0].minor_number is None
    assert node.xids[0].jobs is None


# --- the shipped prolog and epilog ----------------------------------------------------------


def fake_agent(tmp_path: Path, status: int) -> Path:
    agent = tmp_path / "fake-agent"
    agent.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\necho '{{\"error\": \"boom\"}}' >&2\nexit {status}\n")
    agent.chmod(0o755)
    return agent


@pytest.mark.parametrize("script", [PROLOG, EPILOG])
def test_prolog_and_epilog_exit_0_when_the_agent_fails_unless_strict(tmp_path: Path, script: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "FLEETOPS_AGENT": str(fake_agent(tmp_path, 1)), "SLURM_JOB_ID": "77",
           "FLEETOPS_JOBS_ENV": str(tmp_path / "none.env"), "FLEETOPS_JOBS_SYSLOG": "0"}
    done = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False)
    verb = "start" if script == PROLOG else "end"
    assert done.returncode == 0
    assert done.stderr == (f"{script.stem}: job 77: fleetops-agent job {verb} failed (exit 1): "
                           '{"error": "boom"}\n')
    assert (tmp_path / "argv").read_text() == f"job {verb}\n"
    strict = subprocess.run(["/bin/sh", str(script)], env={**env, "FLEETOPS_JOBS_STRICT": "1"}, capture_output=True,
                            text=True, timeout=30, check=False)
    assert strict.returncode == 1


@pytest.mark.parametrize("profile", [None, "steady", "input-bound"])
def test_sim_job_start_refuses_a_straggler_elsewhere_without_a_straggler_job(tmp_path: Path, profile: str | None) -> None:
    from fleetops.sim.fleet import jobs as sim_jobs
    from fleetops.sim.fleet.base import SimFleetError

    with pytest.raises(SimFleetError, match="--straggler-elsewhere .* give --profile straggler"):
        sim_jobs.start(str(tmp_path), "node001", "42", "0", profile=profile, straggler_elsewhere=True)


# --- fleetops-agent job start, with the environment a real slurmd gives the prolog -----------


@pytest.mark.parametrize(("environ", "cpus"), [
    ({"SLURM_JOB_CPUS_PER_NODE": "1"}, 1),  # what slurmd 22.05 gave a one-node job's prolog
    ({"SLURM_JOB_CPUS_PER_NODE": "8(x4)"}, 8),
    ({"SLURM_JOB_CPUS_PER_NODE": "8(x2),8"}, 8),
    ({"SLURM_JOB_CPUS_PER_NODE": "8(x2),4"}, None),  # which count is this node's is not said
    ({"SLURM_JOB_CPUS_PER_NODE": "8(2)"}, None),
    ({"SLURM_CPUS_ON_NODE": "6", "SLURM_JOB_CPUS_PER_NODE": "8"}, 6),  # a step's, where it is set
    ({}, None),
])
def test_job_cpus_come_from_the_per_node_counts_slurmd_gives_the_prolog(environ: dict[str, str],
                                                                       cpus: int | None) -> None:
    from fleetops.agent.job_cli import env_cpus

    assert env_cpus(environ) == cpus


def agent_start(tmp_path: Path, environ: dict[str, str], *argv: str) -> dict:
    import sys

    from fleetops.sim import gpu as sim

    state = tmp_path / "node001.json"
    if not state.exists():
        sim.write_state(str(state), sim.build_state("node001", {}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "FLEETOPS_", "CUDA_"))}
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.agent.main", "job", "start", "--backend", "sim", "--state", str(state),
         "--jobs-dir", str(tmp_path / "jobs"), "--gres-conf", str(tmp_path / "gres.conf"), *argv],
        env={**env, **environ}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["job"]


def test_job_start_reads_gres_conf_lines_of_the_node_slurmd_names_not_of_the_hostname(tmp_path: Path) -> None:
    # the node is Slurm's gpu-a (SLURMD_NODENAME), its host name node001: a gres.conf shared by
    # the cluster lists each node's devices under its Slurm name
    (tmp_path / "gres.conf").write_text("NodeName=gpu-a Name=gpu File=/dev/nvidia3\n"
                                        "NodeName=node001 Name=gpu File=/dev/nvidia5\n")
    environ = {"SLURM_JOB_ID": "41", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "0",
               "SLURMD_NODENAME": "gpu-a", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}
    job = agent_start(tmp_path, environ)
    assert [(g["minor"], g["index"]) for g in job["gpus"]] == [(3, 3)] and job["cpus"] == 4
    flagged = agent_start(tmp_path, {**environ, "SLURM_JOB_ID": "42"}, "--node-name", "node001")
    assert [g["minor"] for g in flagged["gpus"]] == [5]


def test_slurm_conf_gives_the_nodes_gpu_types_in_its_gres_order(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("GresTypes=gpu\nNodeName=DEFAULT Gres=gpu:h100:8\n"
                    "NodeName=gpu[01-02] CPUs=8 Gres=gpu:z:1,gpu:a:7(S:0-1),gpu:z:1 # z twice: counted once\n"
                    "NodeName=gpu03 CPUs=8\nNodeName=gpu04 Gres=gpu:8,mps:100\n")
    assert gres.node_gpu_types(str(conf), "gpu02") == ["z", "a"]
    assert gres.node_gpu_types(str(conf), "gpu03") == ["h100"]  # NodeName=DEFAULT's
    assert gres.node_gpu_types(str(conf), "gpu04") == [""]
    assert gres.node_gpu_types(str(conf), "gpu09") is None
    assert gres.node_gpu_types(str(tmp_path / "none.conf"), "gpu01") is None


def test_typed_gres_ids_follow_slurm_conf_type_order_not_gres_conf_lines(tmp_path: Path) -> None:
    # what a real slurmd 22.05 did: Gres=gpu:z:1,gpu:a:7 with the Type=z line second in gres.conf,
    # and a job given gres id 0 got /dev/nvidia3 (the z line); ids 1 and 2 the first two a lines
    conf = conf_of(tmp_path, "Name=gpu Type=a File=/dev/nvidia0\nName=gpu Type=z File=/dev/nvidia3\n"
                             "Name=gpu Type=a File=/dev/nvidia2\nName=gpu Type=a File=/dev/nvidia1\n")
    ordered = gres.in_slurmd_order(conf, ["z", "a"])
    assert [d.files[0] for d in ordered.devices] == ["/dev/nvidia3", "/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia1"]
    assert [d.gres_id for d in ordered.devices] == [0, 1, 2, 3]
    gpus = [gpu(i, i) for i in range(4)]
    found, _ = resolve.resolve_gres(["0", "1"], ordered, gpus, no_mig)
    assert [g.minor for g in found] == [3, 0]
    assert gres.in_slurmd_order(conf, ["a"]) is conf and gres.in_slurmd_order(conf, None) is conf
