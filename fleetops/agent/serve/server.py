"""The node's unix socket: line requests ``snapshot``, ``history UUID FIELD SECONDS``, ``watch``.

Root-only: the socket is 0600 in a 0700 directory. Nothing that changes state is reachable.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetops.agent.serve.node import NodeService


def serve(svc: NodeService) -> None:
    path = svc.socket_path
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(16)
    sock.settimeout(0.5)
    while not svc.stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            if svc.stop.is_set():
                break
            continue
        threading.Thread(target=_client, args=(svc, conn), daemon=True).start()
    sock.close()
    try:
        os.unlink(path)
    except OSError:
        pass


def _client(svc: NodeService, conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30.0)
        try:
            fh = conn.makefile("rwb")
            line = fh.readline().decode("utf-8", "replace").strip()
            words = line.split()
            if words == ["snapshot"]:
                fh.write(svc.snapshot_json().encode() + b"\n")
            elif len(words) == 4 and words[0] == "history":
                fh.write(_history(svc, words[1], words[2], words[3]).encode() + b"\n")
            elif words == ["watch"]:
                _watch(svc, conn, fh)
            else:
                fh.write(json.dumps({"error": f"unknown request {line!r}", "kind": "usage"}).encode() + b"\n")
            fh.flush()
        except OSError:
            return


def _history(svc: NodeService, uuid: str, name: str, seconds: str) -> str:
    ring = svc.rings.get(uuid)
    if ring is None:
        return json.dumps({"error": f"no such GPU {uuid!r}", "kind": "no-such-gpu"})
    try:
        span = float(seconds)
        samples = ring.samples(name, time.time() - span)
    except ValueError:
        return json.dumps({"error": f"SECONDS must be a number, got {seconds!r}", "kind": "usage"})
    except KeyError:
        return json.dumps({"error": f"no field {name!r}; fields: {', '.join(ring.columns)}", "kind": "usage"})
    return json.dumps({"gpu": uuid, "field": name, "interval_s": svc.interval_s, "samples": samples})


def _changes(old: dict[str, object], new: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in new.items() if old.get(k) != v}


def _watch(svc: NodeService, conn: socket.socket, fh: object) -> None:
    """The whole snapshot first, then one line per change (the top-level keys that changed)."""
    seen, doc = svc.state()
    conn.sendall(svc.snapshot_json().encode() + b"\n")
    last = doc or {}
    while not svc.stop.is_set():
        with svc.changed:
            svc.changed.wait_for(lambda s=seen: svc.version != s or svc.stop.is_set(), timeout=5.0)  # type: ignore[misc]
        version, doc = svc.state()
        if version == seen or doc is None:
            continue
        seen = version
        diff = _changes(last, doc)
        last = doc
        if diff:
            conn.sendall(json.dumps({"change": diff, "at": time.time()}, separators=(",", ":")).encode() + b"\n")
