"""The TUI fed by the nodes' daemons: one long-lived ``watch`` stream per node over SSH.

Each node's resident agent (``fleetops-agent serve``) pushes its whole snapshot, then one line
per change, on its unix socket. ``StreamSource.run`` keeps one SSH connection per node with a
small relay on the far side copying that socket to the channel, and reads every channel from
one thread (``selectors`` over the channels' file descriptors). A change reaches the screen as
soon as the daemon writes it: nothing is polled.

The relay (``RELAY_SCRIPT``) is ``sh`` exec'ing ``socat`` where the node has it, else ``perl``
(``perl-base`` is part of every Debian/Ubuntu install), else ``fleetops-agent watch``: a few MB
of resident memory per session instead of a Python interpreter's, and no interpreter start per
node (a thousand of them would take the controller's CPU for seconds). It runs as the login
user, or under ``sudo`` with the inventory's become, which a forwarded unix socket could not:
the daemon's socket is root-only.

A stream is an OpenSSH client process (``transport.OpenSSHStreamOpener``: the handshake runs in
C outside this interpreter, and the reader thread selects on its stdout pipe) or a paramiko
connection (``transport.StreamOpener``): ``stream_transport`` ``auto`` (openssh where ``ssh`` is
on PATH), ``openssh`` or ``paramiko``; nodes behind a jump host use paramiko either way. Both
resolve the host, and judge its key, the same way. The relay prints
``transport.STREAM_STARTED`` first: the OpenSSH opener returns at that line (connected, the
command running), so ``max_connecting`` bounds handshakes in flight with either transport.

What each node shows:

- connecting fails (refused, no route, auth, host key, timeout while connecting): UNREACH with
  the transport's reason; connects are retried with exponential backoff and jitter, at most
  ``max_connecting`` being opened at once;
- connected but silent (a stopped daemon, a hung host, a host gone without closing the
  connection): its last data, STALE once its age (the daemon's ``age_s`` plus the time since
  that line came) passes ``stale_after_s``. The SSH keepalives would end a dead session only
  after 45 s and more, and a hung sshd is never told from a gone one by the stream alone, so a
  silent stream's host is probed (``liveness``: a TCP connect and the SSH banner) shortly before
  the silence reaches ``stale_after_s``: no TCP answer is UNREACH (the stream is dropped and
  reconnected with backoff), TCP without a banner is HUNG, a banner with the stream still
  silent past ``stale_after_s`` is HUNG too (the daemon or its relay is stuck);
- connecting times out: HUNG when the host's SSH port takes a TCP connection, else UNREACH;
- no daemon on the node (the relay finds no socket, or the stream ends before its first
  line): a cold ``fleetops-agent collect`` every ``interval`` seconds on the pool's session
  (OK when healthy: the header says which nodes have no daemon), and the stream tried again
  every ``retry_no_daemon_s``.
"""

from __future__ import annotations

import json
import random
import selectors
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetops import model
from fleetops.fleet import transport
from fleetops.tui import data, liveness
from fleetops.tui.source import SshSource

# Exit status of the relay when the node has no daemon socket (or nothing accepts on it).
NO_DAEMON_STATUS = 3

# The perl relay: connect to the socket named by the first argument, then copy stdin to it and
# it to stdout until either side ends. No module is loaded (``use Socket`` alone made the relay's
# start cost about 9 ms of CPU more, on every node of every stream opened): the numbers are
# Linux's, on every architecture a GPU node runs (AF_UNIX 1, SOCK_STREAM 1, EINTR 4), and the
# address is sockaddr_un by hand (a native short family, then the path: Linux takes the
# address's length from the call, so the path needs no terminating NUL). The socket is read
# before stdin: what the daemon already sent reaches stdout before an end of stdin ends the relay.
PERL_RELAY = r"""
my $p = $ARGV[0];
if (length($p) > 107) { print STDERR "fleetops relay: socket path too long: $p\n"; exit 3 }
socket(my $s, 1, 1, 0) or exit 3;
connect($s, pack("S a*", 1, $p)) or do { print STDERR "fleetops relay: cannot connect to $p: $!\n"; exit 3 };
my ($in, $sk) = (fileno(STDIN), fileno($s));
my $rin = ''; vec($rin, $in, 1) = 1; vec($rin, $sk, 1) = 1;
while (1) {
  my $r = $rin;
  my $n = select($r, undef, undef, undef);
  if ($n < 0) { next if $! == 4; exit 1 }
  if (vec($r, $sk, 1)) {
    my $k = sysread($s, my $b, 65536); exit 0 unless $k;
    my $o = 0;
    while ($o < $k) { my $w = syswrite(STDOUT, $b, $k - $o, $o); exit 0 unless defined $w; $o += $w }
  }
  if (vec($r, $in, 1)) { my $k = sysread(STDIN, my $b, 4096); exit 0 unless $k; defined(syswrite($s, $b)) or exit 0 }
}
"""

# sh -c RELAY_SCRIPT sh PERL_RELAY AGENT: first the line saying the command started
# (``transport.STREAM_STARTED``: the OpenSSH opener waits for it, the reader drops it), then the
# socket the agent's client would use (``client.socket_for``: $FLEETOPS_AGENT_SOCKET, the
# simulator's beside its state file, else the default), then the smallest relay the node has.
RELAY_SCRIPT = (
    f"echo '{transport.STREAM_STARTED.decode()}'\n"
    + r"""s=${FLEETOPS_AGENT_SOCKET:-}
if [ -z "$s" ]; then
  if [ -n "${FLEETOPS_SIM_STATE:-}" ]; then s="${FLEETOPS_SIM_STATE%.json}.agent/agent.sock"; else s=/run/fleetops/agent.sock; fi
fi
[ -S "$s" ] || { echo "fleetops relay: no daemon socket at $s" >&2; exit 3; }
if command -v socat >/dev/null 2>&1; then exec socat - "UNIX-CONNECT:$s"; fi
if command -v perl >/dev/null 2>&1; then exec perl -e "$1" "$s"; fi
exec "$2" watch
"""
)

# Node states in the source (not shown as such: the entries carry what the screen shows).
WAITING = "waiting"  # a connect is due at ``due``
CONNECTING = "connecting"
STREAMING = "streaming"
POLLING = "polling"  # no daemon: cold collects; the stream is tried again at ``due``


def relay_command(agent: str) -> list[str]:
    return ["sh", "-c", RELAY_SCRIPT, "sh", PERL_RELAY, agent]


def backoff_s(failures: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter: between half and all of ``base * 2**(failures-1)``
    (at most ``cap``), so a fleet that lost its network does not reconnect in lockstep."""
    full = min(cap_s, base_s * 2.0 ** max(0, failures - 1))
    return full * (0.5 + 0.5 * rng.random())


class _Node:
    __slots__ = (
        "name", "state", "due", "failures", "stream", "buffer", "lines", "doc", "got_line",
        "received_at", "age_at_receipt", "stale", "polling_running", "no_daemon_reason",
        "probing", "probed_at", "probe_verdict", "probe_why", "mark", "connected_at",
    )  # fmt: skip

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = WAITING
        self.due = 0.0
        self.failures = 0
        self.stream: transport.AnyStream | None = None
        self.buffer = b""
        self.lines: list[tuple[float, bytes]] = []  # (monotonic receipt, line) not yet processed
        self.doc: dict[str, Any] | None = None  # the daemon's document, changes merged in
        self.got_line = False  # this stream gave at least one line
        self.received_at: float | None = None  # monotonic, the last line's
        self.age_at_receipt = 0.0  # the data's age (daemon clock) when that line came
        self.stale = False
        self.polling_running = False
        self.no_daemon_reason = ""
        self.probing = False  # a probe of its SSH port is in flight
        self.probed_at: float | None = None  # monotonic, when the latest probe started
        self.probe_verdict: str | None = None  # liveness.ANSWERS/HUNG/UNREACHABLE, since the last line
        self.probe_why = ""
        self.mark: tuple[str, str] | None = None  # (status, check) of the silence mark delivered
        self.connected_at = 0.0  # monotonic, when its stream opened: silence counts from then at most

    def heard(self) -> None:
        """A line came: whatever its silence made of the node is over."""
        self.stale = False
        self.probe_verdict, self.probe_why, self.probed_at, self.mark = None, "", None, None


class StreamSource(SshSource):
    """``SshSource`` whose refresh is the daemons' streams; collect, history and actions are the
    parent's (on the pool's session, opened only when used)."""

    def __init__(
        self,
        hosts: list[Any],
        baselines: dict[str, Any] | None = None,
        *,
        max_connecting: int = 48,
        stale_after_s: float = liveness.STALE_AFTER_S,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 30.0,
        retry_no_daemon_s: float = 60.0,
        seed: int | None = None,
        stream_transport: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(hosts, baselines, **kwargs)
        if max_connecting < 1:
            raise ValueError(f"max_connecting must be at least 1, got {max_connecting}")
        self.max_connecting = int(max_connecting)
        self.stale_after_s = float(stale_after_s)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_cap_s = float(backoff_cap_s)
        self.retry_no_daemon_s = float(retry_no_daemon_s)
        self._rng = random.Random(seed)
        self.opener = transport.stream_opener(
            stream_transport,
            connect_timeout=self._connect_timeout,
            known_hosts=self._known_hosts,
            accept_new_hostkeys=self._accept_new_hostkeys,
        )
        self._nodes = {name: _Node(name) for name in self.hosts}
        # room for every node's stream (a soft limit of 1024 fails at a few hundred ssh clients)
        soft, needed = transport.raise_open_files(len(self.hosts))
        self.open_files_warning = (
            f"open files limited to {soft} (hard limit), {needed} wanted for {len(self.hosts)} streams: "
            "streams past it fail to open; raise the limit (ulimit -n)" if soft < needed else ""
        )
        self._nodes_lock = threading.Lock()
        self._connects = ThreadPoolExecutor(max_workers=self.max_connecting, thread_name_prefix="tui-connect")
        # probes of silent streams' hosts, apart from the connects (which hung hosts may fill)
        self._probes = ThreadPoolExecutor(max_workers=min(64, max(1, len(self.hosts))), thread_name_prefix="tui-probe")
        self._selector = selectors.DefaultSelector()
        self._selector_lock = threading.Lock()
        self._dirty: set[str] = set()
        self._dirty_cond = threading.Condition()
        self._closed = False
        # counters the benchmark and tests read: how often a node was marked unreachable, hung
        self.unreachable_marks: dict[str, int] = {}
        self.hung_marks: dict[str, int] = {}
        self.line_count = 0
        self._deliver: Callable[[data.NodeEntry], None] = lambda entry: None

    # --- what the screen asks -----------------------------------------------------------

    def stream_counts(self) -> tuple[int, int]:
        """(nodes streaming now, nodes polled with a cold collect)."""
        with self._nodes_lock:
            states = [n.state for n in self._nodes.values()]
        return states.count(STREAMING), states.count(POLLING)

    def node_state(self, name: str) -> str:
        with self._nodes_lock:
            return self._nodes[name].state

    # --- the loop -----------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        """Keep every node streaming (or polled) until ``should_stop()``; ``deliver`` gets each
        new entry from a worker thread as soon as it is built."""
        stop = threading.Event()
        self._deliver = deliver

        def stopping() -> bool:
            return stop.is_set() or should_stop()

        reader = threading.Thread(target=self._read_loop, args=(stopping,), name="tui-stream-read", daemon=True)
        builder = threading.Thread(
            target=self._build_loop, args=(stopping, deliver), name="tui-stream-build", daemon=True
        )
        reader.start()
        builder.start()
        try:
            while not stopping():
                self._schedule(time.monotonic(), stopping, deliver)
                self._check_silence(deliver)
                time.sleep(0.1)
        finally:
            stop.set()
            with self._dirty_cond:
                self._dirty_cond.notify_all()
            reader.join(timeout=2.0)
            builder.join(timeout=2.0)

    def _schedule(self, now: float, stopping: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        with self._nodes_lock:
            connect = [n for n in self._nodes.values() if n.state in (WAITING, POLLING) and n.due <= now]
            poll = [
                n for n in self._nodes.values()
                if n.state == POLLING and not n.polling_running and n.received_at is not None
                and n.received_at + self.interval <= now
            ]  # fmt: skip
            for n in connect:
                n.state = CONNECTING
            for n in poll:
                n.polling_running = True
        for n in connect:
            self._connects.submit(self._connect, n, stopping, deliver)
        for n in poll:
            self._executor.submit(self._poll, n, stopping, deliver)

    # --- connecting ---------------------------------------------------------------------

    def _connect(self, node: _Node, stopping: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        if stopping():
            return
        host = self.hosts[node.name]
        try:
            stream = self.opener.open(host, relay_command(self.agent(node.name)))
            stream.send(b"watch\n")
        except transport.StreamFailure as exc:
            if exc.kind == "local":  # no SSH stream for a local host: it is polled
                self._start_polling(node, exc.message, stopping, deliver)
                return
            self._unreachable(node, exc.kind, exc.message, deliver)
            return
        except OSError as exc:
            self._unreachable(node, "unreachable", f"{node.name}: {exc}", deliver)
            return
        except Exception as exc:  # noqa: BLE001 - one host's surprise must not stop the others
            self._unreachable(node, "local", f"{node.name}: {type(exc).__name__}: {exc}", deliver)
            return
        if stopping():
            stream.close()
            return
        with self._nodes_lock:
            node.stream, node.buffer, node.got_line = stream, b"", False
            node.state = STREAMING
            node.connected_at = time.monotonic()
            node.probe_verdict, node.probe_why, node.probed_at = None, "", None
        with self._selector_lock:
            self._selector.register(stream, selectors.EVENT_READ, node)

    def _unreachable(self, node: _Node, kind: str, message: str, deliver: Callable[[data.NodeEntry], None]) -> None:
        status = "unreachable"
        if kind == "timeout":
            # a connect that timed out: a host whose SSH port takes the TCP connection but never
            # completes the session is hung, not gone
            probed = self.probe_host(node.name)
            if probed is None or probed[0] != liveness.UNREACHABLE:
                status = "timeout"
            if probed is not None:
                message = f"{message}; {probed[1]}"
        with self._nodes_lock:
            node.failures += 1
            node.state = WAITING
            node.due = time.monotonic() + backoff_s(node.failures, self.backoff_base_s, self.backoff_cap_s, self._rng)
        marks = self.unreachable_marks if status == "unreachable" else self.hung_marks
        marks[node.name] = marks.get(node.name, 0) + 1
        problem = model.Finding(
            check=f"transport.{kind}",
            severity="crit",
            node=node.name,
            message=f"{kind}: {message}",
            action="Check the node is up and reachable over SSH (its sshd, the network, keys and host key)."
            if status == "unreachable"
            else "The host takes TCP connections but its SSH session never answers: check its console (BMC).",
        )
        with self._lock:
            previous = self._entries.get(node.name)
        entry = data.mark_failed(node.name, status, problem, previous)
        with self._lock:
            self._entries[node.name] = entry
        deliver(entry)

    # --- no daemon: cold collects ---------------------------------------------------------

    def _start_polling(
        self, node: _Node, reason: str, stopping: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]
    ) -> None:
        with self._nodes_lock:
            node.state = POLLING
            node.failures = 0
            node.no_daemon_reason = reason
            node.due = time.monotonic() + self.retry_no_daemon_s
            node.polling_running = True
            node.received_at = None
        self._poll(node, stopping, deliver)

    def _poll(self, node: _Node, stopping: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        try:
            if stopping():
                return
            # a healthy node without a daemon is OK like any other: that the fleet (or this node)
            # has no daemon is said once, in the header (``stream_counts``), not as a finding
            entry = self.collect(node.name)
            if entry.status == "unreachable":
                self.unreachable_marks[node.name] = self.unreachable_marks.get(node.name, 0) + 1
            if not stopping():
                deliver(entry)
        finally:
            with self._nodes_lock:
                node.polling_running = False
                node.received_at = time.monotonic()

    # --- reading --------------------------------------------------------------------------

    def _read_loop(self, stopping: Callable[[], bool]) -> None:
        while not stopping():
            with self._selector_lock:
                has = bool(self._selector.get_map())
            if not has:
                time.sleep(0.05)
                continue
            try:
                events = self._selector.select(timeout=0.1)
            except (OSError, ValueError):
                continue
            for key, _ in events:
                self._read_one(key.data, stopping)

    def _read_one(self, node: _Node, stopping: Callable[[], bool]) -> None:
        stream = node.stream
        if stream is None:
            return
        chunks = []
        ended = False
        while True:
            got = stream.read()
            if got is None:
                break
            if not got:
                ended = True
                break
            chunks.append(got)
        if chunks:
            now = time.monotonic()
            data_ = node.buffer + b"".join(chunks)
            *complete, node.buffer = data_.split(b"\n")
            # the relay's "started" line is no data: it must not count as the daemon's first line
            lines = [(now, line) for line in complete if line.strip() and line.strip() != transport.STREAM_STARTED]
            if lines:
                with self._dirty_cond:
                    node.lines.extend(lines)
                    self._dirty.add(node.name)
                    self._dirty_cond.notify()
        if ended:
            with self._selector_lock:
                try:
                    self._selector.unregister(stream)
                except (KeyError, ValueError):
                    pass
            try:
                self._connects.submit(self._ended, node, stream, stopping)
            except RuntimeError:  # closing: close() ends every stream itself
                pass

    def _ended(self, node: _Node, stream: transport.AnyStream, stopping: Callable[[], bool]) -> None:
        """The stream closed: the daemon went, the relay ended, or the connection broke. The
        node keeps its last data (it goes STALE by age); the stream is opened again after a
        backoff, or the node is polled when it never had a daemon line."""
        status = stream.exit_status(wait_s=1.0)
        err = stream.stderr().strip().splitlines()
        stream.close()
        with self._nodes_lock:
            node.stream = None
            had_line = node.got_line
        if stopping():
            return
        if not had_line and (status is not None):
            reason = err[-1] if err else f"the relay exited {status} before the daemon's first line"
            self._start_polling(node, reason, stopping, self._deliver)
            return
        with self._nodes_lock:
            node.failures = 1 if had_line else node.failures + 1
            node.state = WAITING
            node.due = time.monotonic() + backoff_s(node.failures, self.backoff_base_s, self.backoff_cap_s, self._rng)

    # --- building entries -----------------------------------------------------------------

    def _build_loop(self, stopping: Callable[[], bool], deliver: Callable[[data.NodeEntry], None]) -> None:
        while not stopping():
            with self._dirty_cond:
                while not self._dirty and not stopping():
                    self._dirty_cond.wait(0.25)
                names, self._dirty = self._dirty, set()
                work = {n: self._nodes[n].lines for n in names}
                for n in names:
                    self._nodes[n].lines = []
            for name, lines in work.items():
                if stopping():
                    return
                entry = self._apply(self._nodes[name], lines)
                if entry is not None:
                    deliver(entry)

    def _apply(self, node: _Node, lines: list[tuple[float, bytes]]) -> data.NodeEntry | None:
        """Merge the lines into the node's document, then build its entry once."""
        changed = False
        for received, raw in lines:
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            if "error" in doc:  # the daemon has no snapshot yet ("starting"): the next line will
                continue
            if "change" in doc:
                if node.doc is None or not isinstance(doc["change"], dict):
                    continue
                merged = dict(node.doc)
                merged.update(doc["change"])
                node.doc = merged
                daemon = merged.get("daemon")
                at = doc.get("at")
                collected = daemon.get("collected_at") if isinstance(daemon, dict) else None
                if isinstance(at, (int, float)) and isinstance(collected, (int, float)):
                    node.age_at_receipt = max(0.0, float(at) - float(collected))
            else:
                daemon = doc.get("daemon")
                age = daemon.get("age_s") if isinstance(daemon, dict) else None
                if isinstance(daemon, dict):  # later changes carry collected_at, as the daemon keeps it
                    d = dict(daemon)
                    if isinstance(doc.get("collected_at"), (int, float)):
                        d["collected_at"] = doc["collected_at"]
                    doc["daemon"] = d
                node.doc = doc
                node.age_at_receipt = float(age) if isinstance(age, (int, float)) else 0.0
            with self._nodes_lock:
                node.received_at = received
                node.got_line = True
                node.failures = 0
                node.heard()
            changed = True
            self.line_count += 1
        if not changed or node.doc is None:
            return None
        return self._entry_from_doc(node)

    def _entry_from_doc(self, node: _Node) -> data.NodeEntry:
        name = node.name
        assert node.doc is not None and node.received_at is not None
        doc = dict(node.doc)
        daemon = dict(doc.get("daemon") or {})
        daemon["age_s"] = node.age_at_receipt
        doc["daemon"] = daemon
        with self._lock:
            previous = self._entries.get(name)
        try:
            snap = model.node_from_dict(doc)
        except model.SchemaError as exc:
            problem = model.Finding(
                check="transport.output", severity="unknown", node=name,
                message=f"daemon stream: snapshot unusable: {exc}",
                action="Report this as a fleetops bug, with the daemon's snapshot (fleetops-agent collect).",
            )  # fmt: skip
            entry = data.mark_failed(name, "error", problem, previous)
        else:
            snap.hostname = name
            findings = self.judge(name, snap)  # as collects and audits judge it
            # seen_at on the controller's clock: when the daemon took the data it shows
            seen = self.clock() - node.age_at_receipt - (time.monotonic() - node.received_at)
            entry = data.summarize(name, snap, findings, seen, previous, self.baselines.get(name))
        with self._lock:
            self._entries[name] = entry
        return entry

    # --- silent streams -------------------------------------------------------------------

    def _check_silence(self, deliver: Callable[[data.NodeEntry], None]) -> None:
        """Every silent stream's node: STALE once its data's age passes ``stale_after_s``; its host
        probed shortly before the silence does; HUNG or UNREACH as the probe says (``liveness``)."""
        now = time.monotonic()
        lead = liveness.probe_lead_s(self.stale_after_s)
        turned: list[tuple[_Node, float]] = []
        probe: list[_Node] = []
        marked: list[tuple[_Node, str, model.Finding]] = []
        with self._nodes_lock:
            for n in self._nodes.values():
                if n.received_at is None or n.state == POLLING:  # no data yet, or polled
                    continue
                silence = now - n.received_at
                age = n.age_at_receipt + silence
                if not n.stale and age > self.stale_after_s:
                    n.stale = True
                    turned.append((n, age))
                if n.state != STREAMING:  # a stream that ended: its reconnects say what the host does
                    continue
                silence = now - max(n.received_at, n.connected_at)
                if (
                    not n.probing
                    and silence > self.stale_after_s - lead
                    and (n.probed_at is None or now - n.probed_at >= liveness.PROBE_EVERY_S)
                ):
                    n.probing, n.probed_at = True, now
                    probe.append(n)
                mark = self._silence_mark(n, silence)
                if mark is not None and (mark[0], mark[1].check) != n.mark:
                    n.mark = (mark[0], mark[1].check)
                    marked.append((n, *mark))
        for n, age in turned:
            problem = model.Finding(
                check="transport.stale",
                severity="warn",
                node=n.name,
                message=f"no news from the daemon for {age:.0f}s (over {self.stale_after_s:g}s): "
                "its stream is silent; showing its last data",
                action="Check the daemon on the node (systemctl status fleetops-agent); the host may be hung.",
            )
            self._mark(n, data.STATUS_STALE, problem, deliver, only_ok=True)
        for n in probe:
            try:
                self._probes.submit(self._probe, n)
            except RuntimeError:  # closing
                n.probing = False
        for n, status, problem in marked:
            counts = self.unreachable_marks if status == "unreachable" else self.hung_marks
            counts[n.name] = counts.get(n.name, 0) + 1
            self._mark(n, status, problem, deliver)
            if status == "unreachable":
                self._drop_stream(n)

    def _silence_mark(self, n: _Node, silence: float) -> tuple[str, model.Finding] | None:
        """(status, finding) the probe's verdict and the silence make of a streaming node."""
        said, why = n.probe_verdict, n.probe_why
        if said == liveness.UNREACHABLE:
            return "unreachable", model.Finding(
                check="transport.unreachable", severity="crit", node=n.name,
                message=f"unreachable: its stream went silent and its SSH port does not answer ({why})",
                action="Check the node is up and reachable over SSH (its power, sshd, the network).",
            )  # fmt: skip
        if said == liveness.HUNG:
            return "timeout", model.Finding(
                check="transport.hung", severity="crit", node=n.name,
                message=f"hung: its stream went silent and sshd sends no banner ({why})",
                action="The host takes TCP connections but answers nothing: check its console (BMC).",
            )  # fmt: skip
        if said == liveness.ANSWERS and silence > self.stale_after_s:
            return "timeout", model.Finding(
                check="transport.stream_silent", severity="crit", node=n.name,
                message=f"hung: sshd answers but the daemon's stream has been silent over {self.stale_after_s:g}s "
                f"({why}); showing its last data",
                action="Check the daemon on the node (systemctl status fleetops-agent) and the host's load.",
            )  # fmt: skip
        return None

    def _probe(self, n: _Node) -> None:
        started = time.monotonic()
        try:
            probed = self.probe_host(n.name)
        except Exception as exc:  # noqa: BLE001 - a probe's surprise leaves the node STALE, never kills the loop
            probed = None
            n.probe_why = f"probe failed: {type(exc).__name__}: {exc}"
        with self._nodes_lock:
            n.probing = False
            if n.received_at is not None and n.received_at > started:
                return  # a line came meanwhile: the stream is not silent
            if probed is not None:
                n.probe_verdict, n.probe_why = probed

    def _mark(
        self, n: _Node, status: str, problem: model.Finding, deliver: Callable[[data.NodeEntry], None],
        only_ok: bool = False,
    ) -> None:
        """The node's last data with ``status`` and why; ``only_ok``: unless it is marked already."""
        with self._lock:
            previous = self._entries.get(n.name)
            if previous is None or previous.snapshot is None:
                return
            if only_ok and previous.status != data.STATUS_OK:
                return
            entry = data.mark_failed(n.name, status, problem, previous)
            self._entries[n.name] = entry
        deliver(entry)

    def _drop_stream(self, n: _Node) -> None:
        """A silent stream to a host that does not answer: closed, and opened again after a
        backoff (each failed connect keeps it UNREACH; a host back streams again)."""
        with self._nodes_lock:
            stream = n.stream
            if stream is None or n.state != STREAMING:
                return
            n.stream = None
            n.failures += 1
            n.state = WAITING
            n.due = time.monotonic() + backoff_s(n.failures, self.backoff_base_s, self.backoff_cap_s, self._rng)
        with self._selector_lock:
            try:
                self._selector.unregister(stream)
            except (KeyError, ValueError):
                pass
        try:
            self._probes.submit(stream.close)  # closing a dead connection may wait on it
        except RuntimeError:
            stream.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._connects.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)
        with self._nodes_lock:
            streams = [n.stream for n in self._nodes.values() if n.stream is not None]
        for s in streams:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - closing everything matters more than why one failed
                pass
        super().close()
