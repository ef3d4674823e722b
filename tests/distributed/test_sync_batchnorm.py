"""`sync_batchnorm: true`: 2 ranks x b train a BatchNorm model exactly as 1 process x 2b (weights and
running statistics to 1e-10 in float64), in PyTorch, TensorFlowTrainer and Keras `model.fit`, also when
the short last step splits unevenly or leaves a rank without samples, with one sample per rank, and with
gradient accumulation (whose short last step leaves a micro-batch without samples on every rank).

One job per framework and world size runs every case (workers/batchnorm_job.py), shared by the tests."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from harness import run_job

# [n_train, global batch of a micro-batch, grad_accum_steps]: a last step of 5 samples (3 + 2 on 2 ranks),
# of 3 (3 + none), 1 sample per rank in every step (BatchNorm1d refuses one sample unsynchronized), and
# 2 micro-batches a step, the last step's 3 samples all in the first.
TRAININGS = [[37, 8, 1], [35, 8, 1], [10, 2, 1], [35, 8, 2]]
CASES = ["last step split 3 + 2", "last step 3 + none", "one sample per rank", "accumulation"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(framework, world size) -> rank -> report: each job runs once for the whole module, the four side by
    side (a 1-rank job alone leaves a core idle; what they train does not depend on timing)."""
    def run(framework: str, np_: int) -> dict:
        out = tmp_path_factory.mktemp(f"{framework}-{np_}")
        job = run_job("batchnorm_job.py", "--set", f"extra.framework={framework}",
                      "--set", f"extra.trainings={TRAININGS}", out_dir=out, np=np_, timeout=300)
        assert job.returncode == 0, job.output
        return job.reports

    keys = [(framework, np_) for framework in ("torch", "tf") for np_ in (1, 2)]
    with ThreadPoolExecutor(len(keys)) as pool:
        futures = {key: pool.submit(run, *key) for key in keys}
        return {key: future.result() for key, future in futures.items()}


def test_sharded_optimizer_state_and_gradients_keep_batchnorm_exact(runs):
    """zero_stage 2 (the gradients reduce-scattered during backward, the slices allgathered into the
    weights): 2 ranks still train what 1 process trains unsharded, in every case."""
    one, two = runs["torch", 1][0], runs["torch", 2]
    for case, single, rank0, rank1 in zip(CASES, one["torch"], two[0]["torch_zero"], two[1]["torch_zero"],
                                          strict=True):
        _assert_same_weights(rank0["weights"], single["weights"], f"zero_stage 2, {case}: vs 1 process")
        _assert_same_weights(rank1["weights"], rank0["weights"], f"zero_stage 2, {case}: rank 1 vs rank 0")
        assert rank0["batchnorm_batches"] == single["batchnorm_batches"]


def _assert_same_weights(ours, theirs, what):
    assert len(ours) == len(theirs), what
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10, err_msg=what)


@pytest.mark.parametrize(("framework", "kind"), [("torch", "torch"), ("tf", "tf"), ("tf", "keras_fit")])
def test_two_ranks_train_a_batchnorm_model_exactly_as_one_process_with_twice_the_batch(runs, framework, kind):
    one, two = runs[framework, 1][0], runs[framework, 2]
    cases = [case for case, (_, _, accum) in zip(CASES, TRAININGS, strict=True)
             if kind != "keras_fit" or accum == 1]
    for case, single, rank0, rank1 in zip(cases, one[kind], two[0][kind], two[1][kind], strict=True):
        # weights, BatchNorm's affine parameters and its running (moving) mean and variance
        _assert_same_weights(rank0["weights"], single["weights"], f"{kind}, {case}: 2 ranks vs 1 process")
        _assert_same_weights(rank1["weights"], rank0["weights"], f"{kind}, {case}: rank 1 vs rank 0")
        if kind == "torch":
            assert rank0["batchnorm_batches"] == rank1["batchnorm_batches"] == single["batchnorm_batches"]
