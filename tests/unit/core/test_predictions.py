"""core/predictions.py: which batches each rank predicts, and the outputs put back in dataset order."""

import numpy as np
import pytest

from hvdazure.core.metrics import HookReturnError
from hvdazure.core.predictions import (
    as_outputs,
    check_rows,
    gather_in_order,
    join_batches,
    prediction_batches,
)


@pytest.mark.parametrize("num_samples", [0, 1, 7, 8, 9, 63, 101])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 16])
def test_the_ranks_batches_are_the_sets_batches_cut_in_contiguous_runs(num_samples, batch_size, world_size):
    alone = prediction_batches(num_samples, batch_size, 1, 0)
    per_rank = [prediction_batches(num_samples, batch_size, world_size, rank) for rank in range(world_size)]

    assert [b for batches in per_rank for b in batches] == alone  # the same batches, in rank order
    assert [i for b in alone for i in b] == list(range(num_samples))  # each sample once, in order
    assert all(len(b) == batch_size for b in alone[:-1])  # only the set's last batch may be short
    counts = [len(batches) for batches in per_rank]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_a_batch_size_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="batch_size 0 is not positive"):
        prediction_batches(10, 0, 2, 0)


def _simulated_allgather(per_rank):
    """A test double of Collectives.allgather_bytes: what each simulated rank sends, in rank order. Each
    rank's payload is made by the code under test (gather_in_order's encoding) for every rank at once."""
    from hvdazure.core import predictions

    payloads = [predictions._encode(outputs) for outputs in per_rank]
    return lambda mine: payloads


@pytest.mark.parametrize("structure", ["array", "dict"])
def test_gathered_outputs_are_the_ranks_in_rank_order_with_ranks_without_samples(structure):
    values = np.arange(20, dtype=np.float64).reshape(10, 2) / 7
    pieces = [values[0:4], values[4:8], None, values[8:10]]  # rank 2 has no batches; rank 3 the last one
    if structure == "dict":
        pieces = [None if p is None else {"y": p, "index": np.arange(len(p))} for p in pieces]
    gathered = gather_in_order(pieces[0], _simulated_allgather(pieces), 10)
    if structure == "dict":
        assert list(gathered) == ["y", "index"]
        assert gathered["y"].tobytes() == values.tobytes()
        assert gathered["index"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    else:
        assert gathered.tobytes() == values.tobytes()


def test_every_output_must_have_a_row_per_sample():
    check_rows("predict_step", {"y": np.zeros((3, 2))}, 3)
    with pytest.raises(HookReturnError, match=r"predict_step returned y of shape \(1, 2\) for a batch of 3 "
                                              "samples: return one row per sample"):
        check_rows("predict_step", {"y": np.zeros((1, 2))}, 3)
    with pytest.raises(HookReturnError, match="predict_step returned an array of a scalar for a batch of 3"):
        check_rows("predict_step", np.float64(1.0), 3)


def test_what_predict_step_may_return():
    assert as_outputs("predict_step", {"a": [1, 2]}, np.asarray)["a"].tolist() == [1, 2]
    with pytest.raises(HookReturnError, match="predict_step returned a tuple: return one array"):
        as_outputs("predict_step", (np.zeros(2), np.zeros(2)), np.asarray)
    with pytest.raises(HookReturnError, match="predict_step returned an empty dict"):
        as_outputs("predict_step", {}, np.asarray)


def test_batches_of_another_structure_are_refused():
    with pytest.raises(HookReturnError, match=r"another structure for a later batch: a dict of \['a'\] then "
                                              r"a dict of \['b'\]"):
        join_batches("predict_step", [{"a": np.zeros(1)}, {"b": np.zeros(1)}])
    with pytest.raises(HookReturnError, match="an array for one batch and a dict for a later one"):
        join_batches("predict_step", [np.zeros(1), {"b": np.zeros(1)}])
    assert join_batches("predict_step", []) is None
