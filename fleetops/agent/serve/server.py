"""The node's unix socket: line requests ``snapshot``, ``history UUID FIELD SECONDS`` (a job's:
``history job:ID cpu_usage_usec SECONDS``), ``watch``,
``resample`` and ``quiesce SECONDS [WHO]``.

Root-only: the socket is 0600 in a 0700 directory. Nothing that changes the GPUs is reachable:
``quiesce`` only makes the daemon let go of them (NVML shut down) for a reset or a driver
reload, and ``resample`` makes it sample now.

``quiesce`` lasts as long as the connection that asked: the daemon answers one line once it
holds nothing, then waits; a ``resume`` line, the connection's close (the asking process ended,
however it ended: the kernel closes its socket) or the lease running out gives the daemon its
GPUs back, and it samples them at once. A reset flow killed half-way therefore never leaves
the node unmonitored for longer than it takes the kernel to close its socket.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetops.agent.serve.node import NodeService


def listen(svc: NodeService) -> socket.socket:
    """The node's listening socket, bound at its path (a stale socket file replaced). A socket
    another process answers on is never unlinked: ``OSError`` (EADDRINUSE) naming its pid."""
    from fleetops.agent.serve import claim

    path = svc.socket_path
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    peer = claim.answering(path)
    if peer is not None:
        raise OSError(errno.EADDRINUSE, f"another fleetops-agent serve (pid {peer}) answers on it")
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
    return sock


def serve(svc: NodeService) -> None:
    serve_all([svc])


def serve_all(services: list[NodeService]) -> None:
    """Accept on every node's socket from one thread (a simulated fleet's one process serves a
    thousand): each connection gets its own thread, as before. The 0.5 s select bounds how long
    a stopped node's socket stays."""
    import selectors

    sel = selectors.DefaultSelector()
    for svc in services:
        try:
            sock = listen(svc)
        except OSError as exc:
            sys.stderr.write(f"fleetops-agent serve: socket {svc.socket_path}: {exc.strerror or exc}\n")
            continue
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, svc)
    try:
        while sel.get_map():
            for key, _ in sel.select(timeout=0.5):
                listener: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    conn, _ = listener.accept()
                except OSError:  # BlockingIOError: another wake took it; anything else: the next one
                    continue
                conn.setblocking(True)
                threading.Thread(target=_client, args=(key.data, conn), daemon=True).start()
            for key in [k for k in sel.get_map().values() if k.data.stop.is_set()]:
                sel.unregister(key.fileobj)
                _close(key.fileobj, key.data.socket_path)  # type: ignore[arg-type]
    finally:
        for key in list(sel.get_map().values()):
            _close(key.fileobj, key.data.socket_path)  # type: ignore[arg-type]
        sel.close()


def _close(sock: socket.socket, path: str) -> None:
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
            elif words == ["resample"]:
                ok = svc.resample()
                if ok:
                    fh.write(svc.snapshot_json().encode() + b"\n")
                else:
                    fh.write(json.dumps({"error": "cannot sample now (quiesced, or a backend call is hung)",
                                         "kind": "busy"}).encode() + b"\n")
            elif words and words[0] == "quiesce":
                _quiesce(svc, conn, fh, words[1:])
                return
            else:
                fh.write(json.dumps({"error": f"unknown request {line!r}", "kind": "usage"}).encode() + b"\n")
            fh.flush()
        except OSError:
            return


def _history(svc: NodeService, uuid: str, name: str, seconds: str) -> str:
    if uuid.startswith("job:"):  # a job's cgroup CPU time (serve/jobs.py), as a GPU's field
        return _job_history(svc, uuid[4:], name, seconds)
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


def _job_history(svc: NodeService, job_id: str, name: str, seconds: str) -> str:
    if svc.jobs is None:
        return json.dumps({"error": "this daemon reads no job records", "kind": "no-such-job"})
    try:
        samples = svc.jobs.history(job_id, name, time.time() - float(seconds))
    except ValueError:
        return json.dumps({"error": f"SECONDS must be a number, got {seconds!r}", "kind": "usage"})
    except KeyError:
        return json.dumps({"error": f"no field {name!r} for a job; fields: cpu_usage_usec", "kind": "usage"})
    except LookupError:
        return json.dumps({"error": f"no job {job_id!r} within the daemon's window", "kind": "no-such-job"})
    return json.dumps({"job": job_id, "field": name, "interval_s": svc.interval_s, "samples": samples})


def _changes(old: dict[str, object], new: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in new.items() if old.get(k) != v}


def _watch(svc: NodeService, conn: socket.socket, fh: object) -> None:
    """The whole snapshot first, then one line per change (the top-level keys that changed).
    A daemon still starting answers its "no snapshot yet" line first, then the whole snapshot
    once it has one: a watcher only merges changes into a snapshot it has."""
    seen, doc = svc.state()
    conn.sendall(svc.snapshot_json().encode() + b"\n")
    last = doc
    while not svc.stop.is_set():
        with svc.changed:
            svc.changed.wait_for(lambda s=seen: svc.version != s or svc.stop.is_set(), timeout=5.0)  # type: ignore[misc]
        version, doc = svc.state()
        if version == seen or doc is None:
            continue
        seen = version
        if last is None:
            conn.sendall(svc.snapshot_json().encode() + b"\n")
            last = doc
            continue
        diff = _changes(last, doc)
        last = doc
        if diff:
            conn.sendall(json.dumps({"change": diff, "at": time.time()}, separators=(",", ":")).encode() + b"\n")


def _quiesce(svc: NodeService, conn: socket.socket, fh: Any, args: list[str]) -> None:
    """``quiesce SECONDS [WHO]``: release the backend, answer, and hold the quiesce while the
    connection stays open (up to SECONDS); see the module's docstring."""
    try:
        lease = float(args[0])
        if not 0 < lease <= 3600:
            raise ValueError
    except (IndexError, ValueError):
        fh.write(json.dumps({"error": "quiesce needs a lease of 1-3600 seconds: quiesce SECONDS [WHO]",
                             "kind": "usage"}).encode() + b"\n")
        fh.flush()
        return
    who = " ".join(args[1:]) or "unnamed client"
    try:
        held = svc.quiesce(who, lease)
    except RuntimeError as exc:
        fh.write(json.dumps({"error": str(exc), "kind": "busy"}).encode() + b"\n")
        fh.flush()
        return
    why = "the asking connection closed"
    try:
        fh.write(json.dumps({"quiesced": True, "pid": os.getpid(), "backend": svc.backend.name, **held}).encode() + b"\n")
        fh.flush()
        while True:
            left = held["until"] - time.time()
            if left <= 0:
                why = "the quiesce's lease ran out"
                break
            conn.settimeout(left)
            try:
                line = fh.readline()
            except TimeoutError:
                why = "the quiesce's lease ran out"
                break
            if not line:
                break
            if line.strip() == b"resume":
                why = f"resumed by {who}"
                break
    except OSError:
        pass
    finally:
        svc.resume(why)
    try:
        fh.write(json.dumps({"resumed": True, "why": why}).encode() + b"\n")
        fh.flush()
    except OSError:
        pass
