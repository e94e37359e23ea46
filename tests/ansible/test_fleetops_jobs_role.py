"""``playbooks/slurm_jobs.yml`` (the ``fleetops_jobs`` role) through a real ansible-playbook run
(ansible-runner) on the loopback simulated fleet: the prolog and epilog land in prolog.d /
epilog.d beside the site's own, a site's single Prolog script is never replaced, a missing
Epilog= is added only when asked, check mode changes nothing, a second run changes nothing, and
the installed prolog records a job through the agent on the node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetops.rollout.runner import RunResult, run_playbook

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "fleetops_jobs" / "files"
FIRST_ADDRESS = "127.0.72.1"
SITE_CONF = "ClusterName=sim\nPrologFlags=Contain\nProlog=/etc/slurm/site-prolog.sh\n"

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A one-node fleet whose simulated root (``<state>.root``, the role's default there) has a
    slurm.conf running a single site prolog and no epilog."""
    from fleetops.sim import fleet

    if os.geteuid() != 0 or fleet.find_sshd() is None:
        pytest.skip("needs root and sshd: the simulated fleet runs real sshd processes")
    with socket.socket() as sock:
        sock.bind((FIRST_ADDRESS, 0))
        port = sock.getsockname()[1]
    directory = tmp_path / "fleet"
    info = fleet.up(1, str(directory), first_address=FIRST_ADDRESS, port=port)
    try:
        state = info["nodes"]["node001"]["state"]
        root = Path(os.path.splitext(state)[0] + ".root")
        (root / "etc" / "slurm").mkdir(parents=True)
        (root / "etc" / "slurm" / "slurm.conf").write_text(SITE_CONF)
        yield {"info": info, "root": root, "artifacts": tmp_path / "runner", "state": state}
    finally:
        fleet.down(str(directory))


def run(node: dict[str, Any], check: bool = False, **extravars: Any) -> tuple[RunResult, str]:
    lines: list[str] = []
    result = run_playbook("slurm_jobs.yml", [node["info"]["inventory"]], extravars=extravars, check=check,
                          diff=check, emit=lambda kind, line: lines.append(line),
                          private_data_dir=str(node["artifacts"]), keep=5)
    assert not result.errors, result.errors
    assert result.ok, "\n".join(lines)
    return result, "\n".join(lines)


def events_text(result: RunResult) -> str:
    """Every event ansible-runner recorded for the run (the debug task's message among them)."""
    return "\n".join(p.read_text() for p in Path(result.artifacts).rglob("job_events/*.json"))


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_check_mode_reports_the_install_and_changes_nothing(node: dict[str, Any]) -> None:
    before = files(node["root"])
    result, _ = run(node, check=True)
    assert result.changed_hosts() == ["node001"]
    assert files(node["root"]) == before
    assert (node["root"] / "etc/slurm/slurm.conf").read_text() == SITE_CONF


def test_the_role_installs_beside_the_site_script_adds_only_what_is_asked_and_is_idempotent(
    node: dict[str, Any],
) -> None:
    root = node["root"]
    result, _ = run(node, fleetops_jobs_manage_slurm_conf=True)
    assert result.changed_hosts() == ["node001"]
    prolog = root / "etc/slurm/prolog.d/50-fleetops.sh"
    epilog = root / "etc/slurm/epilog.d/50-fleetops.sh"
    assert prolog.read_bytes() == (FILES / "fleetops-prolog.sh").read_bytes()
    assert epilog.read_bytes() == (FILES / "fleetops-epilog.sh").read_bytes()
    assert oct(prolog.stat().st_mode & 0o777) == "0o755"
    # the site's single Prolog script stays; the missing Epilog= is added (asked for)
    assert (root / "etc/slurm/slurm.conf").read_text() == SITE_CONF + "Epilog=/etc/slurm/epilog.d/*\n"
    assert ("Prolog: slurm.conf runs the site script /etc/slurm/site-prolog.sh, left as it is: call "
            "/etc/slurm/prolog.d/50-fleetops.sh from it") in events_text(result)
    assert (root / "etc/fleetops/jobs.env").read_text().splitlines()[1:] == [
        "# Settings of the fleetops job-attribution prolog and epilog (sourced by both).",
        "FLEETOPS_AGENT=/usr/local/bin/fleetops-agent",
        "FLEETOPS_JOBS_STRICT=0",
        "FLEETOPS_JOBS_TIMEOUT=10",
        "FLEETOPS_JOBS_DIR=/run/fleetops/jobs",
        "FLEETOPS_GRES_CONF=/etc/slurm/gres.conf",
    ]
    again, _ = run(node, fleetops_jobs_manage_slurm_conf=True)
    assert again.changed_hosts() == []


def test_the_installed_prolog_records_a_job_through_the_agent_on_the_node(node: dict[str, Any]) -> None:
    from fleetops.sim import gpu as sim

    run(node)
    sim.write_slurm_files(node["state"])
    entry = node["info"]["nodes"]["node001"]
    env = {"SLURM_JOB_ID": "808", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "dave", "SLURM_JOB_GPUS": "2",
           "FLEETOPS_JOBS_ENV": str(node["root"] / "none.env")}
    done = subprocess.run(
        ["ssh", "-i", node["info"]["client_key"], "-p", str(entry["port"]),
         "-o", f"UserKnownHostsFile={node['info']['known_hosts']}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", f"root@{entry['address']}",
         "env", *[f"{k}={v}" for k, v in env.items()], "/bin/sh", str(node["root"] / "etc/slurm/prolog.d/50-fleetops.sh")],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    listed = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fleetops-agent"), "job", "list",
                             "--backend", "sim", "--state", node["state"]], capture_output=True, text=True,
                            timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)["jobs"]
    assert [(j["job_id"], j["user"], [g["index"] for g in j["gpus"]]) for j in jobs] == [("808", "dave", [2])]
