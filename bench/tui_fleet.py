#!/usr/bin/env python3
"""``fleetops tui`` against a simulated fleet over real SSH, every node with its daemon.

    python3 bench/tui_fleet.py                         # 1000 nodes, 120 s
    python3 bench/tui_fleet.py --nodes 50 --duration 40 --injects 2

Starts ``fleetops sim up --daemon`` (a real sshd per loopback address, one resident agent
serving every node), then the real app headless (``App.run_test``) on a ``StreamSource``: one
``watch`` stream per node over SSH. Measured in the app's data layer (``app.state``, what the
screen draws from):

- shown: seconds from starting the app until every node has data (target <= 15 s);
- false UNREACH: nodes ever marked unreachable over the run, every node being up (target 0);
  likewise nodes ever marked HUNG, and nodes STALE at any sample of the steady window (0);
- inject: seconds from ``fleet.inject`` (what ``fleetops sim inject`` calls) of an ECC DBE on a
  random node and GPU to that node's entry turning crit (target <= 3 s); beside it, when the
  daemon took the full snapshot that judged it (``daemon_snapshot_after_inject_s``: within one
  sampling interval, as the daemon takes a full snapshot at once on a new DBE rather than at its
  next full interval) and from that snapshot to the entry (the stream's own share);
- CPU: this process's user+system time per wall second over the steady part of the run (after
  the injections), in % of one core (target <= 50 %), alone and with its child processes (with
  ``--stream-transport openssh`` the handshakes and the ciphers run in one ``ssh`` per node: the
  honest figure counts them; live ssh children from /proc, ended ones from ``os.times``); the same
  two for the start (until every node is shown); the simulated fleet's one daemon's beside it
  (the simulator's cost: on a real fleet each node runs its own);
- ssh client memory: the PSS and RSS of the controller's ``ssh`` children (openssh streams);
- memory per session: PSS and RSS of the sshd session processes and relays, divided by the
  streams open (the listeners' sshd are not counted: they are there without the TUI).

The app starts once every node's daemon answers (``daemons_ready_s``): "shown" is the TUI's
time, not the simulated daemon's start. ``targets`` compares each figure with its target.

The machine is shared: figures are upper bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetops.sim import fleet
from fleetops.tui import data
from fleetops.tui.app import FleetApp
from fleetops.tui.source import resolve_hosts
from fleetops.tui.stream import StreamSource


def _say(text: str) -> None:
    """Progress on stderr (a 1000-node run takes minutes before its figures)."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _proc_cpu(pid: int | None) -> float | None:
    """user+system seconds of another process (the fleet's daemon), None when it is gone."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(comm: str = "ssh") -> list[int]:
    """This process's live child processes named ``comm``: the ssh clients of openssh streams
    (not the fleet's sshd and daemon, which this process started too: the daemon has its own figure)."""
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rpartition(")")[2].split()
            name = Path(f"/proc/{pid}/comm").read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        if fields[1] == me and name == comm:
            out.append(int(pid))
    return out


def _cpu_with_children() -> float:
    """user+system seconds of this process and its ssh clients: the live ones from /proc, the
    ended ones from ``os.times`` (reaped children: during the app's run only ssh clients end)."""
    t = os.times()
    live = sum(c for c in (_proc_cpu(pid) for pid in _children()) if c is not None)
    return t.user + t.system + t.children_user + t.children_system + live


def ssh_client_memory() -> dict[str, Any]:
    """PSS/RSS (kB) of this process's ``ssh`` children."""
    row = {"count": 0, "pss_kb": 0, "rss_kb": 0}
    for pid in _children():
        row["count"] += 1
        row["pss_kb"] += _kb(f"/proc/{pid}/smaps_rollup", "Pss:")
        row["rss_kb"] += _kb(f"/proc/{pid}/status", "VmRSS:")
    return row


def daemon_pid(directory: str) -> int | None:
    """The fleet's ``fleetops-agent serve`` (its command line names the fleet's state folder)."""
    states = os.fsencode(os.path.join(directory, "state"))
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and states in argv:
            return int(pid)
    return None


def wait_daemons(directory: str, timeout: float) -> float | None:
    """Seconds until every node's daemon answers a snapshot on its socket; None past ``timeout``."""
    import socket

    start = time.monotonic()
    pending = sorted(str(p.with_suffix("")) + ".agent/agent.sock" for p in Path(directory, "state").glob("*.json"))
    while pending and time.monotonic() - start < timeout:
        left = []
        for path in pending:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5.0)
            try:
                s.connect(path)
                s.sendall(b"snapshot\n")
                head = s.recv(64)
            except OSError:
                head = b""
            finally:
                s.close()
            if not head.startswith(b"{") or b'"error"' in head:
                left.append(path)
        pending = left
        if pending:
            time.sleep(0.5)
    return None if pending else round(time.monotonic() - start, 1)


def _kb(path: str, field: str) -> int:
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _under_fleet_sshd(pid: int, directory: str) -> bool:
    """Whether a session sshd descends (within two levels) from one of this fleet's listeners,
    whose command line names its config in ``directory``."""
    for _ in range(3):
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace") if os.path.exists(f"/proc/{pid}/stat") else ""
        try:
            pid = int(stat.rpartition(")")[2].split()[1])
        except (IndexError, ValueError):
            return False
        try:
            if os.fsencode(directory) in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            return False
    return False


def session_memory(directory: str) -> dict[str, Any]:
    """PSS/RSS (kB) of the processes a stream adds on the node side: sshd session processes
    (``sshd: root...``) and relays (perl, socat, fleetops-agent watch) of this fleet."""
    out: dict[str, dict[str, int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        cmd = argv[0].decode(errors="replace")
        if cmd.startswith("sshd: root"):
            if not _under_fleet_sshd(int(pid), directory):
                continue
            kind = "sshd-session"
        elif os.fsencode(directory) not in env:
            continue
        elif cmd.endswith("perl") or cmd == "perl":
            kind = "relay-perl"
        elif cmd.endswith("socat"):
            kind = "relay-socat"
        elif b"watch" in argv:
            kind = "relay-agent-watch"
        else:
            continue
        row = out.setdefault(kind, {"count": 0, "pss_kb": 0, "rss_kb": 0})
        row["count"] += 1
        row["pss_kb"] += _kb(f"/proc/{pid}/smaps_rollup", "Pss:")
        row["rss_kb"] += _kb(f"/proc/{pid}/status", "VmRSS:")
    return out


async def measure(app: FleetApp, source: StreamSource, directory: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures, kept when the app fails only while it exits after them (``app_exit_error``):
    a 10-minute run's figures are not lost to its shutdown."""
    result: dict[str, Any] = {}
    try:
        await _measure(app, source, directory, args, result)
    except Exception as exc:
        if "targets" not in result:  # the measurement itself failed
            raise
        result["app_exit_error"] = f"{type(exc).__name__}: {exc}"
    return result


async def _measure(
    app: FleetApp, source: StreamSource, directory: str, args: argparse.Namespace, result: dict[str, Any]
) -> None:
    rng = random.Random(args.seed)
    names = list(source.hosts)
    result["nodes"] = len(names)
    async with app.run_test(size=(160, 45)) as pilot:
        started = time.monotonic()
        start_cpu, start_cpu_all = _cpu(), _cpu_with_children()
        run_end = started + args.duration
        counts: list[tuple[float, int]] = []
        while True:
            shown = sum(1 for e in app.state.entries.values() if e.snapshot is not None)
            elapsed = time.monotonic() - started
            if not counts or elapsed - counts[-1][0] >= 1.0:
                counts.append((round(elapsed, 1), shown))
            if shown == len(names):
                result["all_shown_s"] = round(elapsed, 2)
                break
            if elapsed > args.duration:
                result["all_shown_s"] = None
                break
            await pilot.pause(0.05)
        result["shown_over_time"] = counts[:: max(1, len(counts) // 20)]
        result["start_cpu_s"] = round(_cpu() - start_cpu, 1)
        result["start_cpu_with_children_s"] = round(_cpu_with_children() - start_cpu_all, 1)
        _say(f"shown: {counts[-1][1]} of {len(names)} nodes after {counts[-1][0]} s")
        injects = []
        for _ in range(args.injects):
            name = rng.choice(names)
            gpu = rng.randrange(8)
            seen_version = app.state.entries[name].version
            t_inject = time.time()
            fleet.inject(directory, name, "ecc-dbe", gpu)
            t0 = time.monotonic()
            while app.state.entries[name].health != "crit" and time.monotonic() - t0 < 60:
                await pilot.pause(0.02)
            t_seen = time.time()
            entry = app.state.entries[name]
            snap = entry.snapshot
            daemon = (snap.daemon or {}) if snap is not None else {}
            collected = daemon.get("collected_at") if isinstance(daemon, dict) else None
            injects.append({
                "node": name, "gpu": gpu, "inject_to_app_s": round(t_seen - t_inject, 3),
                "crit": entry.health == "crit", "versions": entry.version - seen_version,
                "daemon_snapshot_after_inject_s": round(float(collected) - t_inject, 3) if collected else None,
                "daemon_snapshot_to_app_s": round(t_seen - float(collected), 3) if collected else None,
            })  # fmt: skip
            fleet.clear(directory, name, "all")
        result["injects"] = injects
        _say(f"injects: {[i['inject_to_app_s'] for i in injects]} s; steady window next")
        # steady state: no more injections, every node streaming
        await pilot.pause(2.0)
        pid = daemon_pid(directory)
        cpu0, wall0, dcpu0, all0 = _cpu(), time.monotonic(), _proc_cpu(pid), _cpu_with_children()
        lines0 = source.line_count
        stale_ever: set[str] = set()
        while time.monotonic() < max(run_end, wall0 + 20):
            await pilot.pause(0.5)
            stale_ever.update(n for n, e in app.state.entries.items() if e.status == data.STATUS_STALE)
        cpu1, wall1, dcpu1, all1 = _cpu(), time.monotonic(), _proc_cpu(pid), _cpu_with_children()
        result["steady_window_s"] = round(wall1 - wall0, 1)
        result["steady_cpu_pct_of_core"] = round(100 * (cpu1 - cpu0) / (wall1 - wall0), 1)
        result["steady_cpu_with_children_pct_of_core"] = round(100 * (all1 - all0) / (wall1 - wall0), 1)
        result["sim_daemon_steady_cpu_pct_of_core"] = (
            round(100 * (dcpu1 - dcpu0) / (wall1 - wall0), 1) if dcpu0 is not None and dcpu1 is not None else None
        )
        result["steady_lines_per_s"] = round((source.line_count - lines0) / (wall1 - wall0), 1)
        result["run_s"] = round(wall1 - started, 1)
        result["false_unreach_nodes"] = sorted(n for n, k in source.unreachable_marks.items() if k)
        result["false_hung_nodes"] = sorted(n for n, k in source.hung_marks.items() if k)
        result["stale_in_steady_window"] = sorted(stale_ever)
        result["unreach_now"] = sorted(n for n, e in app.state.entries.items() if e.display_health == "unreach")
        result["stale_now"] = sorted(n for n, e in app.state.entries.items() if e.status == data.STATUS_STALE)
        result["streaming, polled"] = source.stream_counts()
        mem = session_memory(directory)
        streams = max(1, source.stream_counts()[0])
        result["node_side_memory"] = mem
        result["per_session_pss_kb"] = round(sum(r["pss_kb"] for r in mem.values()) / streams, 1)
        result["per_session_rss_kb"] = round(sum(r["rss_kb"] for r in mem.values()) / streams, 1)
        clients = ssh_client_memory()
        result["ssh_clients"] = clients
        result["ssh_clients_pss_mib"] = round(clients["pss_kb"] / 1024, 1)
        seen = [i["inject_to_app_s"] for i in injects if i["crit"]]
        result["inject_to_app_max_s"] = max(seen) if seen else None
        result["targets"] = {
            "all_shown_le_15s": result["all_shown_s"] is not None and result["all_shown_s"] <= 15.0,
            "false_unreach_0": not result["false_unreach_nodes"],
            "false_hung_0": not result["false_hung_nodes"],
            "stale_in_steady_window_0": not result["stale_in_steady_window"],
            "inject_le_3s": len(seen) == len(injects) and all(t <= 3.0 for t in seen),
            "controller_cpu_le_50pct": result["steady_cpu_pct_of_core"] <= 50.0,
            "controller_cpu_with_children_le_50pct": result["steady_cpu_with_children_pct_of_core"] <= 50.0,
        }
        app.stop_polling()  # no entries arrive while the app takes its screens down
        await pilot.pause(1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--duration", type=float, default=120.0, help="seconds the app runs (default 120)")
    p.add_argument("--injects", type=int, default=5)
    p.add_argument("--first-address", default=os.environ.get("FLEETOPS_BENCH_TUI_ADDRESS", "127.54.60.1"))
    p.add_argument("--port", type=int, default=2222)
    p.add_argument("--max-connecting", type=int, default=48)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument(
        "--stream-transport", choices=("auto", "openssh", "paramiko"), default="auto",
        help="the streams' transport, as fleetops tui's option (default auto)",
    )
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    import signal

    # a timeout's SIGTERM still stops the fleet (the finally below)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    directory = tempfile.mkdtemp(prefix="fleetops-tui-bench-")
    t = time.monotonic()
    try:
        _say(f"fleet up: {args.nodes} nodes")
        fleet.up(args.nodes, directory, first_address=args.first_address, port=args.port, daemon=True)
        up_s = time.monotonic() - t
        _say("waiting for every node's daemon")
        ready = wait_daemons(directory, timeout=max(60.0, args.nodes * 0.3))
        _say(f"daemons ready after {ready} s; starting the app")
        if ready is None:
            raise SystemExit(f"the fleet's daemon did not answer for every node within {max(60.0, args.nodes * 0.3):g} s")
        hosts, baselines = resolve_hosts(os.path.join(directory, "inventory.yml"), None)
        source = StreamSource(
            hosts, baselines, max_connecting=args.max_connecting, connect_timeout=10.0,
            stream_transport=args.stream_transport,
        )
        result_transport = type(source.opener).__name__
        app = FleetApp(source, interval=source.interval)
        result = asyncio.run(measure(app, source, directory, args))
        result["stream_transport"] = f"{args.stream_transport} ({result_transport})"
        result["fleet_up_s"] = round(up_s, 1)
        result["daemons_ready_s"] = ready
        result["load_avg"] = os.getloadavg()
    finally:
        fleet.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
