"""SSH as OpenSSH does it, against real sshd of the simulated fleet (needs root and openssh-server):
a bastion (ProxyJump), known_hosts with markers, a changed key, become through sudo.

The bastion: the controller runs in a network namespace the test creates, where nothing but the
bastion answers: the nodes' addresses are refused there. The bastion's listening socket is made
inside that namespace and each connection is handed to ``sshd -i`` started outside it, so the
bastion's ``direct-tcpip`` channels reach the nodes and the controller's own connections cannot.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from paramiko.hostkeys import HostKeys

from fleetops.fleet import transport
from fleetops.fleet.inventory import Host

pytestmark = pytest.mark.root

CLI = [sys.executable, "-m", "fleetops.cli"]
COLLECT = ["fleetops-agent", "collect"]
CLONE_NEWNET = 0x40000000


def _ns_socket(ns: str) -> socket.socket:
    """A listening socket on 127.0.0.1 inside network namespace ``ns`` (this thread goes there and back)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the test namespace")
        try:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)
    return sock


@dataclasses.dataclass
class Bastion:
    ns: str
    port: int
    known_hosts: str  # the bastion's host key, as [127.0.0.1]:port
    config: str  # an ssh_config: Host bastion, bastion2, and the nodes' addresses through bastion
    second_accepted: list[int]  # one item per connection bastion2 accepted


def _keygen(path: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    return " ".join(Path(path + ".pub").read_text().split()[:2])


@pytest.fixture(scope="module")
def bastion(sim_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bastion]:
    if shutil.which("ip") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("needs ip (iproute2) and ssh-keygen")
    ns = f"fleetops-ssh-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    d = tmp_path_factory.mktemp("bastion")
    procs: list[subprocess.Popen[bytes]] = []
    listener: socket.socket | None = None
    listeners: list[socket.socket] = []
    opened: list[Any] = []
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        host_pub = _keygen(str(d / "host_key"))
        conf = d / "sshd.conf"
        conf.write_text(
            "\n".join(
                [
                    f"HostKey {d / 'host_key'}",
                    "PidFile none",
                    "KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "UseDNS no",
                    f"AuthorizedKeysFile {sim_fleet.info['authorized_keys']}",
                    "StrictModes no",
                    "AllowTcpForwarding yes",
                    "LogLevel INFO",
                    "",
                ]
            )
        )
        listener = _ns_socket(ns)
        port = listener.getsockname()[1]
        sshd = sim_fleet.info["sshd"]
        log = open(d / "sshd.log", "ab")  # closed with the fixture
        opened.append(log)

        def serve(sock: socket.socket, accepted: list[int]) -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                accepted.append(1)
                with conn:
                    procs.append(
                        subprocess.Popen(
                            [sshd, "-i", "-f", str(conf)],
                            stdin=conn.fileno(),
                            stdout=conn.fileno(),
                            stderr=log,
                            close_fds=True,
                        )
                    )

        threading.Thread(target=serve, args=(listener, []), daemon=True, name="bastion-accept").start()
        # a second bastion outside the namespace, reachable only through the first: a chain
        second = socket.socket()
        second.bind(("127.0.0.1", 0))
        second.listen(64)
        listeners.append(second)
        second_port = second.getsockname()[1]
        second_accepted: list[int] = []
        threading.Thread(target=serve, args=(second, second_accepted), daemon=True, name="bastion2").start()
        known = d / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {host_pub}\n[127.0.0.1]:{second_port} {host_pub}\n")
        first = sim_fleet.hosts[0].address.rsplit(".", 1)[0]
        config = d / "ssh_config"
        config.write_text(
            f"Host bastion\n    HostName 127.0.0.1\n    Port {port}\n    User root\n"
            f"    IdentityFile {sim_fleet.info['client_key']}\n    UserKnownHostsFile {known}\n\n"
            f"Host bastion2\n    HostName 127.0.0.1\n    Port {second_port}\n    User root\n"
            f"    IdentityFile {sim_fleet.info['client_key']}\n    UserKnownHostsFile {known}\n\n"
            f"Host {first}.*\n    ProxyJump bastion\n"
        )
        yield Bastion(ns, port, str(known), str(config), second_accepted)
    finally:
        if listener is not None:
            listener.close()
        for sock in listeners:
            sock.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for fh in opened:
            fh.close()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def _audit_in_ns(b: Bastion, inventory: str, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    out = subprocess.run(
        ["ip", "netns", "exec", b.ns, *CLI, "audit", "-i", inventory, "--format", "json", "-q", "--no-history",
         "--connect-timeout", "3", "--timeout", "20", *extra],
        capture_output=True, text=True, timeout=180, check=False,
    )
    doc = json.loads(out.stdout) if out.stdout.strip().startswith("{") else None
    return out.returncode, doc, out.stderr


def _errors(doc: dict[str, Any]) -> dict[str, str | None]:
    return {n["name"]: n.get("error") for n in doc["nodes"]}


def test_audit_through_the_bastion_and_not_without_it(clean_fleet: Any, bastion: Bastion) -> None:
    # from the namespace, the nodes themselves are out of reach
    rc, doc, err = _audit_in_ns(bastion, clean_fleet.inventory_path, "-F", "none")
    assert doc is not None, err
    assert all(n["reachable"] is False for n in doc["nodes"]), doc["nodes"]
    assert all("refused" in (e or "") for e in _errors(doc).values()), _errors(doc)
    # through the bastion (ssh_config's ProxyJump), every node answers with its snapshot
    rc, doc, err = _audit_in_ns(bastion, clean_fleet.inventory_path, "-F", bastion.config)
    assert doc is not None, err
    assert [n["name"] for n in doc["nodes"]] == [h.name for h in clean_fleet.hosts]
    assert all(n["reachable"] and n["snapshot"]["gpu_count"] == 8 for n in doc["nodes"]), _errors(doc)


def test_jump_from_the_inventory_args_and_an_unknown_bastion_key(
    clean_fleet: Any, bastion: Bastion, tmp_path: Path
) -> None:
    """``-J`` in ansible_ssh_extra_args; the bastion's own key is verified too."""
    import yaml

    doc_inv = yaml.safe_load(Path(clean_fleet.inventory_path).read_text())
    hosts = doc_inv["all"]["children"]["sim"]["hosts"]
    for name in hosts:
        hosts[name]["ansible_ssh_extra_args"] = f"-J root@127.0.0.1:{bastion.port}"
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(doc_inv))
    # the bastion's identity and known_hosts come from ssh_config (as ssh -J), keyed by its address
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.0.1\n    IdentityFile {clean_fleet.info['client_key']}\n"
        f"    UserKnownHostsFile {bastion.known_hosts}\n"
    )
    rc, doc, err = _audit_in_ns(bastion, str(inv), "-F", str(config))
    assert doc is not None, err
    assert all(n["reachable"] for n in doc["nodes"]), _errors(doc)
    # the bastion's key unknown: refused, and the message says it is the jump host's
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    config.write_text(
        f"Host 127.0.0.1\n    IdentityFile {clean_fleet.info['client_key']}\n    UserKnownHostsFile {empty}\n"
    )
    rc, doc, err = _audit_in_ns(bastion, str(inv), "-F", str(config))
    assert doc is not None, err
    for name, error in _errors(doc).items():
        assert error is not None and "jump host" in error and "is not in" in error, (name, error)


def test_a_chain_of_two_jumps(clean_fleet: Any, bastion: Bastion, tmp_path: Path) -> None:
    """-J bastion,bastion2: bastion2 listens where the controller cannot reach it either."""
    import yaml

    doc_inv = yaml.safe_load(Path(clean_fleet.inventory_path).read_text())
    hosts = doc_inv["all"]["children"]["sim"]["hosts"]
    for name in hosts:
        hosts[name]["ansible_ssh_extra_args"] = "-o ProxyJump=bastion,bastion2"
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(doc_inv))
    before = len(bastion.second_accepted)
    rc, doc, err = _audit_in_ns(bastion, str(inv), "-F", bastion.config)
    assert doc is not None, err
    assert all(n["reachable"] for n in doc["nodes"]), _errors(doc)
    assert len(bastion.second_accepted) - before == len(clean_fleet.hosts)


def _known_hosts_lines(fleet: Any) -> dict[str, str]:
    lines = Path(fleet.info["known_hosts"]).read_text().splitlines()
    by_name = {}
    for host in fleet.hosts:
        name = f"[{host.address}]:{host.port}"
        by_name[host.name] = next(line for line in lines if line.startswith(name + " "))
    return by_name


def _with_known_hosts(hosts: list[Host], path: Path) -> list[Host]:
    return [
        dataclasses.replace(h, vars={**h.vars, "ansible_ssh_common_args": f"-o UserKnownHostsFile={path}"})
        for h in hosts
    ]


def test_markers_refuse_only_their_hosts(clean_fleet: Any, tmp_path: Path) -> None:
    lines = _known_hosts_lines(clean_fleet)
    host_key = lines["node001"].split(" ", 1)[1]
    ca, other = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    node = {h.name: h for h in clean_fleet.hosts}
    hashed_name = f"[{node['node005'].address}]:{node['node005'].port}"
    kh = tmp_path / "known_hosts"
    kh.write_text(
        f"@cert-authority * {ca.get_name()} {ca.get_base64()}\n"
        f"@revoked * {other.get_name()} {other.get_base64()}\n"
        f"@revoked [{node['node002'].address}]:{node['node002'].port} {host_key}\n"
        + "".join(line + "\n" for name, line in lines.items() if name not in ("node003", "node005"))
        # node005 hashed, as ssh-keygen -H writes it
        + f"{HostKeys.hash_host(hashed_name)} {host_key}\n"
    )
    results = transport.run_all(
        _with_known_hosts(clean_fleet.hosts, kh), COLLECT, ssh_config="none", global_known_hosts=""
    )
    assert results["node002"].error_kind == "hostkey" and "REVOKED" in (results["node002"].error or "")
    ca_only = results["node003"].error or ""
    assert results["node003"].error_kind == "hostkey" and "cannot verify host certificates" in ca_only
    assert "ssh-keyscan" in ca_only and str(kh) in ca_only
    others = [n for n in results if n not in ("node002", "node003")]
    assert "node005" in others
    assert others and all(results[n].ok for n in others), {n: results[n].error for n in others}


def test_a_changed_key_is_refused_even_when_accepting_new(clean_fleet: Any, tmp_path: Path) -> None:
    lines = _known_hosts_lines(clean_fleet)
    host = clean_fleet.host("node001")
    keytype = lines["node001"].split()[1]
    assert keytype == "ssh-ed25519"
    fake_pub = _keygen(str(tmp_path / "fake"))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{host.address}]:{host.port} {fake_pub}\n")
    res = transport.run_all(
        _with_known_hosts([host], kh), COLLECT, accept_new_hostkeys=True, ssh_config="none", global_known_hosts=""
    )["node001"]
    assert res.error_kind == "hostkey" and "CHANGED" in (res.error or ""), res
    assert kh.read_text() == f"[{host.address}]:{host.port} {fake_pub}\n"


def test_global_known_hosts_and_a_fixed_entry_picked_up_without_restart(clean_fleet: Any, tmp_path: Path) -> None:
    lines = _known_hosts_lines(clean_fleet)
    hosts = clean_fleet.hosts[:2]
    user_kh, global_kh = tmp_path / "user_kh", tmp_path / "global_kh"
    user_kh.write_text("")
    global_kh.write_text(lines[hosts[0].name] + "\n")  # only the first is known, and only globally
    with transport.SessionPool(
        _with_known_hosts(hosts, user_kh), ssh_config="none", global_known_hosts=str(global_kh)
    ) as pool:
        first = pool.run(["true"])
        assert first[hosts[0].name].ok, first[hosts[0].name]
        assert first[hosts[1].name].error_kind == "hostkey"
        user_kh.write_text(lines[hosts[1].name] + "\n")  # the operator fixes the entry
        again = pool.run(["true"])
        assert again[hosts[1].name].ok, again[hosts[1].name]


# --- become --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def become_users(sim_fleet: Any) -> Iterator[tuple[str, str]]:
    """Two throwaway logins: one with passwordless sudo, one whose sudo asks for a password."""
    if shutil.which("sudo") is None:
        pytest.skip("needs sudo (apt-get install -y sudo)")
    tag = f"{os.getpid() % 100000}"
    ok_user, pw_user = f"fo-ok{tag}", f"fo-pw{tag}"
    dropin = Path(f"/etc/sudoers.d/fleetops-test-{tag}")
    made: list[str] = []
    # sshd reads authorized_keys as the user logging in: the fleet's file and the folders above
    # it are opened for reading while the test runs, and closed again after
    keys = Path(sim_fleet.info["authorized_keys"])
    opened = [keys] + [p for p in keys.parents if str(p).startswith("/tmp/") and p != Path("/tmp")]
    modes = {p: p.stat().st_mode & 0o7777 for p in opened}
    try:
        keys.chmod(modes[keys] | 0o044)
        for folder in opened[1:]:
            folder.chmod(modes[folder] | 0o011)
        for user in (ok_user, pw_user):
            # "*": no password, yet not locked (sshd refuses a locked account, "!")
            subprocess.run(["useradd", "-M", "-p", "*", "-s", "/bin/sh", user], check=True, capture_output=True)
            made.append(user)
        # the simulated node's environment (state file, agent on PATH) survives sudo, as the
        # agent role's sudoers would arrange on a real node
        dropin.write_text(
            f"Defaults:{ok_user} !secure_path, env_keep += \"FLEETOPS_SIM_STATE PATH HOME\"\n"
            f"{ok_user} ALL=(root) NOPASSWD: ALL\n"
            f"{pw_user} ALL=(root) ALL\n"
        )
        dropin.chmod(0o440)
        check = subprocess.run(["visudo", "-c", "-f", str(dropin)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        yield ok_user, pw_user
    finally:
        dropin.unlink(missing_ok=True)
        for path, mode in modes.items():
            path.chmod(mode)
        for user in made:
            # -f: a session of the test's may still be closing
            subprocess.run(["userdel", "-f", user], check=False, capture_output=True)


def _as(host: Host, user: str, **more: Any) -> Host:
    return dataclasses.replace(host, user=user, vars={**host.vars, **more})


def test_become_runs_the_agent_as_root_from_a_plain_login(clean_fleet: Any, become_users: tuple[str, str]) -> None:
    ok_user, _ = become_users
    host = clean_fleet.host("node001")
    plain = transport.run_all([_as(host, ok_user)], ["id", "-un"], ssh_config="none")["node001"]
    assert plain.ok and plain.stdout.strip() == ok_user, plain
    become = _as(host, ok_user, ansible_become=True)
    who = transport.run_all([become], ["id", "-un"], ssh_config="none")["node001"]
    assert who.ok and who.stdout.strip() == "root", who
    snap = transport.run_all([become], COLLECT, ssh_config="none")["node001"]
    assert snap.ok, snap
    assert json.loads(snap.stdout)["hostname"] == "node001"


def test_become_that_needs_a_password_is_a_clear_auth_error(
    clean_fleet: Any, become_users: tuple[str, str]
) -> None:
    _, pw_user = become_users
    host = _as(clean_fleet.host("node002"), pw_user, ansible_become="yes")
    res = transport.run_all([host], COLLECT, ssh_config="none")["node002"]
    assert res.error_kind == "auth", res
    assert "sudo -n -u root refused" in (res.error or "") and "NOPASSWD" in (res.error or "")
