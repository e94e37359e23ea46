"""A simulated fleet: one real sshd per node on its own loopback address.

Each node ``nodeNNN`` gets an address ``127.0.10.N`` (rolling over into the next /24), its own
sshd config, HOME and simulator state file, so SSH fan-out, timeouts, host-down and Ansible all
run for real against ``fleetops-agent`` on the far side. Layout of the fleet folder ``DIR``::

    DIR/fleet.json              node -> address, port, state file, sshd pid, config (``record.py``)
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
The package: ``up``, ``down``, ``status``, ``inject`` and ``clear`` are here, on ``base``
(constants, the error, small helpers), ``procs`` (the sshd and daemon processes) and ``record``
(fleet.json, sshd configs, scenarios, the inventory).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from fleetops.sim import gpu as sim
from fleetops.sim.fleet.base import (
    FLEET_FAULTS,
    FLEET_FILE,
    FLEET_VERSION,
    INSTALL_HINT,
    LOOPBACK,
    METRICS_PORT,
    SSHD_SEARCH,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    UNIX_PATH_MAX,
    SimFleetError,
    addresses,
    agent_bin_dir,
    ed25519_keypair,
    find_sshd,
    install_sshd,
    known_hosts_name,
    node_names,
    write_atomic,
)
from fleetops.sim.fleet.procs import (
    accepts,
    alive,
    descendants,
    is_our_sshd,
    kill_trees,
    listening_sockets,
    log_tail,
    metrics_addresses,
    signal_all,
    spawn,
    spawn_daemon,
    stop_daemon,
    stopped,
    wait_listening,
    wait_metrics,
)
from fleetops.sim.fleet.record import (
    inventory_yaml,
    locked,
    node_scenarios,
    read_fleet,
    resolve_node,
    sshd_config,
    write_fleet,
)

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
        install_sshd()
        sshd = find_sshd()
    if sshd is None:
        raise SimFleetError(INSTALL_HINT)
    agent_bin = agent_bin_dir()
    names = node_names(nodes)
    if daemon:
        # the daemon's socket for each node sits beside its state file; a unix socket's path is at
        # most 107 bytes, and past that the daemon could serve no collect at all
        sock = os.path.join(os.path.abspath(directory), "state", f"{names[-1]}.agent", "agent.sock")
        if len(os.fsencode(sock)) > UNIX_PATH_MAX:
            raise SimFleetError(
                f"{directory}: too long a folder for the daemon's sockets: {sock} is "
                f"{len(os.fsencode(sock))} bytes, a unix socket's path at most {UNIX_PATH_MAX}; use a shorter --dir"
            )
    addrs = addresses(first_address, nodes)
    scenario: dict[str, Any] = {}
    if scenario_path:
        try:
            scenario = sim.load_scenario(scenario_path)
        except sim.SimError as exc:
            raise SimFleetError(str(exc)) from exc
    per_node = node_scenarios(scenario, names, scenario_path or "scenario")

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    os.makedirs(
        "/run/sshd", mode=0o755, exist_ok=True
    )  # privilege separation dir; systemd makes it elsewhere
    with locked(directory):
        old = read_fleet(directory, required=False)
        if old is not None:
            running = [n for n, e in sorted(old["nodes"].items()) if is_our_sshd(e.get("pid"), e["config"])]
            if running:
                first = old["nodes"][running[0]]
                raise SimFleetError(
                    f"{directory} already runs a fleet ({len(running)} sshd up, e.g. {running[0]} on "
                    f"{first['address']}:{first['port']}): run down on it first"
                )
        taken = {a for a, p in listening_sockets() if p == port} if os.path.exists("/proc/net/tcp") else set()
        busy = sorted(set(addrs + ["0.0.0.0"]) & taken)
        if busy or accepts(addrs[0], port, 0.2):
            where = busy[0] if busy else addrs[0]
            raise SimFleetError(
                f"{where}:{port} is already in use (another fleet?): stop it, or pick first_address/port"
            )
        if daemon and os.path.exists("/proc/net/tcp"):
            metrics_busy = sorted(set(addrs + ["0.0.0.0"]) & {a for a, p in listening_sockets() if p == metrics_port})
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
        host_pub = ed25519_keypair(fleet["host_key"], f"fleetops-sim-host@{directory}")
        client_pub = ed25519_keypair(fleet["client_key"], f"fleetops-sim-client@{directory}")
        write_atomic(fleet["authorized_keys"], client_pub + "\n", 0o600)
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
            write_atomic(node["config"], sshd_config(fleet, name))

        write_atomic(
            fleet["known_hosts"],
            "".join(f"{known_hosts_name(a, port)} {host_key_text}\n" for a in addrs),
        )
        write_atomic(fleet["inventory"], inventory_yaml(fleet))

        try:
            for name in names:
                fleet["nodes"][name]["pid"] = spawn(sshd, fleet["nodes"][name])
            if daemon:
                fleet["daemon"] = spawn_daemon(fleet)
            write_fleet(directory, fleet)  # recorded before waiting, so down() finds them if we fail
            wait_listening(fleet["nodes"], START_TIMEOUT_S)
            if daemon:
                wait_metrics(fleet, START_TIMEOUT_S)
        except BaseException:
            stop_daemon(fleet)
            kill_trees([n["pid"] for n in fleet["nodes"].values() if n["pid"]])
            for n in fleet["nodes"].values():
                n["pid"] = None
            write_fleet(directory, fleet)
            raise
    fleet["elapsed_s"] = round(time.perf_counter() - started, 3)
    return fleet


def down(directory: str) -> int:
    """Stop every sshd of the fleet in ``directory`` (and its sessions); returns how many ran."""
    directory = os.path.abspath(directory)
    if not os.path.isdir(directory):
        return 0
    with locked(directory):
        fleet = read_fleet(directory, required=False)
        if fleet is None:
            return 0
        running = [e["pid"] for e in fleet["nodes"].values() if is_our_sshd(e.get("pid"), e["config"])]
        stop_daemon(fleet)
        kill_trees(running)
        for entry in fleet["nodes"].values():
            entry["pid"] = None
        fleet["stopped_at"] = time.time()
        write_fleet(directory, fleet)
    return len(running)


def _node_status(entry: dict[str, Any]) -> str:
    pid = entry.get("pid")
    if not is_our_sshd(pid, entry["config"]):
        return "down"
    return "hung" if pid is not None and stopped(pid) else "up"


def status(directory: str) -> list[dict[str, Any]]:
    """One row per node: node, address, port, pid, status (up/down/hung), faults (fleet and GPU)."""
    directory = os.path.abspath(directory)
    fleet = read_fleet(directory)
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
    entry["pid"] = spawn(fleet["sshd"], entry)
    wait_listening({name: entry}, START_TIMEOUT_S)


def _reload(fleet: dict[str, Any], name: str) -> None:
    """Rewrite the node's sshd config and make a running sshd re-read it (SIGHUP re-execs, same pid)."""
    entry = fleet["nodes"][name]
    write_atomic(entry["config"], sshd_config(fleet, name))
    pid = entry.get("pid")
    if is_our_sshd(pid, entry["config"]) and not stopped(pid):
        where = (entry["address"], entry["port"])
        old_socket = listening_sockets().get(where)
        os.kill(pid, signal.SIGHUP)
        # it closes its socket and re-execs itself: wait for a new listening socket (another inode)
        deadline = time.monotonic() + START_TIMEOUT_S
        while listening_sockets().get(where) in (None, old_socket):
            if time.monotonic() > deadline or not alive(pid):
                raise SimFleetError(
                    f"sshd of {name} did not come back after SIGHUP: {log_tail(entry['log'])}"
                )
            time.sleep(0.01)


def inject(directory: str, node: str | int, fault: str, gpu: int | None = None, peer: int | None = None) -> bool:
    """Inject ``fault`` on ``node``; False when it was already there. ``peer`` narrows
    slow-nvlink (a validation degradation) to the link between ``gpu`` and ``peer``."""
    directory = os.path.abspath(directory)
    _check_fault(fault)
    with locked(directory):
        fleet = read_fleet(directory)
        assert fleet is not None
        name = resolve_node(fleet, node)
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
        running = is_our_sshd(pid, entry["config"])
        if fault == "host-down":
            kill_trees([pid] if running else [])
            entry["pid"] = None
            faults[:] = [f for f in faults if f != "host-hang"]
        elif fault == "host-hang":
            if not running:
                raise SimFleetError(
                    f"{name} is down (its sshd does not run): nothing to hang; clear host-down first"
                )
            everyone = [pid] + descendants(pid)
            signal_all(everyone, signal.SIGSTOP)
        faults.append(fault)
        if fault == "agent-missing":
            _reload(fleet, name)
        write_fleet(directory, fleet)
        return True


def clear(directory: str, node: str | int, fault: str, gpu: int | None = None) -> int:
    """Clear ``fault`` (or ``all``) on ``node``; returns how many faults were removed."""
    directory = os.path.abspath(directory)
    if fault != "all":
        _check_fault(fault)
    with locked(directory):
        fleet = read_fleet(directory)
        assert fleet is not None
        name = resolve_node(fleet, node)
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
            if is_our_sshd(pid, entry["config"]):
                signal_all([pid] + descendants(pid), signal.SIGCONT)
            faults.remove("host-hang")
            removed += 1
        if "agent-missing" in wanted and "agent-missing" in faults:
            faults.remove("agent-missing")
            _reload(fleet, name)
            removed += 1
        if "host-down" in wanted and "host-down" in faults:
            faults.remove("host-down")
            if not is_our_sshd(pid, entry["config"]):
                _start_node(fleet, name)
            removed += 1
        write_fleet(directory, fleet)
        return removed


# What callers use as ``fleet.X`` (the rest of the names imported above are this module's helpers).
__all__ = [
    "FLEET_FAULTS",
    "FLEET_FILE",
    "FLEET_VERSION",
    "INSTALL_HINT",
    "LOOPBACK",
    "METRICS_PORT",
    "SSHD_SEARCH",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "SimFleetError",
    "addresses",
    "agent_bin_dir",
    "clear",
    "down",
    "find_sshd",
    "inject",
    "metrics_addresses",
    "node_names",
    "status",
    "up",
]
