"""The realistic tier for ``fleetops drain`` and ``fleetops resume``: three Debian hosts booted with
systemd-nspawn -b, each with slurmd, and a real slurmctld on this machine (nspawn_hosts.py). The
commands run scontrol on the controller (SLURM_CONF points it at this cluster), never on a node.

- an operator's drain names its owner in Slurm's Reason, and its resume lifts it;
- another owner's drain (the health program's, set with the cluster's scontrol as the health
  program would) is refused by both commands with the owner named, and ``--force`` lifts it;
- the capacity guard refuses a drain that would take more than the share of the partition out
  (three nodes, 10%: never more than one out), counting a node someone else took out.

The hosts use their own first address (``FLEETOPS_NSPAWN_TEST_ADDRESS``, default 127.0.49.1) so
this module does not collide with test_ansible_realistic.py's cluster.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import nspawn_hosts
import pytest

from fleetops import cli
from fleetops.ops import slurm as ops_slurm

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODES = ["node201", "node202", "node203"]
FIRST_ADDRESS = os.environ.get("FLEETOPS_NSPAWN_TEST_ADDRESS", "127.0.49.1")
HEALTH = "[fleetops] health/20261206T031207Z-7c1e-node202: memory.ecc_dbe_volatile on GPU-5d3e 0000:18:00.0"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    reason = nspawn_hosts.skip_reason() or nspawn_hosts.slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("nspawn-drain")
    try:
        c = nspawn_hosts.up(directory, NODES, "580.159.04", "580.163.01", first=FIRST_ADDRESS, slurm=True)
    except nspawn_hosts.HostsUnavailable as exc:
        pytest.skip(f"container test hosts cannot run here: {exc}")
    try:
        # no agent is installed: drain and resume never touch the node (an empty wheelhouse)
        nspawn_hosts.write_inventory(c, directory / "wheelhouse")
        c.slurm.until_idle()
        yield c
    finally:
        nspawn_hosts.down(c)


@pytest.fixture
def fleetops(cluster, monkeypatch: pytest.MonkeyPatch):
    """``fleetops ARGS -i INVENTORY`` in this process, scontrol on the controller; (exit, out, err)."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.slurm.conf))
    cluster.slurm.resume_all()

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([*argv, "-i", str(cluster.inventory)])
        return code, out.getvalue(), err.getvalue()

    yield run
    cluster.slurm.resume_all()


def test_an_operators_drain_names_the_owner_and_its_resume_lifts_it(cluster, fleetops) -> None:
    run = ops_slurm.operator_run()
    code, out, err = fleetops("drain", "node201", "--reason", "GPU 3 hangs under NCCL, ticket 4411")
    assert code == 0, out + err
    state, reason = cluster.slurm.show("node201")
    assert "DRAIN" in state and reason == f"[fleetops] operator/{run}: GPU 3 hangs under NCCL, ticket 4411"
    # drained again by an operator: nothing sent, the Reason kept
    code, out, _err = fleetops("drain", "node201", "--reason", "other words")
    assert code == 0 and "nothing sent" in out, out
    assert cluster.slurm.show("node201")[1] == reason
    code, out, err = fleetops("resume", "node201", "--json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["results"][0]["outcome"] == "done" and doc["results"][0]["detail"]["owner"]["run"] == run
    state, reason = cluster.slurm.show("node201")
    assert "DRAIN" not in state and reason is None, (state, reason)


def test_another_owners_drain_is_refused_named_and_lifted_only_with_force(cluster, fleetops) -> None:
    cluster.slurm.run("update", "NodeName=node202", "State=DRAIN", f"Reason={HEALTH}")
    code, out, _err = fleetops("drain", "node202", "--reason", "mine now")
    assert code == 1, out
    assert "the health program (run 20261206T031207Z-7c1e-node202)" in out and "set by root at " in out
    assert cluster.slurm.show("node202")[1] == HEALTH
    code, out, _err = fleetops("resume", "node202")
    assert code == 1, out
    assert "the health program" in out and "fleetops resume --force" in out
    assert "DRAIN" in cluster.slurm.show("node202")[0]
    code, out, _err = fleetops("resume", "node202", "--dry-run")
    assert code == 1 and "DRAIN" in cluster.slurm.show("node202")[0], out
    code, out, err = fleetops("resume", "node202", "--force")
    assert code == 0 and "forced by an operator over the health program" in out, out + err
    assert "DRAIN" not in cluster.slurm.show("node202")[0]


def test_the_capacity_guard_refuses_a_drain_over_the_partitions_share(cluster, fleetops) -> None:
    """Three nodes at 10% may have one out; node201 is out (someone else's drain): no room."""
    cluster.slurm.run("update", "NodeName=node201", "State=DRAIN", "Reason=rack 12 PDU swap")
    code, out, _err = fleetops("drain", "node203", "--reason", "ticket 4412")
    assert code == 1, out
    assert "partition gpu: 1 of 3 nodes are out of service already (node201)" in out, out
    assert "more than the allowed 1 (10%)" in out
    assert "DRAIN" not in cluster.slurm.show("node203")[0]
    # a set is refused whole, before anything is sent
    cluster.slurm.resume_all()
    code, out, _err = fleetops("drain", "node202", "node203", "--reason", "ticket 4412", "--yes")
    assert code == 1 and out.count("refused") == 2, out
    assert all("DRAIN" not in s for s in cluster.slurm.states().values())
    # with a share that allows it, the same set goes through
    code, out, err = fleetops(
        "drain", "node202", "node203", "--reason", "ticket 4412", "--yes", "--max-drain-share", "70%"
    )
    assert code == 0, out + err
    assert all("DRAIN" in cluster.slurm.show(n)[0] for n in ("node202", "node203"))
