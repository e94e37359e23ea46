"""A simulated fleet: one real sshd per node on its own loopback address.

Each node ``nodeNNN`` gets an address ``127.0.10.N`` (rolling over into the next /24), its own
sshd config, HOME and simulator state file, so SSH fan-out, timeouts, host-down and Ansible all
run for real against ``fleetops-agent`` on the far side. Layout of the fleet folder ``DIR``::

    DIR/fleet.json              node -> address, port, state file, sshd pid, config (this module's record)
    DIR/inventory.yml           Ansible inventory, group ``sim``
    DIR/known_hosts             ``[127.0.10.1]:2222 ssh-ed25519 ...`` for every node
    DIR/id_ed25519              the client key; DIR/authorized_keys holds its public half
    DIR/ssh_host_ed25519_key    the host key, shared by the nodes of this fleet
    DIR/state/<node>.json       simulator state (``fleetops.sim.gpu``), named by FLEETOPS_SIM_STATE
    DIR/home/<node>/            the node's HOME (an empty .bashrc: root's own runs pyenv setup)
    DIR/sshd/<node>.conf        its sshd_config;  DIR/log/<node>.log  its sshd log

Pitfalls this follows: one sshd per address (one sshd listens on at most 16 sockets), absolute
paths (sshd re-execs after ``chdir /``), ``/run/sshd`` created, a high MaxStartups, and a HOME per
node. What a connection costs this machine is kept small, since a thousand nodes' sshd share its
cores with the controller under test: no re-exec of sshd per connection (``-r``, where this
sshd takes it: a real node pays that cost on its own CPU, not the controller's), and the
ecdh-sha2-nistp256 key exchange, which OpenSSL computes (OpenSSH's own curve25519 is slower, on
both ends; sntrup761, the clients' default, slower still).

Faults: everything ``fleetops.sim.gpu`` knows (written to the node's state file), plus the
fleet-level ``host-down`` (the node's sshd is killed; clearing starts it again with the same
config), ``host-hang`` (sshd and its sessions are SIGSTOPped: TCP connects, no banner ever
comes; clearing sends SIGCONT) and ``agent-missing`` (the node's PATH loses the agent's folder,
so ``fleetops-agent`` is "command not found" there; sshd re-reads its config on SIGHUP).
"""

from __future__ import annotations

import copy
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetops.sim import gpu as sim

FLEET_FAULTS = ("host-down", "host-hang", "agent-missing")
FLEET_FILE = "fleet.json"
FLEET_VERSION = 1
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
START_TIMEOUT_S = 30.0
# The agent's metrics port on every node unless ``up`` is given another (= prom_targets.DEFAULT_PORT)
METRICS_PORT = 9401
STOP_TIMEOUT_S = 5.0
SSHD_SEARCH = "/usr/sbin:/usr/local/sbin:/sbin"
INSTALL_HINT = "sshd not found: apt-get install -y openssh-server"

# sshd processes started by this Python process, so that stopping one also reaps it (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class SimFleetError(sim.SimError):
    """The simulated fleet cannot do what was asked; the message says why and what to do."""


# --- small helpers -------------------------------------------------------------------------


def node_names(count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"node{i:0{width}d}" for i in range(1, count + 1)]


def addresses(first: str, count: int) -> list[str]:
    """``count`` loopback addresses from ``first``, skipping .0 and .255 (next /24 after .254)."""
    try:
        addr = ipaddress.ip_address(first)
    except ValueError as exc:
        raise SimFleetError(f"first_address {first!r} is not an IP address") from exc
    if addr not in LOOPBACK:
        raise SimFleetError(
            f"first_address {first} is not a loopback address: the fleet uses 127.0.0.0/8 only"
        )
    out: list[str] = []
    while len(out) < count:
        if addr not in LOOPBACK or addr == LOOPBACK.broadcast_address:
            raise SimFleetError(f"{count} nodes from {first} run past the end of 127.0.0.0/8")
        last = int(addr) & 0xFF
        if last not in (0, 255):
            out.append(str(addr))
        addr += 1
    return out


def find_sshd() -> str | None:
    found = shutil.which("sshd", path=os.environ.get("PATH", "") + os.pathsep + SSHD_SEARCH)
    return os.path.abspath(found) if found else None


def agent_bin_dir() -> str:
    """The folder holding ``fleetops-agent`` of this environment (the venv's bin, not a pyenv shim)."""
    here = os.path.dirname(os.path.abspath(sys.executable))  # not realpath: a venv's python is a symlink
    if os.access(os.path.join(here, "fleetops-agent"), os.X_OK):
        return here
    found = shutil.which("fleetops-agent")
    if found:
        return os.path.dirname(os.path.abspath(found))
    raise SimFleetError(
        f"fleetops-agent not found next to {sys.executable} nor on PATH: pip install -e . first"
    )


def _install_sshd() -> None:
    """apt-get install openssh-server without letting its postinst start a system sshd on :22."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    if made_policy:
        with open(policy, "w") as fh:
            fh.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        cmd = ["apt-get", "install", "-y", "-qq", "openssh-server"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True, check=False)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SimFleetError("apt-get install -y openssh-server failed: " + " / ".join(tail))
    except FileNotFoundError as exc:
        raise SimFleetError(f"{INSTALL_HINT} (and apt-get is not available here)") from exc
    finally:
        if made_policy:
            os.unlink(policy)


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _ed25519_keypair(private_path: str, comment: str) -> str:
    """Create (or reuse) an OpenSSH ed25519 key at ``private_path``; returns the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if os.path.exists(private_path):
        with open(private_path, "rb") as fh:
            key = serialization.load_ssh_private_key(fh.read(), password=None)
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {comment}"
    _write_atomic(private_path + ".pub", line + "\n")
    return line


def _known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


# --- processes -----------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of ``pid``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    return rest[0], int(rest[1])


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)


def _alive(pid: int | None) -> bool:
    """True while ``pid`` runs (a zombie counts as gone; our own children are reaped here)."""
    if not pid:
        return False
    _reap(pid)
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _is_our_sshd(pid: int | None, config: str) -> bool:
    """``pid`` is alive and is the sshd started with ``config`` (guards against pid reuse)."""
    if not _alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except OSError:
        return False
    # sshd rewrites its title: "sshd: /usr/sbin/sshd -D -f CONFIG -E LOG [listener] ..."
    return b" -f " + config.encode() + b" " in cmdline.replace(b"\0", b" ") + b" "


def _stopped(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] in ("T", "t")


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None:
            kids.setdefault(stat[1], []).append(int(entry))
    return kids


def _descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = _children_map() if kids is None else kids
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if _alive(p)]
    return left


def _kill_trees(listeners: list[int]) -> None:
    """Stop each listener and every process under it (sessions, agents), hung or not."""
    if not listeners:
        return
    kids = _children_map()
    everyone = []
    for pid in listeners:
        everyone.append(pid)
        everyone.extend(_descendants(pid, kids))
    _signal(everyone, signal.SIGTERM)
    _signal(everyone, signal.SIGCONT)  # a stopped (host-hang) process only acts on SIGTERM once continued
    left = _wait_gone(everyone, STOP_TIMEOUT_S)
    if left:
        _signal(left, signal.SIGKILL)
        left = _wait_gone(left, STOP_TIMEOUT_S)
    for pid in everyone:
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            try:
                child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
    if left:
        raise SimFleetError(f"processes {left} did not exit after SIGKILL")


def _listening() -> dict[tuple[str, int], str]:
    """(address, port) -> socket inode of every IPv4 TCP socket in LISTEN, from /proc/net/tcp.

    Reading it makes no connection (a test connect would fork an sshd child per node)."""
    out = {}
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if fields[3] != "0A":
                continue
            hex_addr, hex_port = fields[1].split(":")
            addr = socket.inet_ntoa(bytes.fromhex(hex_addr)[::-1])
            out[(addr, int(hex_port, 16))] = fields[9]
    return out


def _accepts(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def _log_tail(path: str, lines: int = 4) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return " / ".join(line.strip() for line in fh.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


_NO_REEXEC: dict[str, bool] = {}


def _no_reexec_flag(sshd: str) -> list[str]:
    """``["-r"]`` where this sshd takes it (asked once per binary: an sshd that does not know
    the flag refuses the test run)."""
    if sshd not in _NO_REEXEC:
        probe = subprocess.run(
            [sshd, "-t", "-r", "-f", os.devnull], stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False
        )
        _NO_REEXEC[sshd] = probe.returncode == 0
    return ["-r"] if _NO_REEXEC[sshd] else []


def _spawn(sshd: str, node: dict[str, Any]) -> int:
    flags = _no_reexec_flag(sshd)
    with open(node["log"], "ab") as log:
        proc = subprocess.Popen(
            [sshd, "-D", *flags, "-f", node["config"], "-E", node["log"]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            close_fds=True,
            start_new_session=True,
            cwd="/",
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def metrics_addresses(fleet: dict[str, Any]) -> list[str]:
    """Each node's metrics endpoint, ``ADDRESS:PORT`` on the node's own address and the port the
    inventory names (``fleetops_agent_metrics_port``): where ``fleetops prometheus targets``
    points. In the order the daemon serves the nodes: ``--states DIR`` takes the state files
    sorted by name, ``<node>.json``."""
    nodes = fleet["nodes"]
    port = int(fleet.get("metrics_port") or METRICS_PORT)
    return [f"{nodes[name]['address']}:{port}" for name in sorted(nodes, key=lambda n: f"{n}.json")]


def _spawn_daemon(fleet: dict[str, Any]) -> dict[str, Any]:
    """One resident agent for the whole simulated fleet (``sim up --daemon``), serving every
    node's metrics endpoint on that node's address (``metrics_addresses``)."""
    states = os.path.join(fleet["directory"], "state")
    log = os.path.join(fleet["directory"], "log", "agent-serve.log")
    # --sim-on-gpu-node: the fleet is simulated also on a machine with a GPU driver (backend_choice)
    cmd = [os.path.join(fleet["agent_bin"], "fleetops-agent"), "serve", "--backend", "sim", "--sim-on-gpu-node",
           "--states", states,
           "--metrics-address", ",".join(metrics_addresses(fleet))]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, close_fds=True, start_new_session=True, cwd="/"
        )
    _CHILDREN[proc.pid] = proc
    return {"pid": proc.pid, "log": log, "states": states}


def _is_our_daemon(entry: dict[str, Any] | None) -> bool:
    """The recorded daemon still runs and is the one serving this fleet (guards against pid reuse)."""
    if not entry or not _alive(entry.get("pid")):
        return False
    try:
        with open(f"/proc/{entry['pid']}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"serve" in argv and os.fsencode(entry["states"]) in argv


def _stop_daemon(fleet: dict[str, Any]) -> None:
    entry = fleet.get("daemon")
    if _is_our_daemon(entry):
        assert entry is not None
        _kill_trees([entry["pid"]])
    if entry:
        entry["pid"] = None


def _wait_listening(nodes: dict[str, dict[str, Any]], timeout: float) -> None:
    """Wait until every node's sshd listens; raise naming the ones that died or never did."""
    pending = dict(nodes)
    deadline = time.monotonic() + timeout
    use_proc = os.path.exists("/proc/net/tcp")
    while pending:
        listening = _listening() if use_proc else {}
        dead = []
        for name, node in list(pending.items()):
            up = (
                (node["address"], node["port"]) in listening
                if use_proc
                else _accepts(node["address"], node["port"])
            )
            if up:
                del pending[name]
            elif not _alive(node["pid"]):
                dead.append(name)
        if dead:
            name = dead[0]
            raise SimFleetError(
                f"sshd of {name} ({pending[name]['address']}:{pending[name]['port']}) exited at start"
                f"{f' (and {len(dead) - 1} more)' if len(dead) > 1 else ''}: {_log_tail(pending[name]['log'])}"
            )
        if not pending:
            break
        if time.monotonic() > deadline:
            names = sorted(pending)
            raise SimFleetError(
                f"{len(names)} sshd did not listen within {timeout:.0f}s: {', '.join(names[:5])}"
            )
        time.sleep(0.02)


def _wait_metrics(fleet: dict[str, Any], timeout: float) -> None:
    """Wait until the daemon listens on every node's metrics address; raise naming the first
    that does not, with the daemon's log, when it exits or the time runs out."""
    pending = set(metrics_addresses(fleet))
    entry = fleet["daemon"]
    deadline = time.monotonic() + timeout
    while pending:
        listening = _listening()
        pending = {a for a in pending if (a.rpartition(":")[0], int(a.rpartition(":")[2])) not in listening}
        if not pending:
            return
        if not _alive(entry["pid"]) or time.monotonic() > deadline:
            why = "exited" if not _alive(entry["pid"]) else f"did not listen within {timeout:.0f}s"
            raise SimFleetError(f"the fleet's agent daemon {why}: metrics endpoint {sorted(pending)[0]} "
                                f"(and {len(pending) - 1} more) not served: {_log_tail(entry['log'])}")
        time.sleep(0.05)


# --- fleet record --------------------------------------------------------------------------


@contextmanager
def _locked(directory: str) -> Iterator[None]:
    with open(os.path.join(directory, ".fleet.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read_fleet(directory: str, required: bool = True) -> dict[str, Any] | None:
    path = os.path.join(directory, FLEET_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        if required:
            raise SimFleetError(
                f"{directory} holds no simulated fleet ({FLEET_FILE} missing): run up first"
            ) from None
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise SimFleetError(f"{path}: unreadable fleet record: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != FLEET_VERSION or "nodes" not in data:
        raise SimFleetError(f"{path}: not a fleetops simulated fleet record")
    return data


def _write_fleet(directory: str, fleet: dict[str, Any]) -> None:
    _write_atomic(os.path.join(directory, FLEET_FILE), json.dumps(fleet, indent=1) + "\n")


def _resolve_node(fleet: dict[str, Any], node: str | int) -> str:
    nodes = fleet["nodes"]
    names = sorted(nodes)
    key = str(node).strip()
    if key in nodes:
        return key
    if key.isdigit() and 1 <= int(key) <= len(names):
        return str(names[int(key) - 1])
    shown = ", ".join(names[:4]) + (f", ... {names[-1]}" if len(names) > 4 else "")
    raise SimFleetError(f"unknown node {key!r} in {fleet['directory']}; known: {shown} ({len(names)} nodes)")


# --- config and scenario -------------------------------------------------------------------


def _sshd_config(fleet: dict[str, Any], name: str) -> str:
    node = fleet["nodes"][name]
    path = [fleet["agent_bin"], "/usr/local/bin", "/usr/bin", "/bin"]
    if "agent-missing" in node.get("faults", []):
        path = path[1:]
    # FLEETOPS_SIM_ON_GPU_NODE: these nodes are simulated even on a machine with a GPU driver, where
    # the agent refuses an explicit --backend sim without it (gpu/backend_choice.py)
    env = (f"FLEETOPS_SIM_STATE={node['state']} FLEETOPS_SIM_ON_GPU_NODE=1 HOME={node['home']} "
           f"PATH={':'.join(path)}")
    return "\n".join(
        [
            f"# fleetops simulated node {name}; written by fleetops.sim.fleet",
            f"ListenAddress {node['address']}",
            f"Port {node['port']}",
            f"HostKey {fleet['host_key']}",
            "PidFile none",
            "KexAlgorithms ecdh-sha2-nistp256",
            "MaxStartups 1000",
            "MaxSessions 100",
            "LoginGraceTime 30",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            f"AuthorizedKeysFile {fleet['authorized_keys']}",
            "StrictModes no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
            f"SetEnv {env}",
            "",
        ]
    )


def _node_scenarios(scenario: dict[str, Any], names: list[str], source: str) -> dict[str, dict[str, Any]]:
    """Per-node scenario: top-level defaults merged with that node's entry under ``nodes:``."""
    base = {k: v for k, v in scenario.items() if k != "nodes"}
    per = scenario.get("nodes") or {}
    if not isinstance(per, dict):
        raise SimFleetError(f"{source}: 'nodes' is a mapping of node name or number -> overrides")
    out = {name: copy.deepcopy(base) for name in names}
    for key, overrides in per.items():
        text = str(key).strip()
        if text in out:
            name = text
        elif text.isdigit() and 1 <= int(text) <= len(names):
            name = names[int(text) - 1]
        else:
            raise SimFleetError(
                f"{source}: nodes: {key!r} is not a node of this fleet ({names[0]}..{names[-1]}, or 1..{len(names)})"
            )
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise SimFleetError(f"{source}: nodes: {key}: expected a mapping of node, gpu, gpu_count, faults")
        unknown = set(overrides) - {"node", "gpu", "gpu_count", "uptime_s", "faults"}
        if unknown:
            raise SimFleetError(f"{source}: nodes: {key}: unknown keys {sorted(unknown)}")
        merged = out[name]
        for field in ("node", "gpu"):
            if field in overrides:
                merged[field] = {**(merged.get(field) or {}), **(overrides[field] or {})}
        for field in ("gpu_count", "uptime_s"):
            if field in overrides:
                merged[field] = overrides[field]
        if "faults" in overrides:
            merged["faults"] = list(merged.get("faults") or []) + list(overrides["faults"] or [])
    return out


def _inventory_yaml(fleet: dict[str, Any]) -> str:
    import yaml

    hosts = {}
    for name, node in sorted(fleet["nodes"].items()):
        hosts[name] = {
            "ansible_host": node["address"],
            "ansible_port": node["port"],
            "ansible_user": "root",
            "ansible_ssh_private_key_file": fleet["client_key"],
            "ansible_remote_tmp": os.path.join(node["home"], ".ansible", "tmp"),
            "ansible_python_interpreter": sys.executable,
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={fleet['known_hosts']}",
            "fleetops_sim_state": node["state"],
            "fleetops_agent_metrics_port": int(fleet.get("metrics_port") or METRICS_PORT),
        }
    header = (
        f"# simulated fleet in {fleet['directory']}; written by fleetops.sim.fleet.up\n"
        "# fleetops_slurm_managed: false -- the simulator runs no Slurm; set it true where a site\n"
        "# or a test provides scontrol\n"
    )
    group = {"hosts": hosts, "vars": {"fleetops_slurm_managed": False}}
    return header + yaml.safe_dump({"all": {"children": {"sim": group}}}, sort_keys=False)


# --- public API ----------------------------------------------------------------------------


def up(
    nodes: int,
    directory: str,
    scenario_path: str | None = None,
    first_address: str = "127.0.10.1",
    port: int = 2222,
    install: bool = False,
    daemon: bool = False,
    metrics_port: int = METRICS_PORT,
) -> dict[str, Any]:
    """Start ``nodes`` simulated nodes in ``directory``; returns the fleet record (see fleet.json).
    With ``daemon``, one ``fleetops-agent serve --backend sim`` serves every node (each with its
    own socket, ``state/<node>.agent/agent.sock``, and its own metrics endpoint on the node's
    address and ``metrics_port``, which the inventory records); ``down`` stops it."""
    started = time.perf_counter()
    if not isinstance(nodes, int) or nodes < 1:
        raise SimFleetError(f"nodes must be a positive number, not {nodes!r}")
    if not 1 <= int(port) <= 65535:
        raise SimFleetError(f"port {port} is not a TCP port")
    if not 1 <= int(metrics_port) <= 65535 or int(metrics_port) == int(port):
        raise SimFleetError(f"metrics port {metrics_port} is not a TCP port other than the SSH port {port}")
    if os.geteuid() != 0:
        raise SimFleetError(
            "the simulated fleet needs root (sshd must run as root to log in as root): run as root"
        )
    sshd = find_sshd()
    if sshd is None and install:
        _install_sshd()
        sshd = find_sshd()
    if sshd is None:
        raise SimFleetError(INSTALL_HINT)
    agent_bin = agent_bin_dir()
    names = node_names(nodes)
    addrs = addresses(first_address, nodes)
    scenario: dict[str, Any] = {}
    if scenario_path:
        try:
            scenario = sim.load_scenario(scenario_path)
        except sim.SimError as exc:
            raise SimFleetError(str(exc)) from exc
    per_node = _node_scenarios(scenario, names, scenario_path or "scenario")

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    os.makedirs(
        "/run/sshd", mode=0o755, exist_ok=True
    )  # privilege separation dir; systemd makes it elsewhere
    with _locked(directory):
        old = _read_fleet(directory, required=False)
        if old is not None:
            running = [n for n, e in sorted(old["nodes"].items()) if _is_our_sshd(e.get("pid"), e["config"])]
            if running:
                first = old["nodes"][running[0]]
                raise SimFleetError(
                    f"{directory} already runs a fleet ({len(running)} sshd up, e.g. {running[0]} on "
                    f"{first['address']}:{first['port']}): run down on it first"
                )
        taken = {a for a, p in _listening() if p == port} if os.path.exists("/proc/net/tcp") else set()
        busy = sorted(set(addrs + ["0.0.0.0"]) & taken)
        if busy or _accepts(addrs[0], port, 0.2):
            where = busy[0] if busy else addrs[0]
            raise SimFleetError(
                f"{where}:{port} is already in use (another fleet?): stop it, or pick first_address/port"
            )
        if daemon and os.path.exists("/proc/net/tcp"):
            metrics_busy = sorted(set(addrs + ["0.0.0.0"]) & {a for a, p in _listening() if p == metrics_port})
            if metrics_busy:
                raise SimFleetError(f"{metrics_busy[0]}:{metrics_port} is already in use (another agent?): the "
                                    "daemon serves each node's metrics there; stop it, or pick first_address/metrics_port")

        for sub in ("state", "home", "sshd", "log"):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        fleet: dict[str, Any] = {
            "version": FLEET_VERSION,
            "directory": directory,
            "created_at": time.time(),
            "sshd": sshd,
            "agent_bin": agent_bin,
            "port": port,
            "metrics_port": int(metrics_port),
            "host_key": os.path.join(directory, "ssh_host_ed25519_key"),
            "client_key": os.path.join(directory, "id_ed25519"),
            "authorized_keys": os.path.join(directory, "authorized_keys"),
            "known_hosts": os.path.join(directory, "known_hosts"),
            "inventory": os.path.join(directory, "inventory.yml"),
            "scenario": os.path.abspath(scenario_path) if scenario_path else None,
            "nodes": {},
        }
        host_pub = _ed25519_keypair(fleet["host_key"], f"fleetops-sim-host@{directory}")
        client_pub = _ed25519_keypair(fleet["client_key"], f"fleetops-sim-client@{directory}")
        _write_atomic(fleet["authorized_keys"], client_pub + "\n", 0o600)
        host_key_text = " ".join(host_pub.split()[:2])

        for name, address in zip(names, addrs, strict=True):
            home = os.path.join(directory, "home", name)
            node: dict[str, Any] = {
                "address": address,
                "port": port,
                "state": os.path.join(directory, "state", f"{name}.json"),
                "home": home,
                "config": os.path.join(directory, "sshd", f"{name}.conf"),
                "log": os.path.join(directory, "log", f"{name}.log"),
                "pid": None,
                "faults": [],
            }
            fleet["nodes"][name] = node
            os.makedirs(os.path.join(home, ".ansible", "tmp"), exist_ok=True)
            with open(os.path.join(home, ".bashrc"), "w"):
                pass
            try:
                sim.init_state(node["state"], name, per_node[name])
            except sim.SimError as exc:
                raise SimFleetError(f"{scenario_path or 'scenario'}: {name}: {exc}") from exc
            _write_atomic(node["config"], _sshd_config(fleet, name))

        _write_atomic(
            fleet["known_hosts"],
            "".join(f"{_known_hosts_name(a, port)} {host_key_text}\n" for a in addrs),
        )
        _write_atomic(fleet["inventory"], _inventory_yaml(fleet))

        try:
            for name in names:
                fleet["nodes"][name]["pid"] = _spawn(sshd, fleet["nodes"][name])
            if daemon:
                fleet["daemon"] = _spawn_daemon(fleet)
            _write_fleet(directory, fleet)  # recorded before waiting, so down() finds them if we fail
            _wait_listening(fleet["nodes"], START_TIMEOUT_S)
            if daemon:
                _wait_metrics(fleet, START_TIMEOUT_S)
        except BaseException:
            _stop_daemon(fleet)
            _kill_trees([n["pid"] for n in fleet["nodes"].values() if n["pid"]])
            for n in fleet["nodes"].values():
                n["pid"] = None
            _write_fleet(directory, fleet)
            raise
    fleet["elapsed_s"] = round(time.perf_counter() - started, 3)
    return fleet


def down(directory: str) -> int:
    """Stop every sshd of the fleet in ``directory`` (and its sessions); returns how many ran."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        return 0
    with _locked(directory):
        fleet = _read_fleet(directory, required=False)
        if fleet is None:
            return 0
        running = [e["pid"] for e in fleet["nodes"].values() if _is_our_sshd(e.get("pid"), e["config"])]
        _stop_daemon(fleet)
        _kill_trees(running)
        for entry in fleet["nodes"].values():
            entry["pid"] = None
        fleet["stopped_at"] = time.time()
        _write_fleet(directory, fleet)
    return len(running)


def _node_status(entry: dict[str, Any]) -> str:
    pid = entry.get("pid")
    if not _is_our_sshd(pid, entry["config"]):
        return "down"
    return "hung" if pid is not None and _stopped(pid) else "up"


def status(directory: str) -> list[dict[str, Any]]:
    """One row per node: node, address, port, pid, status (up/down/hung), faults (fleet and GPU)."""
    directory = os.path.abspath(directory)
    fleet = _read_fleet(directory)
    assert fleet is not None
    rows = []
    for name, entry in sorted(fleet["nodes"].items()):
        state = _node_status(entry)
        faults = list(entry.get("faults", []))
        row: dict[str, Any] = {
            "node": name,
            "address": entry["address"],
            "port": entry["port"],
            "pid": entry.get("pid") if state != "down" else None,
            "status": state,
        }
        try:
            sim_state = sim.read_state(entry["state"])
            for f in sim_state["faults"]:
                faults.append(f["name"] if f.get("gpu") is None else f"{f['name']}@{f['gpu']}")
            for v in sim_state.get("validation_faults") or []:  # what only validate measures
                link = f"-{v['peer']}" if v.get("peer") is not None else ""
                faults.append(f"{v['fault']}@{v['gpu']}{link}")
        except sim.SimError as exc:
            row["error"] = str(exc)
        row["faults"] = faults
        rows.append(row)
    return rows


def _check_fault(fault: str) -> None:
    if fault in FLEET_FAULTS:
        return
    try:
        sim.check_fault_name(fault)
    except sim.SimError as exc:
        raise SimFleetError(f"{exc}; fleet-level: {', '.join(FLEET_FAULTS)}") from exc


def _start_node(fleet: dict[str, Any], name: str) -> None:
    entry = fleet["nodes"][name]
    entry["pid"] = _spawn(fleet["sshd"], entry)
    _wait_listening({name: entry}, START_TIMEOUT_S)


def _reload(fleet: dict[str, Any], name: str) -> None:
    """Rewrite the node's sshd config and make a running sshd re-read it (SIGHUP re-execs, same pid)."""
    entry = fleet["nodes"][name]
    _write_atomic(entry["config"], _sshd_config(fleet, name))
    pid = entry.get("pid")
    if _is_our_sshd(pid, entry["config"]) and not _stopped(pid):
        where = (entry["address"], entry["port"])
        old_socket = _listening().get(where)
        os.kill(pid, signal.SIGHUP)
        # it closes its socket and re-execs itself: wait for a new listening socket (another inode)
        deadline = time.monotonic() + START_TIMEOUT_S
        while _listening().get(where) in (None, old_socket):
            if time.monotonic() > deadline or not _alive(pid):
                raise SimFleetError(
                    f"sshd of {name} did not come back after SIGHUP: {_log_tail(entry['log'])}"
                )
            time.sleep(0.01)


def inject(directory: str, node: str | int, fault: str, gpu: int | None = None, peer: int | None = None) -> bool:
    """Inject ``fault`` on ``node``; False when it was already there. ``peer`` narrows
    slow-nvlink (a validation degradation) to the link between ``gpu`` and ``peer``."""
    directory = os.path.abspath(directory)
    _check_fault(fault)
    with _locked(directory):
        fleet = _read_fleet(directory)
        assert fleet is not None
        name = _resolve_node(fleet, node)
        entry = fleet["nodes"][name]
        if fault not in FLEET_FAULTS:
            try:
                return sim.inject(entry["state"], fault, gpu, peer)
            except sim.SimError as exc:
                raise SimFleetError(f"{name}: {exc}") from exc
        if gpu is not None or peer is not None:
            raise SimFleetError(f"fault {fault!r} is host-wide; it takes no GPU index")
        faults = entry.setdefault("faults", [])
        if fault in faults:
            return False
        pid = entry.get("pid")
        running = _is_our_sshd(pid, entry["config"])
        if fault == "host-down":
            _kill_trees([pid] if running else [])
            entry["pid"] = None
            faults[:] = [f for f in faults if f != "host-hang"]
        elif fault == "host-hang":
            if not running:
                raise SimFleetError(
                    f"{name} is down (its sshd does not run): nothing to hang; clear host-down first"
                )
            everyone = [pid] + _descendants(pid)
            _signal(everyone, signal.SIGSTOP)
        faults.append(fault)
        if fault == "agent-missing":
            _reload(fleet, name)
        _write_fleet(directory, fleet)
        return True


def clear(directory: str, node: str | int, fault: str, gpu: int | None = None) -> int:
    """Clear ``fault`` (or ``all``) on ``node``; returns how many faults were removed."""
    directory = os.path.abspath(directory)
    if fault != "all":
        _check_fault(fault)
    with _locked(directory):
        fleet = _read_fleet(directory)
        assert fleet is not None
        name = _resolve_node(fleet, node)
        entry = fleet["nodes"][name]
        removed = 0
        if fault not in FLEET_FAULTS:
            try:
                removed += sim.clear(entry["state"], fault, gpu)
            except sim.SimError as exc:
                raise SimFleetError(f"{name}: {exc}") from exc
            if fault != "all":
                return removed
        faults = entry.setdefault("faults", [])
        wanted = list(FLEET_FAULTS) if fault == "all" else [fault]
        pid = entry.get("pid")
        if "host-hang" in wanted and "host-hang" in faults:
            if _is_our_sshd(pid, entry["config"]):
                _signal([pid] + _descendants(pid), signal.SIGCONT)
            faults.remove("host-hang")
            removed += 1
        if "agent-missing" in wanted and "agent-missing" in faults:
            faults.remove("agent-missing")
            _reload(fleet, name)
            removed += 1
        if "host-down" in wanted and "host-down" in faults:
            faults.remove("host-down")
            if not _is_our_sshd(pid, entry["config"]):
                _start_node(fleet, name)
            removed += 1
        _write_fleet(directory, fleet)
        return removed
