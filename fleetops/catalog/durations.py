"""The one duration grammar of every fleetops flag that takes a span of time, on both sides (the
agent's flags too: this module imports nothing but the standard library).

A duration is plain seconds (``90``, ``2.5``) or numbers each followed by a unit, ``s``, ``m``,
``h``, ``d`` or ``w`` (``90s``, ``15m``, ``12h``, ``7d``, ``2w``), several of them largest first
(``1h30m``, ``1d12h``). Anything else, a negative span included, is refused with the flag named, so
``--keep 2w`` and ``--max-audit-age 2w`` can never mean different things again."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

__all__ = [
    "FOREVER_WORDS",
    "GRAMMAR",
    "UNITS",
    "DurationError",
    "duration_arg",
    "parse_duration",
    "parse_retention",
    "retention_arg",
]

UNITS: dict[str, float] = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# Said once, the same way, in every flag's help (the reference docs repeat these words).
GRAMMAR = "seconds, or with a unit: 90s, 15m, 12h, 7d, 2w, 1h30m"
# Words a retention or look-back flag takes for "no limit".
FOREVER_WORDS = ("forever", "all", "0")

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(rf"^{_NUMBER}$")
_PART = re.compile(rf"({_NUMBER})([wdhms])")


class DurationError(ValueError):
    """A span of time that is not in the grammar, with the flag that was given it."""

    def __init__(self, flag: str, text: str, why: str) -> None:
        self.flag, self.text, self.why = flag, text, why
        super().__init__(f"{flag} {text!r}: {why}")


def _seconds(text: str) -> float | None:
    """The seconds ``text`` says, or None where it is not in the grammar."""
    t = text.strip().lower()
    if _PLAIN.match(t):
        return float(t)
    pos, total, last_rank = 0, 0.0, -1
    order = list(UNITS)
    for part in _PART.finditer(t):
        if part.start() != pos:
            return None
        rank = order.index(part.group(2))
        if rank <= last_rank:  # each unit once, largest first: "1h30m", never "30m1h" or "1h1h"
            return None
        total += float(part.group(1)) * UNITS[part.group(2)]
        pos, last_rank = part.end(), rank
    return total if pos and pos == len(t) else None


def parse_duration(text: str, *, flag: str, allow_zero: bool = False) -> float:
    """Seconds from a duration in the grammar; a DurationError naming ``flag`` otherwise.

    Zero is refused unless ``allow_zero`` (an interval or a window of 0 would spin or match
    nothing; a maximum age of 0 is a real choice: "always fresh")."""
    seconds = _seconds(str(text))
    if seconds is None or not math.isfinite(seconds):
        raise DurationError(flag, str(text), f"not a duration; give {GRAMMAR}")
    if seconds == 0 and not allow_zero:
        raise DurationError(flag, str(text), "must be more than 0")
    return seconds


def parse_retention(text: str, *, flag: str, unit_required: bool = False) -> float | None:
    """A duration, or None for "no limit" (``forever``, ``all`` or ``0``).

    ``unit_required``: a bare number other than 0 is refused (``--keep 30`` would prune every audit
    older than 30 seconds; whoever typed it meant days)."""
    t = str(text).strip().lower()
    if t in FOREVER_WORDS:
        return None
    if unit_required and _PLAIN.match(t):
        raise DurationError(flag, str(text), f"give a unit (e.g. {t}d), or 'forever' to keep everything")
    return parse_duration(text, flag=flag)


def duration_arg(flag: str, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a duration flag: its error is argparse's usage error."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, flag=flag, allow_zero=allow_zero)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(f"{exc.text!r}: {exc.why}") from exc

    parse.__name__ = "duration"
    return parse


def retention_arg(flag: str, *, unit_required: bool = False) -> Callable[[str], float | None]:
    """An argparse ``type=`` for a retention or look-back flag (a duration, or 'forever')."""

    def parse(text: str) -> float | None:
        try:
            return parse_retention(text, flag=flag, unit_required=unit_required)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(f"{exc.text!r}: {exc.why}") from exc

    parse.__name__ = "duration"
    return parse
