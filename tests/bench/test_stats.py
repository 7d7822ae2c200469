"""The benchmarks' order statistics: exact, never past the maximum, refused from too few samples."""

import pytest

from tests.bench import stats


def test_minimum_samples_put_ten_beyond_the_percentile() -> None:
    assert [stats.min_samples(q) for q in (50, 90, 99, 99.9)] == [20, 100, 1000, 10000]


def test_percentile_is_the_nearest_rank_sample() -> None:
    values = list(range(1, 1001))  # 1..1000
    assert stats.percentile(values, 50) == 500
    assert stats.percentile(values, 99) == 990
    assert stats.percentile(list(reversed(values)), 99) == 990


def test_percentile_never_extrapolates_past_the_maximum() -> None:
    values = [1.0] * 999 + [5.0]
    assert stats.percentile(values, 99) == 1.0
    assert stats.percentile([1.0] * 999 + [7.0] * 11, 99) == 7.0  # rank 1000 of 1010


def test_too_few_samples_give_no_figure_and_say_so() -> None:
    assert stats.percentile([1.0] * 999, 99) is None
    assert stats.percentile([1.0] * 19, 50) is None
    assert stats.fmt_pct([0.001] * 40, 99) == "p99 - (n=40 < 1000)"
    assert stats.fmt_pct([0.001] * 40, 50) == "p50 1.00 ms (n=40)"
    assert stats.ratio([1.0] * 40, [1.0] * 2000, 99) is None


def test_out_of_range_percentile_is_refused() -> None:
    with pytest.raises(ValueError):
        stats.percentile([1.0] * 10, 100)
