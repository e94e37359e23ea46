"""The pure parts of the SSH transport: quoting, options, ssh_config resolution, host-key decisions,
error classes. No sshd, no root."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import paramiko
import pytest
from paramiko.hostkeys import HostKeys, InvalidHostKey

from fleetops.fleet import hostkeys, sshconfig, transport
from fleetops.fleet.inventory import Host


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def _line(name: str, key: paramiko.PKey, marker: str = "") -> str:
    return (f"@{marker} " if marker else "") + f"{name} {key.get_name()} {key.get_base64()}\n"


def _resolver(text: str = "", **kw: object) -> sshconfig.Resolver:
    return sshconfig.Resolver(paramiko.SSHConfig.from_text(text), **kw)  # type: ignore[arg-type]


# --- quoting -----------------------------------------------------------------------------


def test_command_line_quotes_each_argument() -> None:
    assert transport.command_line(["echo", "a b", "$(id)", "it's"]) == "echo 'a b' '$(id)' 'it'\"'\"'s'"


def test_command_line_puts_env_then_sudo_in_front() -> None:
    become = sshconfig.Become("sudo", "root")
    line = transport.command_line(["fleetops-agent", "collect"], {"A": "x y"}, become)
    assert line == "sudo -n -u root -- env 'A=x y' fleetops-agent collect"


def test_command_line_refuses_a_shell_string_and_bad_env_names() -> None:
    with pytest.raises(TypeError):
        transport.command_line("echo hi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not valid variable names"):
        transport.command_line(["true"], {"A;rm": "1"})
    with pytest.raises(ValueError, match="empty"):
        transport.command_line([])


def test_sudo_asking_for_a_password_is_a_become_refusal() -> None:
    become = sshconfig.Become("sudo", "root")
    msg = transport.become_refused(become, 1, "sudo: a password is required\n")
    assert msg is not None and "NOPASSWD" in msg and "did not run" in msg
    sshd_first = "Could not chdir to home directory /home/x: No such file\nsudo: a password is required\n"
    assert transport.become_refused(become, 1, sshd_first) is not None
    # the agent's own exit 1, or no become at all: not sudo's refusal
    assert transport.become_refused(become, 1, "collect failed: sudo: a password is required") is None
    assert transport.become_refused(None, 1, "sudo: a password is required") is None
    assert transport.become_refused(become, 2, "sudo: a password is required") is None


# --- options -----------------------------------------------------------------------------


def test_split_args_reads_o_J_i_p_l_first_value_wins() -> None:
    opts, jump, keys = sshconfig.split_args(
        "-o UserKnownHostsFile=/a -oStrictHostKeyChecking=accept-new -o 'ConnectTimeout 7' "
        "-o UserKnownHostsFile=/b -J bastion -i /k -p 2200 -l alice -o ProxyJump=other"
    )
    assert opts["userknownhostsfile"] == "/a"
    assert opts["stricthostkeychecking"] == "accept-new"
    assert opts["connecttimeout"] == "7"
    assert opts["port"] == "2200" and opts["user"] == "alice"
    assert jump == "bastion" and keys == ["/k"]


def test_split_args_proxyjump_option_alone_and_bad_quoting() -> None:
    assert sshconfig.split_args("-o ProxyJump=j1,j2")[1] == "j1,j2"
    assert sshconfig.split_args("")[1] is None
    with pytest.raises(sshconfig.ConfigError, match="ssh args"):
        sshconfig.split_args("-o 'unclosed")


def test_parse_jump_hops() -> None:
    assert sshconfig.parse_jump("alice@b1:2200,b2,ssh://bob@[::1]:22") == [
        ("alice", "b1", 2200),
        (None, "b2", None),
        ("bob", "::1", 22),
    ]
    with pytest.raises(sshconfig.ConfigError, match="empty hop"):
        sshconfig.parse_jump("b1,,b2")
    with pytest.raises(sshconfig.ConfigError, match="not a TCP port"):
        sshconfig.parse_jump("b1:99999")


# --- ssh_config resolution -----------------------------------------------------------------

CONFIG = """
Host node*
    User cfguser
    Port 2022
    IdentityFile /keys/node
    UserKnownHostsFile /kh/nodes
    ConnectTimeout 9
    ProxyJump jumper

Host node1
    User ignored-first-match-wins
    HostName 10.0.0.1

Host jumper
    HostName 127.0.0.9
    User jumpuser
    Port 2200
    IdentityFile /keys/jump
    StrictHostKeyChecking accept-new

Host *
    StrictHostKeyChecking yes
    GlobalKnownHostsFile /kh/global
"""


def test_config_fills_what_the_inventory_leaves_out() -> None:
    target = _resolver(CONFIG).resolve(Host(name="n1", address="node1"))
    assert target.hostname == "10.0.0.1"
    assert target.user == "cfguser"  # first match wins within ssh_config
    assert target.port == 2022
    assert target.key_files == ("/keys/node",)
    assert target.known_hosts == ("/kh/nodes",)
    assert target.global_known_hosts == ("/kh/global",)
    assert target.connect_timeout == 9.0
    assert target.strict == "yes"
    [jump] = target.jumps
    assert (jump.hostname, jump.port, jump.user, jump.key_files) == ("127.0.0.9", 2200, "jumpuser", ("/keys/jump",))
    assert jump.strict == "accept-new"


def test_inventory_wins_over_its_ssh_args_which_win_over_config() -> None:
    host = Host(
        name="n1",
        address="node1",
        port=2500,
        user="invuser",
        key_file="/keys/inv",
        vars={
            "ansible_port": 2500,
            "ansible_ssh_common_args": "-o User=argsuser -o UserKnownHostsFile=/kh/args -o ConnectTimeout=3",
            "ansible_ssh_extra_args": "-J alice@b2:2201",
        },
    )
    target = _resolver(CONFIG).resolve(host)
    assert (target.port, target.user, target.key_files) == (2500, "invuser", ("/keys/inv",))
    assert target.known_hosts == ("/kh/args",)
    assert target.connect_timeout == 3.0
    [jump] = target.jumps
    assert (jump.hostname, jump.user, jump.port) == ("b2", "alice", 2201)


def test_no_config_gives_openssh_defaults_and_flags_override() -> None:
    target = _resolver("").resolve(Host(name="n", address="10.1.1.1"))
    assert (target.hostname, target.port, target.jumps, target.key_files) == ("10.1.1.1", 22, (), ())
    assert target.known_hosts == (os.path.expanduser("~/.ssh/known_hosts"),)
    assert target.global_known_hosts == ("/etc/ssh/ssh_known_hosts",)
    assert target.strict == "yes" and target.connect_timeout is None
    flagged = _resolver(CONFIG, known_hosts="/kh/flag", accept_new=True, global_known_hosts="").resolve(
        Host(name="n1", address="node1")
    )
    assert flagged.known_hosts == ("/kh/flag",) and flagged.global_known_hosts == ()
    assert flagged.strict == "accept-new"


def test_strict_no_is_explicit_and_bad_values_are_named() -> None:
    host = Host(name="n", address="a", vars={"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"})
    assert _resolver("").resolve(host).strict == "no"
    bad = Host(name="n7", address="a", vars={"ansible_ssh_common_args": "-o StrictHostKeyChecking=maybe"})
    with pytest.raises(sshconfig.ConfigError, match="host n7: StrictHostKeyChecking 'maybe'"):
        _resolver("").resolve(bad)


def test_jump_chain_and_loops() -> None:
    text = "Host a\n ProxyJump b\nHost b\n ProxyJump c\nHost loop\n ProxyJump loop\n"
    target = _resolver(text).resolve(Host(name="t", address="t", vars={"ansible_ssh_common_args": "-J a,x"}))
    assert [j.hostname for j in target.jumps] == ["c", "b", "a", "x"]
    assert all(j.jumps == () for j in target.jumps)
    with pytest.raises(sshconfig.ConfigError, match="hops"):
        _resolver(text).resolve(Host(name="t", address="loop"))
    none = _resolver(CONFIG).resolve(
        Host(name="t", address="node2", vars={"ansible_ssh_common_args": "-o ProxyJump=none"})
    )
    assert none.jumps == ()


def test_become_from_inventory() -> None:
    target = _resolver("").resolve(Host(name="n", address="a", user="ops", vars={"ansible_become": "yes"}))
    assert target.become == sshconfig.Become("sudo", "root") and target.user == "ops"
    other = _resolver("").resolve(
        Host(name="n", address="a", vars={"ansible_become": True, "ansible_become_user": "gpu"})
    )
    assert other.become == sshconfig.Become("sudo", "gpu")
    assert _resolver("").resolve(Host(name="n", address="a", vars={"ansible_become": False})).become is None
    with pytest.raises(sshconfig.ConfigError, match="ansible_become_method=su"):
        _resolver("").resolve(
            Host(name="n", address="a", vars={"ansible_become": True, "ansible_become_method": "su"})
        )


def test_load_config_missing_explicit_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(sshconfig.ConfigError, match="nope: no such file"):
        sshconfig.load_config(str(tmp_path / "nope"))
    assert sshconfig.load_config("none").get_hostnames() == set()
    path = tmp_path / "config"
    path.write_text("Host x\n User u\n")
    assert sshconfig.load_config(str(path)).lookup("x")["user"] == "u"


# --- known_hosts ---------------------------------------------------------------------------


def test_markers_hashed_wildcards_and_bad_lines(tmp_path: Path) -> None:
    known, other, ca, revoked = _key(), _key(), _key(), _key()
    path = tmp_path / "known_hosts"
    path.write_text(
        "# comment\n"
        + _line("*.example.com,!bad.example.com", ca, "cert-authority")
        + _line("*", revoked, "revoked")
        + _line(HostKeys.hash_host("[10.0.0.1]:2222"), known)
        + _line("10.0.0.2", revoked)
        + "10.0.0.3 ssh-ed25519 not-base64!!\n"
        + "@weird 10.0.0.4 " + other.get_name() + " " + other.get_base64() + "\n"
        + _line("[10.0.0.5]:22?2", other)
    )
    store = hostkeys.KnownHosts()
    files = [str(path)]
    v = store.verdict(files, "[10.0.0.1]:2222")
    assert v.known == {known.get_name(): known} and v.authorities == [] and len(v.revoked) == 1
    assert v.revoked_entry(revoked) is not None and v.revoked_entry(known) is None
    # a key that is both listed and revoked stays refused
    assert store.verdict(files, "10.0.0.2").known == {}
    ca_only = store.verdict(files, "gpu1.example.com")
    assert ca_only.known == {} and [e.key for e in ca_only.authorities] == [ca]
    assert store.verdict(files, "bad.example.com").authorities == []
    # brackets are literal, ? is one character
    assert store.verdict(files, "[10.0.0.5]:2222").known == {other.get_name(): other}
    assert store.verdict(files, "10.0.0.5").known == {}
    notes = store.skipped(files)
    assert any(":6: unreadable key" in n for n in notes)
    assert any(":7: unknown marker @weird" in n for n in notes)


def test_paramiko_alone_fails_on_a_ca_line_ours_does_not(tmp_path: Path) -> None:
    """The reported bug: paramiko's loader gives up on the whole file at a marker line."""
    key, ca = _key(), _key()
    path = tmp_path / "known_hosts"
    path.write_text(_line("*.example.com", ca, "cert-authority") + _line("10.0.0.1", key))
    with pytest.raises(InvalidHostKey):
        HostKeys(str(path))
    assert hostkeys.KnownHosts().verdict([str(path)], "10.0.0.1").known == {key.get_name(): key}


def test_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    old, new = _key(), _key()
    path = tmp_path / "known_hosts"
    path.write_text(_line("h", old))
    store = hostkeys.KnownHosts()
    assert store.verdict([str(path)], "h").known == {old.get_name(): old}
    path.write_text(_line("h", new))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert store.verdict([str(path)], "h").known == {new.get_name(): new}
    path.unlink()
    assert store.verdict([str(path)], "h").known == {}


# --- host-key decisions -----------------------------------------------------------------------


def _policy(tmp_path: Path, text: str, name: str, strict: str = "yes") -> transport.HostKeyPolicy:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    target = sshconfig.Target(
        name="n", hostname="h", port=22, user="u", key_files=(), known_hosts=(str(path),),
        global_known_hosts=(), strict=strict, connect_timeout=None,
    )
    store = hostkeys.KnownHosts()
    return transport.HostKeyPolicy(store, target, store.verdict([str(path)], name))


def test_unknown_key_is_refused_by_default_and_recorded_on_accept_new(tmp_path: Path) -> None:
    key = _key()
    with pytest.raises(transport.Failure) as info:
        _policy(tmp_path, "", "h").missing_host_key(paramiko.SSHClient(), "h", key)
    assert info.value.kind == "hostkey" and "is not in" in info.value.message
    with pytest.raises(transport.Failure) as info:
        _policy(tmp_path, "h ssh-ed25519 broken!!\n", "h").missing_host_key(paramiko.SSHClient(), "h", key)
    assert "lines skipped there:" in info.value.message and ":1: unreadable key" in info.value.message
    _policy(tmp_path, "", "h", "accept-new").missing_host_key(paramiko.SSHClient(), "h", key)
    assert (tmp_path / "known_hosts").read_text() == _line("h", key)


def test_revoked_key_is_refused_even_when_accepting_new(tmp_path: Path) -> None:
    key = _key()
    policy = _policy(tmp_path, _line("*", key, "revoked"), "h", "accept-new")
    with pytest.raises(transport.Failure) as info:
        policy.missing_host_key(paramiko.SSHClient(), "h", key)
    assert info.value.kind == "hostkey" and "REVOKED" in info.value.message and ":1" in info.value.message


def test_ca_only_host_gets_the_fix_named(tmp_path: Path) -> None:
    policy = _policy(tmp_path, _line("h", _key(), "cert-authority"), "h")
    with pytest.raises(transport.Failure) as info:
        policy.missing_host_key(paramiko.SSHClient(), "h", _key())
    msg = info.value.message
    assert info.value.kind == "hostkey"
    assert "@cert-authority" in msg and "cannot verify host certificates" in msg and "ssh-keyscan h" in msg


# --- error classes --------------------------------------------------------------------------------


def test_connect_errors_are_classified() -> None:
    old, new = _key(), _key()

    def kind(exc: Exception, elapsed: float = 0.0) -> tuple[str, str]:
        f = transport.classify_connect(exc, "h:22", elapsed, 5.0)
        return f.kind, f.message

    assert kind(paramiko.BadHostKeyException("h", new, old))[0] == "hostkey"
    assert "CHANGED" in kind(paramiko.BadHostKeyException("h", new, old))[1]
    assert kind(paramiko.AuthenticationException("denied"))[0] == "auth"
    assert kind(paramiko.AuthenticationException("Authentication timeout."))[0] == "timeout"
    refused = paramiko.ssh_exception.NoValidConnectionsError({("h", 22): OSError(errno.ECONNREFUSED, "x")})
    assert kind(refused) == ("unreachable", "h:22: connection refused")
    assert kind(socket.gaierror(-2, "Name or service not known"))[0] == "unreachable"
    assert kind(TimeoutError())[0] == "timeout"
    assert kind(paramiko.SSHException("Error reading SSH protocol banner"))[0] == "timeout"
    assert kind(paramiko.SSHException("Incompatible ssh peer"))[0] == "unreachable"
    assert kind(paramiko.SSHException("Incompatible ssh peer"), elapsed=4.9)[0] == "timeout"
    assert kind(EOFError())[0] == "unreachable"
    assert kind(OSError(errno.EHOSTUNREACH, "x")) == ("unreachable", "h:22: no route to host")
    assert kind(RuntimeError("odd"))[0] == "local"


def test_bad_ssh_config_is_a_local_error_per_host(tmp_path: Path) -> None:
    result = transport.run_all(
        [Host(name="n1", address="127.0.0.1", vars={"ansible_ssh_common_args": "-o StrictHostKeyChecking=maybe"})],
        ["true"],
        ssh_config="none",
    )["n1"]
    assert result.error_kind == "local" and "host n1: StrictHostKeyChecking" in (result.error or "")
    missing = transport.run_all([Host(name="n2", address="127.0.0.1")], ["true"], ssh_config=str(tmp_path / "x"))
    assert missing["n2"].error_kind == "local" and "no such file" in (missing["n2"].error or "")


def test_ssh_config_option_is_applied_once_and_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    import argparse

    from fleetops.common.errors import UsageError
    from fleetops.fleet import sshopts

    p = argparse.ArgumentParser()
    sshopts.add_ssh_config(p)
    with pytest.raises(UsageError, match=r"--ssh-config: ssh config .*missing: no such file"):
        sshopts.apply(p.parse_args(["-F", str(tmp_path / "missing")]))
    config = tmp_path / "config"
    config.write_text("Host n1\n    HostName 127.0.0.1\n    StrictHostKeyChecking bogus\n")
    try:
        sshopts.apply(p.parse_args(["--ssh-config", str(config)]))
        # the default reaches connections whose caller names no file: this one's block is read
        result = transport.run_all([Host(name="n1", address="n1")], ["true"])["n1"]
        assert result.error_kind == "local" and "StrictHostKeyChecking 'bogus'" in (result.error or "")
    finally:
        transport.set_default_ssh_config(None)


def test_a_ca_line_no_longer_fails_every_host_before_it_connects(tmp_path: Path) -> None:
    """The reported bug, through run_all: a @cert-authority line made every host a ``local``
    InvalidHostKey failure before any connection; now the host is tried (and is refused here,
    as nothing listens on that port)."""
    key, ca = _key(), _key()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = tmp_path / "known_hosts"
    path.write_text(_line("*.example.com", ca, "cert-authority") + _line(f"[127.0.0.1]:{port}", key))
    result = transport.run_all(
        [Host(name="n1", address="127.0.0.1", port=port)], ["true"], known_hosts=str(path), ssh_config="none"
    )["n1"]
    assert result.error_kind == "unreachable" and "connection refused" in (result.error or ""), result


def test_readable_takes_descriptors_past_selects_limit() -> None:
    """A controller with a thousand streams holds descriptors over 1024, where select() raises."""
    import resource

    from fleetops.fleet import transport

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    r, w = os.pipe()
    high_r, high_w = os.dup2(r, 1100), os.dup2(w, 1101)
    os.close(r)
    os.close(w)
    try:
        assert transport.readable([high_r], 0.0) == set()
        os.write(high_w, b"x")
        assert transport.readable([high_r], 1.0) == {high_r}
        os.read(high_r, 1)
        assert transport.readable([high_r], 0.0) == set()
        os.close(high_w)
        assert transport.readable([high_r], 1.0) == {high_r}  # the end reads as readable
    finally:
        os.close(high_r)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_raise_open_files_lifts_the_soft_limit_for_the_streams_and_never_lowers_it() -> None:
    import resource

    from fleetops.fleet import transport

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        got, needed = transport.raise_open_files(1000)
        assert needed == 1000 * transport.FDS_PER_STREAM + transport.FDS_SPARE
        want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        assert got == want == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert transport.raise_open_files(10) == (want, 10 * transport.FDS_PER_STREAM + transport.FDS_SPARE)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
