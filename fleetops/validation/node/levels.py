"""How long each kind of test runs untimed, and how long each timed repeat lasts, per level, for
every CUDA backend.

The first calls of a GEMM run at boost clock, before the power cap pulls the clock down (on a
real H200: 1980 MHz to 1200-1550 MHz within the first second of bf16 and fp8 GEMMs), so timing
them spreads a healthy GPU's repeats by 11-18 %, past the judge's steady-state limit, and the
median is not the figure the GPU sustains. Every test therefore runs untimed first
(``warm_up``): the quick level until its last five batches agree within 2 % (at least 0.1 s, at
most ``warmup_s``), the full level for the whole ``warmup_s``, a soak long enough for a weak
cooling loop or a board that power-brakes to show. The full level also makes each timed repeat
last at least ``repeat_s``. Eight GPUs one after the other stay within each level's budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

WARMUP_S = {
    "quick": {"hbm": 0.2, "gemm": 1.0, "copy": 0.1},
    "full": {"hbm": 2.0, "gemm": 10.0, "copy": 1.0},
}
REPEAT_S = {
    "quick": {"hbm": 0.0, "gemm": 0.0, "copy": 0.0},
    "full": {"hbm": 0.1, "gemm": 0.3, "copy": 0.1},
}


SETTLED = 0.02  # the last SETTLED_BATCHES batch times within this fraction of their least
SETTLED_BATCHES = 5
SETTLED_MIN_S = 0.1


class Timing(NamedTuple):
    warmup_s: float = 0.0
    repeat_s: float = 0.0
    settle: bool = False  # end the warm-up once the batches agree, not at warmup_s


UNTIMED_WARMUP = Timing()  # one untimed call, no warm-up time, repeats as ``inner`` makes them


def timing(level: str, kind: str) -> Timing:
    """How a test of ``kind`` runs at ``level`` (the backends' ``_time`` takes it)."""
    return Timing(WARMUP_S[level][kind], REPEAT_S[level][kind], settle=level == "quick")


def warm_up(batch: Callable[[], float], timing: Timing, clock: Callable[[], float] = time.monotonic) -> int:
    """Run ``batch`` (it returns the seconds one batch took) untimed as ``timing`` says; returns
    how many batches ran."""
    start = clock()
    recent: list[float] = []
    runs = 0
    while clock() - start < timing.warmup_s:
        recent = [*recent[-(SETTLED_BATCHES - 1):], batch()]
        runs += 1
        if (
            timing.settle
            and len(recent) == SETTLED_BATCHES
            and clock() - start >= SETTLED_MIN_S
            and max(recent) - min(recent) <= SETTLED * min(recent)
        ):
            break
    return runs


def time_repeats(
    elapsed: Callable[[int], float], first: Callable[[], None], repeats: int, inner: int, window: Any, test: str,
    timing: Timing,
) -> list[float]:
    """The backends' one timing rule: ``first()`` (one call, synchronised), the warm-up, then
    ``repeats`` timed batches of ``inner`` calls, or of as many as last ``timing.repeat_s``;
    ``elapsed(calls)`` runs a batch and gives its seconds on the GPU's own clock. ``window`` (a
    ``telemetry.Window``) samples the GPU from before the first call until the last batch ended,
    as ``test``. Seconds per call, one per repeat."""
    if window is not None:
        window.begin(test)
    try:
        first()
        if timing.repeat_s > 0:
            inner = max(inner, math.ceil(timing.repeat_s / max(elapsed(1), 1e-6)))
        warm_up(lambda: elapsed(inner), timing)
        return [elapsed(inner) / inner for _ in range(repeats)]
    finally:
        if window is not None:
            window.end()
