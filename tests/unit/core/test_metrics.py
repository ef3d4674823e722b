"""hvdazure.core.metrics: sample-weighted metric means over steps and ranks, reduced in one collective.

A "rank" here is a MetricAccumulator. Ranks are reduced by handing every accumulator's row to
`combine_rows`, which is what each rank does with the rows an allgather returns (real ranks are tested in
tests/distributed, and the whole loop on simulated ranks in test_loop_fake_ranks.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from hvdazure.core.config import ConfigError
from hvdazure.core.metrics import (
    HookReturnError,
    MetricAccumulator,
    Reduced,
    RunningMean,
    check_metric_shape,
    combine_rows,
    names_fingerprint,
)


def _accumulator(*batches: tuple[dict[str, Any], int], to_float64: Any = float) -> MetricAccumulator:
    accumulator = MetricAccumulator(to_float64)
    for metrics, count in batches:
        accumulator.add(metrics, count)
    return accumulator


def _no_name_exchange(names: list[str]) -> list[list[str]]:
    raise AssertionError("ranks with the same metrics must not exchange their names")


def _alone(accumulator: MetricAccumulator, flags: Sequence[float] = ()) -> Reduced:
    return accumulator.reduce(lambda row: [[float(v) for v in row]], _no_name_exchange, flags)


def _reduce_ranks(*ranks: MetricAccumulator, flags: Sequence[Sequence[float]] | None = None,
                  exchanges: list[int] | None = None) -> list[Reduced]:
    """Every rank's result, as each would compute it from the gathered rows (and names, if they differ)."""
    flags = flags or [()] * len(ranks)
    names = [rank.names for rank in ranks]
    rows = [[float(v) for v in rank.row(f)] for rank, f in zip(ranks, flags, strict=True)]

    def gather_names(_own: list[str]) -> list[list[str]]:
        if exchanges is not None:
            exchanges.append(1)
        return names

    return [combine_rows(rows, names[r], len(flags[r]), gather_names) for r in range(len(ranks))]


# --- one rank -----------------------------------------------------------------------------------------------
def test_means_are_weighted_by_sample_count() -> None:
    result = _alone(_accumulator(({"loss": 1.0}, 2), ({"loss": 4.0}, 1)))
    assert result.means == {"loss": 2.0}
    assert result.count == 3


def test_each_metric_gets_its_own_mean() -> None:
    result = _alone(_accumulator(({"loss": 0.5, "acc": 1.0}, 4), ({"loss": 1.5, "acc": 0.0}, 4)))
    assert result.means == {"acc": 0.5, "loss": 1.0}


def test_a_metric_reported_on_some_batches_is_averaged_over_those_batches_only() -> None:
    result = _alone(_accumulator(({"loss": 1.0, "extra": 5.0}, 2), ({"loss": 3.0}, 2)))
    assert result.means == {"extra": 5.0, "loss": 2.0}
    assert result.counts == {"extra": 2, "loss": 4}
    assert result.count == 4


def test_framework_scalars_are_accepted_until_the_reduce() -> None:
    result = _alone(_accumulator(({"loss": np.float32(0.25)}, 4), ({"loss": np.float64(1.0)}, 4)))
    assert result.means == {"loss": 0.625}


def test_sums_are_accumulated_in_float64_whatever_the_batch_dtype() -> None:
    # 3000 batches of a float16 value: summed in float16 the total stops growing near 2048 / 0.1
    batches = [({"loss": np.float16(0.1)}, 1)] * 3000
    result = _alone(_accumulator(*batches, to_float64=np.float64))
    assert result.means["loss"] == pytest.approx(float(np.float16(0.1)), rel=1e-12)


def test_a_batch_without_samples_adds_nothing() -> None:
    accumulator = _accumulator(({"loss": 2.0}, 3), ({"loss": math.nan, "acc": 0.5}, 0))
    assert accumulator.names == ["loss"]
    result = _alone(accumulator)
    assert result.means == {"loss": 2.0}
    assert result.count == 3


@pytest.mark.parametrize("value", [np.ones(4), np.ones((4, 10))], ids=["per sample", "probabilities"])
def test_a_metric_that_is_not_one_number_is_refused_naming_the_hook_the_metric_and_its_shape(value) -> None:
    accumulator = MetricAccumulator(hook="validation_step")

    with pytest.raises(HookReturnError) as raised:
        accumulator.add({"loss": 1.0, "probs": value}, 4)

    assert str(raised.value) == (f"validation_step returned metric 'probs' of shape {value.shape}: it must "
                                 "be the mean over the batch (one number)")
    assert isinstance(raised.value, ConfigError) and raised.value.exit_status == 2  # one line, bad input


@pytest.mark.parametrize("value", [np.float32(0.5), np.array(0.5), np.array([0.5]), np.array([[0.5]])])
def test_a_metric_of_one_element_is_one_number_whatever_its_shape(value) -> None:
    accumulator = _accumulator(({"acc": value}, 2), to_float64=lambda v: np.asarray(v).item())  # as torch's
    assert _alone(accumulator).means == {"acc": 0.5}


def test_a_loss_that_is_not_one_number_says_the_step_must_return_the_mean_over_the_batch() -> None:
    with pytest.raises(HookReturnError, match=r"^training_step returned a loss of shape \(32,\): it must be "
                                              r"the mean over the batch \(one number\)$"):
        check_metric_shape("training_step", "loss", (32,))


@pytest.mark.parametrize("shape", [(None,), (None, 1), (), (1,), None, (None, None)],
                         ids=["per sample", "per sample, a column", "scalar", "one element", "unknown rank",
                              "unknown sizes"])
def test_one_value_per_sample_passes_where_the_binding_averages_them(shape) -> None:
    check_metric_shape("validation_step", "acc", shape, per_sample=True)


@pytest.mark.parametrize("shape", [(None, 10), (10,), (None, 1, 3)])
def test_more_than_one_value_per_sample_is_refused_even_where_per_sample_values_are_averaged(shape) -> None:
    with pytest.raises(HookReturnError, match=r"^validation_step returned metric 'probs' of shape .*: it "
                                              r"must be the mean over the batch \(one number\) or one value "
                                              r"per sample \(shape \(batch,\)\), which hvdazure averages$"):
        check_metric_shape("validation_step", "probs", shape, per_sample=True)


def test_no_samples_gives_no_means_and_count_zero() -> None:
    result = _alone(_accumulator(({"loss": 1.0}, 0)))
    assert result.means == {}
    assert result.count == 0


def test_the_row_holds_fingerprint_count_flags_sums_then_counts() -> None:
    row = _accumulator(({"loss": 1.0, "acc": 0.5}, 4)).row(flags=[1.0, 0.0])
    assert row == [names_fingerprint(["acc", "loss"]), 4.0, 1.0, 0.0, 2.0, 4.0, 4.0, 4.0]


def test_the_names_fingerprint_is_an_exact_float64_integer() -> None:
    value = names_fingerprint(["acc", "loss"])
    assert value == int(value) < 2**53
    assert value != names_fingerprint(["acc", "los"])


def test_flags_come_back_from_the_reduce() -> None:
    assert _alone(_accumulator(({"loss": 1.0}, 1)), flags=[1.0, 0.0]).flags == [1.0, 0.0]


def test_reduce_starts_afresh() -> None:
    accumulator = _accumulator(({"loss": 10.0}, 5))
    _alone(accumulator)
    assert accumulator.names == []
    accumulator.add({"acc": 1.0}, 2)
    result = _alone(accumulator)
    assert (result.means, result.count) == ({"acc": 1.0}, 2)


# --- several ranks ------------------------------------------------------------------------------------------
def test_two_ranks_get_the_exact_mean_over_all_their_samples() -> None:
    rank_a = _accumulator(({"loss": 1.0}, 3), ({"loss": 2.0}, 1))
    rank_b = _accumulator(({"loss": 6.0}, 4))
    result_a, result_b = _reduce_ranks(rank_a, rank_b)
    assert (result_a.means, result_a.count) == ({"loss": (3 * 1.0 + 1 * 2.0 + 4 * 6.0) / 8}, 8)
    assert result_b == result_a


def test_two_ranks_agree_with_one_process_that_saw_every_batch() -> None:
    batches = [({"loss": 0.3, "acc": 0.75}, 4), ({"loss": 0.9, "acc": 0.25}, 4),
               ({"loss": 0.6, "acc": 1.0}, 1)]
    single = _alone(_accumulator(*batches))
    result_a, _ = _reduce_ranks(_accumulator(*batches[:2]), _accumulator(batches[2]))
    assert result_a.count == single.count
    assert result_a.means == pytest.approx(single.means)


def test_ranks_with_the_same_metrics_exchange_no_names() -> None:
    exchanges: list[int] = []
    _reduce_ranks(_accumulator(({"loss": 1.0}, 1)), _accumulator(({"loss": 2.0}, 1)), exchanges=exchanges)
    assert exchanges == []


def test_a_rank_without_samples_does_not_change_the_mean() -> None:
    result_a, result_b = _reduce_ranks(_accumulator(({"loss": 3.0}, 2)), _accumulator())
    assert (result_a.means, result_a.count) == ({"loss": 3.0}, 2)
    assert result_b == result_a


def test_a_metric_only_one_rank_reports_is_averaged_over_that_ranks_samples() -> None:
    # was: the collective was named by the number of values, so these two ranks waited on different names
    result_a, result_b = _reduce_ranks(_accumulator(({"loss": 1.0, "extra": 7.0}, 2)),
                                       _accumulator(({"loss": 3.0}, 2)))
    assert result_a.means == {"extra": 7.0, "loss": 2.0}
    assert result_b == result_a


def test_two_different_sets_of_the_same_size_are_never_summed_together() -> None:
    # was: the sums were matched by position, so "acc" on one rank was added to "f1" on the other
    exchanges: list[int] = []
    result_a, result_b = _reduce_ranks(_accumulator(({"loss": 1.0, "acc": 0.5}, 2)),
                                       _accumulator(({"loss": 3.0, "f1": 0.25}, 2)), exchanges=exchanges)
    assert result_a.means == {"acc": 0.5, "f1": 0.25, "loss": 2.0}
    assert result_b == result_a
    assert len(exchanges) == 2  # each rank saw the difference and took part in the name exchange


def test_flags_are_summed_over_ranks() -> None:
    result_a, result_b = _reduce_ranks(_accumulator(({"loss": 1.0}, 1)), _accumulator(({"loss": 1.0}, 1)),
                                       flags=[[1.0, 0.0], [1.0, 1.0]])
    assert result_a.flags == [2.0, 1.0]
    assert result_b.flags == [2.0, 1.0]


def test_ranks_add_rows_in_rank_order_so_every_rank_gets_the_same_bits() -> None:
    ranks = [_accumulator(({"loss": v}, 1)) for v in (0.1, 1e16, -1e16, 0.3)]
    results = _reduce_ranks(*ranks)
    assert len({r.means["loss"] for r in results}) == 1


# --- RunningMean --------------------------------------------------------------------------------------------
def _reduced(means: dict[str, float], count: int) -> Reduced:
    return Reduced(means, dict.fromkeys(means, count), count, [])


def test_running_mean_weights_intervals_by_sample_count() -> None:
    running = RunningMean()
    running.add(_reduced({"loss": 1.0}, 1))
    running.add(_reduced({"loss": 4.0}, 3))
    assert running.means() == {"loss": 3.25}


def test_running_mean_weights_each_metric_by_its_own_count() -> None:
    running = RunningMean()
    running.add(Reduced({"loss": 1.0, "extra": 8.0}, {"loss": 4, "extra": 1}, 4, []))
    running.add(_reduced({"loss": 3.0}, 4))
    assert running.means() == {"loss": 2.0, "extra": 8.0}


def test_running_mean_of_nothing_is_empty() -> None:
    assert RunningMean().means() == {}


def test_running_mean_survives_a_round_trip_and_reads_the_older_single_count_form() -> None:
    running = RunningMean()
    running.add(_reduced({"loss": 2.0}, 5))
    restored = RunningMean()
    restored.load_state_dict(running.state_dict())
    assert restored.means() == {"loss": 2.0}
    older = RunningMean()
    older.load_state_dict({"sums": {"loss": 10.0}, "count": 5})
    assert older.means() == {"loss": 2.0}
