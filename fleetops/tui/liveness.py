"""How old the TUI lets a node's data be, and how it tells a hung host from a gone one: the
thresholds in one place (docs/runbooks/incident-tui.md lists them) and the probe.

A node's row is one of:

- OK/WARN/CRIT...: its data is younger than ``STALE_AFTER_S``;
- STALE: its data is older than ``STALE_AFTER_S`` and nothing more is known (a stream that
  still flows with old data, a host the probe cannot reach directly, e.g. behind a jump host);
- HUNG: the host answers on its SSH port (TCP, or TCP and banner) but nothing else does: no
  SSH banner within ``PROBE_TIMEOUT_S``, or sshd answers while the agent's stream has been
  silent past ``STALE_AFTER_S``, or the agent's command never answered;
- UNREACH: the SSH port refuses, times out or has no route.

A stream that has been silent for ``STALE_AFTER_S - probe_lead_s`` is probed (a TCP connect
to the SSH port and a read of the banner, at most ``PROBE_TIMEOUT_S``), and again every
``PROBE_EVERY_S`` while it stays silent, so the probe's verdict is there when the silence
passes the threshold: every state above is shown within ``STALE_AFTER_S + PROBE_TIMEOUT_S``
of the fault, whatever the SSH keepalives (which take 45 s and more to end a dead session).
"""

from __future__ import annotations

import socket
import time

# data older than this is not shown as current (``fleetops tui --stale-after``); it must be
# longer than the daemon's full-snapshot interval (10 s), the longest a healthy stream is silent
STALE_AFTER_S = 30.0
# the probe's whole budget: TCP connect and SSH banner (sshd sends it at once on a live host)
PROBE_TIMEOUT_S = 4.0
# a silent node is probed again this often, so a hung host that then goes down turns UNREACH
PROBE_EVERY_S = 5.0

# the probe's verdicts
ANSWERS = "answers"  # an SSH banner came: sshd runs
HUNG = "hung"  # TCP accepted, no banner: the host (or its sshd) is hung
UNREACHABLE = "unreachable"  # refused, timed out, no route


def probe_lead_s(stale_after_s: float) -> float:
    """How long before the silence reaches the threshold the first probe starts: the probe's
    budget, but never more than half the threshold (a short threshold must not probe nodes
    whose streams are merely between two lines)."""
    return min(PROBE_TIMEOUT_S, stale_after_s / 2.0)


def probe(hostname: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[str, str]:
    """(verdict, why) for the SSH port of a host: ``ANSWERS``, ``HUNG`` or ``UNREACHABLE``."""
    where = f"{hostname}:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((hostname, port), timeout=timeout_s)
    except TimeoutError:
        return UNREACHABLE, f"{where}: no TCP answer within {timeout_s:g}s"
    except OSError as exc:
        return UNREACHABLE, f"{where}: {exc.strerror or exc}"
    try:
        got = b""
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                chunk = sock.recv(256)
            except TimeoutError:
                break
            except OSError as exc:
                return UNREACHABLE, f"{where}: TCP connected, then {exc.strerror or exc}"
            if not chunk:
                return HUNG, f"{where}: TCP accepted, then closed with no SSH banner"
            got += chunk
        if got.startswith(b"SSH-"):
            banner = got.split(b"\n")[0].strip().decode(errors="replace")
            return ANSWERS, f"{where}: sshd answers ({banner})"
        return HUNG, f"{where}: TCP accepted, no SSH banner within {timeout_s:g}s"
    finally:
        sock.close()
