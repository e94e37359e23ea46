"""The node side of the node-pair RDMA bandwidth test (``fleetops-agent ib-bw``): perftest's
``ib_write_bw`` between one rail (``mlx5_N``) of this node and the same rail of a peer, the
controller running the server on one node and the client on the other (``fleetops validate
--level full``).

Each end chooses its own memory: the GPU behind the HCA's PCIe switch when GPUDirect RDMA is
possible here (``nvidia_peermem`` loaded, or the dma-buf path: NVIDIA's open kernel module on
Linux 5.12 or later), host memory otherwise, and says which (AzNHC's ``check_ib_bw_gdr`` is the
GPUDirect figure; a host-memory figure measures the link and the HCA, not the GPU's placement).

The simulator (``--backend sim``) answers from the simulated HCAs: its server listens on TCP at
the node's address as ``ib_write_bw``'s server does for its out-of-band exchange, sends the state
and rate of its port, and the client works out the figure from both ends (``sim_gbps``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

from fleetops import model

PERFTEST = "ib_write_bw"
DEFAULT_PORT = 18515  # perftest's default TCP port for the exchange
DURATION_S = 10  # -D: seconds each rail is measured, both ends
CONNECT_S = 30.0  # how long a client tries to reach its server's listener (it may still be starting)
RUN_DIR = "/run/fleetops"
NOT_INSTALLED = "perftest not installed (no ib_write_bw on PATH)"

# The simulator's figures: ib_write_bw reaches about 98 % of the port's rate on a healthy NDR
# rail (392 of 400 Gb/s); each pair and rail its own small, deterministic jitter (+-0.5 %).
SIM_EFFICIENCY = 0.98
SIM_JITTER = 0.005


class IbBwError(Exception):
    pass


# --- perftest's output ----------------------------------------------------------------------

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]\s+MsgRate\[([^\]]+)\]")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z .*_-]*?)\s*:\s*(\S+)")


def parse(text: str) -> dict[str, Any]:
    """perftest's result from its output: ``bytes``, ``iterations``, ``peak_gbps``,
    ``average_gbps``, ``msg_rate_mpps`` from the line under the ``#bytes ... BW average[Gb/sec]``
    header (``--report_gbits``), with the banner's ``device``, ``link_type`` and
    ``transport``, and ``cuda`` (the GPU perftest picked, or None). Raises IbBwError when there is
    no result line or its unit is not Gb/sec."""
    lines = text.splitlines()
    out: dict[str, Any] = {"cuda": None}
    for line in lines:
        for part in line.split("\t"):
            m = _FIELD.match(part)
            if m is None:
                continue
            key = m.group(1).strip().lower()
            if key == "device":
                out["device"] = m.group(2)
            elif key == "link type":
                out["link_type"] = m.group(2)
            elif key == "transport type":
                out["transport"] = m.group(2)
        cuda = re.match(r"^\s*Picking device No\.\s*(\d+)", line)
        if cuda:
            out["cuda"] = int(cuda.group(1))
    for i, line in enumerate(lines):
        m = _HEADER.search(line)
        if m is None:
            continue
        unit = m.group(2)
        if unit != "Gb/sec":
            raise IbBwError(f"ib_write_bw reported in {unit}, not Gb/sec (run it with --report_gbits)")
        for row in lines[i + 1:]:
            fields = row.split()
            if not fields or set(row.strip()) == {"-"}:
                continue
            try:
                out.update(bytes=int(fields[0]), iterations=int(fields[1]), peak_gbps=float(fields[2]),
                           average_gbps=float(fields[3]), msg_rate_mpps=float(fields[4]))
            except (ValueError, IndexError) as exc:
                raise IbBwError(f"ib_write_bw: result line not understood: {row.strip()!r}") from exc
            return out
    raise IbBwError("ib_write_bw printed no result line")


# --- what this node can do --------------------------------------------------------------------


def perftest_path() -> str | None:
    return shutil.which(PERFTEST)


def gpudirect(sys_root: str = "/sys", proc_root: str = "/proc") -> tuple[str | None, str]:
    """(how GPUDirect RDMA reaches GPU memory here, why): ``nvidia_peermem`` where the module is
    loaded, ``dma-buf`` where NVIDIA's open kernel module runs on Linux 5.12 or later (perftest's
    ``--use_cuda_dmabuf``), else None: host memory."""
    if os.path.isdir(os.path.join(sys_root, "module", "nvidia_peermem")):
        return "nvidia_peermem", "nvidia_peermem loaded"
    try:
        with open(os.path.join(proc_root, "driver", "nvidia", "version"), encoding="ascii", errors="replace") as fh:
            driver = fh.read()
    except OSError:
        return None, "no NVIDIA driver loaded: host memory"
    release = os.uname().release
    m = re.match(r"(\d+)\.(\d+)", release)
    new_kernel = m is not None and (int(m.group(1)), int(m.group(2))) >= (5, 12)
    if "Open Kernel Module" in driver and new_kernel:
        return "dma-buf", f"NVIDIA open kernel module on Linux {release}: dma-buf"
    return None, "nvidia_peermem not loaded and no dma-buf (needs the open kernel module, Linux >= 5.12): host memory"


def describe(fabric: model.Fabric, gpus: list[dict[str, Any]], perftest: str | None,
             gdr: tuple[str | None, str]) -> dict[str, Any]:
    """The ``rdma`` section of ``fleetops-agent validate --level full``: what the controller
    pairs the nodes by (the HCAs and their ports, the GPUs by index and bus id), whether perftest
    is here, and the memory GPUDirect would use."""
    doc: dict[str, Any] = {
        "fabric": model.to_dict(fabric),
        "gpus": [{"index": int(g["index"]), "bus_id": str(g["bus_id"])} for g in gpus],
        "perftest": perftest,
        "gpudirect": gdr[0],
        "gpudirect_note": gdr[1],
    }
    if not fabric.hcas:
        doc["not_applicable"] = fabric.note or "; ".join(fabric.unavailable.values()) or "no RDMA device"
    elif perftest is None:
        doc["not_applicable"] = NOT_INSTALLED
    return doc


def _norm(bus: str) -> str:
    try:
        return model.normalize_bus_id(bus)
    except ValueError:
        return bus.lower()


def roce_gid_index(sys_root: str, device: str, port: int = 1) -> int | None:
    """The GID index of the port's first RoCE v2 GID that holds an IPv4-mapped address (what
    ``ib_write_bw -x`` takes on Ethernet), else its first RoCE v2 GID that is set, else None."""
    folder = os.path.join(sys_root, "class", "infiniband", device, "ports", str(port))
    try:
        names = sorted(int(n) for n in os.listdir(os.path.join(folder, "gid_attrs", "types")) if n.isdigit())
    except OSError:
        return None
    fallback = None
    for n in names:
        try:
            with open(os.path.join(folder, "gid_attrs", "types", str(n)), encoding="ascii") as fh:
                kind = fh.read().strip()
            with open(os.path.join(folder, "gids", str(n)), encoding="ascii") as fh:
                gid = fh.read().strip()
        except OSError:
            continue
        if kind.lower() != "roce v2" or set(gid.replace(":", "")) <= {"0"}:
            continue
        if gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return n
        fallback = n if fallback is None else fallback
    return fallback


def setup(fabric: model.Fabric, device: str, gpus: list[dict[str, Any]], gdr: tuple[str | None, str],
          sys_root: str = "/sys") -> dict[str, Any]:
    """How this end runs ``device``'s rail: its port 1's state, the GID index on RoCE, and the
    memory (the lowest-indexed GPU behind the HCA's PCIe switch with GPUDirect, else host)."""
    hca = next((h for h in fabric.hcas or [] if h.name == device), None)
    if hca is None or not hca.ports:
        return {"device": device, "active": False, "state": "absent",
                "why": f"{device}: no such RDMA device (or no port) on this node"}
    port = hca.ports[0]
    out: dict[str, Any] = {"device": device, "port": port.port, "active": port.active, "state": port.state,
                           "rate_gbps": port.rate_gbps, "link_layer": port.link_layer, "gid_index": None,
                           "gpu": None, "memory": "host", "gpudirect": None}
    if port.link_layer == "Ethernet":
        out["gid_index"] = roce_gid_index(sys_root, device, port.port)
    beside = {_norm(b) for b in hca.gpus or []}
    near = sorted(int(g["index"]) for g in gpus if _norm(str(g["bus_id"])) in beside)
    if not near:
        out["memory_note"] = f"host memory: no GPU behind {device}'s PCIe switch"
    elif gdr[0] is None:
        out["gpu"] = near[0]
        out["memory_note"] = f"host memory: GPUDirect off ({gdr[1]})"
    else:
        out.update(gpu=near[0], memory="cuda", gpudirect=gdr[0],
                   memory_note=f"GPU {near[0]} memory through {gdr[0]}")
    if not port.active:
        out["why"] = f"port {device}/{port.port} is {port.state or 'in an unknown state'}: not measured"
    return out


def perftest_argv(rail: dict[str, Any], tcp_port: int, duration: int, peer: str | None = None) -> list[str]:
    """``ib_write_bw`` for one end of one rail (the client names the server's address last)."""
    argv = [PERFTEST, "-d", str(rail["device"]), "-i", str(rail.get("port") or 1), "-p", str(tcp_port),
            "-F", "--report_gbits", "-D", str(duration)]
    if rail.get("gid_index") is not None:
        argv += ["-x", str(rail["gid_index"])]
    if rail.get("memory") == "cuda":
        argv.append(f"--use_cuda={rail['gpu']}")
        if rail.get("gpudirect") == "dma-buf":
            argv.append("--use_cuda_dmabuf")
    if peer is not None:
        argv.append(peer)
    return argv


def perftest_env() -> dict[str, str]:
    """``--use_cuda=N`` takes a CUDA device index, and CUDA numbers devices fastest first unless
    told otherwise; in PCI bus order its indexes are NVML's, which chose the GPU."""
    return {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _public(rail: dict[str, Any]) -> dict[str, Any]:
    return {k: rail.get(k) for k in ("memory", "gpu", "gpudirect", "memory_note", "link_layer", "rate_gbps")}


# --- the server, its stop, the client (perftest) ----------------------------------------------


def pid_file(token: str, run_dir: str = RUN_DIR) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", token):
        raise IbBwError(f"--token {token!r}: letters, digits, '.', '_' and '-' only")
    return os.path.join(run_dir, f"ib-bw-{token}.pid")


def run_dir_for(default: str = RUN_DIR) -> str:
    """Where the server's pid file lives: ``/run/fleetops`` where this user may write there (the
    agent runs as root), else a folder of this user's in the temporary directory; the server and
    ``stop`` (the same user, over SSH) reach the same one."""
    try:
        os.makedirs(default, exist_ok=True)
        if os.access(default, os.W_OK):
            return default
    except OSError:
        pass
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"fleetops-{os.getuid()}")


class _Stop:
    """SIGTERM (``ib-bw stop``, or the controller giving up) ends the server's wait."""

    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self._on)
        signal.signal(signal.SIGHUP, self._on)  # a session that hangs up, where sshd sends it

    def _on(self, *_: Any) -> None:
        self.asked = True


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(rails: list[dict[str, Any]], base_port: int, duration: int, wait_s: float, token: str,
          run_dir: str = RUN_DIR) -> dict[str, Any]:
    """One ``ib_write_bw`` server per active rail (TCP port ``base_port`` + the rail's place),
    until each has served its client, ``wait_s`` passed, or SIGTERM; whatever is still running
    then is ended. The pid file lets ``ib-bw stop --token`` end it from another session."""
    os.makedirs(run_dir, exist_ok=True)
    path = pid_file(token, run_dir)
    with open(path, "w", encoding="ascii") as fh:
        fh.write(f"{os.getpid()}\n")
    stop = _Stop()
    out: dict[str, Any] = {}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for i, rail in enumerate(rails):
            if not rail["active"]:
                out[rail["device"]] = {"failed": rail["why"], **_public(rail)}
                continue
            procs[rail["device"]] = subprocess.Popen(
                perftest_argv(rail, base_port + i, duration), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, stdin=subprocess.DEVNULL, env=perftest_env())
        deadline = time.monotonic() + wait_s
        while procs and not stop.asked and time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.1)
        for device, proc in procs.items():
            ended = proc.poll() is not None
            _end(proc)
            text = proc.stdout.read() if proc.stdout is not None else ""
            rail = next(r for r in rails if r["device"] == device)
            entry: dict[str, Any] = {**_public(rail), "exit": proc.returncode}
            if not ended:
                entry["error"] = "stopped before its client finished" if stop.asked else f"no client within {wait_s:.0f} s"
            elif proc.returncode != 0:
                entry["error"] = f"ib_write_bw exited {proc.returncode}: {_tail(text)}"
            out[device] = entry
    finally:
        for proc in procs.values():
            _end(proc)
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"kind": "ib-bw", "role": "server", "rails": out}


def stop(token: str, run_dir: str = RUN_DIR) -> dict[str, Any]:
    """End the server of ``token`` (SIGTERM; it ends its ``ib_write_bw`` processes itself). Its
    pid is checked against the process's command line first, so a reused pid is left alone."""
    path = pid_file(token, run_dir)
    try:
        with open(path, encoding="ascii") as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return {"kind": "ib-bw", "role": "stop", "stopped": False, "note": "no server of this token runs"}
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmdline = ""
    if "ib-bw" not in cmdline or token not in cmdline:
        return {"kind": "ib-bw", "role": "stop", "stopped": False, "note": f"pid {pid} is not this server"}
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"kind": "ib-bw", "role": "stop", "stopped": False, "note": "the server had ended"}
    return {"kind": "ib-bw", "role": "stop", "stopped": True, "pid": pid}


def _tail(text: str, n: int = 300) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-4:])[-n:]


def client(rails: list[dict[str, Any]], peer: str, base_port: int, duration: int,
           connect_s: float = CONNECT_S,
           run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> dict[str, Any]:
    """Each rail in turn (one at a time: rails measured together share the host's PCIe and
    memory): ``ib_write_bw`` against ``peer``, retried while the server's listener is not up yet."""
    out: dict[str, Any] = {}
    for i, rail in enumerate(rails):
        if not rail["active"]:
            out[rail["device"]] = {"failed": rail["why"], **_public(rail)}
            continue
        argv = perftest_argv(rail, base_port + i, duration, peer)
        deadline = time.monotonic() + connect_s
        while True:
            try:
                proc = run(argv, capture_output=True, text=True, timeout=duration + 60, check=False,
                           env=perftest_env())
            except subprocess.TimeoutExpired:
                out[rail["device"]] = {"error": f"ib_write_bw ran past {duration + 60} s", **_public(rail)}
                break
            text = (proc.stdout or "") + (proc.stderr or "")
            if proc.returncode != 0 and "Couldn't connect" in text and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            out[rail["device"]] = _client_result(rail, proc.returncode, text)
            break
    return {"kind": "ib-bw", "role": "client", "peer": peer, "rails": out}


def _client_result(rail: dict[str, Any], code: int, text: str) -> dict[str, Any]:
    base = _public(rail)
    if code != 0:
        state = re.search(r"[Pp]ort (?:number )?\d+ state is (\w+)", text)
        if state:
            return {"failed": f"ib_write_bw: port {rail['device']} state is {state.group(1)}", **base}
        return {"error": f"ib_write_bw exited {code}: {_tail(text)}", **base}
    try:
        result = parse(text)
    except IbBwError as exc:
        return {"error": str(exc), **base}
    if rail.get("memory") == "cuda" and result.get("cuda") != rail.get("gpu"):
        picked = result.get("cuda")
        said = f"perftest picked {'no GPU it named' if picked is None else f'GPU {picked}'}, not GPU {rail.get('gpu')}"
        base["memory_note"] = "; ".join(x for x in (base.get("memory_note"), said) if x)
    return {"gbps": result["average_gbps"], "bytes": result["bytes"], "iterations": result["iterations"], **base}


# --- the simulator ----------------------------------------------------------------------------


def sim_gbps(rate_a: float, rate_b: float, host_a: str, host_b: str, device: str) -> float:
    """A simulated rail's figure: 98 % of the slower end's rate, with its own jitter."""
    import hashlib

    h = int(hashlib.sha256(f"{host_a}|{host_b}|{device}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return round(min(rate_a, rate_b) * SIM_EFFICIENCY * (1 + (h - 0.5) * 2 * SIM_JITTER), 2)


def sim_serve(rails: list[dict[str, Any]], listen: str, base_port: int, hostname: str, wait_s: float,
              token: str, run_dir: str) -> dict[str, Any]:
    """The simulated server: a TCP listener per rail at ``listen`` (``base_port`` + the rail's
    place), answering one client each with its port's state and rate, as ``ib_write_bw``'s
    server exchanges its side over TCP before the transfer."""
    import selectors

    os.makedirs(run_dir, exist_ok=True)
    path = pid_file(token, run_dir)
    with open(path, "w", encoding="ascii") as fh:
        fh.write(f"{os.getpid()}\n")
    stop_flag = _Stop()
    out: dict[str, Any] = {}
    sel = selectors.DefaultSelector()
    listeners: list[socket.socket] = []
    try:
        for i, rail in enumerate(rails):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((listen, base_port + i))
            sock.listen(1)
            sock.setblocking(False)
            listeners.append(sock)
            sel.register(sock, selectors.EVENT_READ, rail)
        waiting = {r["device"] for r in rails}
        deadline = time.monotonic() + wait_s
        while waiting and not stop_flag.asked and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                rail = key.data
                conn, _addr = key.fileobj.accept()  # type: ignore[union-attr]
                with conn:
                    conn.setblocking(True)
                    conn.settimeout(10.0)
                    side = {"host": hostname, "device": rail["device"], "active": rail["active"],
                            "state": rail.get("state"), "rate_gbps": rail.get("rate_gbps")}
                    conn.sendall((json.dumps(side) + "\n").encode())
                    conn.recv(4096)  # the client's word that it is done
                sel.unregister(key.fileobj)
                waiting.discard(rail["device"])
                out[rail["device"]] = {"failed": rail["why"], **_public(rail)} if not rail["active"] else {
                    **_public(rail), "exit": 0}
        for device in waiting:
            rail = next(r for r in rails if r["device"] == device)
            why = "stopped before its client finished" if stop_flag.asked else f"no client within {wait_s:.0f} s"
            out[device] = {"error": why, **_public(rail)}
    finally:
        for sock in listeners:
            sock.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"kind": "ib-bw", "role": "server", "rails": out, "simulated": True}


def sim_client(rails: list[dict[str, Any]], peer: str, base_port: int, hostname: str,
               connect_s: float = CONNECT_S) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, rail in enumerate(rails):
        device = rail["device"]
        deadline = time.monotonic() + connect_s
        while True:
            try:
                conn = socket.create_connection((peer, base_port + i), timeout=5.0)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    conn = None
                    out[device] = {"error": f"Couldn't connect to {peer}:{base_port + i} ({exc})", **_public(rail)}
                    break
                time.sleep(0.2)
        if conn is None:
            continue
        with conn:
            reader = conn.makefile("r", encoding="utf-8")
            side = json.loads(reader.readline() or "{}")
            conn.sendall(b"done\n")
        if not rail["active"]:
            out[device] = {"failed": rail["why"], **_public(rail)}
        elif not side.get("active"):
            out[device] = {"failed": f"port {device}/1 on {side.get('host', peer)} is {side.get('state')}: "
                                     "not measured", **_public(rail)}
        else:
            gbps = sim_gbps(float(rail["rate_gbps"]), float(side["rate_gbps"]), hostname, str(side.get("host")),
                            device)
            out[device] = {"gbps": gbps, **_public(rail)}
    return {"kind": "ib-bw", "role": "client", "peer": peer, "rails": out, "simulated": True}


# --- the agent's entry points -----------------------------------------------------------------


def _context(backend: str, state_path: str | None) -> dict[str, Any]:
    """What both the ``rdma`` section and ``ib-bw`` read: the fabric, the GPUs, GPUDirect,
    perftest, and where the server keeps its pid file; the simulator's from its state."""
    from fleetops.fabric import sysfs
    from fleetops.gpu import backend_choice

    path = state_path or os.environ.get(backend_choice.SIM_STATE_ENV)
    chosen = backend_choice.choose(backend if backend in backend_choice.BACKENDS else "auto", bool(path))
    if chosen == "sim":
        if not path:
            raise IbBwError("--backend sim needs --state or $FLEETOPS_SIM_STATE")
        from fleetops.sim import gpu as sim
        from fleetops.sim.gpu import fabric as simfabric

        state = sim.read_state(path)
        gpus = [{"index": g["index"] if "index" in g else i, "bus_id": g["bus_id"]} for i, g in enumerate(state["gpus"])]
        root = simfabric.sys_root(path)
        return {"sim": True, "root": root, "fabric": sysfs.read(root, [g["bus_id"] for g in gpus]), "gpus": gpus,
                "gdr": ("nvidia_peermem", "nvidia_peermem loaded (simulated)"),
                "perftest": None if state.get("perftest_missing") else "ib_write_bw (simulated)",
                "hostname": str(state["hostname"]),
                "run_dir": os.path.splitext(os.path.abspath(path))[0] + ".run"}
    from fleetops.validation.node.telemetry import nvml_gpus

    gpus = [{"index": g["index"], "bus_id": g["bus_id"]} for g in nvml_gpus()]
    return {"sim": False, "root": "/sys", "fabric": sysfs.read("/sys", [_norm(g["bus_id"]) for g in gpus]),
            "gpus": gpus, "gdr": gpudirect(), "perftest": perftest_path(), "hostname": socket.gethostname(),
            "run_dir": run_dir_for()}


def rdma_section(backend: str, state_path: str | None) -> dict[str, Any]:
    """``validate --level full``'s ``rdma``: see ``describe``."""
    ctx = _context(backend, state_path)
    return describe(ctx["fabric"], ctx["gpus"], ctx["perftest"], ctx["gdr"])


def main_args(args: Any) -> dict[str, Any]:
    """``fleetops-agent ib-bw server|client|stop``."""
    ctx = _context(args.backend, args.state)
    if args.role == "stop":
        return stop(args.token, ctx["run_dir"])
    if ctx["perftest"] is None:
        return {"kind": "ib-bw", "role": args.role, "not_applicable": NOT_INSTALLED, "rails": {}}
    devices = [d for d in (args.devices or "").split(",") if d]
    if not devices:
        raise IbBwError("--devices: name at least one RDMA device (mlx5_0,mlx5_1,...)")
    rails = [setup(ctx["fabric"], d, ctx["gpus"], ctx["gdr"], ctx["root"]) for d in devices]
    if args.role == "server":
        if not args.token:
            raise IbBwError("server: --token names it for ib-bw stop")
        if ctx["sim"]:
            return sim_serve(rails, args.listen or "127.0.0.1", args.port, ctx["hostname"], args.wait, args.token,
                             ctx["run_dir"])
        return serve(rails, args.port, args.duration, args.wait, args.token, ctx["run_dir"])
    if not args.peer:
        raise IbBwError("client: --peer names the server's address")
    if ctx["sim"]:
        return sim_client(rails, args.peer, args.port, ctx["hostname"])
    return client(rails, args.peer, args.port, args.duration)
