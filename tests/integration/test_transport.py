"""Parallel SSH against real sshd processes of the simulated fleet (needs root and openssh-server)."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time

import pytest

from fleetops import model
from fleetops.fleet import transport
from fleetops.fleet.inventory import Host
from fleetops.sim import fleet

pytestmark = pytest.mark.root

COLLECT = ["fleetops-agent", "collect"]


def without_inventory_known_hosts(hosts):
    """The hosts as if the inventory named no UserKnownHostsFile (so the argument decides)."""
    return [
        dataclasses.replace(h, vars={k: v for k, v in h.vars.items() if k != "ansible_ssh_common_args"})
        for h in hosts
    ]


def test_collect_from_every_node_is_a_valid_snapshot(clean_fleet):
    results = transport.run_all(clean_fleet.hosts, COLLECT, forks=50)
    assert list(results) == [h.name for h in clean_fleet.hosts]
    for host in clean_fleet.hosts:
        res = results[host.name]
        assert res.ok, res
        assert res.error_kind is None and res.exit_status == 0
        node = model.node_from_json(res.stdout)
        assert node.hostname == host.name  # each sshd has its own node identity
        assert node.backend == "sim" and node.gpu_count == 8
        assert res.elapsed_s > 0


def test_each_node_has_its_own_state_file(clean_fleet):
    results = transport.run_all(clean_fleet.hosts, ["printenv", "FLEETOPS_SIM_STATE", "HOME"])
    seen = set()
    for host in clean_fleet.hosts:
        state, home = results[host.name].stdout.split()
        assert state == host.vars["fleetops_sim_state"]
        assert home.endswith(f"/home/{host.name}")
        seen.add(state)
    assert len(seen) == len(clean_fleet.hosts)


def test_garbage_output_is_still_ok(clean_fleet):
    res = transport.run_all(clean_fleet.hosts[:2], ["echo", "garbage"])
    for r in res.values():
        assert r.ok and r.stdout == "garbage\n" and r.stderr == ""


def test_arguments_are_quoted_not_interpreted(clean_fleet):
    host = clean_fleet.hosts[0]
    res = transport.run_all([host], ["echo", "$(id -u)", "a;b", "it's"])[host.name]
    assert res.ok and res.stdout == "$(id -u) a;b it's\n"
    res = transport.run_all([host], ["printenv", "FOO"], env={"FOO": "x y;$z"})[host.name]
    assert res.ok and res.stdout == "x y;$z\n"


def test_nonzero_exit_is_a_command_error_with_stderr(clean_fleet):
    host = clean_fleet.hosts[0]
    res = transport.run_all([host], ["sh", "-c", "echo partial; echo broken >&2; exit 3"])[host.name]
    assert not res.ok
    assert res.error_kind == "command" and res.exit_status == 3
    assert res.stdout == "partial\n" and res.stderr == "broken\n"
    assert "broken" in res.error


def test_agent_missing_from_path_is_command_not_found(clean_fleet):
    fleet.inject(clean_fleet.directory, "node004", "agent-missing")
    results = transport.run_all(clean_fleet.hosts, COLLECT)
    bad = results["node004"]
    assert not bad.ok and bad.error_kind == "command" and bad.exit_status == 127
    assert "not found" in bad.error and "fleetops-agent" in bad.stderr
    assert all(r.ok for name, r in results.items() if name != "node004")
    fleet.clear(clean_fleet.directory, "node004", "agent-missing")
    assert transport.run_all([clean_fleet.host("node004")], COLLECT)["node004"].ok


def test_host_down_is_unreachable_and_host_hang_times_out_without_stalling_others(clean_fleet):
    fleet.inject(clean_fleet.directory, "node005", "host-down")
    fleet.inject(clean_fleet.directory, "node006", "host-hang")
    finished: dict[str, float] = {}  # host -> monotonic time its result was delivered
    results = transport.run_all(
        clean_fleet.hosts,
        COLLECT,
        connect_timeout=3.0,
        on_result=lambda r: finished.setdefault(r.host, time.monotonic()),
    )
    down, hung = results["node005"], results["node006"]
    assert down.error_kind == "unreachable" and "refused" in down.error  # final at once: not a timeout
    assert hung.error_kind == "timeout" and not hung.ok and "3s" in hung.error
    assert hung.elapsed_s >= 2.5, hung  # it did wait for connect_timeout (3 s)
    for name in ("node001", "node002", "node003", "node004"):
        assert results[name].ok, results[name]
    assert sorted(finished) == sorted(results)
    # Not held up by the hung one: every other host's run overlapped the hung host's wait (each
    # span ends when its result was delivered and began elapsed_s before). Run one after the
    # other, one would end before the other began, however fast or slow the machine.
    spans = {name: (finished[name] - results[name].elapsed_s, finished[name]) for name in results}
    hung_start, hung_end = spans["node006"]
    for name in ("node001", "node002", "node003", "node004"):
        start, end = spans[name]
        assert start < hung_end and hung_start < end, (name, spans)
    # the refused host is answered in a millisecond, maybe before the hung host's connect even
    # began: it is only never held behind it (its answer came before the hung one's 2.5 s wait)
    assert spans["node005"][1] < hung_end, spans


def test_on_result_errors_surface_after_all_hosts(clean_fleet):
    calls = []

    def boom(result):
        calls.append(result.host)
        raise RuntimeError("progress bar broke")

    with pytest.raises(RuntimeError, match="progress bar broke"):
        transport.run_all(clean_fleet.hosts, ["true"], on_result=boom)
    assert sorted(calls) == sorted(h.name for h in clean_fleet.hosts)


def test_forks_bound_concurrency(clean_fleet):
    active, peak, lock = [0], [0], threading.Lock()
    original = transport.Runner.run_once

    def counting(self, host, command, env, **kw):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return original(self, host, command, env, **kw)
        finally:
            with lock:
                active[0] -= 1

    transport.Runner.run_once = counting
    try:
        results = transport.run_all(clean_fleet.hosts, ["sleep", "0.2"], forks=2)
    finally:
        transport.Runner.run_once = original
    assert all(r.ok for r in results.values())
    assert peak[0] == 2


def test_command_timeout(clean_fleet):
    host = clean_fleet.hosts[0]
    start = time.monotonic()
    res = transport.run_all([host], ["sh", "-c", "echo started; sleep 30"], command_timeout=1.0)[host.name]
    # the command alone sleeps 30 s: back sooner means it was cut, however loaded the machine
    assert time.monotonic() - start < 30
    assert res.error_kind == "timeout" and "1s" in res.error
    assert res.stdout == "started\n"  # what came before the timeout is kept


def test_unknown_host_key_refused_by_default_and_accepted_when_asked(clean_fleet, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    hosts = without_inventory_known_hosts(clean_fleet.hosts)
    refused = transport.run_all(hosts, ["true"], known_hosts=str(known))
    for r in refused.values():
        assert r.error_kind == "hostkey" and "not in" in r.error and str(known) in r.error
    accepted = transport.run_all(hosts, ["true"], known_hosts=str(known), accept_new_hostkeys=True)
    assert all(r.ok for r in accepted.values()), accepted
    lines = known.read_text().splitlines()
    assert len(lines) == len(hosts)
    assert all(line.split()[1] == "ssh-ed25519" for line in lines)
    again = transport.run_all(hosts, ["true"], known_hosts=str(known))  # now known: plain verify
    assert all(r.ok for r in again.values())


def test_explicit_known_hosts_wins_then_inventory_then_home(clean_fleet, tmp_path, monkeypatch):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    # an explicit argument (--known-hosts) is used over the inventory's UserKnownHostsFile
    res = transport.run_all(clean_fleet.hosts[:1], ["true"], known_hosts=str(empty))
    r = next(iter(res.values()))
    assert r.error_kind == "hostkey" and str(empty) in r.error
    # without it, the inventory's (the fleet's, complete) is used
    res = transport.run_all(clean_fleet.hosts[:1], ["true"])
    assert all(r.ok for r in res.values())
    # no inventory setting, no argument: ~/.ssh/known_hosts of a HOME with nothing in it
    monkeypatch.setenv("HOME", str(tmp_path))
    res = transport.run_all(without_inventory_known_hosts(clean_fleet.hosts[:1]), ["true"])
    r = next(iter(res.values()))
    assert r.error_kind == "hostkey" and os.path.join(str(tmp_path), ".ssh", "known_hosts") in r.error


def test_changed_host_key_refused_even_with_accept_new(clean_fleet, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    host = without_inventory_known_hosts(clean_fleet.hosts[:1])[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{host.address}]:{host.port} {other}\n")
    for accept in (False, True):
        res = transport.run_all([host], ["true"], known_hosts=str(known), accept_new_hostkeys=accept)[
            host.name
        ]
        assert res.error_kind == "hostkey" and "CHANGED" in res.error
    assert known.read_text().count("\n") == 1  # nothing appended


def test_wrong_key_is_auth_error(clean_fleet, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = tmp_path / "stranger"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    host = dataclasses.replace(clean_fleet.hosts[0], key_file=str(key))
    res = transport.run_all([host], ["true"])[host.name]
    assert res.error_kind == "auth", res
    missing = dataclasses.replace(clean_fleet.hosts[0], key_file=str(tmp_path / "nope"))
    res = transport.run_all([missing], ["true"])[missing.name]
    assert res.error_kind == "local" and "nope" in res.error


def free_port(address):
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def test_refused_port_and_unresolvable_name_are_unreachable(clean_fleet):
    base = clean_fleet.hosts[0]
    closed = dataclasses.replace(base, name="closed", port=free_port(base.address))
    nowhere = dataclasses.replace(base, name="nowhere", address="no-such-host.invalid")
    results = transport.run_all([closed, nowhere], ["true"], connect_timeout=2.0)
    assert results["closed"].error_kind == "unreachable" and "refused" in results["closed"].error
    assert results["nowhere"].error_kind == "unreachable"


def test_local_connection_runs_here():
    here = Host(name="localhost", address="localhost", connection="local")
    res = transport.run_all([here], ["echo", "$HOME", "a b"])["localhost"]
    assert res.ok and res.stdout == "$HOME a b\n"
    res = transport.run_all([here], ["sh", "-c", "exit 4"])["localhost"]
    assert res.error_kind == "command" and res.exit_status == 4
    res = transport.run_all([here], ["no-such-program-fleetops"])["localhost"]
    assert res.error_kind == "command" and res.exit_status == 127 and "not found" in res.error
    res = transport.run_all([here], ["sleep", "5"], command_timeout=0.5)["localhost"]
    assert res.error_kind == "timeout"
    res = transport.run_all([here], ["printenv", "FOO"], env={"FOO": "bar"})["localhost"]
    assert res.stdout == "bar\n"


def test_command_must_be_a_list():
    with pytest.raises(TypeError):
        transport.run_all([], "fleetops-agent collect")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        transport.run_all([], [])
    with pytest.raises(ValueError):
        transport.run_all([], ["true"], env={"BAD NAME": "x"})
    assert transport.run_all([], ["true"]) == {}


def test_inject_and_clear_through_the_fleet_change_the_snapshot(clean_fleet):
    def ecc(name):
        res = transport.run_all([clean_fleet.host(name)], COLLECT)[name]
        assert res.ok, res
        return {g.index: g.ecc_uncorrected_volatile for g in model.node_from_json(res.stdout).gpus}

    assert set(ecc("node002").values()) == {0}
    assert fleet.inject(clean_fleet.directory, "node002", "ecc-dbe", 3) is True
    after = ecc("node002")
    assert after[3] == 2
    assert all(v == 0 for i, v in after.items() if i != 3)
    assert set(ecc("node001").values()) == {0}
    assert fleet.clear(clean_fleet.directory, "node002", "ecc-dbe", 3) == 1
    assert set(ecc("node002").values()) == {0}


def test_session_pool_reuses_connections_and_recovers(clean_fleet):
    hosts = clean_fleet.hosts
    with transport.SessionPool(hosts, connect_timeout=2.0, command_timeout=5.0) as pool:
        first = pool.run(COLLECT)
        assert all(r.ok for r in first.values())
        assert pool.connected() == sorted(h.name for h in hosts)
        # the same connection answers again: the command's parent is the same sshd session process
        parents = [pool.run(["sh", "-c", "echo $PPID"]) for _ in range(2)]
        assert all(r.ok for run in parents for r in run.values())
        assert {n: r.stdout for n, r in parents[0].items()} == {n: r.stdout for n, r in parents[1].items()}

        # node003 restarts: its old connection is dead, the pool reconnects in the same run
        fleet.inject(clean_fleet.directory, "node003", "host-down")
        down = pool.run(["true"], hosts=["node003"])["node003"]
        assert down.error_kind == "unreachable"
        fleet.clear(clean_fleet.directory, "node003", "host-down")
        assert pool.run(["true"], hosts=["node003"])["node003"].ok

        # node004 hangs with a connection open: timeout, then back once it continues
        fleet.inject(clean_fleet.directory, "node004", "host-hang")
        hung = pool.run(["true"])
        # back, and cut by the pool's own connect timeout (2 s) on opening the session, which
        # the open connection would otherwise wait on for ever
        assert hung["node004"].error_kind == "timeout"
        assert hung["node004"].error == "no answer to opening a session within 2s", hung["node004"]
        assert all(r.ok for n, r in hung.items() if n != "node004")
        fleet.clear(clean_fleet.directory, "node004", "host-hang")
        assert pool.run(["true"], hosts=["node004"])["node004"].ok
        with pytest.raises(KeyError):
            pool.run(["true"], hosts=["node999"])
    assert pool.connected() == []


# A command that records its pid in MARKER, then kills the sshd process that serves its own
# connection (the nearest sshd above it): the connection drops after the command was sent.
KILL_OWN_SSHD = r"""
import os, signal, sys
marker = sys.argv[1]
with open(marker, "a") as fh:
    fh.write(f"{os.getpid()}\n")
if len(open(marker).read().split()) > 1 and sys.argv[2] == "once":
    sys.exit(0)  # a second send (only the idempotent test expects one) finishes normally
pid = os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    if comm.startswith("sshd"):
        os.kill(pid, signal.SIGKILL)
        break
    pid = int(stat[stat.rindex(")") + 2 :].split()[1])
else:
    sys.exit("no sshd above this command")
# SIGKILL leaves sshd no chance to send an exit status; ending now leaves no stray process
"""

# Prints the pid of the sshd that serves this connection, so a test can kill it later.
OWN_SSHD_PID = r"""
import os
pid = os.getppid()
while pid > 1:
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    if stat[stat.index("(") + 1 : stat.rindex(")")].startswith("sshd"):
        print(pid)
        break
    pid = int(stat[stat.rindex(")") + 2 :].split()[1])
"""


def sends(marker):
    return len(marker.read_text().split()) if marker.exists() else 0


def test_connection_lost_after_sending_is_outcome_unknown_and_not_sent_again(clean_fleet, tmp_path):
    marker = tmp_path / "sent"
    command = ["python3", "-c", KILL_OWN_SSHD, str(marker), "always"]
    with transport.SessionPool(clean_fleet.hosts, connect_timeout=2.0, command_timeout=20.0) as pool:
        assert pool.run_one("node002", ["true"]).ok  # a reused connection: the old code re-sent on it
        res = pool.run_one("node002", command)
        assert sends(marker) == 1, marker.read_text()
        assert not res.ok and res.error_kind == "outcome-unknown", res
        assert "outcome-unknown" in transport.ERROR_KINDS
        assert "node002" in res.error and "was sent" in res.error and "no answer came" in res.error
        assert str(marker) in res.error  # the command, so the operator can check for its effect
        # the pool is usable again afterwards, on a new connection
        assert pool.run_one("node002", ["true"]).ok
    assert sends(marker) == 1
    # one-shot run_all: the same rule, no second send
    marker.unlink()
    res = transport.run_all([clean_fleet.host("node003")], command, command_timeout=20.0)["node003"]
    assert res.error_kind == "outcome-unknown" and sends(marker) == 1, res


def test_an_idempotent_read_is_sent_again_once(clean_fleet, tmp_path):
    marker = tmp_path / "sent"
    command = ["python3", "-c", KILL_OWN_SSHD, str(marker), "once"]
    with transport.SessionPool(clean_fleet.hosts, connect_timeout=2.0, command_timeout=20.0) as pool:
        assert pool.run_one("node004", ["true"]).ok
        res = pool.run_one("node004", command, idempotent=True)
        assert res.ok, res
        assert sends(marker) == 2
        # it asked for a retry once, not forever: killed on both sends, it is a lost connection
        marker.unlink()
        always = ["python3", "-c", KILL_OWN_SSHD, str(marker), "always"]
        res = pool.run_one("node004", always, idempotent=True)
        assert res.error_kind == "unreachable" and sends(marker) == 2, res
    # one-shot: a read that lost its connection is unreachable, as before
    marker.unlink()
    res = transport.run_all([clean_fleet.host("node004")], always, idempotent=True)["node004"]
    assert res.error_kind == "unreachable" and sends(marker) == 1, res


def test_dead_pooled_connection_is_reopened_before_sending_and_runs_once(clean_fleet, tmp_path):
    marker = tmp_path / "sent"
    with transport.SessionPool(clean_fleet.hosts, connect_timeout=2.0, command_timeout=20.0) as pool:
        first = pool.run_one("node005", ["python3", "-c", OWN_SSHD_PID])
        assert first.ok and first.stdout.strip(), first
        old = pool._clients["node005"]
        os.kill(int(first.stdout), 9)  # the connection dies while idle, before the next command
        for _ in range(200):
            if "node005" not in pool.connected():
                break
            time.sleep(0.05)
        assert "node005" not in pool.connected()
        res = pool.run_one("node005", ["sh", "-c", f"echo $$ >> {marker}"])
        assert res.ok, res
        assert sends(marker) == 1
        assert pool._clients["node005"] is not old and "node005" in pool.connected()


def test_per_call_timeout_overrides_the_pool_command_timeout(clean_fleet):
    with transport.SessionPool(clean_fleet.hosts, connect_timeout=2.0, command_timeout=1.0) as pool:
        # longer than the pool's 1 s, within the call's own budget: it finishes
        res = pool.run_one("node006", ["sh", "-c", "sleep 1.5; echo done"], timeout=10.0)
        assert res.ok and res.stdout == "done\n", res
        short = pool.run_one("node006", ["sleep", "5"], timeout=0.5)
        assert short.error_kind == "timeout" and "0.5s" in short.error


def test_a_second_command_on_a_busy_session_is_not_sent_and_says_busy(clean_fleet, tmp_path):
    """The pool runs one command per host: a second one meanwhile comes back at once as ``busy``
    (nothing sent), never ``timeout``, so a reset refused there is "not done", not "unknown"."""
    import threading

    from fleetops.common import selectors
    from fleetops.ops import reset as ops_reset
    from fleetops.ops import results

    marker = tmp_path / "sent"
    with transport.SessionPool(clean_fleet.hosts, connect_timeout=2.0, command_timeout=20.0) as pool:
        long = threading.Thread(target=lambda: pool.run_one("node006", ["sh", "-c", "sleep 2"]))
        long.start()
        for _ in range(200):  # the first command holds the session
            if "node006" in pool.connected():
                break
            time.sleep(0.05)
        time.sleep(0.3)
        res = pool.run_one("node006", ["sh", "-c", f"echo $$ >> {marker}"])
        long.join(30)
        assert (res.ok, res.error_kind, res.exit_status) == (False, "busy", None), res
        assert not marker.exists()  # not sent
        gpu = selectors.ResolvedGpu(selectors.parse("GPU-x"), "GPU-x", "0000:18:00.0")
        verdict = ops_reset.outcome(clean_fleet.host("node006"), gpu, ["fleetops-agent", "reset"], res, 60.0)
        assert verdict.outcome == results.FAILED and "not done" in verdict.message, verdict
