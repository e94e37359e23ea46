"""The ring against a plain list of samples: same answers through wrap-around, for fields that
never change, change now and then, change on every sample, appear late or go unread."""

from __future__ import annotations

import math
import random

from fleetops.agent.serve.ring import Ring


def test_ring_answers_as_the_last_capacity_samples_do() -> None:
    rng = random.Random(7)
    capacity = 50
    ring = Ring(capacity, ("steady", "sometimes", "always", "gaps"))
    kept: list[tuple[float, dict[str, float | None]]] = []
    sometimes = 0.0
    for i in range(400):
        if rng.random() < 0.05:
            sometimes += 1
        row: dict[str, float | None] = {
            "steady": 3.0,
            "sometimes": sometimes,
            "always": float(rng.randint(0, 1000)),
            "gaps": None if rng.random() < 0.5 else 1.0,
        }
        if i >= 120:
            ring.add_field("late")
            row["late"] = float(i // 10)
        ring.append(1000.0 + i, row)
        kept = (kept + [(1000.0 + i, row)])[-capacity:]
        # checked after every sample: a value lost at the window's edge shows for one sample only
        since = kept[len(kept) // 3][0]
        for name in ("steady", "sometimes", "always", "gaps", "late"):
            if name == "late" and i < 120:
                continue
            for start in (since, 0.0):  # part of the window, and all of it (the oldest sample too)
                want = [(t, r.get(name)) for t, r in kept if t >= start]
                assert ring.samples(name, start) == want, (i, name, start)  # all exact in float32
        base = ring.oldest_within(since)
        assert base is not None and base[0] == since
        assert base[1]["sometimes"] == kept[len(kept) // 3][1]["sometimes"]
    assert ring.oldest_within(2000.0) is None
    # the counters that hardly move cost runs, the busy field a dense column
    assert ring.columns["steady"].dense is None and len(ring.columns["steady"].starts) == 1
    assert ring.columns["sometimes"].dense is None
    assert ring.columns["always"].dense is not None
    assert ring.nbytes() < 8 * capacity + 6 * 4 * capacity


def test_an_hour_of_an_idle_gpu_costs_little() -> None:
    capacity = 1800  # an hour at 2 s
    fields = [f"nvlink{n}_{f}" for n in range(18) for f in ("crc_errors", "replay_errors", "recovery_errors")]
    ring = Ring(capacity, ["temp_gpu_c", *fields])
    for i in range(3 * capacity):
        ring.append(float(i), {"temp_gpu_c": 30.0 + (i % 7), **{f: 0.0 for f in fields}})
    assert ring.samples("nvlink17_crc_errors", 0.0)[-1] == (float(3 * capacity - 1), 0.0)
    assert len(ring.samples("temp_gpu_c", 0.0)) == capacity
    assert ring.nbytes() < 8 * capacity + 4 * capacity + len(fields) * 64
    assert not any(math.isnan(v) for _, v in ring.samples("temp_gpu_c", 0.0) if v is not None)
