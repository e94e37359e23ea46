"""NCCL all_reduce bus bandwidth through torch.distributed: one spawned process per GPU on this
node, rendezvous on 127.0.0.1, nothing on any other address."""

from __future__ import annotations

import os
import queue
import socket
import time
from typing import Any

WARMUP = 3


class NcclRunError(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world: int, port: int, nbytes: int, repeats: int, results: Any) -> None:
    """One rank: warm-up collectives discarded, then ``repeats`` timed ones, each between two
    barriers so every rank times the same collective."""
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{rank}")
        for _ in range(WARMUP):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(buf)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, times, None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as this rank's error
        results.put((rank, [], f"{type(exc).__name__}: {exc}"[:300]))


def run(world: int, nbytes: int, repeats: int, timeout_s: float, sample: Any) -> dict[str, Any]:
    import torch.multiprocessing as mp

    # NCCL's own bootstrap and the rendezvous stay on the loopback interface unless the
    # operator chose an interface; the environment the ranks inherit records it.
    env_before = {k: os.environ.get(k) for k in ("NCCL_SOCKET_IFNAME",)}
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, nbytes, repeats, results), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        got: dict[int, tuple[list[float], str | None]] = {}
        sampled = False
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NcclRunError(f"all_reduce over {world} GPUs did not finish in {timeout_s:.0f} s")
            if not sampled and time.monotonic() > deadline - timeout_s + 5:
                sample("allreduce_busbw_gbps")
                sampled = True
            try:
                rank, times, err = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                    if dead:
                        raise NcclRunError(f"rank {dead[0]} exited with {procs[dead[0]].exitcode}") from None
                continue
            got[rank] = (times, err)
        errors = [f"rank {r}: {e}" for r, (_, e) in sorted(got.items()) if e]
        if errors:
            raise NcclRunError("; ".join(errors))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=10)
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    # The collective ends when its slowest rank does.
    per_repeat = [max(got[r][0][i] for r in range(world)) for i in range(repeats)]
    algbw = [nbytes / s / 1e9 for s in per_repeat]
    factor = 2 * (world - 1) / world
    return {
        "gpus": world,
        "message_bytes": nbytes,
        "dtype": "float32",
        "algorithm": os.environ.get("NCCL_ALGO", "default"),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")} | {"NCCL_SOCKET_IFNAME": env_before["NCCL_SOCKET_IFNAME"] or "lo"},
        "algbw_gbps": algbw,
        "allreduce_busbw_gbps": [a * factor for a in algbw],
    }
