"""The one statistic the node side needs, without the standard library's ``statistics``.

``statistics`` brings ``fractions``, ``decimal`` and ``random`` with it: about 2 MiB of the
resident agent's memory for a median. The agent's rate checks, the kernel-log clock pairing
and the validation judgement all take their medians here.
"""

from __future__ import annotations

from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count), as a float.
    ValueError for no values, as ``statistics.median`` raises (its error is a ValueError)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no values")
    mid = n // 2
    if n % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2.0
