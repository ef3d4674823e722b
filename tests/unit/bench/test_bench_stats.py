"""The statistics `hvdazure bench` reports, on inputs whose answers are known."""

import math

import numpy as np
import pytest

from hvdazure.bench import stats


@pytest.mark.parametrize(("op", "world_size", "expected"), [
    ("allreduce", 2, 10.0), ("allreduce", 4, 15.0), ("allreduce", 1, 0.0),
    ("allgather", 4, 7.5), ("broadcast", 8, 10.0),
])
def test_bus_bandwidth_uses_the_nccl_tests_factors(op, world_size, expected):
    assert stats.bus_bandwidth(10.0, world_size, op) == pytest.approx(expected)


def test_bootstrap_interval_of_identical_values_is_that_value():
    assert stats.bootstrap_interval([1.5] * 20) == (1.5, 1.5)


def test_bootstrap_interval_contains_the_median_and_is_reproducible():
    values = np.random.default_rng(0).normal(1.0, 0.1, size=40)
    low, high = stats.bootstrap_interval(values)

    assert low < np.median(values) < high
    assert high - low < 0.2
    assert stats.bootstrap_interval(values) == (low, high)


def test_bootstrap_interval_narrows_with_more_values():
    rng = np.random.default_rng(1)
    few, many = rng.normal(1.0, 0.1, size=10), rng.normal(1.0, 0.1, size=1000)

    width = [high - low for low, high in (stats.bootstrap_interval(few), stats.bootstrap_interval(many))]

    assert width[1] < width[0]


def test_bootstrap_interval_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        stats.bootstrap_interval([])


def test_ratio_interval_of_constant_samples_is_the_ratio():
    assert stats.ratio_interval([180.0] * 5, [100.0] * 5, scale=2) == pytest.approx((0.9, 0.9))


def test_scaling_efficiency_is_total_over_n_times_one_rank():
    assert stats.scaling_efficiency(total_n=180.0, total_1=100.0, world_size=2) == pytest.approx(0.9)


@pytest.mark.parametrize(("interval", "expected"), [
    ((0.99, 1.01), "met"), ((1.00, 1.02), "met"), ((1.03, 1.10), "not met"), ((1.00, 1.05), "undecided"),
])
def test_verdict_on_a_ratio_that_should_stay_at_or_below_the_target(interval, expected):
    assert stats.verdict(interval, 1.02) == expected


@pytest.mark.parametrize(("interval", "expected"), [
    ((0.98, 1.1), "met"), ((0.90, 0.97), "not met"), ((0.95, 1.01), "undecided"),
])
def test_at_least_verdict_on_a_figure_that_should_reach_the_target(interval, expected):
    assert stats.at_least_verdict(interval, 0.98) == expected


def test_summary_gives_mean_median_extremes_and_a_finite_interval():
    s = stats.summary([1.0, 2.0, 3.0, 4.0])

    assert (s["mean"], s["median"], s["min"], s["max"], s["n"]) == (2.5, 2.5, 1.0, 4.0, 4)
    assert all(math.isfinite(v) for v in s["ci95"]) and s["ci95"][0] <= 2.5 <= s["ci95"][1]


def test_launch_overhead_is_the_median_of_per_repeat_differences():
    from hvdazure.bench import launch

    s = launch.summarize(ours=[2.0, 2.5, 2.1], bare=[1.8, 2.0, 2.0])

    assert s["overhead_s_median"] == pytest.approx(0.2)
    assert s["bare_median_s"] == pytest.approx(2.0) and s["hvdazure_median_s"] == pytest.approx(2.1)
    assert s["overhead_s_ci95"][0] <= 0.2 <= s["overhead_s_ci95"][1]
