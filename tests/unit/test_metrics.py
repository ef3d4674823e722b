"""hvdazure.core.metrics: sample-weighted metric means over steps and ranks, reduced in one allreduce.

A "rank" here is a MetricAccumulator; two ranks are reduced with an allreduce that adds the other rank's
vector, which is the arithmetic a real allreduce(sum) performs (real ranks are tested in tests/distributed).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from hvdazure.core.metrics import AllreduceSum, MetricAccumulator, RunningMean


def world_of_one(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values]


def _accumulator(*batches: tuple[dict[str, Any], int]) -> MetricAccumulator:
    accumulator = MetricAccumulator()
    for metrics, count in batches:
        accumulator.add(metrics, count)
    return accumulator


def _sent(accumulator: MetricAccumulator, flags: Sequence[float] = ()) -> list[float]:
    """The vector `accumulator` contributes to the allreduce (read from a copy, which `reduce` resets)."""
    sent: list[float] = []

    def record(values: Sequence[Any]) -> list[float]:
        sent.extend(float(v) for v in values)
        return list(sent)

    copy.deepcopy(accumulator).reduce(record, flags)
    return sent


def _adding(peer: list[float]) -> AllreduceSum:
    def allreduce_sum(values: Sequence[Any]) -> list[float]:
        return [float(v) + p for v, p in zip(values, peer, strict=True)]
    return allreduce_sum


def _reduce_two_ranks(a: MetricAccumulator, b: MetricAccumulator, flags_a: Sequence[float] = (),
                      flags_b: Sequence[float] = ()) -> tuple[Any, Any]:
    sent_a, sent_b = _sent(a, flags_a), _sent(b, flags_b)
    return a.reduce(_adding(sent_b), flags_a), b.reduce(_adding(sent_a), flags_b)


# --- one rank -----------------------------------------------------------------------------------------------
def test_means_are_weighted_by_sample_count() -> None:
    accumulator = _accumulator(({"loss": 1.0}, 2), ({"loss": 4.0}, 1))
    means, count, _ = accumulator.reduce(world_of_one)
    assert means == {"loss": 2.0}
    assert count == 3


def test_each_metric_gets_its_own_mean() -> None:
    accumulator = _accumulator(({"loss": 0.5, "acc": 1.0}, 4), ({"loss": 1.5, "acc": 0.0}, 4))
    assert accumulator.reduce(world_of_one)[0] == {"acc": 0.5, "loss": 1.0}


def test_framework_scalars_are_accepted_until_the_reduce() -> None:
    accumulator = _accumulator(({"loss": np.float32(0.25)}, 4), ({"loss": np.float64(1.0)}, 4))
    assert accumulator.reduce(world_of_one)[0] == {"loss": 0.625}


def test_count_zero_registers_the_names_only() -> None:
    accumulator = _accumulator(({"loss": 2.0}, 3), ({"loss": 7.0, "acc": 0.5}, 0))
    assert accumulator.names == ["acc", "loss"]
    means, count, _ = accumulator.reduce(world_of_one)
    assert means["loss"] == 2.0
    assert count == 3


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_count_zero_ignores_the_value_even_when_it_is_not_finite(value: float) -> None:
    accumulator = _accumulator(({"loss": 2.0}, 3), ({"loss": value}, 0))
    assert accumulator.reduce(world_of_one)[0] == {"loss": 2.0}


def test_no_samples_gives_nan_means_and_count_zero() -> None:
    means, count, _ = _accumulator(({"loss": 1.0}, 0)).reduce(world_of_one)
    assert math.isnan(means["loss"])
    assert count == 0


def test_reduce_sends_sums_then_count_then_flags_in_one_allreduce() -> None:
    calls: list[list[float]] = []

    def allreduce_sum(values: Sequence[Any]) -> list[float]:
        calls.append(world_of_one(values))
        return calls[-1]

    _accumulator(({"loss": 1.0, "acc": 0.5}, 4)).reduce(allreduce_sum, flags=[1.0, 0.0])
    assert calls == [[2.0, 4.0, 4.0, 1.0, 0.0]]  # acc sum, loss sum (sorted names), count, flags


def test_flags_come_back_from_the_reduce() -> None:
    assert _accumulator(({"loss": 1.0}, 1)).reduce(world_of_one, flags=[1.0, 0.0])[2] == [1.0, 0.0]


def test_reduce_starts_afresh() -> None:
    accumulator = _accumulator(({"loss": 10.0}, 5))
    accumulator.reduce(world_of_one)
    assert accumulator.names == []
    accumulator.add({"acc": 1.0}, 2)
    assert accumulator.reduce(world_of_one)[:2] == ({"acc": 1.0}, 2)


# --- two ranks ----------------------------------------------------------------------------------------------
def test_two_ranks_get_the_exact_mean_over_all_their_samples() -> None:
    rank_a = _accumulator(({"loss": 1.0}, 3), ({"loss": 2.0}, 1))
    rank_b = _accumulator(({"loss": 6.0}, 4))
    result_a, result_b = _reduce_two_ranks(rank_a, rank_b)
    assert result_a[:2] == ({"loss": (3 * 1.0 + 1 * 2.0 + 4 * 6.0) / 8}, 8)
    assert result_b == result_a


def test_two_ranks_agree_with_one_process_that_saw_every_batch() -> None:
    batches = [({"loss": 0.3, "acc": 0.75}, 4), ({"loss": 0.9, "acc": 0.25}, 4),
               ({"loss": 0.6, "acc": 1.0}, 1)]
    single = _accumulator(*batches).reduce(world_of_one)
    result_a, _ = _reduce_two_ranks(_accumulator(*batches[:2]), _accumulator(batches[2]))
    assert result_a[1] == single[1]
    assert result_a[0] == pytest.approx(single[0])


def test_a_rank_without_samples_that_registered_the_names_does_not_change_the_mean() -> None:
    result_a, result_b = _reduce_two_ranks(_accumulator(({"loss": 3.0}, 2)), _accumulator(({"loss": 0.0}, 0)))
    assert result_a[:2] == ({"loss": 3.0}, 2)
    assert result_b == result_a


def test_flags_are_summed_over_ranks() -> None:
    result_a, result_b = _reduce_two_ranks(_accumulator(({"loss": 1.0}, 1)), _accumulator(({"loss": 1.0}, 1)),
                                           flags_a=[1.0, 0.0], flags_b=[1.0, 1.0])
    assert result_a[2] == [2.0, 1.0]
    assert result_b[2] == [2.0, 1.0]


# --- RunningMean --------------------------------------------------------------------------------------------
def test_running_mean_weights_intervals_by_sample_count() -> None:
    running = RunningMean()
    running.add({"loss": 1.0}, 1)
    running.add({"loss": 4.0}, 3)
    assert running.means() == {"loss": 3.25}


def test_running_mean_ignores_an_interval_without_samples() -> None:
    running = RunningMean()
    running.add({"loss": 2.0}, 5)
    running.add({"loss": 100.0}, 0)
    assert running.means() == {"loss": 2.0}


def test_running_mean_of_nothing_is_empty() -> None:
    assert RunningMean().means() == {}
