"""Waiting for something a real process does, for every test tier: one poll loop with an upper
bound, sized for a loaded CI machine, that says what it waited for and what it saw last."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(what: str, fn: Callable[[], Any], deadline_s: float = 60.0, step_s: float = 0.1) -> Any:
    """``fn()``'s first truthy answer; AssertionError naming ``what`` and the last answer when
    none comes within ``deadline_s``."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(step_s)
    raise AssertionError(f"timed out after {deadline_s:g} s waiting for {what}; last: {last!r}")
