"""Both trainers on a ShardedDataset, on real ranks (Gloo and MPI): exact at any world size and resumable.

37 samples in 5 tar shards of 8, 8, 8, 8 and 5 (tests/distributed/sharded_data.py), 4 lanes, global
batch 8, 2 epochs.
The jobs are few and shared: each run below starts on first use and serves every test that reads it.
"""

import json

import pytest
from harness import run_job
from sharded_data import NUM_SAMPLES, write_regression_shards

JOB = "sharded_job.py"
COMMON = ("epochs=2", "lr=0.05", "base_batch_size=8")
FIRST_STEPS = 7  # of 10: the first run stops 2 steps into epoch 2
# name: (framework, ranks, controller, its settings). "<framework>-first" runs 2 ranks x batch 4 and stops;
# "<framework>-resumed" resumes it on 1 rank x batch 8, to the end; "<framework>-1" is 1 x 8 throughout.
# The TensorFlow jobs of 2 ranks x 4 and 1 x 8 then also run Keras `model.fit` on the shards.
RUNS = {
    "torch-first": ("torch", 2, "gloo", ("batch_size=4", "num_workers=2", f"max_steps={FIRST_STEPS}")),
    "torch-resumed": ("torch", 1, "mpi", ("batch_size=8", "num_workers=2", "resume=auto")),
    "torch-1": ("torch", 1, "mpi", ("batch_size=8",)),
    "tensorflow-first": ("tensorflow", 2, "mpi", ("batch_size=4", f"max_steps={FIRST_STEPS}",
                                                  "extra.keras=true")),
    "tensorflow-resumed": ("tensorflow", 1, "mpi", ("batch_size=8", "resume=auto")),
    "tensorflow-1": ("tensorflow", 1, "mpi", ("batch_size=8", "extra.batch_decode=true", "extra.keras=true")),
}
FRAMEWORKS = ("torch", "tensorflow")


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    return write_regression_shards(tmp_path_factory.mktemp("sharded") / "train")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shards):
    """runs(name): that job, run on first use and shared by the module's tests (a resumed run shares its
    first run's checkpoint directory, `checkpoints`)."""
    done = {}

    def get(name):
        if name in done:
            return done[name]
        framework, np, controller, settings = RUNS[name]
        if name.endswith("-resumed"):
            checkpoints = get(f"{framework}-first").checkpoints
        else:
            checkpoints = tmp_path_factory.mktemp(f"{name}-ckpt")
        out = tmp_path_factory.mktemp(name)
        args = [*COMMON, f"extra.framework={framework}", f"extra.data={shards}",
                f"checkpoint_dir={checkpoints}", *settings]
        job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=np,
                      controller=controller, timeout=240)
        assert job.returncode == 0, job.output
        assert sorted(job.reports) == list(range(np)), job.output
        job.checkpoints = checkpoints
        done[name] = job
        return job

    return get


def seen(*jobs, epoch):
    return sorted(i for job in jobs for report in job.reports.values()
                  for i in report["seen"].get(str(epoch), []))


def assert_close(steps, reference):
    assert len(steps) == len(reference)
    for step, (got, expected) in enumerate(zip(steps, reference, strict=True)):
        assert got == pytest.approx(expected, rel=0, abs=1e-10), step


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_two_ranks_with_batch_b_match_one_process_with_batch_2b_in_float64_step_by_step(runs, framework):
    two, one = runs(f"{framework}-first").reports, runs(f"{framework}-1").reports[0]

    assert two[0]["trajectory"] == two[1]["trajectory"]
    assert two[0]["steps_per_epoch"] == one["steps_per_epoch"] == 5
    assert_close(two[0]["trajectory"], one["trajectory"][:FIRST_STEPS])
    assert two[0]["history"][0]["train_loss"] == pytest.approx(one["history"][0]["train_loss"], rel=0,
                                                               abs=1e-10)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_sample_is_trained_on_exactly_once_per_epoch_across_the_stop_and_resume(runs, framework):
    first, resumed, one = (runs(f"{framework}-{name}") for name in ("first", "resumed", "1"))

    assert seen(first, epoch=0) == seen(one, epoch=0) == list(range(NUM_SAMPLES))
    assert len(seen(first, epoch=1)) == 16  # 2 steps of 8
    assert seen(first, resumed, epoch=1) == seen(one, epoch=1) == list(range(NUM_SAMPLES))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_evaluation_on_sharded_data_counts_every_sample_once_on_2_ranks_and_1(runs, framework):
    # eval "index" is the mean of the sample indices 0..36: exactly 18.0 only if each counts once
    assert runs(f"{framework}-first").reports[0]["history"][0]["eval_index"] == 18.0
    assert [r["eval_index"] for r in runs(f"{framework}-1").reports[0]["history"]] == [18.0, 18.0]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_run_stopped_mid_epoch_resumes_on_another_world_size_to_the_uninterrupted_result(runs, framework):
    first, resumed = runs(f"{framework}-first"), runs(f"{framework}-resumed")

    manifest = json.loads((first.checkpoints / f"step-{FIRST_STEPS:08d}" / "manifest.json").read_text())
    assert manifest["epoch"] == 1 and manifest["samples_in_epoch"] == 16  # 2 steps into epoch 2
    assert manifest["order"]["lanes"] == 4 and manifest["data_fingerprint"]
    uninterrupted = runs(f"{framework}-1").reports[0]["trajectory"]
    assert_close(resumed.reports[0]["trajectory"], uninterrupted[FIRST_STEPS:])  # to the last step


def test_keras_fit_on_sharded_data_with_2_ranks_x_b_matches_1_process_x_2b(runs):
    two, one = runs("tensorflow-first").reports, runs("tensorflow-1").reports[0]["keras"]

    assert two[0]["keras"] == two[1]["keras"]
    assert two[0]["keras"]["steps_per_epoch"] == one["steps_per_epoch"] == 5
    assert_close([two[0]["keras"]["weights"]], [one["weights"]])
    assert_close(two[0]["keras"]["history"]["val_loss"], one["history"]["val_loss"])


def test_a_resume_on_changed_shards_is_refused_on_every_rank(runs, tmp_path):
    first = runs("torch-resumed")  # its checkpoints: the first run's and the resumed run's
    changed = write_regression_shards(tmp_path / "changed", samples_per_shard=10)  # 37 samples, 4 shards
    out = tmp_path / "out"
    out.mkdir()
    args = [*COMMON, "extra.framework=torch", f"extra.data={changed}", f"checkpoint_dir={first.checkpoints}",
            "batch_size=4", "resume=auto"]
    job = run_job(JOB, *[a for s in args for a in ("--set", s)], out_dir=out, np=2, timeout=120)

    assert job.returncode != 0
    for rank in (0, 1):
        prefix = f"[{rank}]<stderr>:hvdazure: error:"
        line = next(line for line in job.stderr.splitlines() if line.startswith(prefix))
        assert "the training data's index changed" in line and "sample order changed" in line, line
    assert "Traceback" not in job.stderr
