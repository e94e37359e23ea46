"""Job attribution against a real slurmd: one Debian host booted with systemd-nspawn -b
(nspawn_hosts.py) whose slurmd (Slurm 22.05) is registered with a real slurmctld on this machine
as a GPU node: slurm.conf ``GresTypes=gpu`` and ``Gres=gpu:8``, a gres.conf naming
``/dev/nvidia0`` .. ``/dev/nvidia7`` in minor order, and those files made at boot as character
devices of NVIDIA's major with the simulated GPUs' minors, which are NOT their NVML indexes
(MINORS). The agent and the job-attribution role go in by the playbooks (agent.yml,
slurm_jobs.yml, which adds Prolog=/Epilog= globs to the node's slurm.conf), and real jobs are
submitted with sbatch, as ``nobody``.

What this pins, from what the real slurmd did:
- the prolog's record exists while the job runs and names exactly the GPUs of the device files
  Slurm gave the job (worked out here independently: the ids the job itself sees, gres.conf's
  order, each file's st_rdev minor, the simulated GPU with that minor), with the job's user and
  uid; the epilog ends it;
- no cgroup: this slurm.conf runs proctrack/linuxproc and task/none, and the record says so
  (``cgroup`` null). The cgroup plugins cannot run here: on this machine's hybrid hierarchy the
  container's cgroup v1 controllers are mounted read-only and its cgroup2 (/sys/fs/cgroup/unified)
  has no controllers, so cgroup.candidates() is not checked against a real slurmstepd path;
- typed gres: slurmd numbers gres.conf's devices grouped by type in the order of slurm.conf's
  ``Gres=``, not in gres.conf's line order, and the record of a ``--gres=gpu:z:1`` job names the
  one z device's GPU;
- MIG: a GPU in MIG mode with 1g, 3g and 1g instances, gres.conf's ``MultipleFiles=`` lines (its
  /dev/nvidia<minor> and nvidia-caps files, made as character devices) interleaving the profiles:
  slurmd gives a gpu:3g.71gb job id 0 (slurm.conf names 3g first) and the record names that MIG
  instance's UUID through the node's mig-minors table (line order would have named a whole GPU);
- the environment slurmd gives its prolog and epilog (dumped by a script chained before ours) and
  the one ``fleetops sim job`` fabricates (``fleetops.sim.fleet.jobs.slurm_env``) agree on every
  variable the simulator sets and every one the agent reads.

One host, booted once for the module: about 40 s in all once the base image is cached.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nspawn_hosts
import pytest
from polling import until

pytestmark = [pytest.mark.root, pytest.mark.slow]

OLD, NEW = "580.159.04", "580.163.01"
NODE = "node601"
# Each simulated GPU's device minor, by NVML index: out of index order, as on a node whose driver
# numbered its device files otherwise than NVML enumerates them.
MINORS = [3, 1, 0, 2, 4, 5, 7, 6]
NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_JOBS_TEST_ADDRESS", "127.0.52.1")
ENV_DUMP = "10-fleetops-test-env.sh"
# What fleetops-agent job start/end reads from the environment slurmd gives the scripts.
AGENT_READS = (
    "SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_USER", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES",
    "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURMD_NODENAME",
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = nspawn_hosts.skip_reason() or nspawn_hosts.slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("nspawn-jobs")
    try:
        c = nspawn_hosts.up(
            directory, [NODE], OLD, NEW, first=FIRST_ADDRESS, slurm=True, gpu_minor_numbers=MINORS, gres=True
        )
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        wheelhouse = directory / "wheelhouse"
        nspawn_hosts.build_wheel(REPO, wheelhouse)
        nspawn_hosts.write_inventory(
            c,
            wheelhouse,
            {
                "fleetops_agent_service": False,
                "fleetops_audit_history": False,
                # the node's slurm.conf sets no Prolog=/Epilog=: the role adds the globs
                "fleetops_jobs_manage_slurm_conf": True,
            },
        )
        yield c
    finally:
        nspawn_hosts.down(c)


def _playbook(c: Any, book: str) -> tuple[bool, str]:
    from fleetops.rollout.progress import summary_text
    from fleetops.rollout.runner import run_playbook

    lines: list[str] = []
    result = run_playbook(
        book, [str(c.inventory)], emit=lambda k, line: lines.append(line),
        private_data_dir=str(c.directory / "runner"),
    )  # fmt: skip
    return result.ok, "\n".join(lines) + "\n" + summary_text(result.rows) + "\n" + "\n".join(result.errors)


def _slurm(c: Any, *argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(c.slurm.conf)}
    done = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, f"{argv}: {done.stderr}{done.stdout}"
    return done.stdout


def _job_state(c: Any, job: str) -> str:
    out = _slurm(c, "scontrol", "show", "job", job, "-o")
    return next(w[9:] for w in out.split() if w.startswith("JobState="))


def _env_file(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _read(c: Any, path: str) -> str | None:
    done = c.ssh(c.hosts[0], f"cat {path}", check=False)
    return done.stdout if done.returncode == 0 else None


@pytest.fixture(scope="module")
def installed(cluster: Any) -> Any:
    """The agent and the role installed by their playbooks, our env dump chained before the
    role's script, and slurmd reconfigured to the slurm.conf the role changed."""
    for book in ("agent.yml", "slurm_jobs.yml"):
        ok, text = _playbook(cluster, book)
        assert ok, text
    host = cluster.hosts[0]
    conf = cluster.ssh(host, "cat /etc/slurm/slurm.conf").stdout.splitlines()
    assert conf[-2:] == ["Prolog=/etc/slurm/prolog.d/*", "Epilog=/etc/slurm/epilog.d/*"], conf
    for kind in ("prolog", "epilog"):
        # runs before 50-fleetops.sh (Slurm runs the glob's files in name order)
        script = f"#!/bin/sh\nenv > /run/fleetops-test-env.{kind}.$SLURM_JOB_ID\n"
        cluster.ssh(
            host,
            f"printf %s {_quote(script)} > /etc/slurm/{kind}.d/{ENV_DUMP} && chmod 755 /etc/slurm/{kind}.d/{ENV_DUMP}",
        )
    # as an operator does after changing slurm.conf: slurmd re-reads its own file
    _slurm(cluster, "scontrol", "reconfigure")
    cluster.slurm.until_idle(60)
    return cluster


def _quote(text: str) -> str:
    return shlex.quote(text)


JOB_SCRIPT = """#!/bin/sh
# prints the environment it runs in, then holds its GPUs until the test releases it
env > /tmp/job-env.$SLURM_JOB_ID
i=0
while [ ! -e /tmp/release.$SLURM_JOB_ID ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
"""


def _submit(c: Any, tmp_path: Path, gpus: int) -> str:
    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT)
    out = _slurm(
        c, "sbatch", "--parsable", f"--uid={NOBODY}", f"--gid={NOBODY}", f"--gres=gpu:{gpus}", "--oversubscribe",
        "-w", NODE, "--chdir=/tmp", "--output=/dev/null", str(script),
    )  # fmt: skip
    return out.strip().split(";")[0]


def _job_env(c: Any, job: str) -> dict[str, str]:
    """The job's own environment, once its batch script has written it (the prolog has run)."""
    text = until(
        f"job {job} to start and print its environment", lambda: _read(c, f"/tmp/job-env.{job}"), 60, 0.3
    )
    return _env_file(text)


def _expected_uuids(c: Any, ids: str) -> list[tuple[str, int, int]]:
    """(UUID, minor, NVML index) of the GPUs behind gres ids ``ids`` (``0,1,2``), worked out
    without fleetops: the Nth ``Name=gpu File=`` of the node's gres.conf, that file's minor from
    stat in the container, the simulated GPU with that minor."""
    files = []
    for line in (c.hosts[0].root / "etc/slurm/gres.conf").read_text().splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w and not line.startswith("#"))
        if words.get("Name") == "gpu":
            files.append(words["File"])
    gpus = c.state(NODE)["gpus"]
    out = []
    for gres_id in (int(i) for i in ids.split(",")):
        major, minor = (
            int(x, 16) for x in c.ssh(c.hosts[0], f"stat -c '%t %T' {files[gres_id]}").stdout.split()
        )
        assert major == nspawn_hosts.NVIDIA_MAJOR
        (gpu,) = [g for g in gpus if g["minor_number"] == minor]
        out.append((gpu["uuid"], minor, gpu["index"]))
    return out


def _slurmd_devices(c: Any) -> list[str]:
    """slurmd's own GPU device list, in the order it numbers them (its gres ids), from the lines
    DebugFlags=Gres has it log each time it loads gres.conf (``gpu device number 3(/dev/nvidia3)``):
    the last load's."""
    log = c.ssh(c.hosts[0], "cat /var/log/slurmd.log").stdout
    return re.findall(r"gpu device number -?[0-9]+\(([^)]+)\)", log)[-len(MINORS) :]


def _record(c: Any, job: str) -> dict[str, Any] | None:
    text = _read(c, f"/run/fleetops/jobs/{job}.json")
    return json.loads(text) if text else None


def _release(c: Any, job: str) -> None:
    c.ssh(c.hosts[0], f"touch /tmp/release.{job}")
    until(f"job {job} to complete", lambda: _job_state(c, job) == "COMPLETED", 60, 0.3)


def test_the_prolog_records_the_gpus_slurm_gave_two_jobs_by_device_minor_and_the_epilog_ends_them(
    installed: Any, tmp_path: Path
) -> None:
    c = installed
    first = _submit(c, tmp_path, 3)
    first_env = _job_env(c, first)
    second = _submit(c, tmp_path, 2)
    second_env = _job_env(c, second)
    try:
        jobs = {first: first_env, second: second_env}
        assert {first_env["SLURM_JOB_GPUS"], second_env["SLURM_JOB_GPUS"]} == {"0,1,2", "3,4"}, jobs
        for job, env in jobs.items():
            assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_JOB_GPUS"]  # no device cgroup: global ids
            expected = _expected_uuids(c, env["SLURM_JOB_GPUS"])
            job_rec = _record(c, job)
            assert job_rec is not None, f"no record of job {job}"
            assert job_rec["ended_at"] is None
            assert [g["uuid"] for g in job_rec["gpus"]] == [u for u, _, _ in expected], (job_rec, expected)
            assert [(g["minor"], g["index"]) for g in job_rec["gpus"]] == [(m, i) for _, m, i in expected]
            assert (job_rec["uid"], job_rec["user"]) == (NOBODY, "nobody")
            # slurmd gives the prolog no SLURM_CPUS_ON_NODE, only SLURM_JOB_CPUS_PER_NODE (here 1)
            assert job_rec["cpus"] == 1
            assert "device files' st_rdev" in job_rec["source"], job_rec["source"]
            # no cgroup plugin in this slurm.conf (proctrack/linuxproc, task/none): none recorded
            assert job_rec["cgroup"] is None
        # gres.conf's order is slurmd's own numbering here (one type)
        assert _slurmd_devices(c) == [f"/dev/nvidia{m}" for m in sorted(MINORS)]
        # the minors are not the indexes: an index-based mapping would have named other GPUs
        assert any(
            m != i for job_env in jobs.values() for _, m, i in _expected_uuids(c, job_env["SLURM_JOB_GPUS"])
        )
    finally:
        for job in (first, second):
            c.ssh(c.hosts[0], f"touch /tmp/release.{job}")
    for job in (first, second):
        _release(c, job)
        ended = until(
            f"job {job}'s record ended by the epilog",
            lambda j=job: (_record(c, j) or {}).get("ended_at"),
            30,
            0.3,
        )
        assert ended > 0
    config = _slurm(c, "scontrol", "show", "config")
    assert "proctrack/linuxproc" in config and "task/none" in config


def test_slurmd_gives_the_prolog_and_epilog_what_the_simulator_fabricates(
    installed: Any, tmp_path: Path
) -> None:
    from fleetops.sim.fleet.jobs import slurm_env

    c = installed
    job = _submit(c, tmp_path, 2)
    env = _job_env(c, job)
    _release(c, job)
    dumps = {
        context: _env_file(until(f"job {job}'s {kind} environment", lambda k=kind: _read(  # type: ignore[misc]
            c, f"/run/fleetops-test-env.{k}.{job}"), 30, 0.3))
        for context, kind in (("prolog_slurmd", "prolog"), ("epilog_slurmd", "epilog"))
    }  # fmt: skip
    for context, real in dumps.items():
        assert real["SLURM_SCRIPT_CONTEXT"] == context
        # what slurmd 22.05 gives both scripts: the job's gres ids, in SLURM_JOB_GPUS and in
        # CUDA_VISIBLE_DEVICES (the same ids: no device cgroup renumbers them); its CPUs only as
        # the job's per-node counts; none of its own environment, not even PATH
        assert real["SLURM_JOB_GPUS"] == real["CUDA_VISIBLE_DEVICES"] == env["SLURM_JOB_GPUS"], real
        assert "SLURM_CPUS_ON_NODE" not in real and real["SLURM_JOB_CPUS_PER_NODE"] == "1", real
        assert "PATH" not in real and "HOME" not in real, real
        fabricated = slurm_env(job, NOBODY, "nobody", env["SLURM_JOB_GPUS"], context, "/nonexistent/state.json",
                               NODE, cpus=1)  # fmt: skip
        # SLURM_CONF is set by both, each to its node's own file (the simulated node's is in its run folder)
        assert real["SLURM_CONF"] == "/etc/slurm/slurm.conf" and "SLURM_CONF" in fabricated
        ours = {k: v for k, v in fabricated.items() if not k.startswith("FLEETOPS_") and k != "SLURM_CONF"}
        assert {k: real.get(k) for k in ours} == ours, context
        assert [k for k in AGENT_READS if (k in real) != (k in fabricated)] == [], (context, sorted(real))


def test_typed_gres_ids_follow_slurm_conf_type_order_and_the_record_names_the_typed_device(
    installed: Any, tmp_path: Path
) -> None:
    """gres.conf in minor order with one device of another type (/dev/nvidia3, Type=z, its fourth
    line) and slurm.conf naming that type first (Gres=gpu:z:1,gpu:a:7): slurmd numbers the z device
    0, and the record of a job asking for gpu:z names the GPU whose minor is 3, the only z device
    (gres.conf's line 0, /dev/nvidia0, is another GPU)."""
    c = installed
    host = c.hosts[0]
    lines = ["AutoDetect=off"] + [
        f"Name=gpu Type={'z' if m == 3 else 'a'} File=/dev/nvidia{m}" for m in sorted(MINORS)
    ]
    c.ssh(host, f"printf '%s\\n' {' '.join(_quote(x) for x in lines)} > /etc/slurm/gres.conf")
    c.ssh(host, "sed -i 's/Gres=gpu:8/Gres=gpu:z:1,gpu:a:7/' /etc/slurm/slurm.conf")
    c.slurm.conf.write_text(c.slurm.conf.read_text().replace("Gres=gpu:8", "Gres=gpu:z:1,gpu:a:7"))
    _slurm(c, "scontrol", "reconfigure")
    c.ssh(host, "systemctl restart slurmd")
    until("the node's typed gres", lambda: "gpu:z:1" in _slurm(c, "scontrol", "show", "node", NODE), 60, 0.5)
    c.slurm.until_idle(60)

    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT)
    job = _slurm(
        c, "sbatch", "--parsable", f"--uid={NOBODY}", f"--gid={NOBODY}", "--gres=gpu:z:1", "--oversubscribe",
        "-w", NODE, "--chdir=/tmp", "--output=/dev/null", str(script),
    ).strip()  # fmt: skip
    other = _slurm(
        c, "sbatch", "--parsable", f"--uid={NOBODY}", f"--gid={NOBODY}", "--gres=gpu:a:2", "--oversubscribe",
        "-w", NODE, "--chdir=/tmp", "--output=/dev/null", str(script),
    ).strip()  # fmt: skip
    try:
        # slurmd's own device list: the z device first, then the a devices in gres.conf's order
        devices = _slurmd_devices(c)
        assert devices == ["/dev/nvidia3"] + [f"/dev/nvidia{m}" for m in sorted(MINORS) if m != 3], devices
        env = _job_env(c, job)
        assert env["SLURM_JOB_GPUS"] == "0", env  # slurmd's id of the z device: its type comes first
        a_env = _job_env(c, other)
        a_rec = _record(c, other)
        assert a_rec is not None
        minors = [
            int(devices[int(i)].removeprefix("/dev/nvidia")) for i in a_env["SLURM_JOB_GPUS"].split(",")
        ]
        assert [g["minor"] for g in a_rec["gpus"]] == minors and 3 not in minors, (a_env, a_rec)
        (z_gpu,) = [g for g in c.state(NODE)["gpus"] if g["minor_number"] == 3]
        rec = _record(c, job)
        assert rec is not None
        assert [(g["uuid"], g["minor"]) for g in rec["gpus"]] == [(z_gpu["uuid"], 3)], rec
        assert "grouped by type in /etc/slurm/slurm.conf's Gres= order (z, a)" in rec["source"], rec["source"]
    finally:
        for j in (job, other):
            c.ssh(host, f"touch /tmp/release.{j}")
        _release(c, job)
        _release(c, other)


CAPS_MAJOR = 240  # nvidia-caps' major is dynamic (in 234-254); slurmd and the agent only stat it


def test_mig_devices_of_interleaved_profiles_resolve_to_their_mig_uuids_under_real_slurmd(
    installed: Any, tmp_path: Path
) -> None:
    """GPU index 1 (minor 1) in MIG mode with 1g, 3g and 1g instances (gres.conf lists them by GPU
    instance id, so the two profiles interleave), its lines ``MultipleFiles=/dev/nvidia1,
    /dev/nvidia-caps/nvidia-capN,...`` as Slurm documents MIG devices; slurm.conf names 3g first.
    A gpu:3g.71gb job's record names the one 3g instance's MIG UUID; a gpu:1g.18gb job's one of
    the 1g ones, the first in gres.conf (slurmd's lowest id of that type)."""
    from fleetops.sim import gpu as sim

    c = installed
    host = c.hosts[0]
    gpu_index = 1
    with sim.locked_state(str(host.state)) as st:
        sim.set_mig_mode(st, gpu_index, True)
        sim.set_mig_instances(st, gpu_index, ["1g.18gb", "3g.71gb", "1g.18gb"])
        minor = int(st["gpus"][gpu_index]["minor_number"])
    devices = sim.write_slurm_files(str(host.state))  # the node's mig-minors table, in its run folder
    mig = sorted((d for d in devices if d["gi"] is not None), key=lambda d: d["gi"])
    assert [d["profile"] for d in mig] == ["1g.18gb", "3g.71gb", "1g.18gb"]
    caps = [[os.path.basename(f) for f in d["files"][1:]] for d in mig]
    # 8 devices, as slurm.conf had: 5 whole GPUs, the 3 MIG devices (slurmctld took a new Gres=
    # count at reconfigure only with the same total: 10 stayed gpu:8 until a restart)
    lines = ["AutoDetect=off"]
    for m in sorted(MINORS)[:6]:
        if m != minor:
            lines.append(f"Name=gpu Type=full File=/dev/nvidia{m}")
        else:
            lines += [f"Name=gpu Type={d['profile']} MultipleFiles=/dev/nvidia{m},"
                      + ",".join(f"/dev/nvidia-caps/{cap}" for cap in names) for d, names in zip(mig, caps, strict=True)]  # fmt: skip
    make = " && ".join(
        f"mknod -m 0444 /dev/nvidia-caps/{cap} c {CAPS_MAJOR} {cap.removeprefix('nvidia-cap')}"
        for names in caps
        for cap in names
    )
    c.ssh(host, f"mkdir -p /dev/nvidia-caps && rm -f /dev/nvidia-caps/* && {make}")
    c.ssh(host, f"printf '%s\\n' {' '.join(_quote(x) for x in lines)} > /etc/slurm/gres.conf")
    gres = "Gres=gpu:3g.71gb:1,gpu:1g.18gb:2,gpu:full:5"
    c.ssh(host, f"sed -i 's/Gres=[^ ]*/{gres}/' /etc/slurm/slurm.conf")
    conf = re.sub(r"Gres=\S+", gres, c.slurm.conf.read_text())
    c.slurm.conf.write_text(conf)
    _slurm(c, "scontrol", "reconfigure")
    c.ssh(host, "systemctl restart slurmd")
    until(
        "the node's MIG gres", lambda: "gpu:3g.71gb:1" in _slurm(c, "scontrol", "show", "node", NODE), 60, 0.5
    )
    c.slurm.until_idle(60)

    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT)
    jobs = {
        profile: _slurm(
            c, "sbatch", "--parsable", f"--uid={NOBODY}", f"--gid={NOBODY}", f"--gres=gpu:{profile}:1",
            "--oversubscribe", "-w", NODE, "--chdir=/tmp", "--output=/dev/null", str(script),
        ).strip()
        for profile in ("3g.71gb", "1g.18gb")
    }  # fmt: skip
    try:
        instances = {m["gpu_instance_id"]: m for m in c.state(NODE)["gpus"][gpu_index]["mig_instances"]}
        for profile, job in jobs.items():
            env = _job_env(c, job)
            # slurmd's ids: the 3g device first (slurm.conf's first type), then the 1g ones; in
            # gres.conf's line order the 3g device is the 3rd line and id 0 a whole GPU
            assert env["SLURM_JOB_GPUS"] == {"3g.71gb": "0", "1g.18gb": "1"}[profile], (profile, env)
            rec = _record(c, job)
            assert rec is not None, (profile, _read(c, "/var/log/slurmd.log"))
            first = next(d for d in mig if d["profile"] == profile)  # slurmd's lowest id of the type
            want = instances[first["gi"]]
            assert [(g["mig_uuid"], g["minor"]) for g in rec["gpus"]] == [(want["uuid"], minor)], (
                profile,
                env,
                rec,
            )
    finally:
        for job in jobs.values():
            c.ssh(host, f"touch /tmp/release.{job}")
        for job in jobs.values():
            _release(c, job)
