import pytest

from fleetops.common import stats


def test_median_of_odd_and_even_counts() -> None:
    assert stats.median([5, 1, 3]) == 3.0
    assert type(stats.median([5, 1, 3])) is float
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median(x for x in (7.5,)) == 7.5  # a generator, as the callers pass
    assert stats.median([-2.0, 10.0]) == 4.0


def test_median_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="median of no values"):
        stats.median([])
