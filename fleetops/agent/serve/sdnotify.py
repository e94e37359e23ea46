"""systemd's readiness and watchdog pings (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``).

Its own module so that the loops and the daemon's entry ping without importing each other."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> None:
    """sd_notify without a library: one datagram to $NOTIFY_SOCKET when systemd set it."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), path)
    except OSError:
        pass
