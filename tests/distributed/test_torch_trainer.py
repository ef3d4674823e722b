"""TorchTrainer on real ranks: what every data-parallel user relies on, asserted across processes.

The trainings run together: one 2-rank job (and one 1-rank job for the single-process references, and one
under MPI) runs every training below in turn (harness.run_trainings), and each test reads the trainings it
needs. The loop's logic across many world sizes is proven on fake ranks
(tests/unit/loop/test_loop_fake_ranks.py); this file proves that the PyTorch binding on Horovod does what
the loop asks.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import REPO, WORKERS, read_reports, run_job, run_trainings

JOB = "torch_job.py"

# Bit-identical ranks, exactly once, the data order by seed: one training checks all three.
SHARED = ("epochs=3", "batch_size=3", "extra.n_train=37", "grad_accum_steps=2", "lr=0.05",
          "warmup_steps=3", "schedule=cosine", "grad_clip_norm=1.0")

# 2 ranks x batch b against 1 rank x batch 2b. 37 samples: the last optimizer step of each epoch is uneven
# across ranks (and empty for some). The default on CPUs allreduces after backward; "overlapped" takes
# Horovod's DistributedOptimizer path.
EQUAL_BATCHES = {
    "plain": (),
    "accumulation": ("grad_accum_steps=2",),
    "clipping": ("grad_clip_norm=0.5",),
    "overlapped": ("grad_allreduce=overlap",),
    "overlapped accumulation": ("grad_allreduce=overlap", "grad_accum_steps=2"),
}
EQUAL_BATCHES_COMMON = ("epochs=3", "extra.n_train=37", "lr=0.05", "base_batch_size=8")

# After backward against Horovod's overlapped allreduce: the same op, compression and predivide split.
ALLREDUCE_PATHS = {"fp16 predivided": ("compression=fp16", "gradient_predivide_factor=2.0"),
                   "sum": ("reduce_op=sum",)}
ALLREDUCE_COMMON = ("epochs=2", "extra.n_train=37", "batch_size=4", "lr=0.05")

LR, LR_BATCH, LR_WARMUP = 0.01, 4, 4
LR_ACCUM = (1, 2)


def _lr_training(accum: int) -> tuple[str, ...]:
    return (f"lr={LR}", f"batch_size={LR_BATCH}", f"grad_accum_steps={accum}", f"warmup_steps={LR_WARMUP}",
            "epochs=2", "extra.n_train=40")


LAUNCHER_REFERENCE = ("batch_size=4", "extra.n_train=21")

TWO_RANKS = {
    "shared": (*SHARED, "seed=7"),
    "other seed": (*SHARED, "seed=8"),
    # "shared" in a subclass that takes every name the loop used to keep on the trainer (workers/squatter.py)
    "squatting": (*SHARED, "seed=7", "extra.squat=true"),
    **{f"b {name}": (*EQUAL_BATCHES_COMMON, *s, "batch_size=4") for name, s in EQUAL_BATCHES.items()},
    **{f"{name} after": (*ALLREDUCE_COMMON, *s, "grad_allreduce=after_backward")
       for name, s in ALLREDUCE_PATHS.items()},
    **{f"{name} overlapped": (*ALLREDUCE_COMMON, *s, "grad_allreduce=overlap")
       for name, s in ALLREDUCE_PATHS.items()},
    # 9 eval samples over 2 ranks (5 + 4), batch 2: uneven batches and ranks
    "eval odd": ("batch_size=2", "extra.n_eval=9"),
    "eval on one rank": ("batch_size=2", "extra.n_eval=1"),
    **{f"lr accum {a}": _lr_training(a) for a in LR_ACCUM},
    "stop on one rank": ("epochs=5", "batch_size=2", "extra.n_train=40", "extra.stop_rank=1",
                         "extra.stop_step=3"),
    # an LR so large that eval_mse grows: patience 1 stops after the second evaluation
    "early stopping": ("epochs=10", "batch_size=4", "lr=2.0", "lr_scaling=none", "extra.n_eval=8",
                       "early_stopping_patience=1", "monitor=eval_mse"),
    "launcher reference": LAUNCHER_REFERENCE,
}
ONE_RANK = {
    **{f"2b {name}": (*EQUAL_BATCHES_COMMON, *s, "batch_size=8") for name, s in EQUAL_BATCHES.items()},
    "eval odd": ("batch_size=2", "base_batch_size=2", "lr_scaling=none", "extra.n_eval=9"),
    **{f"lr accum {a}": _lr_training(a) for a in LR_ACCUM},
    "launcher reference": LAUNCHER_REFERENCE,
}
UNDER_MPI = {"shared": TWO_RANKS["shared"]}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_trainings(TWO_RANKS, tmp_path_factory.mktemp("two-ranks"), np=2)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return run_trainings(ONE_RANK, tmp_path_factory.mktemp("one-rank"), np=1)


@pytest.fixture(scope="module")
def under_mpi(tmp_path_factory):
    return run_trainings(UNDER_MPI, tmp_path_factory.mktemp("under-mpi"), np=2, controller="mpi")


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_parameters_are_bit_identical_across_ranks_after_training(request, controller):
    reports = request.getfixturevalue({"gloo": "two_ranks", "mpi": "under_mpi"}[controller])["shared"]

    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["history"] == reports[1]["history"]


def test_a_subclass_using_every_name_the_loop_once_kept_on_the_trainer_trains_exactly_as_its_base(two_ranks):
    # the loop's state and machinery live in one name-mangled object: the user's `_build`, `_emit`,
    # `_checkpoints`, ... are neither called nor overwritten (was: fit() called the user's methods)
    squatting, shared = two_ranks["squatting"], two_ranks["shared"]

    assert [squatting[rank]["squat_intact"] for rank in (0, 1)] == [True, True]
    for key in ("params_sha256", "history", "seen", "lrs"):
        assert [squatting[rank][key] for rank in (0, 1)] == [shared[rank][key] for rank in (0, 1)], key


@pytest.mark.parametrize("name", EQUAL_BATCHES)
def test_two_ranks_with_batch_b_match_one_rank_with_batch_2b(two_ranks, one_rank, name):
    two, one = two_ranks[f"b {name}"], one_rank[f"2b {name}"]

    assert two[0]["steps_per_epoch"] == one[0]["steps_per_epoch"]
    for p2, p1 in zip(two[0]["params"], one[0]["params"], strict=True):
        np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-10)
    final_loss = [run[0]["history"][-1]["train_loss"] for run in (two, one)]
    assert final_loss[0] == pytest.approx(final_loss[1], abs=1e-10)


@pytest.mark.parametrize("name", ALLREDUCE_PATHS)
def test_gradients_allreduced_after_backward_equal_horovods_overlapped_allreduce(two_ranks, name):
    after, overlapped = two_ranks[f"{name} after"], two_ranks[f"{name} overlapped"]

    assert after[0]["params_sha256"] == after[1]["params_sha256"]
    for a, o in zip(after[0]["params"], overlapped[0]["params"], strict=True):
        np.testing.assert_allclose(a, o, rtol=0, atol=1e-12)


def test_every_sample_is_used_exactly_once_per_epoch_and_the_order_changes_between_epochs(two_ranks):
    reports = two_ranks["shared"]

    for epoch in ("0", "1", "2"):
        used = reports[0]["seen"][epoch] + reports[1]["seen"][epoch]
        assert sorted(used) == list(range(37)), f"epoch {epoch}"
    assert reports[0]["seen"]["0"] != reports[0]["seen"]["1"]


def test_same_seed_gives_the_same_order_and_another_seed_another(two_ranks, under_mpi):
    # two separate jobs with seed 7 (under Gloo and under MPI: the order depends on neither), and seed 8
    first, again, other = two_ranks["shared"], under_mpi["shared"], two_ranks["other seed"]

    assert first[0]["seen"] == again[0]["seen"] and first[1]["seen"] == again[1]["seen"]
    assert first[0]["seen"] != other[0]["seen"]


def test_evaluation_on_an_odd_sized_set_equals_the_single_process_result(two_ranks, one_rank):
    # eval "index" is the mean of the sample indices, which is exactly 4.0 only if each sample counts once
    # with the right weight.
    two, one = two_ranks["eval odd"], one_rank["eval odd"]

    assert two[0]["history"][-1]["eval_index"] == 4.0
    assert one[0]["history"][-1]["eval_index"] == 4.0
    assert two[0]["history"][-1]["eval_mse"] == two[1]["history"][-1]["eval_mse"]


def test_a_rank_without_evaluation_samples_does_not_hang(two_ranks):
    reports = two_ranks["eval on one rank"]

    assert reports[0]["history"][-1]["eval_index"] == 0.0
    assert reports[1]["history"][-1]["eval_index"] == 0.0


def _expected_lr(step, lr, peak, warmup):
    return lr + (peak - lr) * step / warmup if step < warmup else peak


@pytest.mark.parametrize(("np_", "accum"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_lr_follows_warmup_to_the_linearly_scaled_lr_counted_in_optimizer_steps(two_ranks, one_rank, np_,
                                                                               accum):
    reports = {1: one_rank, 2: two_ranks}[np_][f"lr accum {accum}"]

    peak = LR * np_ * accum  # linear scaling: global batch / base batch (= batch_size)
    lrs = reports[0]["lrs"]
    assert len(lrs) == 2 * math.ceil(40 / (LR_BATCH * np_ * accum))  # one LR per optimizer step
    for step, used in enumerate(lrs):
        assert used == pytest.approx(_expected_lr(step, LR, peak, LR_WARMUP), rel=1e-12), step


def test_a_stop_requested_on_one_rank_stops_all_ranks_at_the_same_step(two_ranks):
    reports = two_ranks["stop on one rank"]

    # asked in on_step_end of step 3, after that step's sync: agreed at the next sync, step 4, by all
    assert [len(r["lrs"]) for r in reports.values()] == [4, 4]
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["stop_reason"] == "stop requested by another rank"
    assert reports[1]["stop_reason"] == "rank 1 asked at step 3"


def test_early_stopping_stops_every_rank_together(two_ranks):
    reports = two_ranks["early stopping"]

    assert len(reports[0]["history"]) == len(reports[1]["history"]) == 2
    assert reports[0]["stop_reason"].startswith("early stopping: eval_mse did not improve")


def test_digits_sample_reaches_95_percent_on_two_ranks(tmp_path):
    job = run_job(REPO / "samples" / "torch_digits.py", out_dir=tmp_path, timeout=180)

    assert job.returncode == 0, job.output
    final = [line for line in job.stdout.splitlines() if "final: eval accuracy" in line]
    assert len(final) == 1, job.stdout  # printed by rank 0 only
    assert job.stderr.splitlines().count("hvdazure: 2 ranks on 1 node, CPU") == 1, job.stderr  # the layout
    accuracy = float(final[0].split("eval accuracy ")[1].split(",")[0])
    assert accuracy >= 0.95


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "python"])
def test_the_same_script_runs_under_plain_mpirun_horovodrun_and_python(tmp_path, two_ranks, one_rank,
                                                                       launcher):
    script = [sys.executable, str(WORKERS / JOB), *[a for s in LAUNCHER_REFERENCE for a in ("--set", s)]]
    prefix = {
        "mpirun": ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot"],
        "horovodrun": [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2"],
        "python": [],
    }[launcher]
    proc = subprocess.run([*prefix, *script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HVDAZURE_TEST_OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr

    reports = read_reports(tmp_path)
    expected_size = 1 if launcher == "python" else 2
    assert sorted(reports) == list(range(expected_size))
    reference = {1: one_rank, 2: two_ranks}[expected_size]["launcher reference"]
    assert {r["params_sha256"] for r in reports.values()} == {reference[0]["params_sha256"]}
