"""How to reach one host, resolved as OpenSSH run by Ansible would: inventory, then ssh_config.

Ansible runs ``ssh -o Port=.. -o User=.. -o IdentityFile=.. <ansible_ssh_common_args>
<ansible_ssh_extra_args> ansible_host``, and OpenSSH takes the first value it obtains for each
option: command line first, then the ``Host`` blocks of ``~/.ssh/config`` (or ``-F FILE``) in
file order. So the inventory's variables win over its ``-o`` options, which win over
ssh_config; ssh_config is looked up by the address Ansible would connect to (``ansible_host``,
else the inventory name), and its ``HostName`` replaces it. Blocks are read with paramiko's
``SSHConfig``.

``StrictHostKeyChecking``: ``yes`` (and OpenSSH's default ``ask``: there is no one to ask)
verifies; ``accept-new`` and ``no`` record keys never seen. A changed key is refused whatever
the setting, unlike OpenSSH's ``no``: fleetops runs commands as root.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import shlex
from dataclasses import dataclass
from typing import Any

import paramiko

from fleetops.fleet.hostkeys import DEFAULT_USER_KNOWN_HOSTS, GLOBAL_KNOWN_HOSTS

DEFAULT_SSH_CONFIG = "~/.ssh/config"
MAX_JUMPS = 8
_TRUE = ("1", "yes", "true", "on", "y")


class ConfigError(ValueError):
    """An SSH setting that cannot be used; the message names where it came from."""


@dataclass(frozen=True)
class Become:
    method: str
    user: str


@dataclass(frozen=True)
class Target:
    """Everything a connection to one host needs."""

    name: str  # what the operator called it (inventory name, or the jump spec)
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]  # empty: paramiko's default keys and the agent
    known_hosts: tuple[str, ...]  # user files: the first one is where new keys are recorded
    global_known_hosts: tuple[str, ...]
    strict: str  # "yes" | "accept-new" | "no"
    connect_timeout: float | None  # from ConnectTimeout; None: the caller's
    jumps: tuple[Target, ...] = ()  # connected in this order, the last one opens the channel
    become: Become | None = None

    @property
    def where(self) -> str:
        return f"{self.hostname}:{self.port}"


def split_args(text: str) -> tuple[dict[str, str], str | None, list[str]]:
    """OpenSSH options in Ansible's ssh args: (``-o`` options lowercased, ``-J`` value, ``-i`` files).

    First value wins, as OpenSSH's command line; ``-o ProxyJump=X`` and ``-J X`` are the same."""
    options: dict[str, str] = {}
    jump: str | None = None
    keys: list[str] = []
    if not text.strip():
        return options, jump, keys
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"ssh args {text!r}: {exc}") from exc
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        value: str | None = None
        flag = tok[:2] if tok.startswith("-") and len(tok) >= 2 else ""
        if flag in ("-o", "-J", "-i", "-p", "-l"):
            if len(tok) > 2:
                value = tok[2:]
            elif i + 1 < len(tokens):
                value, i = tokens[i + 1], i + 1
        i += 1
        if value is None:
            continue
        if flag == "-o":
            key, sep, val = value.partition("=")
            if not sep:
                key, _, val = value.strip().partition(" ")
            options.setdefault(key.strip().lower(), val.strip())
        elif flag == "-J":
            jump = jump or value
        elif flag == "-i":
            keys.append(value)
        elif flag == "-p":
            options.setdefault("port", value)
        elif flag == "-l":
            options.setdefault("user", value)
    if "proxyjump" in options:
        jump = jump or options["proxyjump"]
    return options, jump, keys


def load_config(path: str | None) -> paramiko.SSHConfig:
    """``path`` (``-F``), else ``~/.ssh/config`` when it exists; ``none`` reads none, as ``ssh -F none``."""
    if path is not None and path.lower() == "none":
        return paramiko.SSHConfig()
    explicit = path is not None
    full = os.path.expanduser(path or DEFAULT_SSH_CONFIG)
    if not os.path.exists(full):
        if explicit:
            raise ConfigError(f"ssh config {full}: no such file")
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(full)
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise ConfigError(f"ssh config {full}: {exc}") from exc


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value).split()


def _strict(value: str | None, where: str) -> str:
    low = (value or "yes").strip().lower()
    if low in ("yes", "ask", "true"):
        return "yes"
    if low == "accept-new":
        return "accept-new"
    if low in ("no", "off", "false"):
        return "no"
    raise ConfigError(f"{where}: StrictHostKeyChecking {value!r} is not yes, accept-new, no or ask")


def _port(value: Any, where: str) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise ConfigError(f"{where}: port {value!r} is not a TCP port") from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where}: port {value!r} is not a TCP port")
    return port


def _timeout(value: Any, where: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        raise ConfigError(f"{where}: ConnectTimeout {value!r} is not a number of seconds") from None
    return seconds if seconds > 0 else None


def parse_jump(spec: str) -> list[tuple[str | None, str, int | None]]:
    """``[user@]host[:port][,...]`` (also ``ssh://user@host:port``) -> (user, host, port) per hop."""
    hops: list[tuple[str | None, str, int | None]] = []
    for part in spec.split(","):
        part = part.strip()
        if part.startswith("ssh://"):
            part = part[len("ssh://") :]
        if not part:
            raise ConfigError(f"ProxyJump {spec!r}: empty hop")
        user, at, rest = part.rpartition("@")
        host, port_text = rest, ""
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port_text = tail[1:] if tail.startswith(":") else ""
        elif rest.count(":") == 1:
            host, _, port_text = rest.partition(":")
        if not host:
            raise ConfigError(f"ProxyJump {spec!r}: no host in {part!r}")
        hops.append((user if at else None, host, _port(port_text, f"ProxyJump {spec!r}") if port_text else None))
    return hops


def _become(vars_: dict[str, Any], name: str) -> Become | None:
    value = vars_.get("ansible_become")
    if value is None or str(value).strip().lower() not in _TRUE:
        return None
    method = str(vars_.get("ansible_become_method") or "sudo")
    if method != "sudo":
        raise ConfigError(f"host {name}: ansible_become_method={method} is not supported (fleetops uses sudo)")
    user = str(vars_.get("ansible_become_user") or "root")
    return Become(method, user)


class Resolver:
    """Resolves inventory hosts and jump specs against one ssh_config."""

    def __init__(
        self,
        config: paramiko.SSHConfig,
        known_hosts: str | None = None,
        accept_new: bool = False,
        global_known_hosts: str | None = None,
    ) -> None:
        self.config = config
        self.known_hosts = known_hosts  # --known-hosts: wins over everything
        self.accept_new = accept_new  # --accept-new-hostkeys
        self.global_known_hosts = global_known_hosts  # tests point it away from /etc/ssh

    def _common(
        self,
        name: str,
        lookup_name: str,
        given: dict[str, str],
        key_files: list[str],
        jump: str | None,
        depth: int,
    ) -> Target:
        where = f"host {name}"
        conf = self.config.lookup(lookup_name)
        hostname = given.get("hostname") or str(conf.get("hostname") or lookup_name)
        port = _port(given.get("port") or conf.get("port") or 22, where)
        user = given.get("user") or str(conf.get("user") or getpass.getuser())
        files = key_files or _as_list(given.get("identityfile")) or _as_list(conf.get("identityfile"))
        if self.known_hosts:
            user_files = [self.known_hosts]
        else:
            user_files = _as_list(given.get("userknownhostsfile")) or _as_list(conf.get("userknownhostsfile"))
        user_files = user_files or [DEFAULT_USER_KNOWN_HOSTS]
        if self.global_known_hosts is not None:
            global_files = [self.global_known_hosts] if self.global_known_hosts else []
        else:
            global_files = _as_list(given.get("globalknownhostsfile")) or _as_list(
                conf.get("globalknownhostsfile")
            ) or [GLOBAL_KNOWN_HOSTS]
        strict = _strict(given.get("stricthostkeychecking") or conf.get("stricthostkeychecking"), where)
        if self.accept_new and strict == "yes":
            strict = "accept-new"
        timeout = _timeout(given.get("connecttimeout") or conf.get("connecttimeout"), where)
        spec = jump if jump is not None else conf.get("proxyjump")
        jumps: tuple[Target, ...] = ()
        if spec and str(spec).lower() != "none":
            jumps = self._jumps(str(spec), depth, where)
        return Target(
            name=name,
            hostname=hostname,
            port=port,
            user=user,
            key_files=tuple(os.path.expanduser(f) for f in files if f.lower() != "none"),
            known_hosts=tuple(os.path.expanduser(f) for f in user_files if f.lower() != "none"),
            global_known_hosts=tuple(os.path.expanduser(f) for f in global_files if f.lower() != "none"),
            strict=strict,
            connect_timeout=timeout,
            jumps=jumps,
        )

    def _jumps(self, spec: str, depth: int, where: str) -> tuple[Target, ...]:
        if depth >= MAX_JUMPS:
            raise ConfigError(f"{where}: ProxyJump {spec!r}: more than {MAX_JUMPS} hops (a loop?)")
        chain: list[Target] = []
        for i, (user, host, port) in enumerate(parse_jump(spec)):
            given: dict[str, str] = {}
            if user:
                given["user"] = user
            if port:
                given["port"] = str(port)
            # as OpenSSH's -J: the first hop may have its own ProxyJump; later hops go through the chain
            hop = self._common(host, host, given, [], None if i == 0 else "none", depth + 1)
            chain.extend(hop.jumps)
            chain.append(dataclasses.replace(hop, jumps=()))
        return tuple(chain)

    def resolve(self, host: Any) -> Target:
        """The Target for an inventory host (``fleetops.fleet.inventory.Host`` or alike)."""
        name = str(host.name)
        vars_ = dict(getattr(host, "vars", None) or {})
        text = " ".join(str(vars_.get(k) or "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args"))
        try:
            options, jump, arg_keys = split_args(text)
        except ConfigError as exc:
            raise ConfigError(f"host {name}: {exc}") from None
        given = dict(options)
        # what Ansible passes before the ssh args: the inventory's port, user and key
        if any(vars_.get(k) is not None for k in ("ansible_port", "ansible_ssh_port")) or int(host.port or 22) != 22:
            given["port"] = str(host.port)
        if getattr(host, "user", None):
            given["user"] = str(host.user)
        key_file = getattr(host, "key_file", None)
        keys = [str(key_file)] if key_file else arg_keys
        target = self._common(name, str(host.address), given, keys, jump, 0)
        become = _become(vars_, name)
        if become is None:
            return target
        return dataclasses.replace(target, become=become)
